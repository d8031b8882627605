/*
 * pool.h - the L1 pool allocator: first fit over 4 KiB pages, a bitmap with a summary tree.
 *
 * The allocator hands out byte offsets (relative to the segment start) and never touches the
 * memory itself. Every operation costs O(log n) tree steps plus one bitmap word per 64 pages it
 * sets or clears, whatever the pool's size and fragmentation. Not thread-safe: the store's lock
 * protects it.
 */
#ifndef KVP_POOL_H
#define KVP_POOL_H

#include <stdbool.h>
#include <stdint.h>

#define KVP_POOL_PAGE 4096u

/* The free pages of a span of bitmap words: at its start, at its end, the longest run inside. */
struct kvp_pool_node {
    uint32_t pre, suf, max;
};

struct kvp_pool {
    uint64_t base; /* offset of page 0 */
    uint64_t npages;
    uint64_t avail; /* pages [0, avail) are reserved and may be handed out */
    uint64_t used;  /* pages in use */
    uint64_t *bits; /* 1 = used (or not reserved yet, or past the end) */
    uint64_t nwords;
    struct kvp_pool_node *tree; /* tree[1] is the root; leaf w is tree[leaves + w] */
    uint64_t leaves;            /* a power of two >= nwords */
    uint64_t steps;             /* tree nodes and bitmap words visited, ever (see below) */
};

/*
 * Manages [base, base + size): size is rounded down to whole pages, of which the first avail
 * bytes (rounded down, at most size) may be handed out. Returns 0, or -ENOMEM (also for a pool
 * of 2^32 pages or more, 16 TiB).
 */
int kvp_pool_init(struct kvp_pool *p, uint64_t base, uint64_t size, uint64_t avail);
/* Lets the first avail bytes be handed out (reserved meanwhile); never shrinks. */
void kvp_pool_extend(struct kvp_pool *p, uint64_t avail);
void kvp_pool_destroy(struct kvp_pool *p);

/*
 * Allocates len bytes (rounded up to pages) at the lowest offset where they fit. Returns 0 and
 * the offset, -EINVAL for len 0, or -ENOSPC when no free run is long enough (known at once from
 * the tree's root).
 */
int kvp_pool_alloc(struct kvp_pool *p, uint64_t len, uint64_t *off);

/* Frees an allocation made with the same len. Adjacent free runs merge by construction. */
void kvp_pool_free(struct kvp_pool *p, uint64_t off, uint64_t len);

uint64_t kvp_pool_size(const struct kvp_pool *p);
/* Bytes that may be handed out: the reserved part of the pool. */
uint64_t kvp_pool_avail(const struct kvp_pool *p);
uint64_t kvp_pool_used(const struct kvp_pool *p);
/* Length in bytes of the largest free run (the largest allocation that would succeed). O(1). */
uint64_t kvp_pool_largest_free(const struct kvp_pool *p);

/*
 * Page-level queries for the store's targeted eviction. Pages are indices from page 0; pages
 * past avail count as used. Each costs one bitmap word per 64 pages it looks at, and looks no
 * further than its limit.
 */
static inline bool kvp_pool_page_used(const struct kvp_pool *p, uint64_t i)
{
    return i >= p->npages || (p->bits[i / 64] >> (i % 64)) & 1;
}
/* The end of the free run that starts at page i: the first used page in [i, lim), or lim;
 * i itself when lim <= i. */
uint64_t kvp_pool_free_end(struct kvp_pool *p, uint64_t i, uint64_t lim);
/* The start of the free run that ends just before page i: the lowest page j >= lim such that
 * pages [j, i) are all free (i itself when page i - 1 is used or lim >= i). */
uint64_t kvp_pool_free_start(struct kvp_pool *p, uint64_t i, uint64_t lim);
/* Marks the free pages [i, i + n) used, as an allocation there would; the caller frees them
 * with kvp_pool_free() (any split of the span, each part with its own offset and length). */
void kvp_pool_claim(struct kvp_pool *p, uint64_t i, uint64_t n);

#endif /* KVP_POOL_H */
