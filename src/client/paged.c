/*
 * paged.c - gather/scatter between an engine's paged KV cache and kvpool's chunk layout.
 *
 * Geometry. One "row" is one token of one layer and one of K/V: hidden = heads * head_dim
 * elements. In the chunk, rows are dense: row (kv, layer, t) starts at
 * ((kv * num_layers + layer) * chunk_tokens + t) * row_bytes. In a layer buffer, block b's K or V
 * half (block_size rows) starts at b * block_stride + kv * kv_stride, where
 *
 *     default (NHD, HND):  block_stride = 2 * half,  kv_stride = half
 *     KVP_PAGED_KV_FIRST:  block_stride = half,      kv_stride = num_blocks * half
 *     MLA:                 block_stride = half,      one plane only
 *
 * and half = block_size * row_bytes. Inside a half, NHD and MLA store rows one after the other,
 * so the tokens of one block form a single run: a run of up to block_size rows is one memcpy.
 * HND stores [heads, block_size, head_dim]: a head's tokens are contiguous in the block but the
 * chunk interleaves heads inside each row, so the longest common run is one head of one token
 * (head_dim elements). copy_2d() moves those with a fixed-size memcpy for the usual head sizes,
 * which the compiler turns into a few vector moves instead of a library call per head.
 *
 * Safety. All arguments are validated before the first byte is copied: the cache description
 * (sizes computed with overflow checks and compared with layer_bytes), the chunk size, the token
 * range against the block table and every block id it touches against num_blocks. After that,
 * every offset computed in the copy loops lies inside a validated buffer, so the loops carry no
 * checks. No state, no locks, no allocation.
 */
#include "kvpool_paged.h"

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

/* The public struct is mirrored by the Python binding (python/kvpool/_lib.py): keep it stable. */
#if UINTPTR_MAX == UINT64_MAX
_Static_assert(sizeof(kvp_paged_cache) == 48, "kvp_paged_cache size is ABI");
_Static_assert(offsetof(kvp_paged_cache, layer_bytes) == 32, "kvp_paged_cache layout is ABI");
_Static_assert(offsetof(kvp_paged_cache, layers) == 40, "kvp_paged_cache layout is ABI");
#endif

/* Derived geometry of a validated cache description. */
struct geom {
    uint32_t planes;     /* 2 (K and V) or 1 (MLA) */
    size_t row_bytes;    /* hidden * elem_size */
    size_t head_bytes;   /* head_dim * elem_size (HND run) */
    size_t half_bytes;   /* block_size rows: one block's K or V */
    size_t block_stride; /* bytes between consecutive blocks */
    size_t kv_stride;    /* bytes between a block's K and V halves */
};

/* *acc *= f, returning false on 64-bit overflow. */
static bool mul_ok(uint64_t *acc, uint64_t f)
{
    if (f != 0 && *acc > UINT64_MAX / f)
        return false;
    *acc *= f;
    return true;
}

/* Validates a cache description and derives its geometry. */
static int cache_geom(const kvp_paged_cache *c, struct geom *g)
{
    if (!c || !c->layers)
        return -EINVAL;
    if (c->layout > KVP_PAGED_MLA || (c->flags & ~KVP_PAGED_KV_FIRST))
        return -EINVAL;
    if (c->layout == KVP_PAGED_MLA && (c->flags & KVP_PAGED_KV_FIRST))
        return -EINVAL;
    if (!c->num_layers || !c->num_blocks || !c->block_size || !c->heads || !c->head_dim)
        return -EINVAL;
    if (c->elem_size != 1 && c->elem_size != 2 && c->elem_size != 4 && c->elem_size != 8)
        return -EINVAL;
    for (uint32_t l = 0; l < c->num_layers; l++)
        if (!c->layers[l])
            return -EINVAL;

    uint64_t row = c->heads, half, total;
    if (!mul_ok(&row, c->head_dim) || !mul_ok(&row, c->elem_size))
        return -EOVERFLOW;
    half = row;
    if (!mul_ok(&half, c->block_size))
        return -EOVERFLOW;
    g->planes = c->layout == KVP_PAGED_MLA ? 1 : 2;
    total = half;
    if (!mul_ok(&total, g->planes) || !mul_ok(&total, c->num_blocks))
        return -EOVERFLOW;
    if (total > SIZE_MAX)
        return -EOVERFLOW;
    if (total > c->layer_bytes)
        return -EINVAL;

    g->row_bytes = (size_t)row;
    g->head_bytes = (size_t)c->head_dim * c->elem_size;
    g->half_bytes = (size_t)half;
    if (g->planes == 1) {
        g->block_stride = g->half_bytes;
        g->kv_stride = 0;
    } else if (c->flags & KVP_PAGED_KV_FIRST) {
        g->block_stride = g->half_bytes;
        g->kv_stride = g->half_bytes * c->num_blocks;
    } else {
        g->block_stride = 2 * g->half_bytes;
        g->kv_stride = g->half_bytes;
    }
    return 0;
}

