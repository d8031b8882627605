/*
 * pool.c - first-fit page allocator.
 *
 * One bit per 4 KiB page (a 1 GiB pool needs 32 KiB of bitmap, allocated once), so the
 * allocator never allocates after start-up and freeing can never fail. Coalescing is implicit:
 * a free run is just consecutive zero bits, whatever order they were freed in. The search skips
 * whole 64-page words that are full; with the multi-megabyte chunks of real KV layouts a
 * search touches a few hundred words at most.
 *
 * Reservation: a large pool is reserved in the background after start-up (server.c), so only
 * pages [0, avail) may be handed out; the pages beyond are marked used until kvp_pool_extend()
 * releases them, which keeps the search unchanged.
 *
 * Invariant: used == number of set bits below avail; bits from avail on (and past npages in
 * the last word) are set, so the search never returns a page that is not reserved.
 */
#include "core/pool.h"

#include <errno.h>
#include <stdlib.h>

/* Sets (v=1) or clears (v=0) pages [i, i+n). */
static void set_range(struct kvp_pool *p, uint64_t i, uint64_t n, int v)
{
    while (n) {
        uint64_t w = i / 64, b = i % 64;
        uint64_t take = 64 - b < n ? 64 - b : n;
        uint64_t mask = take == 64 ? ~0ull : ((1ull << take) - 1) << b;
        if (v)
            p->bits[w] |= mask;
        else
            p->bits[w] &= ~mask;
        i += take;
        n -= take;
    }
}

int kvp_pool_init(struct kvp_pool *p, uint64_t base, uint64_t size, uint64_t avail)
{
    *p = (struct kvp_pool){.base = base, .npages = size / KVP_POOL_PAGE};
    p->avail = avail / KVP_POOL_PAGE < p->npages ? avail / KVP_POOL_PAGE : p->npages;
    p->nwords = (p->npages + 63) / 64;
    p->bits = calloc(p->nwords ? p->nwords : 1, sizeof(uint64_t));
    if (!p->bits)
        return -ENOMEM;
    /* Mark everything from avail to the end of the last word as used, so that searches stop
     * at the reserved end. */
    uint64_t tail = p->nwords * 64 - p->avail;
    if (tail)
        set_range(p, p->avail, tail, 1);
    return 0;
}

void kvp_pool_extend(struct kvp_pool *p, uint64_t avail)
{
    uint64_t n = avail / KVP_POOL_PAGE < p->npages ? avail / KVP_POOL_PAGE : p->npages;
    if (n <= p->avail)
        return;
    set_range(p, p->avail, n - p->avail, 0);
    p->avail = n;
}

void kvp_pool_destroy(struct kvp_pool *p)
{
    free(p->bits);
    p->bits = NULL;
}

/* Index of the first free page at or after i, or npages. */
static uint64_t next_free(const struct kvp_pool *p, uint64_t i)
{
    while (i < p->npages) {
        uint64_t w = p->bits[i / 64] | ((1ull << (i % 64)) - 1);
        if (~w)
            return (i / 64) * 64 + (uint64_t)__builtin_ctzll(~w);
        i = (i / 64 + 1) * 64;
    }
    return p->npages;
}

/* Index of the first used page at or after i, or npages. */
static uint64_t next_used(const struct kvp_pool *p, uint64_t i)
{
    while (i < p->npages) {
        uint64_t w = p->bits[i / 64] & ~((1ull << (i % 64)) - 1);
        if (w) {
            uint64_t r = (i / 64) * 64 + (uint64_t)__builtin_ctzll(w);
            return r < p->npages ? r : p->npages;
        }
        i = (i / 64 + 1) * 64;
    }
    return p->npages;
}

int kvp_pool_alloc(struct kvp_pool *p, uint64_t len, uint64_t *off)
{
    if (len == 0)
        return -EINVAL;
    /* Divide first: rounding up by adding a page could wrap for lengths near 2^64. */
    uint64_t need = len / KVP_POOL_PAGE + (len % KVP_POOL_PAGE != 0);
    if (need > p->avail - p->used)
        return -ENOSPC;

    uint64_t i = next_free(p, 0);
    while (i < p->npages) {
        uint64_t end = next_used(p, i);
        if (end - i >= need) {
            set_range(p, i, need, 1);
            p->used += need;
            *off = p->base + i * KVP_POOL_PAGE;
            return 0;
        }
        i = next_free(p, end);
    }
    return -ENOSPC;
}

void kvp_pool_free(struct kvp_pool *p, uint64_t off, uint64_t len)
{
    uint64_t i = (off - p->base) / KVP_POOL_PAGE;
    uint64_t n = (len + KVP_POOL_PAGE - 1) / KVP_POOL_PAGE;
    set_range(p, i, n, 0);
    p->used -= n;
}

uint64_t kvp_pool_size(const struct kvp_pool *p)
{
    return p->npages * KVP_POOL_PAGE;
}

uint64_t kvp_pool_avail(const struct kvp_pool *p)
{
    return p->avail * KVP_POOL_PAGE;
}

uint64_t kvp_pool_used(const struct kvp_pool *p)
{
    return p->used * KVP_POOL_PAGE;
}

uint64_t kvp_pool_largest_free(const struct kvp_pool *p)
{
    uint64_t best = 0, i = next_free(p, 0);
    while (i < p->npages) {
        uint64_t end = next_used(p, i);
        if (end - i > best)
            best = end - i;
        i = next_free(p, end);
    }
    return best * KVP_POOL_PAGE;
}
