/*
 * test_eviction.c - a pool under pressure: least-recently-used chunks make room, pinned chunks
 * never do, and "no space" is an answer distinct from "already cached".
 *
 * Pool: 1 MiB; chunk: 2 x 2 layers x 16 tokens x 64 x fp16 = 8 KiB, so 128 chunks fit.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"

#define C 16
#define SEQ_CHUNKS 48 /* three sequences exceed the 128-chunk pool */

static struct kvpt_daemon daemon_;

static int setup(void **state)
{
    const char *args[] = {"--l1-size", "1MiB", "--chunk-size", "16", NULL};
    return kvpt_group_start(state, &daemon_, args);
}

struct seq {
    uint32_t id;
    uint32_t *tok;
    kvp_tokens t;
    void *bufs[SEQ_CHUNKS];
};

static void seq_init(struct seq *s, uint32_t id, size_t bytes)
{
    s->id = id;
    s->tok = kvpt_tokens(id, SEQ_CHUNKS * C);
    s->t = (kvp_tokens){.ids = s->tok, .count = SEQ_CHUNKS * C};
    for (uint32_t i = 0; i < SEQ_CHUNKS; i++) {
        s->bufs[i] = malloc(bytes);
        kvpt_fill(s->bufs[i], bytes, id, i);
    }
}

static void seq_free(struct seq *s)
{
    for (uint32_t i = 0; i < SEQ_CHUNKS; i++)
        free(s->bufs[i]);
    free(s->tok);
}

static int store(kvp_instance *inst, struct seq *s, kvp_store_result *r)
{
    return kvp_store(inst, &s->t, 0, SEQ_CHUNKS * C, (const void *const *)s->bufs, r);
}