/* Bytes of a chunk of chunk_tokens tokens, or a negative error. */
static int chunk_size(const kvp_paged_cache *c, const struct geom *g, uint32_t chunk_tokens,
                      uint64_t *bytes)
{
    uint64_t b = g->row_bytes;
    if (!mul_ok(&b, g->planes) || !mul_ok(&b, c->num_layers) || !mul_ok(&b, chunk_tokens))
        return -EOVERFLOW;
    if (b > SIZE_MAX)
        return -EOVERFLOW;
    *bytes = b;
    return 0;
}

int kvp_paged_chunk_bytes(const kvp_paged_cache *cache, uint32_t chunk_tokens, uint64_t *bytes)
{
    struct geom g;
    int rc;

    if (!bytes || !chunk_tokens)
        return -EINVAL;
    if ((rc = cache_geom(cache, &g)) < 0)
        return rc;
    return chunk_size(cache, &g, chunk_tokens, bytes);
}

/*
 * Validates everything a gather or scatter of the sequence's tokens [first, end) depends on.
 * first = token_start + skip_first_n. Reads each block table entry of the range once.
 */
static int check_call(const kvp_paged_cache *c, struct geom *g, const int32_t *table,
                      uint32_t table_len, uint32_t token_start, uint32_t num_tokens, uint32_t skip,
                      const void *chunk, uint64_t chunk_bytes, uint32_t chunk_tokens)
{
    uint64_t need;
    int rc;

    if ((rc = cache_geom(c, g)) < 0)
        return rc;
    if (!chunk_tokens || num_tokens > chunk_tokens || skip > num_tokens)
        return -EINVAL;
    if ((uint64_t)token_start + num_tokens > UINT32_MAX)
        return -EOVERFLOW;
    if ((rc = chunk_size(c, g, chunk_tokens, &need)) < 0)
        return rc;
    if (num_tokens == skip)
        return 0; /* nothing to copy: the table and buffers are not looked at */
    if (!chunk || chunk_bytes < need || !table)
        return -EINVAL;

    uint32_t first = token_start + skip, last = token_start + num_tokens - 1;
    uint32_t first_blk = first / c->block_size, last_blk = last / c->block_size;
    if (last_blk >= table_len)
        return -EINVAL;
    for (uint32_t i = first_blk; i <= last_blk; i++)
        if (table[i] < 0 || (uint32_t)table[i] >= c->num_blocks)
            return -EINVAL;
    return 0;
}

/*
 * Copies rows of len bytes: rows times, from src (advancing by sstride) to dst (advancing by
 * dstride). Constant-size cases let the compiler inline the copy; they cover head_dim * elem_size
 * for the common head sizes.
 */
static void copy_2d(char *dst, size_t dstride, const char *src, size_t sstride, size_t rows,
                    size_t len)
{
#define KVP_COPY_FIXED(n)                                    \
    case n:                                                  \
        for (size_t r = 0; r < rows; r++)                    \
            memcpy(dst + r * dstride, src + r * sstride, n); \
        return;
    switch (len) {
        KVP_COPY_FIXED(16)
        KVP_COPY_FIXED(32)
        KVP_COPY_FIXED(64)
        KVP_COPY_FIXED(128)
        KVP_COPY_FIXED(192)
        KVP_COPY_FIXED(256)
        KVP_COPY_FIXED(512)
    default:
        for (size_t r = 0; r < rows; r++)
            memcpy(dst + r * dstride, src + r * sstride, len);
        return;
    }
#undef KVP_COPY_FIXED
}

