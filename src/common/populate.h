/*
 * populate.h - faulting memory in ahead of use, with MADV_POPULATE_WRITE (Linux 5.14), for the
 * kernel headers that predate it. Best effort everywhere: on an older kernel madvise() fails
 * with EINVAL and the pages are faulted in on first use, as without it.
 */
#ifndef KVP_POPULATE_H
#define KVP_POPULATE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/*
 * Faults in the whole pages inside [p, p + len) of a private anonymous mapping (such as a
 * large calloc), without changing a byte. The partial pages at either end are left to their
 * first use: they may belong to memory the caller does not own.
 */
static inline void kvp_populate_inside(void *p, size_t len)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = ((uintptr_t)p + page - 1) & ~(page - 1);
    uintptr_t end = ((uintptr_t)p + len) & ~(page - 1);
    if (end > start)
        (void)madvise((void *)start, end - start, MADV_POPULATE_WRITE);
}

#endif /* KVP_POPULATE_H */
