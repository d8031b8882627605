/*
 * test_l2_share.c - the L2 tier on one real redis-server: two daemons with separate pools
 * ("two hosts") share chunks through it on both transports, a restarted daemon finds what it
 * stored before, a crashed one adopts what it had loaded from it, a chunk evicted from L1 comes
 * back from L2, and a corrupted or truncated value planted in Redis is never served.
 *
 * Layout: kvpt_layout() with --chunk-size 16: 2 x 2 layers x 16 tokens x 64 x fp16 = 8 KiB.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"
#include "redis_fixture.h"

#define C 16
#define CHUNK 8192

static struct kvpt_redis redis_;

static int group_setup(void **state)
{
    (void)state;
    kvpt_redis_require();
    kvpt_redis_start(&redis_, false);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    kvpt_redis_stop(&redis_);
    return 0;
}

/* Empties Redis between cases, so that each one counts only its own values. */
static int flush(void **state)
{
    (void)state;
    redisContext *c = kvpt_redis_connect(&redis_);
    freeReplyObject(kvpt_redis_cmd(c, "FLUSHALL"));
    redisFree(c);
    return 0;
}

/* A daemon on redis_ with its own pool of l1 bytes. */
static void start_daemon(struct kvpt_daemon *d, const char *l1)
{
    const char *args[] = {"--l1-size",    l1,     "--chunk-size",
                          "16",           "--l2", redis_.url,
                          "--l2-timeout", "2000", NULL};
    kvpt_daemon_start(d, args);
}

static kvp_instance *reg(kvp_client *c, const char *id, uint32_t transport)
{
    kvp_register_opts o = kvpt_layout(id, transport);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    assert_int_equal(kvp_instance_get_info(inst)->chunk_bytes, CHUNK);
    return inst;
}

/* Waits until d has copied `want` chunks to L2 in all, and none is pending. */
static void wait_written(const struct kvpt_daemon *d, uint64_t want)
{
    assert_int_equal(kvpt_stat_wait(d, "l2_written_chunks", want, 10000), want);
    assert_int_equal(kvpt_stat_wait(d, "l2_backlog_chunks", 0, 10000), 0);
}

static size_t l2_keys(void)
{
    redisContext *c = kvpt_redis_connect(&redis_);
    size_t n = kvpt_redis_keys(c, "kvpool:v1:*", NULL, 0);
    redisFree(c);
    return n;
}

/* A stores through one transport, B reads through the other, and the other way round. */
static void share(uint32_t store_transport, uint32_t read_transport, uint32_t seq)
{
    struct kvpt_daemon a, b;
    start_daemon(&a, "4MiB");
    start_daemon(&b, "4MiB");
    kvp_client *ca = kvpt_connect(&a), *cb = kvpt_connect(&b);
    kvp_instance *ia = reg(ca, "host-a", store_transport);
    kvp_instance *ib = reg(cb, "host-b", read_transport);

    kvpt_store_seq(ia, seq, 12);
    wait_written(&a, 12);
    assert_int_equal(l2_keys(), 12);

    /* B never saw the sequence: lookup counts it from L2, retrieve serves it byte-exact. */
    kvpt_assert_seq(ib, seq, 12, 12);
    assert_int_equal(kvpt_stat(cb, "l2_lookup_hit_chunks"), 12);
    assert_int_equal(kvpt_stat(cb, "l2_hits"), 12);
    assert_int_equal(kvpt_stat(cb, "l2_corrupt"), 0);
    /* Now in B's L1: served from there, and B copies nothing back to L2. */
    kvpt_assert_seq(ib, seq, 12, 12);
    assert_int_equal(kvpt_stat(cb, "l2_hits"), 12);
    assert_int_equal(kvpt_stat(cb, "l2_write_queued"), 0);
    assert_int_equal(kvpt_stat(cb, "l2_up"), 1);

    /* A longer sequence with the same prefix: the prefix is shared, the rest is not there. */
    kvpt_assert_seq(ib, seq, 12, 20);

    kvp_client_close(ca);
    kvp_client_close(cb);
    kvpt_daemon_stop(&a);
    kvpt_daemon_stop(&b);
}

static void test_share_shm_to_inline(void **state)
{
    (void)state;
    share(KVP_TRANSPORT_SHM, KVP_TRANSPORT_INLINE, 1001);
}

static void test_share_inline_to_shm(void **state)
{
    (void)state;
    share(KVP_TRANSPORT_INLINE, KVP_TRANSPORT_SHM, 1002);
}

