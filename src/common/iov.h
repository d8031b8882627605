/*
 * iov.h - resuming gathered I/O after a partial sendmsg/recvmsg, shared by the daemon and the
 * client library.
 */
#ifndef KVP_IOV_H
#define KVP_IOV_H

#include <stddef.h>
#include <sys/uio.h>

/*
 * Marks done bytes of iov[i..n) as transferred: fully covered entries are skipped, a partly
 * covered one is advanced in place. Returns the index of the first entry with bytes left (n when
 * everything was transferred).
 */
size_t kvp_iov_advance(struct iovec *iov, size_t n, size_t i, size_t done);

#endif /* KVP_IOV_H */
