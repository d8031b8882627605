/*
 * test_malformed_limits.c - clients that take more than their share: the per-connection limit
 * on open reservations (-EMFILE, everything released at close) and a flood of connections
 * beyond --max-clients (-EUSERS for each, the connected worker served throughout, freed slots
 * usable again).
 *
 * The rule checked everywhere: each offending request gets an error reply or a closed connection
 * (never a success, never silence on an open connection), the daemon keeps serving (a fresh
 * client pings after every batch) and nothing leaks (no reservation, pin or instance left).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/msg.h"
#include "common/wire.h"
#include "harness.h"
#include "malformed.h"

static struct kvpt_daemon daemon_;

static int setup(void **state)
{
    static const char *const args[] = MALFORMED_DAEMON_ARGS;
    return kvpt_group_start(state, &daemon_, args);
}

/* ---------------------------------------------------------------------------------------- */
/* The per-connection hold limit.                                                            */

static void test_hold_limit(void **state)
{
    (void)state;
    static struct kvp_wire_slot slots[KVP_MAX_CHUNKS];
    struct kvp_slots_reply sr = {.slots = slots};
    struct kvpt_reply r;
    kvp_register_opts o = kvpt_layout("hoarder", KVP_TRANSPORT_INLINE);
    uint32_t h;
    kvp_client *c = kvpt_connect(&daemon_);
    uint64_t used0 = kvpt_stat(c, "pool_used");

    int fd = kvpt_raw_connect_or_fail(&daemon_);
    assert_int_equal(kvpt_raw_register(fd, &o, &h, NULL), 0);
    /* 1024 open one-chunk reservations (8 MiB of the 16 MiB pool), then one too many. */
    for (uint32_t i = 0; i < 1024; i++) {
        assert_int_equal(kvpt_raw_prepare(fd, KVP_OP_PREPARE_STORE, h, 100000 + i, C, &sr), 0);
        assert_int_equal(sr.nslots, 1);
    }
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 1024);
    int rc = kvpt_raw_prepare(fd, KVP_OP_PREPARE_STORE, h, 99999, C, &sr);
    assert_int_equal(rc, -EMFILE);
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 1024);
    /* Still usable; closing releases all of them at once. */
    assert_int_equal(kvpt_raw_call(fd, KVP_OP_PING, NULL, 0, &r), 0);
    free(r.body);
    close(fd);
    assert_int_equal(kvpt_stat_poll(c, "objects_reserved", 0, 5000), 0);
    assert_int_equal(kvpt_stat(c, "pool_used"), used0);
    kvp_client_close(c);
    kvpt_assert_clean(&daemon_);
}

/* ---------------------------------------------------------------------------------------- */
/* A flood of connections against --max-clients.                                            */

static void test_connection_flood(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {
        "--l1-size", "4MiB",        "--chunk-size", "16", "--max-clients", "8", "--io-timeout",
        "500",       "--log-level", "info",         NULL};
    kvpt_daemon_start(&d, args);
    kvp_client *c = kvpt_connect(&d);
    /* The harness's readiness probe has closed, but the daemon may still count it: the idle
     * connections below must find exactly this one in place, or one of them is refused. */
    assert_int_equal(kvpt_stat_poll(c, "connections", 1, 10000), 1);
    kvp_register_opts o = kvpt_layout("flood-survivor", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);

    /* Seven idle raw connections fill the daemon up. */
    int idle[7];
    for (int i = 0; i < 7; i++) {
        idle[i] = kvpt_raw_connect(&d);
        assert_true(idle[i] >= 0);
    }
    assert_int_equal(kvpt_stat_poll(c, "connections", 8, 5000), 8);

    /* More are refused with -EUSERS, whether they speak the protocol or send noise. */
    uint64_t rejected0 = kvpt_stat(c, "connections_rejected");
    for (int i = 0; i < 20; i++) {
        kvp_client *x = NULL;
        kvp_opts xo = {.socket_path = d.socket, .timeout_ms = 5000};
        int rc = kvp_client_open(&xo, &x);
        if (rc != -EUSERS)
            fail_msg("client %d over --max-clients: %d (%s)", i, rc, kvp_strerror(rc));
        int fd = kvpt_raw_connect(&d);
        assert_true(fd >= 0);
        uint8_t noise[64];
        memset(noise, i, sizeof(noise));
        kvpt_raw_send_bytes(fd, noise, sizeof(noise));
        assert_true(kvpt_raw_closed(fd, 5000));
        close(fd);
    }
    assert_int_equal(kvpt_stat(c, "connections_rejected") - rejected0, 40);
    assert_int_equal(kvpt_stat(c, "connections"), 8);

    /* The connected worker is served throughout, and freed slots are usable again. */
    uint32_t *tok = kvpt_tokens(70, 2 * C);
    kvp_tokens t = {.ids = tok, .count = 2 * C};
    uint8_t b0[CHUNK_BYTES], b1[CHUNK_BYTES];
    void *bufs[2] = {b0, b1};
    kvpt_fill(b0, CHUNK_BYTES, 70, 0);
    kvpt_fill(b1, CHUNK_BYTES, 70, 1);
    assert_int_equal(kvp_store(inst, &t, 0, 2 * C, (const void *const *)bufs, NULL), 2);
    for (int i = 0; i < 7; i++)
        close(idle[i]);
    assert_int_equal(kvpt_stat_poll(c, "connections", 1, 5000), 1);
    kvp_client *late = kvpt_connect(&d);
    kvp_register_opts lo = kvpt_layout("flood-late", KVP_TRANSPORT_INLINE);
    kvp_instance *li = NULL;
    assert_int_equal(kvp_register(late, &lo, &li), 0);
    memset(b0, 0, sizeof(b0));
    memset(b1, 0, sizeof(b1));
    assert_int_equal(kvp_retrieve(li, &t, 0, 2 * C, bufs), 2);
    assert_true(kvpt_check(b0, CHUNK_BYTES, 70, 0));
    assert_true(kvpt_check(b1, CHUNK_BYTES, 70, 1));
    free(tok);
    kvp_client_close(late);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hold_limit),
        cmocka_unit_test(test_connection_flood),
    };
    return cmocka_run_group_tests(tests, setup, kvpt_group_stop);
}