/* Retrieve without a lookup first: the daemon loads the chunks on the worker's request. */
static void test_retrieve_without_lookup(void **state)
{
    (void)state;
    struct kvpt_daemon a, b;
    start_daemon(&a, "4MiB");
    start_daemon(&b, "4MiB");
    kvp_client *ca = kvpt_connect(&a), *cb = kvpt_connect(&b);
    kvp_instance *ia = reg(ca, "host-a", KVP_TRANSPORT_AUTO);
    kvp_instance *ib = reg(cb, "host-b", KVP_TRANSPORT_SHM);
    kvpt_store_seq(ia, 1003, 8);
    wait_written(&a, 8);

    uint32_t *tok = kvpt_tokens(1003, 8 * C);
    kvp_tokens t = {.ids = tok, .count = 8 * C};
    void *bufs[8];
    for (int i = 0; i < 8; i++)
        bufs[i] = calloc(1, CHUNK);
    assert_int_equal(kvp_retrieve(ib, &t, 0, 8 * C, bufs), 8);
    for (uint32_t i = 0; i < 8; i++) {
        assert_true(kvpt_check(bufs[i], CHUNK, 1003, i));
        free(bufs[i]);
    }
    free(tok);
    assert_int_equal(kvpt_stat(cb, "l2_hits"), 8);
    kvp_client_close(ca);
    kvp_client_close(cb);
    kvpt_daemon_stop(&a);
    kvpt_daemon_stop(&b);
}

static void test_restart(void **state)
{
    (void)state;
    struct kvpt_daemon a;
    start_daemon(&a, "4MiB");
    kvp_client *c = kvpt_connect(&a);
    kvpt_store_seq(reg(c, "restarted", KVP_TRANSPORT_AUTO), 1004, 10);
    wait_written(&a, 10);
    kvp_client_close(c);
    assert_int_equal(kvpt_daemon_signal_wait(&a, SIGTERM), 0);

    const char *args[] = {"--l1-size", "4MiB", "--chunk-size", "16", "--l2", redis_.url, NULL};
    kvpt_daemon_restart(&a, args);
    c = kvpt_connect(&a);
    kvp_instance *inst = reg(c, "restarted", KVP_TRANSPORT_AUTO);
    assert_int_equal(kvpt_stat(c, "objects_committed"), 0);
    kvpt_assert_seq(inst, 1004, 10, 10);
    assert_int_equal(kvpt_stat(c, "l2_hits"), 10);
    kvp_client_close(c);
    kvpt_daemon_stop(&a);
}

/*
 * Chunks loaded from L2 into L1 are sealed as a worker's commit is: after a crash, the next
 * daemon adopts them with its pool and serves them with Redis emptied.
 */
static void test_loaded_then_adopted(void **state)
{
    struct kvpt_daemon a, b;
    start_daemon(&a, "4MiB");
    start_daemon(&b, "4MiB");
    kvp_client *ca = kvpt_connect(&a), *cb = kvpt_connect(&b);
    kvpt_store_seq(reg(ca, "host-a", KVP_TRANSPORT_SHM), 1008, 10);
    wait_written(&a, 10);
    kvp_client_close(ca);
    kvpt_daemon_stop(&a);

    /* B holds them only as loads from L2. */
    kvpt_assert_seq(reg(cb, "host-b", KVP_TRANSPORT_SHM), 1008, 10, 10);
    assert_int_equal(kvpt_stat(cb, "l2_hits"), 10);
    kvp_client_close(cb);
    assert_int_equal(kvpt_daemon_signal_wait(&b, SIGKILL), 128 + SIGKILL);
    flush(state);

    const char *args[] = {"--l1-size", "4MiB", "--chunk-size", "16", "--l2", redis_.url, NULL};
    kvpt_daemon_restart(&b, args);
    assert_int_equal(kvpt_log_count(&b, "Adopted the pool of kvpoold pid "), 1);
    cb = kvpt_connect(&b);
    assert_int_equal(kvpt_stat(cb, "objects_committed"), 10);
    kvpt_assert_seq(reg(cb, "host-b", KVP_TRANSPORT_SHM), 1008, 10, 10);
    assert_int_equal(kvpt_stat(cb, "warm_restart_verified_chunks"), 10);
    assert_int_equal(kvpt_stat(cb, "l2_hits"), 0);
    assert_int_equal(l2_keys(), 0);
    kvp_client_close(cb);
    kvpt_daemon_stop(&b);
}

/* A pool of 128 chunks: three sequences of 48 evict the first one's chunks from L1. */
static void test_evicted_then_retrieved(void **state)
{
    (void)state;
    struct kvpt_daemon a;
    start_daemon(&a, "1MiB");
    kvp_client *c = kvpt_connect(&a);
    kvp_instance *inst = reg(c, "evict", KVP_TRANSPORT_SHM);
    kvpt_store_seq(inst, 1005, 48);
    wait_written(&a, 48);
    kvpt_store_seq(inst, 1006, 48);
    kvpt_store_seq(inst, 1007, 48);
    assert_true(kvpt_stat(c, "evictions") >= 16);
    wait_written(&a, 3 * 48);
    /* Eviction from L1 does not delete from L2. */
    assert_int_equal(l2_keys(), 3 * 48);

    uint64_t hits = kvpt_stat(c, "l2_hits");
    kvpt_assert_seq(inst, 1005, 48, 48);
    assert_true(kvpt_stat(c, "l2_hits") > hits);
    kvp_client_close(c);
    kvpt_daemon_stop(&a);
}