/*
 * Copies the tokens [first, end) of one plane (K, V or the MLA latent) of one layer between the
 * paged buffer `base` and the chunk rows starting at `rows` (row 0 = token first). to_chunk
 * selects the direction. The arguments have been validated by check_call().
 */
static void copy_plane(const kvp_paged_cache *c, const struct geom *g, char *base, size_t kv_off,
                       const int32_t *table, uint32_t first, uint32_t end, char *rows,
                       bool to_chunk)
{
    uint32_t p = first;
    while (p < end) {
        uint32_t o = p % c->block_size;
        uint32_t run = c->block_size - o;
        if (run > end - p)
            run = end - p;
        char *blk = base + (size_t)table[p / c->block_size] * g->block_stride + kv_off;
        char *crow = rows + (size_t)(p - first) * g->row_bytes;

        if (c->layout != KVP_PAGED_HND) {
            /* NHD / MLA: the run is contiguous on both sides. */
            char *prow = blk + (size_t)o * g->row_bytes;
            if (to_chunk)
                memcpy(crow, prow, (size_t)run * g->row_bytes);
            else
                memcpy(prow, crow, (size_t)run * g->row_bytes);
        } else {
            /* HND: head h of token o + i is at blk + (h * block_size + o + i) * head_bytes.
             * Walk tokens in the outer loop so that the chunk side, which is dense, is written
             * or read sequentially (measured faster than walking heads outside). */
            size_t head_plane = (size_t)c->block_size * g->head_bytes;
            for (uint32_t i = 0; i < run; i++) {
                char *ptok = blk + (size_t)(o + i) * g->head_bytes;
                char *ctok = crow + (size_t)i * g->row_bytes;
                if (to_chunk)
                    copy_2d(ctok, g->head_bytes, ptok, head_plane, c->heads, g->head_bytes);
                else
                    copy_2d(ptok, head_plane, ctok, g->head_bytes, c->heads, g->head_bytes);
            }
        }
        p += run;
    }
}

/* Walks every layer and plane; the chunk rows of (plane, layer) start at row
 * (plane * num_layers + layer) * chunk_tokens + (first - token_start). */
static void copy_all(const kvp_paged_cache *c, const struct geom *g, const int32_t *table,
                     uint32_t token_start, uint32_t first, uint32_t end, char *chunk,
                     uint32_t chunk_tokens, bool to_chunk)
{
    for (uint32_t kv = 0; kv < g->planes; kv++) {
        for (uint32_t l = 0; l < c->num_layers; l++) {
            size_t row0 = ((size_t)kv * c->num_layers + l) * chunk_tokens + (first - token_start);
            copy_plane(c, g, (char *)c->layers[l], kv * g->kv_stride, table, first, end,
                       chunk + row0 * g->row_bytes, to_chunk);
        }
    }
}

int kvp_paged_gather(const kvp_paged_cache *cache, const int32_t *block_table, uint32_t table_len,
                     uint32_t token_start, uint32_t num_tokens, void *chunk, uint64_t chunk_bytes,
                     uint32_t chunk_tokens)
{
    struct geom g;
    int rc = check_call(cache, &g, block_table, table_len, token_start, num_tokens, 0, chunk,
                        chunk_bytes, chunk_tokens);
    if (rc < 0 || num_tokens == 0)
        return rc;
    copy_all(cache, &g, block_table, token_start, token_start, token_start + num_tokens, chunk,
             chunk_tokens, true);
    return 0;
}

int kvp_paged_scatter(const kvp_paged_cache *cache, const int32_t *block_table, uint32_t table_len,
                      uint32_t token_start, uint32_t num_tokens, uint32_t skip_first_n,
                      const void *chunk, uint64_t chunk_bytes, uint32_t chunk_tokens)
{
    struct geom g;
    int rc = check_call(cache, &g, block_table, table_len, token_start, num_tokens, skip_first_n,
                        chunk, chunk_bytes, chunk_tokens);
    if (rc < 0 || num_tokens == skip_first_n)
        return rc;
    /* The chunk is only read; copy_all() takes a char * for both directions. */
    copy_all(cache, &g, block_table, token_start, token_start + skip_first_n,
             token_start + num_tokens, (char *)(uintptr_t)chunk, chunk_tokens, false);
    return 0;
}
