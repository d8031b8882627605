/*
 * test_paged.c - kvp_paged_gather() / kvp_paged_scatter() against a per-element reference.
 *
 * The reference computes the address of every element from the layout formulas of
 * kvpool_paged.h, one element at a time, with no shared code. Each case fills the paged layers
 * and the chunk with pseudo-random bytes, runs the library and the reference on identical
 * copies, and compares every byte of the destination (including bytes that must not change).
 * Cases cover NHD, HND and MLA, KV-first, odd block sizes, ranges not aligned to blocks,
 * partial chunks, skip-first-n, shuffled block tables and every validation error.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvpool_paged.h"

/* xorshift64*: deterministic pseudo-random data, reproducible from the printed seed. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static void fill_random(void *buf, size_t n)
{
    unsigned char *p = buf;
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(rng() >> 56);
}

static uint32_t rand_below(uint32_t n)
{
    return (uint32_t)(rng() % n);
}

struct pcase {
    uint32_t layout, flags, layers, num_blocks, block_size, heads, head_dim, elem_size;
    uint32_t chunk_tokens, token_start, num_tokens, skip;
};

static void print_case(const struct pcase *k)
{
    print_error("case: layout=%u flags=%u layers=%u blocks=%u bs=%u heads=%u hd=%u es=%u "
                "chunk=%u start=%u n=%u skip=%u\n",
                k->layout, k->flags, k->layers, k->num_blocks, k->block_size, k->heads, k->head_dim,
                k->elem_size, k->chunk_tokens, k->token_start, k->num_tokens, k->skip);
}

static size_t planes_of(const struct pcase *k)
{
    return k->layout == KVP_PAGED_MLA ? 1 : 2;
}

static size_t layer_size(const struct pcase *k)
{
    return planes_of(k) * k->num_blocks * k->block_size * k->heads * k->head_dim * k->elem_size;
}

static size_t chunk_size_of(const struct pcase *k)
{
    return planes_of(k) * k->layers * k->chunk_tokens * k->heads * k->head_dim * k->elem_size;
}

/* Element index of (kv, block, offset in block, head, d) in a layer buffer. */
static size_t ref_paged_index(const struct pcase *k, size_t kv, size_t blk, size_t o, size_t h,
                              size_t d)
{
    size_t B = k->num_blocks, S = k->block_size, H = k->heads, D = k->head_dim;
    switch (k->layout) {
    case KVP_PAGED_NHD:
        if (k->flags & KVP_PAGED_KV_FIRST)
            return (((kv * B + blk) * S + o) * H + h) * D + d;
        return (((blk * 2 + kv) * S + o) * H + h) * D + d;
    case KVP_PAGED_HND:
        if (k->flags & KVP_PAGED_KV_FIRST)
            return (((kv * B + blk) * H + h) * S + o) * D + d;
        return (((blk * 2 + kv) * H + h) * S + o) * D + d;
    default: /* MLA: hidden = heads * head_dim as one latent row */
        return (blk * S + o) * H * D + h * D + d;
    }
}

/* Element index of (kv, layer, t, h, d) in the chunk. */
static size_t ref_chunk_index(const struct pcase *k, size_t kv, size_t l, size_t t, size_t h,
                              size_t d)
{
    return ((kv * k->layers + l) * k->chunk_tokens + t) * k->heads * k->head_dim + h * k->head_dim +
           d;
}

/* Per-element reference: to_chunk = gather, else scatter (rows [skip, n)). */
static void ref_copy(const struct pcase *k, unsigned char **layers, const int32_t *table,
                     unsigned char *chunk, int to_chunk)
{
    size_t es = k->elem_size;
    for (size_t kv = 0; kv < planes_of(k); kv++)
        for (size_t l = 0; l < k->layers; l++)
            for (size_t t = k->skip; t < k->num_tokens; t++) {
                size_t pos = k->token_start + t;
                size_t blk = (size_t)table[pos / k->block_size], o = pos % k->block_size;
                for (size_t h = 0; h < k->heads; h++)
                    for (size_t d = 0; d < k->head_dim; d++) {
                        unsigned char *pe = layers[l] + ref_paged_index(k, kv, blk, o, h, d) * es;
                        unsigned char *ce = chunk + ref_chunk_index(k, kv, l, t, h, d) * es;
                        if (to_chunk)
                            memcpy(ce, pe, es);
                        else
                            memcpy(pe, ce, es);
                    }
            }
}