/* The value of key, copied (the caller frees). */
static char *get_value(redisContext *rc, const char *key, size_t *len)
{
    redisReply *r = kvpt_redis_cmd(rc, "GET %s", key);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    assert_int_equal(r->len, 128 + CHUNK);
    char *v = malloc(r->len);
    memcpy(v, r->str, r->len);
    *len = r->len;
    freeReplyObject(r);
    return v;
}

/* Stores a damaged copy of the good value v under key. */
static void tamper(redisContext *rc, const char *key, const char *v, size_t len, int how)
{
    char *bad = malloc(len);
    memcpy(bad, v, len);
    if (how == 0)
        bad[128 + 4000] ^= 1; /* one flipped bit of data */
    else if (how == 1)
        len = 128 + CHUNK / 2; /* truncated */
    else
        len = 100; /* not even a header */
    freeReplyObject(kvpt_redis_cmd(rc, "SET %s %b", key, bad, len));
    free(bad);
}

static void test_corrupt_never_served(void **state)
{
    (void)state;
    struct kvpt_daemon a, b;
    start_daemon(&a, "4MiB");
    kvp_client *ca = kvpt_connect(&a);
    kvpt_store_seq(reg(ca, "writer", KVP_TRANSPORT_AUTO), 1008, 12);
    wait_written(&a, 12);

    /* Three of the twelve values are damaged: flipped, truncated, cut inside the header. */
    redisContext *rc = kvpt_redis_connect(&redis_);
    char *keys[12], *good[3];
    size_t len[3];
    assert_int_equal(kvpt_redis_keys(rc, "kvpool:v1:*", keys, 12), 12);
    for (int i = 0; i < 3; i++)
        good[i] = get_value(rc, keys[i], &len[i]);

    /* Every daemon that reads them refuses them: retrieve stops before the first bad one and
     * whatever it returns is what was stored. */
    for (uint32_t transport = KVP_TRANSPORT_SHM; transport <= KVP_TRANSPORT_INLINE; transport++) {
        /* A refused value is deleted from L2: damage them again for each reader. */
        for (int i = 0; i < 3; i++)
            tamper(rc, keys[i], good[i], len[i], i);
        start_daemon(&b, "4MiB");
        kvp_client *cb = kvpt_connect(&b);
        kvp_instance *ib = reg(cb, "reader", transport);
        uint32_t *tok = kvpt_tokens(1008, 12 * C);
        kvp_tokens t = {.ids = tok, .count = 12 * C};
        void *bufs[12];
        for (int i = 0; i < 12; i++)
            bufs[i] = calloc(1, CHUNK);
        int got = kvp_retrieve(ib, &t, 0, 12 * C, bufs);
        assert_true(got >= 0 && got < 12);
        for (int i = 0; i < got; i++)
            assert_true(kvpt_check(bufs[i], CHUNK, 1008, (uint32_t)i));
        for (int i = 0; i < 12; i++)
            free(bufs[i]);
        /* The twelve values are read in one pipelined round: the three damaged ones are
         * refused and deleted, the nine others are loaded, and the first damaged one in the
         * sequence's order ended the run. */
        assert_int_equal(kvpt_stat(cb, "l2_corrupt"), 3);
        assert_int_equal(kvpt_stat(cb, "l2_hits"), 9);
        assert_int_equal(kvp_lookup(ib, &t), got);
        assert_int_equal(l2_keys(), 9);
        free(tok);
        kvp_client_close(cb);
        assert_true(kvpt_log_wait(&b, "Discarding the L2 value", 0));
        kvpt_daemon_stop(&b);
    }
    for (int i = 0; i < 12; i++)
        free(keys[i]);
    for (int i = 0; i < 3; i++)
        free(good[i]);
    redisFree(rc);
    kvp_client_close(ca);
    kvpt_daemon_stop(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_share_shm_to_inline, flush),
        cmocka_unit_test_setup(test_share_inline_to_shm, flush),
        cmocka_unit_test_setup(test_retrieve_without_lookup, flush),
        cmocka_unit_test_setup(test_restart, flush),
        cmocka_unit_test_setup(test_loaded_then_adopted, flush),
        cmocka_unit_test_setup(test_evicted_then_retrieved, flush),
        cmocka_unit_test_setup(test_corrupt_never_served, flush),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
