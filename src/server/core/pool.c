/*
 * pool.c - first-fit page allocator: a bitmap of pages and a summary tree over its words.
 *
 * One bit per 4 KiB page says whether the page is used. A complete binary tree sits over the
 * bitmap's 64-page words: each node holds, for the span of pages below it, the free pages at its
 * start (pre), at its end (suf) and the longest free run inside (max), the classic "longest
 * free segment" tree. A leaf is computed from its word; an inner node from its two children
 * (max = the larger child max, or the left's suf plus the right's pre when the run crosses the
 * middle). So:
 *
 *   - "is there room for n pages" is the root's max: O(1), and ENOSPC is known at once;
 *   - the lowest run of n free pages is found by one descent: go left while the left child
 *     holds such a run, else take the run across the middle if it is long enough, else go
 *     right. The leftmost fit always lies wholly in the child chosen, so the result is exactly
 *     first fit, in O(log n) steps, however fragmented the pool is;
 *   - allocating or freeing n pages rewrites their n/64 words and the nodes above them:
 *     O(n/64 + log n). Coalescing is implicit: a free run is consecutive zero bits, whatever
 *     order its pages were freed in.
 *
 * Memory: the bitmap (a bit per page) and the tree (24 bytes per 64 pages), allocated once:
 * 1.5 MiB for 12 GiB. Nothing is allocated after start-up and freeing cannot fail.
 *
 * Reservation: a large pool is reserved in the background after start-up (warmup.c), so only
 * pages [0, avail) may be handed out; the pages beyond are marked used until kvp_pool_extend()
 * releases them, and the padding past npages stays used for ever.
 *
 * Invariant: used == number of set bits below avail; bits from avail on (and past npages in
 * the last word) are set; every tree node equals the summary of the words below it; padding
 * leaves (past nwords) are all-used nodes.
 *
 * steps counts tree nodes and bitmap words visited, so that tests can check the cost of an
 * operation without timing it.
 */
#include "core/pool.h"

#include <errno.h>
#include <stdlib.h>

/* The summary of one word: 64 pages, a set bit is a used page. */
static struct kvp_pool_node leaf_of(uint64_t w)
{
    if (w == 0)
        return (struct kvp_pool_node){64, 64, 64};
    if (w == ~0ull)
        return (struct kvp_pool_node){0, 0, 0};
    struct kvp_pool_node n = {(uint32_t)__builtin_ctzll(w), (uint32_t)__builtin_clzll(w), 0};
    /* The longest run of free pages: shrink the free mask by one page per round. */
    for (uint64_t f = ~w; f; f &= f >> 1)
        n.max++;
    return n;
}

/* Combines two children that each cover len pages. */
static struct kvp_pool_node join(struct kvp_pool_node l, struct kvp_pool_node r, uint32_t len)
{
    struct kvp_pool_node n;
    n.pre = l.pre == len ? len + r.pre : l.pre;
    n.suf = r.suf == len ? len + l.suf : r.suf;
    n.max = l.max > r.max ? l.max : r.max;
    if (l.suf + r.pre > n.max)
        n.max = l.suf + r.pre;
    return n;
}

/* Recomputes the leaves of words [w0, w1] and every node above them. */
static void refresh(struct kvp_pool *p, uint64_t w0, uint64_t w1)
{
    uint64_t lo = p->leaves + w0, hi = p->leaves + w1;
    for (uint64_t k = lo; k <= hi; k++)
        p->tree[k] = leaf_of(p->bits[k - p->leaves]);
    p->steps += hi - lo + 1;
    for (uint32_t len = 64; lo > 1; len *= 2) {
        lo /= 2;
        hi /= 2;
        for (uint64_t k = lo; k <= hi; k++)
            p->tree[k] = join(p->tree[2 * k], p->tree[2 * k + 1], len);
        p->steps += hi - lo + 1;
    }
}

/* Sets (v=1) or clears (v=0) pages [i, i+n), n > 0, and refreshes the tree above them. */
static void set_range(struct kvp_pool *p, uint64_t i, uint64_t n, int v)
{
    uint64_t w0 = i / 64, w1 = (i + n - 1) / 64;
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
    refresh(p, w0, w1);
}