static kvp_paged_cache make_cache(const struct pcase *k, unsigned char **layers)
{
    return (kvp_paged_cache){
        .layout = k->layout,
        .flags = k->flags,
        .num_layers = k->layers,
        .num_blocks = k->num_blocks,
        .block_size = k->block_size,
        .heads = k->heads,
        .head_dim = k->head_dim,
        .elem_size = k->elem_size,
        .layer_bytes = layer_size(k),
        .layers = (void *const *)layers,
    };
}

/* A block table for the case: a random permutation of the blocks, long enough for the range. */
static int32_t *make_table(const struct pcase *k, uint32_t *len)
{
    uint32_t need = (k->token_start + k->num_tokens + k->block_size - 1) / k->block_size;
    int32_t *perm = malloc(sizeof(int32_t) * k->num_blocks);
    assert_non_null(perm);
    for (uint32_t i = 0; i < k->num_blocks; i++)
        perm[i] = (int32_t)i;
    for (uint32_t i = k->num_blocks; i > 1; i--) {
        uint32_t j = rand_below(i);
        int32_t tmp = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = tmp;
    }
    assert_true(need <= k->num_blocks);
    *len = need ? need : 1;
    return perm;
}

/* Runs one case through gather and scatter and compares with the reference. */
static void run_case(const struct pcase *k)
{
    size_t lsz = layer_size(k), csz = chunk_size_of(k);
    unsigned char **la = calloc(k->layers, sizeof(*la)), **lb = calloc(k->layers, sizeof(*lb));
    unsigned char *ca = malloc(csz), *cb = malloc(csz);
    uint32_t tlen;
    int32_t *table = make_table(k, &tlen);
    assert_non_null(la);
    assert_non_null(lb);
    assert_non_null(ca);
    assert_non_null(cb);
    for (uint32_t l = 0; l < k->layers; l++) {
        la[l] = malloc(lsz);
        lb[l] = malloc(lsz);
        assert_non_null(la[l]);
        assert_non_null(lb[l]);
        fill_random(la[l], lsz);
        memcpy(lb[l], la[l], lsz);
    }

    /* Gather (the skip of the case applies to scatter only). */
    struct pcase g = *k;
    g.skip = 0;
    fill_random(ca, csz);
    memcpy(cb, ca, csz);
    kvp_paged_cache cache = make_cache(k, la);
    int rc = kvp_paged_gather(&cache, table, tlen, k->token_start, k->num_tokens, ca, csz,
                              k->chunk_tokens);
    ref_copy(&g, la, table, cb, 1);
    if (rc != 0 || memcmp(ca, cb, csz) != 0)
        print_case(k);
    assert_int_equal(rc, 0);
    assert_memory_equal(ca, cb, csz);

    /* Scatter a fresh random chunk into identical copies of the layers. */
    fill_random(ca, csz);
    rc = kvp_paged_scatter(&cache, table, tlen, k->token_start, k->num_tokens, k->skip, ca, csz,
                           k->chunk_tokens);
    ref_copy(k, lb, table, ca, 0);
    for (uint32_t l = 0; l < k->layers; l++) {
        if (rc != 0 || memcmp(la[l], lb[l], lsz) != 0)
            print_case(k);
        assert_int_equal(rc, 0);
        assert_memory_equal(la[l], lb[l], lsz);
    }

    /* Round trip: gathering what was scattered gives back the chunk rows [skip, n). */
    fill_random(cb, csz);
    assert_int_equal(kvp_paged_gather(&cache, table, tlen, k->token_start, k->num_tokens, cb, csz,
                                      k->chunk_tokens),
                     0);
    size_t row = (size_t)k->heads * k->head_dim * k->elem_size;
    for (size_t p = 0; p < planes_of(k) * k->layers; p++) {
        size_t off = (p * k->chunk_tokens + k->skip) * row;
        assert_memory_equal(ca + off, cb + off, (k->num_tokens - k->skip) * row);
    }

    for (uint32_t l = 0; l < k->layers; l++) {
        free(la[l]);
        free(lb[l]);
    }
    free(la);
    free(lb);
    free(ca);
    free(cb);
    free(table);
}

