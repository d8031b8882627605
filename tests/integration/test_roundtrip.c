/*
 * test_roundtrip.c - store and retrieve through a real kvpoold on both transports: byte-exact
 * data, lookup counts, partial prefixes, cached stores, unregister (instance identity:
 * test_identity.c).
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

#define C 16 /* --chunk-size */

static struct kvpt_daemon daemon_;

static int setup(void **state)
{
    const char *args[] = {"--l1-size", "64MiB", "--chunk-size", "16", NULL};
    return kvpt_group_start(state, &daemon_, args);
}

/* n chunk buffers filled for (seed, first + i). */
static void **make_chunks(uint32_t n, size_t bytes, uint32_t seed, uint32_t first)
{
    void **v = calloc(n, sizeof(*v));
    assert_non_null(v);
    for (uint32_t i = 0; i < n; i++) {
        v[i] = malloc(bytes);
        assert_non_null(v[i]);
        kvpt_fill(v[i], bytes, seed, first + i);
    }
    return v;
}

static void **make_empty(uint32_t n, size_t bytes)
{
    void **v = calloc(n, sizeof(*v));
    assert_non_null(v);
    for (uint32_t i = 0; i < n; i++) {
        v[i] = calloc(1, bytes);
        assert_non_null(v[i]);
    }
    return v;
}

