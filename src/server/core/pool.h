/*
 * pool.h - the L1 pool allocator: first-fit over 4 KiB pages, tracked by a bitmap.
 *
 * The allocator hands out byte offsets (relative to the segment start) and never touches the
 * memory itself. Not thread-safe: the store's lock protects it.
 */
#ifndef KVP_POOL_H
#define KVP_POOL_H

#include <stdint.h>

#define KVP_POOL_PAGE 4096u

struct kvp_pool {
    uint64_t base; /* offset of page 0 */
    uint64_t npages;
    uint64_t avail; /* pages [0, avail) are reserved and may be handed out */
    uint64_t used;  /* pages in use */
    uint64_t *bits; /* 1 = used */
    uint64_t nwords;
};

/*
 * Manages [base, base + size): size is rounded down to whole pages, of which the first avail
 * bytes (rounded down, at most size) may be handed out. Returns 0 or -ENOMEM.
 */
int kvp_pool_init(struct kvp_pool *p, uint64_t base, uint64_t size, uint64_t avail);
/* Lets the first avail bytes be handed out (reserved meanwhile); never shrinks. */
void kvp_pool_extend(struct kvp_pool *p, uint64_t avail);
void kvp_pool_destroy(struct kvp_pool *p);

/*
 * Allocates len bytes (rounded up to pages) at the lowest offset where they fit. Returns 0 and
 * the offset, -EINVAL for len 0, or -ENOSPC when no free run is long enough.
 */
int kvp_pool_alloc(struct kvp_pool *p, uint64_t len, uint64_t *off);

/* Frees an allocation made with the same len. Adjacent free runs merge by construction. */
void kvp_pool_free(struct kvp_pool *p, uint64_t off, uint64_t len);

uint64_t kvp_pool_size(const struct kvp_pool *p);
/* Bytes that may be handed out: the reserved part of the pool. */
uint64_t kvp_pool_avail(const struct kvp_pool *p);
uint64_t kvp_pool_used(const struct kvp_pool *p);
/* Length in bytes of the largest free run (the largest allocation that would succeed). */
uint64_t kvp_pool_largest_free(const struct kvp_pool *p);

#endif /* KVP_POOL_H */
