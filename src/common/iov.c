/*
 * iov.c - see iov.h. Entries of length zero are skipped too, so callers never hand the kernel
 * an iovec that starts with nothing to move.
 */
#include "common/iov.h"

#include <stdint.h>

size_t kvp_iov_advance(struct iovec *iov, size_t n, size_t i, size_t done)
{
    while (i < n && done >= iov[i].iov_len) {
        done -= iov[i].iov_len;
        iov[i].iov_len = 0;
        i++;
    }
    if (i < n) {
        iov[i].iov_base = (uint8_t *)iov[i].iov_base + done;
        iov[i].iov_len -= done;
    }
    return i;
}