static void test_lru_eviction(void **state)
{
    (void)state;
    kvp_client *c = kvpt_connect(&daemon_);
    kvp_register_opts o = kvpt_layout("evict", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    kvp_store_result r;
    struct seq a, b, d;

    assert_int_equal(kvp_register(c, &o, &inst), 0);
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
    assert_int_equal(bytes, 8192);
    seq_init(&a, 100, bytes);
    seq_init(&b, 101, bytes);
    seq_init(&d, 102, bytes);

    assert_int_equal(store(inst, &a, &r), SEQ_CHUNKS);
    assert_int_equal(store(inst, &b, &r), SEQ_CHUNKS);
    /* Touch a: now b is the least recently used. */
    assert_int_equal(kvp_lookup(inst, &a.t), SEQ_CHUNKS);
    uint64_t ev0 = kvpt_stat(c, "evictions");
    assert_int_equal(store(inst, &d, &r), SEQ_CHUNKS);
    assert_int_equal(r.no_space, 0);
    uint64_t evicted = kvpt_stat(c, "evictions") - ev0;
    assert_int_equal(evicted, 3 * SEQ_CHUNKS - 128);

    /* a and d intact; b lost its oldest chunks, so its leading run is gone. */
    assert_int_equal(kvp_lookup(inst, &a.t), SEQ_CHUNKS);
    assert_int_equal(kvp_lookup(inst, &d.t), SEQ_CHUNKS);
    assert_int_equal(kvp_lookup(inst, &b.t), 0);

    void *out[SEQ_CHUNKS];
    for (uint32_t i = 0; i < SEQ_CHUNKS; i++)
        out[i] = calloc(1, bytes);
    assert_int_equal(kvp_retrieve(inst, &a.t, 0, SEQ_CHUNKS * C, out), SEQ_CHUNKS);
    for (uint32_t i = 0; i < SEQ_CHUNKS; i++)
        assert_true(kvpt_check(out[i], bytes, a.id, i));
    assert_int_equal(kvp_retrieve(inst, &d.t, 0, SEQ_CHUNKS * C, out), SEQ_CHUNKS);
    for (uint32_t i = 0; i < SEQ_CHUNKS; i++) {
        assert_true(kvpt_check(out[i], bytes, d.id, i));
        free(out[i]);
    }
    seq_free(&a);
    seq_free(&b);
    seq_free(&d);
    kvp_client_close(c);
}

static void test_pinned_never_evicted(void **state)
{
    (void)state;
    kvp_client *c = kvpt_connect(&daemon_);
    kvp_register_opts o = kvpt_layout("pinner", KVP_TRANSPORT_SHM);
    kvp_instance *inst = NULL;
    kvp_retrieve_plan pa, pb;
    kvp_store_plan sp;
    kvp_store_result r;
    struct seq a, b, d;

    assert_int_equal(kvp_register(c, &o, &inst), 0);
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
    seq_init(&a, 200, bytes);
    seq_init(&b, 201, bytes);
    seq_init(&d, 202, bytes);
    assert_int_equal(store(inst, &a, &r) + (int)r.cached, SEQ_CHUNKS);
    assert_int_equal(store(inst, &b, &r) + (int)r.cached, SEQ_CHUNKS);

    /* Pin both: 96 of 128 chunks pinned. Another reservation fills the rest. */
    assert_int_equal(kvp_prepare_retrieve(inst, &a.t, 0, SEQ_CHUNKS * C, &pa), SEQ_CHUNKS);
    assert_int_equal(kvp_prepare_retrieve(inst, &b.t, 0, SEQ_CHUNKS * C, &pb), SEQ_CHUNKS);
    assert_int_equal(kvp_prepare_store(inst, &d.t, 0, SEQ_CHUNKS * C, &sp), 128 - 2 * SEQ_CHUNKS);
    assert_int_equal(sp.no_space, 3 * SEQ_CHUNKS - 128);
    assert_int_equal(kvp_abort_store(inst, &sp), 0);

    /* With a and b pinned, storing d gets 32 chunks and a precise no_space for 16. */
    assert_int_equal(store(inst, &d, &r), 128 - 2 * SEQ_CHUNKS);
    assert_int_equal(r.stored, 128 - 2 * SEQ_CHUNKS);
    assert_int_equal(r.no_space, 3 * SEQ_CHUNKS - 128);
    assert_int_equal(r.cached, 0);
    assert_int_equal(kvpt_stat(c, "objects_pinned"), 2 * SEQ_CHUNKS);
    /* The pinned data is intact. */
    for (uint32_t i = 0; i < SEQ_CHUNKS; i++) {
        assert_true(kvpt_check(pa.slots[i].data, bytes, a.id, i));
        assert_true(kvpt_check(pb.slots[i].data, bytes, b.id, i));
    }
    assert_int_equal(kvp_commit_retrieve(inst, &pa), 0);
    assert_int_equal(kvp_commit_retrieve(inst, &pb), 0);
    assert_int_equal(kvpt_stat(c, "objects_pinned"), 0);

    /* Unpinned, the rest of d now fits by evicting the least recently used. */
    assert_int_equal(store(inst, &d, &r), 3 * SEQ_CHUNKS - 128);
    assert_int_equal(r.cached, 128 - 2 * SEQ_CHUNKS);
    assert_int_equal(kvp_lookup(inst, &d.t), SEQ_CHUNKS);
    seq_free(&a);
    seq_free(&b);
    seq_free(&d);
    kvp_client_close(c);
}

/* Many random sequences far beyond the pool: every hit is byte-exact. */
static void test_churn_integrity(void **state)
{
    (void)state;
    kvp_client *c = kvpt_connect(&daemon_);
    kvp_register_opts o = kvpt_layout("churn", KVP_TRANSPORT_AUTO);
    kvp_register_opts oi = kvpt_layout("churn-inline", KVP_TRANSPORT_INLINE);
    kvp_instance *inst = NULL, *ii = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    assert_int_equal(kvp_register(c, &oi, &ii), 0);
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
    unsigned rng = 12345;
    uint32_t hits = 0;

    for (int round = 0; round < 200; round++) {
        rng = rng * 1103515245u + 12345u;
        uint32_t id = 300 + (rng >> 16) % 24;
        uint32_t n = 1 + (rng >> 8) % 16;
        kvp_instance *who = (round & 1) ? inst : ii;
        uint32_t *tok = kvpt_tokens(id, n * C);
        kvp_tokens t = {.ids = tok, .count = n * C};
        void *bufs[16];
        for (uint32_t i = 0; i < n; i++)
            bufs[i] = calloc(1, bytes);
        int got = kvp_retrieve(who, &t, 0, n * C, bufs);
        assert_true(got >= 0 && got <= (int)n);
        for (int i = 0; i < got; i++)
            assert_true(kvpt_check(bufs[i], bytes, id, (uint32_t)i));
        hits += (uint32_t)got;
        for (uint32_t i = 0; i < n; i++)
            kvpt_fill(bufs[i], bytes, id, i);
        assert_true(kvp_store(who, &t, 0, n * C, (const void *const *)bufs, NULL) >= 0);
        for (uint32_t i = 0; i < n; i++)
            free(bufs[i]);
        free(tok);
    }
    assert_true(hits > 0);
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 0);
    assert_int_equal(kvpt_stat(c, "objects_pinned"), 0);
    kvp_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lru_eviction),
        cmocka_unit_test(test_pinned_never_evicted),
        cmocka_unit_test(test_churn_integrity),
    };
    return cmocka_run_group_tests(tests, setup, kvpt_group_stop);
}