static void free_chunks(void **v, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* Stores chunks [0, n) of sequence seq and reads them back through the given instance. */
static void roundtrip(kvp_instance *inst, uint32_t seq, uint32_t n)
{
    const kvp_instance_info *info = kvp_instance_get_info(inst);
    size_t bytes = info->chunk_bytes;
    uint32_t *tok = kvpt_tokens(seq, n * C + 5); /* a partial last chunk is ignored */
    kvp_tokens t = {.ids = tok, .count = n * C + 5};
    void **in = make_chunks(n, bytes, seq, 0);
    void **out = make_empty(n, bytes);
    kvp_store_result r;

    assert_int_equal(kvp_lookup(inst, &t), 0);
    assert_int_equal(kvp_store(inst, &t, 0, t.count, (const void *const *)in, &r), (int)n);
    assert_int_equal(r.nchunks, n);
    assert_int_equal(r.stored, n);
    assert_int_equal(r.cached, 0);
    assert_int_equal(r.no_space, 0);
    assert_int_equal(kvp_lookup(inst, &t), (int)n);
    assert_int_equal(kvp_retrieve(inst, &t, 0, t.count, out), (int)n);
    for (uint32_t i = 0; i < n; i++)
        assert_true(kvpt_check(out[i], bytes, seq, i));
    free_chunks(in, n);
    free_chunks(out, n);
    free(tok);
}

static void test_shm_roundtrip(void **state)
{
    (void)state;
    kvp_client *c = kvpt_connect(&daemon_);
    kvp_register_opts o = kvpt_layout("rt-shm", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;

    assert_int_equal(kvp_register(c, &o, &inst), 0);
    const kvp_instance_info *info = kvp_instance_get_info(inst);
    assert_int_equal(info->transport, KVP_TRANSPORT_SHM);
    assert_int_equal(info->chunk_tokens, C);
    assert_int_equal(info->ndim, 4);
    assert_int_equal(info->shape[0], 2);
    assert_int_equal(info->shape[1], 2);
    assert_int_equal(info->shape[2], C);
    assert_int_equal(info->shape[3], 64);
    assert_int_equal(info->chunk_bytes, 2 * 2 * C * 64 * 2);
    assert_string_equal(info->shm_name, daemon_.shm_name);

    char line[256];
    snprintf(line, sizeof(line),
             "Instance rt-shm non-GPU context using SHM transport (shm_name=%s, "
             "pool_size=67108864)",
             daemon_.shm_name);
    assert_true(kvpt_log_wait(&daemon_, line, 5000));

    roundtrip(inst, 1, 64);
    assert_int_equal(kvp_unregister(inst), 0);
    kvp_client_close(c);
}

static void test_inline_roundtrip(void **state)
{
    (void)state;
    kvp_client *c = kvpt_connect(&daemon_);
    kvp_register_opts o = kvpt_layout("rt-inline", KVP_TRANSPORT_INLINE);
    kvp_instance *inst = NULL;

    assert_int_equal(kvp_register(c, &o, &inst), 0);
    const kvp_instance_info *info = kvp_instance_get_info(inst);
    assert_int_equal(info->transport, KVP_TRANSPORT_INLINE);
    assert_string_equal(info->shm_name, "");
    assert_true(kvpt_log_wait(
        &daemon_, "Instance rt-inline non-GPU context using inline transport (requested by worker)",
        5000));

    roundtrip(inst, 2, 64);
    kvp_client_close(c);
}

/* The two-phase zero-copy API: write into slots, commit; read from pinned slots, release. */
static void test_two_phase_shm(void **state)
{
    (void)state;
    kvp_client *c = kvpt_connect(&daemon_);
    kvp_register_opts o = kvpt_layout("rt-2phase", KVP_TRANSPORT_SHM);
    kvp_instance *inst = NULL;
    kvp_store_plan sp;
    kvp_retrieve_plan rp;
    uint32_t n = 8;
    uint32_t *tok = kvpt_tokens(3, n * C);
    kvp_tokens t = {.ids = tok, .count = n * C};

    assert_int_equal(kvp_register(c, &o, &inst), 0);
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;

    assert_int_equal(kvp_prepare_store(inst, &t, 0, n * C, &sp), (int)n);
    assert_int_equal(sp.nslots, n);
    assert_int_equal(sp.nchunks, n);
    for (uint32_t i = 0; i < sp.nslots; i++) {
        assert_non_null(sp.slots[i].data);
        assert_int_equal(sp.slots[i].length, bytes);
        kvpt_fill(sp.slots[i].data, bytes, 3, sp.slots[i].chunk_index);
    }
    /* Reserved but not committed: invisible. */
    assert_int_equal(kvp_lookup(inst, &t), 0);
    assert_int_equal(kvp_commit_store(inst, &sp), (int)n);
    assert_int_equal(kvp_lookup(inst, &t), (int)n);

    assert_int_equal(kvp_prepare_retrieve(inst, &t, 2 * C, 6 * C, &rp), 4);
    assert_int_equal(rp.nchunks, 4);
    for (uint32_t i = 0; i < rp.nslots; i++) {
        assert_int_equal(rp.slots[i].chunk_index, i);
        assert_true(kvpt_check(rp.slots[i].data, bytes, 3, 2 + i));
    }
    assert_int_equal(kvp_commit_retrieve(inst, &rp), 0);

    /* Abort: nothing becomes visible and the space is returned. */
    uint32_t *tok2 = kvpt_tokens(4, 2 * C);
    kvp_tokens t2 = {.ids = tok2, .count = 2 * C};
    uint64_t used = kvpt_stat(c, "pool_used");
    assert_int_equal(kvp_prepare_store(inst, &t2, 0, 2 * C, &sp), 2);
    assert_int_equal(kvpt_stat(c, "pool_used"), used + 2 * bytes);
    assert_int_equal(kvp_abort_store(inst, &sp), 0);
    assert_int_equal(kvpt_stat(c, "pool_used"), used);
    assert_int_equal(kvp_lookup(inst, &t2), 0);

    free(tok);
    free(tok2);
    kvp_client_close(c);
}

/* Data stored over one transport is found over the other: keys do not depend on transport. */
static void test_cross_transport(void **state)
{
    (void)state;
    kvp_client *c = kvpt_connect(&daemon_);
    kvp_register_opts os = kvpt_layout("x-shm", KVP_TRANSPORT_AUTO);
    kvp_register_opts oi = kvpt_layout("x-inline", KVP_TRANSPORT_INLINE);
    kvp_instance *is = NULL, *ii = NULL;
    uint32_t n = 6;
    uint32_t *tok = kvpt_tokens(5, n * C);
    kvp_tokens t = {.ids = tok, .count = n * C};

    assert_int_equal(kvp_register(c, &os, &is), 0);
    assert_int_equal(kvp_register(c, &oi, &ii), 0);
    size_t bytes = kvp_instance_get_info(is)->chunk_bytes;
    void **in = make_chunks(n, bytes, 5, 0);
    void **out = make_empty(n, bytes);
    assert_int_equal(kvp_store(is, &t, 0, n * C, (const void *const *)in, NULL), (int)n);
    assert_int_equal(kvp_lookup(ii, &t), (int)n);
    assert_int_equal(kvp_retrieve(ii, &t, 0, n * C, out), (int)n);
    for (uint32_t i = 0; i < n; i++)
        assert_true(kvpt_check(out[i], bytes, 5, i));
    free_chunks(in, n);
    free_chunks(out, n);
    free(tok);
    kvp_client_close(c);
}

static void test_prefix_and_cached(void **state)
{
    (void)state;
    kvp_client *c = kvpt_connect(&daemon_);
    kvp_register_opts o = kvpt_layout("prefix", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    kvp_store_result r;
    uint32_t n = 10;
    uint32_t *tok = kvpt_tokens(6, n * C);
    kvp_tokens t = {.ids = tok, .count = n * C};

    assert_int_equal(kvp_register(c, &o, &inst), 0);
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
    void **in = make_chunks(n, bytes, 6, 0);
    void **out = make_empty(n, bytes);

    /* Chunks [0, 4). */
    assert_int_equal(kvp_store(inst, &t, 0, 4 * C, (const void *const *)in, &r), 4);
    assert_int_equal(kvp_lookup(inst, &t), 4);
    assert_int_equal(kvp_retrieve(inst, &t, 0, n * C, out), 4);
    for (uint32_t i = 0; i < 4; i++)
        assert_true(kvpt_check(out[i], bytes, 6, i));

    /* A sub-range: chunks 2 and 3 land in out[0] and out[1]. */
    memset(out[0], 0, bytes);
    assert_int_equal(kvp_retrieve(inst, &t, 2 * C, 4 * C, out), 2);
    assert_true(kvpt_check(out[0], bytes, 6, 2));
    assert_true(kvpt_check(out[1], bytes, 6, 3));

    /* A later range with a gap: lookup still counts only the leading run. */
    assert_int_equal(kvp_store(inst, &t, 6 * C, 8 * C, (const void *const *)&in[6], &r), 2);
    assert_int_equal(kvp_lookup(inst, &t), 4);
    assert_int_equal(kvp_retrieve(inst, &t, 4 * C, n * C, out), 0);

    /* Everything cached: "all cached" is a distinct answer, not a failure. */
    assert_int_equal(kvp_store(inst, &t, 0, 4 * C, (const void *const *)in, &r), 0);
    assert_int_equal(r.cached, 4);
    assert_int_equal(r.stored, 0);
    assert_int_equal(r.no_space, 0);

    /* Half cached: only the new chunks are stored. */
    assert_int_equal(kvp_store(inst, &t, 0, n * C, (const void *const *)in, &r), 4);
    assert_int_equal(r.nchunks, n);
    assert_int_equal(r.cached, 6);
    assert_int_equal(r.stored, 4);
    assert_int_equal(kvp_lookup(inst, &t), (int)n);
    assert_int_equal(kvp_retrieve(inst, &t, 0, n * C, out), (int)n);
    for (uint32_t i = 0; i < n; i++)
        assert_true(kvpt_check(out[i], bytes, 6, i));

    /* A different salt is a different key space. */
    kvp_tokens salted = t;
    salted.salt = "tenant-b";
    salted.salt_len = 8;
    assert_int_equal(kvp_lookup(inst, &salted), 0);

    /* Range errors. */
    assert_int_equal(kvp_retrieve(inst, &t, 3, n * C, out), -EINVAL);
    assert_int_equal(kvp_lookup(inst, &t), (int)n); /* the connection is still usable */
    assert_int_equal(kvp_retrieve(inst, &t, 0, n * C + C, out), -EINVAL);

    free_chunks(in, n);
    free_chunks(out, n);
    free(tok);
    kvp_client_close(c);
}

static void test_unregister_releases(void **state)
{
    (void)state;
    kvp_client *c = kvpt_connect(&daemon_);
    kvp_register_opts o = kvpt_layout("unreg", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    kvp_store_plan sp;
    kvp_retrieve_plan rp;
    uint32_t *tok = kvpt_tokens(7, 8 * C);
    kvp_tokens t = {.ids = tok, .count = 8 * C};

    uint64_t used = kvpt_stat(c, "pool_used");
    uint64_t reserved = kvpt_stat(c, "objects_reserved");
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
    void **in = make_chunks(4, bytes, 7, 0);
    assert_int_equal(kvp_store(inst, &t, 0, 4 * C, (const void *const *)in, NULL), 4);
    assert_int_equal(kvp_prepare_retrieve(inst, &t, 0, 4 * C, &rp), 4);
    assert_int_equal(kvpt_stat(c, "objects_pinned"), 4);
    assert_int_equal(kvp_prepare_store(inst, &t, 4 * C, 8 * C, &sp), 4);
    assert_int_equal(kvpt_stat(c, "objects_reserved"), reserved + 4);
    assert_int_equal(kvpt_stat(c, "pool_used"), used + 8 * bytes);

    assert_int_equal(kvp_unregister(inst), 0);
    assert_int_equal(kvpt_stat(c, "objects_reserved"), reserved);
    assert_int_equal(kvpt_stat(c, "objects_pinned"), 0);
    assert_int_equal(kvpt_stat(c, "pool_used"), used + 4 * bytes);
    assert_true(kvpt_log_wait(&daemon_, "Instance unreg unregistered", 5000));

    /* The reserved chunks never became visible. */
    kvp_instance *again = NULL;
    assert_int_equal(kvp_register(c, &o, &again), 0);
    assert_int_equal(kvp_instance_get_info(again)->existing, 0);
    assert_int_equal(kvp_lookup(again, &t), 4);
    free(sp.slots); /* the plan's reservation died with the instance */
    free(rp.slots);
    free_chunks(in, 4);
    free(tok);
    kvp_client_close(c);
}

static void test_bad_registration(void **state)
{
    (void)state;
    kvp_client *c = kvpt_connect(&daemon_);
    kvp_instance *inst = NULL;
    kvp_register_opts o = kvpt_layout("bad", KVP_TRANSPORT_AUTO);

    o.num_layers = 0;
    assert_int_equal(kvp_register(c, &o, &inst), -EINVAL);
    assert_non_null(strstr(kvp_last_error(c), "num_layers"));
    o = kvpt_layout("bad", KVP_TRANSPORT_AUTO);
    o.dtype = "float17";
    assert_int_equal(kvp_register(c, &o, &inst), -EINVAL);
    assert_non_null(strstr(kvp_last_error(c), "dtype"));
    o = kvpt_layout("bad", KVP_TRANSPORT_AUTO);
    o.worker_rank = 1;
    assert_int_equal(kvp_register(c, &o, &inst), -EINVAL);
    assert_non_null(strstr(kvp_last_error(c), "worker_rank"));
    o = kvpt_layout("bad", KVP_TRANSPORT_AUTO);
    o.hidden_dim = 1u << 30; /* 2*2*16*2^30*2 bytes: far larger than the pool */
    assert_int_equal(kvp_register(c, &o, &inst), -EINVAL);
    assert_non_null(strstr(kvp_last_error(c), "pool"));
    /* Still serving this connection. */
    assert_int_equal(kvp_ping(c), 0);
    kvp_client_close(c);
}

/* MLA layouts drop the K/V axis and share chunks across ranks. */
static void test_mla_shared_across_ranks(void **state)
{
    (void)state;
    kvp_client *c = kvpt_connect(&daemon_);
    kvp_register_opts o0 = kvpt_layout("mla-0", KVP_TRANSPORT_AUTO);
    kvp_register_opts o1 = kvpt_layout("mla-1", KVP_TRANSPORT_AUTO);
    kvp_instance *r0 = NULL, *r1 = NULL;
    o0.use_mla = o1.use_mla = 1;
    o0.world_size = o1.world_size = 2;
    o1.worker_rank = 1;
    assert_int_equal(kvp_register(c, &o0, &r0), 0);
    assert_int_equal(kvp_register(c, &o1, &r1), 0);
    const kvp_instance_info *info = kvp_instance_get_info(r0);
    assert_int_equal(info->ndim, 3);
    assert_int_equal(info->shape[0], 2);
    assert_int_equal(info->shape[1], C);
    assert_int_equal(info->shape[2], 64);
    assert_int_equal(info->chunk_bytes, 2 * C * 64 * 2);

    uint32_t *tok = kvpt_tokens(8, 3 * C);
    kvp_tokens t = {.ids = tok, .count = 3 * C};
    void **in = make_chunks(3, info->chunk_bytes, 8, 0);
    assert_int_equal(kvp_store(r0, &t, 0, 3 * C, (const void *const *)in, NULL), 3);
    assert_int_equal(kvp_lookup(r1, &t), 3);

    /* Non-MLA ranks do not share. */
    kvp_register_opts p1 = kvpt_layout("tp-1", KVP_TRANSPORT_AUTO);
    kvp_instance *q1 = NULL;
    p1.world_size = 2;
    p1.worker_rank = 1;
    assert_int_equal(kvp_register(c, &p1, &q1), 0);
    assert_int_equal(kvp_lookup(q1, &t), 0);
    free_chunks(in, 3);
    free(tok);
    kvp_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shm_roundtrip),     cmocka_unit_test(test_inline_roundtrip),
        cmocka_unit_test(test_two_phase_shm),     cmocka_unit_test(test_cross_transport),
        cmocka_unit_test(test_prefix_and_cached), cmocka_unit_test(test_unregister_releases),
        cmocka_unit_test(test_bad_registration),  cmocka_unit_test(test_mla_shared_across_ranks),
    };
    return cmocka_run_group_tests(tests, setup, kvpt_group_stop);
}
