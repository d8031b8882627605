/*
 * segment.h - the memory that holds the pool: a POSIX shared-memory segment (shm transport) or
 * private anonymous memory (inline only). Either way every page is reserved and pre-faulted at
 * creation, so no access to the pool can fault later.
 *
 * Layout: one 4 KiB header page, then the pool. Header page (little-endian):
 *   0  char[8] "KVPOOLSG"   8 u32 version (1)   12 u32 header size (4096)
 *   16 u8[16]  nonce        32 u64 segment size 40 u32 owner pid
 */
#ifndef KVP_SEGMENT_H
#define KVP_SEGMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVP_SEG_HEADER 4096u
#define KVP_SEG_MAGIC "KVPOOLSG"

struct kvp_segment {
    uint8_t *base;  /* mapping of the whole segment */
    uint64_t size;  /* header + pool */
    int fd;         /* shared segment fd (holds our flock), -1 otherwise */
    bool shared;    /* workers can map it (posix or memfd) */
    bool memfd;     /* anonymous memfd: no name, handed out by fd passing */
    char name[128]; /* posix: without '/'; "" otherwise */
    uint8_t nonce[16];
};

#define KVP_SEGMENT_INIT \
    {                    \
        .fd = -1         \
    }

/*
 * Creates the named segment of size bytes: O_CREAT|O_EXCL, mode 0600, an exclusive flock held
 * for the daemon's lifetime, posix_fallocate (retrying on EINTR), MAP_POPULATE mapping, header.
 * A namesake left by a dead daemon (no lock held) is logged and replaced.
 * Returns 0; -EBUSY when a live daemon holds the name (fatal: never share a pool); any other
 * negative errno when the segment cannot be made (why says what happened, the name is unlinked,
 * the caller falls back to private memory).
 */
int kvp_segment_create_shared(struct kvp_segment *seg, const char *name, uint64_t size,
                              uint32_t mode, char *why, size_t why_size);

/*
 * Creates an anonymous memfd segment of size bytes: memfd_create with sealing allowed,
 * posix_fallocate, seals against shrinking and growing (so a worker holding the fd can never
 * truncate the pool under the daemon), MAP_POPULATE mapping, header. Nothing appears in
 * /dev/shm and the memory goes away with the last process holding the fd. Returns 0 or a
 * negative errno with why filled (the caller falls back to private memory).
 */
int kvp_segment_create_memfd(struct kvp_segment *seg, uint64_t size, char *why, size_t why_size);

/* Creates private pre-faulted memory of size bytes. Returns 0 or the negative errno of mmap
 * (-ENOMEM when the memory is not available). */
int kvp_segment_create_private(struct kvp_segment *seg, uint64_t size);

/* Unmaps, unlinks the name if we own it, closes. Safe on a half-built or zeroed segment. */
void kvp_segment_destroy(struct kvp_segment *seg);

#endif /* KVP_SEGMENT_H */