int kvp_pool_init(struct kvp_pool *p, uint64_t base, uint64_t size, uint64_t avail)
{
    *p = (struct kvp_pool){.base = base, .npages = size / KVP_POOL_PAGE};
    if (p->npages >= ((uint64_t)1 << 32))
        return -ENOMEM; /* the tree counts pages in 32 bits */
    p->avail = avail / KVP_POOL_PAGE < p->npages ? avail / KVP_POOL_PAGE : p->npages;
    p->nwords = (p->npages + 63) / 64;
    p->leaves = 1;
    while (p->leaves < p->nwords)
        p->leaves *= 2;
    p->bits = calloc(p->nwords ? p->nwords : 1, sizeof(uint64_t));
    /* Padding leaves stay all zero: an all-used node. */
    p->tree = calloc(2 * p->leaves, sizeof(*p->tree));
    if (!p->bits || !p->tree) {
        kvp_pool_destroy(p);
        return -ENOMEM;
    }
    /* Mark everything from avail to the end of the last word as used, so that searches stop
     * at the reserved end. */
    uint64_t tail = p->nwords * 64 - p->avail;
    if (tail)
        set_range(p, p->avail, tail, 1);
    if (p->nwords)
        refresh(p, 0, p->nwords - 1);
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
    free(p->tree);
    p->bits = NULL;
    p->tree = NULL;
}

/* The lowest bit where need (1..64) consecutive zero bits of w start; w must have such a run. */
static uint32_t run_in_word(uint64_t w, uint64_t need)
{
    uint64_t f = ~w;
    /* Bit j of f stays set while bits j .. j+k are all free; shifting in zeros from the top
     * drops the runs that would leave the word. */
    for (uint64_t k = 1; k < need; k++)
        f &= ~w >> k;
    return (uint32_t)__builtin_ctzll(f);
}

int kvp_pool_alloc(struct kvp_pool *p, uint64_t len, uint64_t *off)
{
    if (len == 0)
        return -EINVAL;
    /* Divide first: rounding up by adding a page could wrap for lengths near 2^64. */
    uint64_t need = len / KVP_POOL_PAGE + (len % KVP_POOL_PAGE != 0);
    p->steps++;
    if (!p->nwords || need > p->tree[1].max)
        return -ENOSPC;

    /* Invariant: the lowest free run of need pages lies wholly inside node k, which covers
     * pages [first, first + span). */
    uint64_t k = 1, first = 0, span = 64 * p->leaves, start;
    for (;;) {
        p->steps++;
        if (k >= p->leaves) {
            start = first + run_in_word(p->bits[k - p->leaves], need);
            break;
        }
        const struct kvp_pool_node *l = &p->tree[2 * k], *r = &p->tree[2 * k + 1];
        span /= 2;
        if (l->max >= need) {
            k = 2 * k;
        } else if ((uint64_t)l->suf + r->pre >= need) {
            start = first + span - l->suf;
            break;
        } else {
            k = 2 * k + 1;
            first += span;
        }
    }
    set_range(p, start, need, 1);
    p->used += need;
    *off = p->base + start * KVP_POOL_PAGE;
    return 0;
}

void kvp_pool_free(struct kvp_pool *p, uint64_t off, uint64_t len)
{
    uint64_t i = (off - p->base) / KVP_POOL_PAGE;
    uint64_t n = (len + KVP_POOL_PAGE - 1) / KVP_POOL_PAGE;
    if (!n)
        return;
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
    return p->nwords ? (uint64_t)p->tree[1].max * KVP_POOL_PAGE : 0;
}

uint64_t kvp_pool_free_end(struct kvp_pool *p, uint64_t i, uint64_t lim)
{
    if (lim > p->npages)
        lim = p->npages;
    if (lim <= i)
        return i;
    while (i < lim) {
        p->steps++;
        uint64_t w = p->bits[i / 64] & ~((1ull << (i % 64)) - 1);
        if (w) {
            uint64_t r = (i / 64) * 64 + (uint64_t)__builtin_ctzll(w);
            return r < lim ? r : lim;
        }
        i = (i / 64 + 1) * 64;
    }
    return lim;
}

uint64_t kvp_pool_free_start(struct kvp_pool *p, uint64_t i, uint64_t lim)
{
    if (i > p->npages)
        i = p->npages;
    if (lim >= i)
        return i;
    while (i > lim) {
        p->steps++;
        /* Pages [(i-1)/64*64, i) of the word that holds page i - 1. */
        uint64_t last = i - 1, b = last % 64;
        uint64_t w = p->bits[last / 64] & (b == 63 ? ~0ull : (1ull << (b + 1)) - 1);
        if (w) {
            uint64_t r = (last / 64) * 64 + 63 - (uint64_t)__builtin_clzll(w) + 1;
            return r > lim ? r : lim;
        }
        i = (last / 64) * 64;
    }
    return lim;
}

void kvp_pool_claim(struct kvp_pool *p, uint64_t i, uint64_t n)
{
    if (!n)
        return;
    set_range(p, i, n, 1);
    p->used += n;
}