static void test_nhd(void **state)
{
    (void)state;
    const struct pcase cases[] = {
        /* layout, flags, layers, blocks, bs, heads, hd, es, chunk, start, n, skip */
        {KVP_PAGED_NHD, 0, 2, 8, 16, 2, 8, 2, 16, 0, 16, 0},    /* aligned */
        {KVP_PAGED_NHD, 0, 3, 12, 3, 2, 5, 2, 16, 16, 16, 0},   /* bs 3, 16 % 3 != 0 */
        {KVP_PAGED_NHD, 0, 2, 12, 5, 1, 7, 4, 16, 32, 16, 3},   /* bs 5, skip */
        {KVP_PAGED_NHD, 0, 1, 9, 16, 4, 16, 2, 32, 16, 32, 17}, /* chunk spans 3 blocks */
        {KVP_PAGED_NHD, 0, 2, 6, 7, 3, 4, 1, 16, 5, 11, 0},     /* partial chunk */
        {KVP_PAGED_NHD, 0, 2, 4, 64, 2, 8, 8, 16, 40, 16, 0},   /* chunk inside a block */
        {KVP_PAGED_NHD, KVP_PAGED_KV_FIRST, 3, 10, 5, 2, 6, 2, 16, 16, 16, 2},
        {KVP_PAGED_NHD, KVP_PAGED_KV_FIRST, 2, 5, 16, 2, 64, 2, 16, 32, 16, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        run_case(&cases[i]);
}

static void test_hnd(void **state)
{
    (void)state;
    const struct pcase cases[] = {
        {KVP_PAGED_HND, 0, 2, 8, 16, 2, 8, 2, 16, 0, 16, 0},   /* 16-byte heads: fixed copy */
        {KVP_PAGED_HND, 0, 2, 12, 3, 4, 64, 2, 16, 16, 16, 0}, /* 128-byte heads */
        {KVP_PAGED_HND, 0, 3, 12, 5, 3, 5, 2, 16, 32, 16, 7},  /* odd head size, skip */
        {KVP_PAGED_HND, 0, 1, 9, 16, 2, 128, 2, 32, 16, 32, 31},
        {KVP_PAGED_HND, 0, 2, 6, 7, 3, 4, 4, 16, 5, 11, 1},
        {KVP_PAGED_HND, 0, 2, 4, 64, 2, 96, 2, 16, 40, 16, 0}, /* 192-byte heads */
        {KVP_PAGED_HND, KVP_PAGED_KV_FIRST, 3, 10, 5, 2, 6, 2, 16, 16, 16, 2},
        {KVP_PAGED_HND, KVP_PAGED_KV_FIRST, 2, 5, 16, 8, 32, 1, 16, 32, 16, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        run_case(&cases[i]);
}

static void test_mla(void **state)
{
    (void)state;
    const struct pcase cases[] = {
        {KVP_PAGED_MLA, 0, 2, 8, 16, 1, 576, 2, 16, 0, 16, 0},
        {KVP_PAGED_MLA, 0, 3, 12, 3, 1, 9, 2, 16, 16, 16, 4},
        {KVP_PAGED_MLA, 0, 2, 12, 5, 1, 33, 1, 16, 32, 13, 0},
        {KVP_PAGED_MLA, 0, 1, 3, 64, 1, 16, 4, 16, 100, 16, 15},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        run_case(&cases[i]);
}

/* Random geometries: every layout, small odd sizes. */
static void test_random_sweep(void **state)
{
    (void)state;
    static const uint32_t sizes[] = {1, 2, 4, 8};
    for (int it = 0; it < 400; it++) {
        struct pcase k = {0};
        k.layout = rand_below(3);
        k.flags = (k.layout != KVP_PAGED_MLA && rand_below(2)) ? KVP_PAGED_KV_FIRST : 0;
        k.layers = 1 + rand_below(3);
        k.block_size = 1 + rand_below(17);
        k.heads = k.layout == KVP_PAGED_MLA ? 1 : 1 + rand_below(4);
        k.head_dim = 1 + rand_below(20);
        k.elem_size = sizes[rand_below(4)];
        k.chunk_tokens = 1 + rand_below(40);
        k.num_tokens = rand_below(k.chunk_tokens + 1);
        k.skip = rand_below(k.num_tokens + 1);
        k.token_start = rand_below(50);
        k.num_blocks = (k.token_start + k.num_tokens + k.block_size - 1) / k.block_size +
                       rand_below(4) + 1;
        run_case(&k);
    }
}

/* Shared set-up for the error tests: NHD, 2 layers, 4 blocks of 4 tokens, chunk of 8. */
struct err_env {
    struct pcase k;
    unsigned char *layers[2];
    unsigned char *chunk;
    unsigned char *copy;
    size_t csz, lsz;
    kvp_paged_cache cache;
    int32_t table[4];
};

static void err_env_init(struct err_env *e)
{
    e->k = (struct pcase){KVP_PAGED_NHD, 0, 2, 4, 4, 2, 4, 2, 8, 0, 8, 0};
    e->lsz = layer_size(&e->k);
    e->csz = chunk_size_of(&e->k);
    for (int l = 0; l < 2; l++) {
        e->layers[l] = malloc(e->lsz);
        assert_non_null(e->layers[l]);
        fill_random(e->layers[l], e->lsz);
    }
    e->chunk = malloc(e->csz);
    e->copy = malloc(e->csz);
    assert_non_null(e->chunk);
    assert_non_null(e->copy);
    fill_random(e->chunk, e->csz);
    memcpy(e->copy, e->chunk, e->csz);
    e->cache = make_cache(&e->k, e->layers);
    for (int i = 0; i < 4; i++)
        e->table[i] = 3 - i;
}

static void err_env_free(struct err_env *e)
{
    free(e->layers[0]);
    free(e->layers[1]);
    free(e->chunk);
    free(e->copy);
}

/* Expects gather to fail with err and leave the chunk untouched. */
static void expect_gather_err(struct err_env *e, const kvp_paged_cache *c, const int32_t *table,
                              uint32_t tlen, uint32_t start, uint32_t n, uint64_t cbytes,
                              uint32_t ctok, int err)
{
    assert_int_equal(kvp_paged_gather(c, table, tlen, start, n, e->chunk, cbytes, ctok), err);
    assert_memory_equal(e->chunk, e->copy, e->csz);
}

static void test_gather_errors(void **state)
{
    (void)state;
    struct err_env e;
    err_env_init(&e);

    /* Invalid block ids: too large, negative; only in the range's second block. */
    int32_t bad[4] = {0, 4, 1, 2};
    expect_gather_err(&e, &e.cache, bad, 4, 0, 8, e.csz, 8, -EINVAL);
    bad[1] = -1;
    expect_gather_err(&e, &e.cache, bad, 4, 0, 8, e.csz, 8, -EINVAL);
    /* The same table is fine for a range that does not touch the bad entry. */
    assert_int_equal(kvp_paged_gather(&e.cache, bad, 4, 8, 8, e.chunk, e.csz, 8), 0);
    memcpy(e.copy, e.chunk, e.csz);

    /* Range beyond the table. */
    expect_gather_err(&e, &e.cache, e.table, 2, 4, 8, e.csz, 8, -EINVAL);
    expect_gather_err(&e, &e.cache, e.table, 4, 12, 8, e.csz, 8, -EINVAL);
    /* More tokens than the chunk holds; chunk buffer too small; zero chunk tokens. */
    expect_gather_err(&e, &e.cache, e.table, 4, 0, 9, e.csz, 8, -EINVAL);
    expect_gather_err(&e, &e.cache, e.table, 4, 0, 8, e.csz - 1, 8, -EINVAL);
    expect_gather_err(&e, &e.cache, e.table, 4, 0, 0, e.csz, 0, -EINVAL);
    /* Token range past 32 bits. */
    expect_gather_err(&e, &e.cache, e.table, 4, UINT32_MAX - 2, 8, e.csz, 8, -EOVERFLOW);
    /* NULL table or chunk. */
    expect_gather_err(&e, &e.cache, NULL, 4, 0, 8, e.csz, 8, -EINVAL);
    assert_int_equal(kvp_paged_gather(&e.cache, e.table, 4, 0, 8, NULL, e.csz, 8), -EINVAL);
    assert_int_equal(kvp_paged_gather(NULL, e.table, 4, 0, 8, e.chunk, e.csz, 8), -EINVAL);

    /* Invalid descriptions. */
    kvp_paged_cache c = e.cache;
    c.layer_bytes = e.lsz - 1;
    expect_gather_err(&e, &c, e.table, 4, 0, 8, e.csz, 8, -EINVAL);
    c = e.cache;
    c.layout = 3;
    expect_gather_err(&e, &c, e.table, 4, 0, 8, e.csz, 8, -EINVAL);
    c = e.cache;
    c.flags = 0x2;
    expect_gather_err(&e, &c, e.table, 4, 0, 8, e.csz, 8, -EINVAL);
    c = e.cache;
    c.layout = KVP_PAGED_MLA;
    c.flags = KVP_PAGED_KV_FIRST;
    expect_gather_err(&e, &c, e.table, 4, 0, 8, e.csz, 8, -EINVAL);
    c = e.cache;
    c.elem_size = 3;
    expect_gather_err(&e, &c, e.table, 4, 0, 8, e.csz, 8, -EINVAL);
    c = e.cache;
    c.block_size = 0;
    expect_gather_err(&e, &c, e.table, 4, 0, 8, e.csz, 8, -EINVAL);
    c = e.cache;
    c.num_blocks = 5; /* claims more blocks than layer_bytes holds */
    expect_gather_err(&e, &c, e.table, 4, 0, 8, e.csz, 8, -EINVAL);
    void *with_null[2] = {e.layers[0], NULL};
    c = e.cache;
    c.layers = with_null;
    expect_gather_err(&e, &c, e.table, 4, 0, 8, e.csz, 8, -EINVAL);
    c = e.cache;
    c.heads = UINT32_MAX;
    c.head_dim = UINT32_MAX;
    c.elem_size = 8;
    c.block_size = UINT32_MAX;
    expect_gather_err(&e, &c, e.table, 4, 0, 8, e.csz, 8, -EOVERFLOW);

    /* Zero tokens is a no-op even with an empty table. */
    assert_int_equal(kvp_paged_gather(&e.cache, NULL, 0, 0, 0, e.chunk, e.csz, 8), 0);
    assert_memory_equal(e.chunk, e.copy, e.csz);
    err_env_free(&e);
}

static void test_scatter_errors(void **state)
{
    (void)state;
    struct err_env e;
    err_env_init(&e);
    unsigned char *l0 = malloc(e.lsz), *l1 = malloc(e.lsz);
    assert_non_null(l0);
    assert_non_null(l1);
    memcpy(l0, e.layers[0], e.lsz);
    memcpy(l1, e.layers[1], e.lsz);

    int32_t bad[4] = {0, 1, 9, 2};
    assert_int_equal(kvp_paged_scatter(&e.cache, bad, 4, 4, 8, 0, e.chunk, e.csz, 8), -EINVAL);
    /* skip > n, range beyond the table, chunk too small. */
    assert_int_equal(kvp_paged_scatter(&e.cache, e.table, 4, 0, 4, 5, e.chunk, e.csz, 8), -EINVAL);
    assert_int_equal(kvp_paged_scatter(&e.cache, e.table, 3, 8, 8, 0, e.chunk, e.csz, 8), -EINVAL);
    assert_int_equal(kvp_paged_scatter(&e.cache, e.table, 4, 0, 8, 0, e.chunk, 16, 8), -EINVAL);
    assert_memory_equal(l0, e.layers[0], e.lsz);
    assert_memory_equal(l1, e.layers[1], e.lsz);

    /* Skipping into the bad block makes the same table valid: only copied tokens count. */
    assert_int_equal(kvp_paged_scatter(&e.cache, bad, 4, 4, 8, 8, e.chunk, e.csz, 8), 0);
    assert_memory_equal(l0, e.layers[0], e.lsz);
    bad[2] = 2;
    bad[3] = 9;
    assert_int_equal(kvp_paged_scatter(&e.cache, bad, 4, 4, 8, 4, e.chunk, e.csz, 8), 0);
    free(l0);
    free(l1);
    err_env_free(&e);
}

static void test_chunk_bytes(void **state)
{
    (void)state;
    struct err_env e;
    err_env_init(&e);
    uint64_t b = 0;
    assert_int_equal(kvp_paged_chunk_bytes(&e.cache, 8, &b), 0);
    assert_int_equal(b, e.csz);
    assert_int_equal(kvp_paged_chunk_bytes(&e.cache, 0, &b), -EINVAL);
    assert_int_equal(kvp_paged_chunk_bytes(&e.cache, 8, NULL), -EINVAL);
    kvp_paged_cache c = e.cache;
    c.layout = KVP_PAGED_MLA;
    assert_int_equal(kvp_paged_chunk_bytes(&c, 8, &b), 0);
    assert_int_equal(b, e.csz / 2);
    err_env_free(&e);
}

int main(void)
{
    const char *seed = getenv("KVP_TEST_SEED");
    if (seed)
        rng_state = strtoull(seed, NULL, 0) | 1;
    fprintf(stderr, "test_paged: seed 0x%llx\n", (unsigned long long)rng_state);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nhd),           cmocka_unit_test(test_hnd),
        cmocka_unit_test(test_mla),           cmocka_unit_test(test_random_sweep),
        cmocka_unit_test(test_gather_errors), cmocka_unit_test(test_scatter_errors),
        cmocka_unit_test(test_chunk_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
