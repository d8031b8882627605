/*
 * test_l2_hostile.c - kvpoold against a Redis that misbehaves (tests/fake_redis.c), through
 * the worker's calls:
 *
 *   - a Redis that answers everything, one byte every 0.4 s (each byte well within
 *     --l2-timeout 1000): a lookup and a retrieve that go to L2 come back with what L1 has,
 *     bounded by the timeout, and the tier counts an outage each time (l2_outages), as for a
 *     dead server;
 *   - a Redis that answers PING with a 1 GiB bulk: the daemon reads a bounded part of it, stays
 *     small, and reports L2 down with the reason.
 *
 * Layout: kvpt_layout() with --chunk-size 16: 8 KiB chunks.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/kvp_assert.h"
#include "fake_redis.h"
#include "harness.h"

#define C 16
#define SEQ 12
/* A functional bound, far above the 1 s --l2-timeout and far below the 19 s that the dripped
 * answers to 12 keys take. */
#define BOUND_MS 10000

static kvp_instance *reg(kvp_client *c, const char *id)
{
    kvp_register_opts o = kvpt_layout(id, KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_rc(kvp_register(c, &o, &inst), 0);
    return inst;
}

static void test_drip(void **state)
{
    (void)state;
    struct kvpt_fake_redis f = {.drip_ms = 400};
    struct kvpt_daemon d;
    assert_rc(kvpt_fake_redis_start(&f, KVPT_FAKE_DRIP), 0);
    const char *args[] = {"--l1-size", "8MiB",         "--chunk-size", "16", "--l2",
                          f.url,       "--l2-timeout", "1000",         NULL};
    kvpt_daemon_start(&d, args);
    kvp_client *c = kvpt_connect(&d);
    kvp_instance *inst = reg(c, "dripped");
    assert_int_equal(kvpt_stat_poll(c, "l2_up", 1, 5000), 1);

    /* A lookup past L1: EXISTS of 12 keys, answered a byte at a time. */
    uint32_t *tok = kvpt_tokens(4000, SEQ * C);
    kvp_tokens t = {.ids = tok, .count = SEQ * C};
    uint64_t t0 = kvpt_now_ms();
    int found = kvp_lookup(inst, &t);
    uint64_t took = kvpt_now_ms() - t0;
    assert_rc(found, 0);
    if (took > BOUND_MS)
        fail_msg("the lookup took %llu ms", (unsigned long long)took);
    assert_true(kvpt_stat(c, "l2_outages") >= 1);
    assert_true(kvpt_log_wait(&d, "EXISTS: timed out", 1000));

    /* A retrieve past L1: GETRANGE of 12 keys, likewise (once L2 counts as up again: PING is
     * answered at once). */
    assert_int_equal(kvpt_stat_poll(c, "l2_up", 1, 10000), 1);
    uint64_t outages = kvpt_stat(c, "l2_outages");
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
    void *bufs[SEQ];
    for (int i = 0; i < SEQ; i++)
        bufs[i] = malloc(bytes);
    t0 = kvpt_now_ms();
    int got = kvp_retrieve(inst, &t, 0, SEQ * C, bufs);
    took = kvpt_now_ms() - t0;
    assert_rc(got, 0);
    if (took > BOUND_MS)
        fail_msg("the retrieve took %llu ms", (unsigned long long)took);
    assert_true(kvpt_stat(c, "l2_outages") > outages);
    for (int i = 0; i < SEQ; i++)
        free(bufs[i]);
    free(tok);

    /* L1 is served meanwhile, as ever. */
    kvpt_store_seq(inst, 4001, 2);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
    kvpt_fake_redis_stop(&f);
}

static void test_huge_reply(void **state)
{
    (void)state;
    struct kvpt_fake_redis f = {.huge_limit = 512u << 20};
    struct kvpt_daemon d;
    assert_rc(kvpt_fake_redis_start(&f, KVPT_FAKE_HUGE), 0);
    const char *args[] = {"--l1-size", "8MiB", "--chunk-size", "16", "--l2", f.url, NULL};
    kvpt_daemon_start(&d, args);
    assert_true(kvpt_log_wait(&d, "a reply larger than", 10000));
    /* Its background connections tried once each at least; each read a bounded part. */
    uint64_t sent = atomic_load(&f.sent), rss = kvpt_rss_kib(d.pid);
    if (sent > (64u << 20) || rss > 128 * 1024)
        fail_msg("the server sent %llu bytes of PING's answer; the daemon's RSS is %llu KiB",
                 (unsigned long long)sent, (unsigned long long)rss);
    kvp_client *c = kvpt_connect(&d);
    assert_int_equal(kvpt_stat(c, "l2_up"), 0);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
    kvpt_fake_redis_stop(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drip),
        cmocka_unit_test(test_huge_reply),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
