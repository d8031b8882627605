/*
 * test_http_metrics.c - GET /metrics of a real kvpoold over real HTTP: Prometheus's own checker
 * (promtool check metrics, Debian's prometheus package) accepts the text, and the samples equal
 * what was done: transfers per transport, instances per transport, evictions and allocation
 * failures in a full pool, reservations dropped for each cause (abort, unregister, disconnect,
 * timeout), protocol errors, connected clients by front end, request counts per opcode, and
 * the store lock's hold histogram with its maximum.
 *
 * Exit 77 (skipped) when promtool is not installed: scripts/install-deps.sh check installs it.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/kvp_assert.h"
#include "common/msg.h"
#include "common/wire.h"
#include "harness.h"
#include "http_client.h"

#define C 16 /* tokens per chunk */

static uint16_t start(struct kvpt_daemon *d, const char *l1, const char *extra)
{
    const char *args[] = {"--l1-size",   l1,    "--chunk-size",     "16", "--http",
                          "127.0.0.1:0", extra, extra ? "1" : NULL, NULL};
    kvpt_daemon_start(d, args);
    uint16_t port = kvpt_http_port_in_log(d->log, 5000);
    if (!port)
        fail_msg("no 'HTTP endpoint on' line in %s", d->log);
    return port;
}

/* The /metrics text, after promtool has accepted it. Caller frees. */
static char *metrics(uint16_t port)
{
    struct kvpt_http_reply r;
    char ctype[128], path[] = "/tmp/kvpt-metrics-XXXXXX", cmd[160];

    assert_rc(kvpt_http_request(port, "GET", "/metrics", &r), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(kvpt_http_header(&r, "Content-Type", ctype, sizeof(ctype)));
    assert_string_equal(ctype, "text/plain; version=0.0.4; charset=utf-8");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, r.body, r.body_len), (ssize_t)r.body_len);
    close(fd);
    snprintf(cmd, sizeof(cmd), "promtool check metrics < %s", path);
    int rc = system(cmd);
    unlink(path);
    if (rc != 0)
        fail_msg("promtool check metrics failed (status %d) on:\n%s", rc, r.body);
    return r.body;
}

/* The value of one series; fails the test if it is absent. */
static long long value(const char *text, const char *series)
{
    int found;
    double v = kvpt_metric(text, series, &found);
    if (!found)
        fail_msg("no sample %s", series);
    return (long long)v;
}

/*
 * Waits until series reads want (up to 5 s): a connection the test closed leaves the daemon's
 * list when its thread sees the end, a moment later. Returns the last value read.
 */
static long long wait_value(uint16_t port, const char *series, long long want)
{
    long long v = -1;
    for (int i = 0; i < 250 && v != want; i++) {
        struct kvpt_http_reply r;
        int found = 0;
        if (i)
            kvpt_sleep_ms(20);
        assert_rc(kvpt_http_request(port, "GET", "/metrics", &r), 0);
        v = (long long)kvpt_metric(r.body, series, &found);
        kvpt_http_free(&r);
        assert_true(found);
    }
    return v;
}

static int lookup(kvp_instance *inst, uint32_t seq, uint32_t n)
{
    uint32_t *tok = kvpt_tokens(seq, n * C);
    kvp_tokens t = {.ids = tok, .count = n * C};
    int rc = kvp_lookup(inst, &t);
    free(tok);
    return rc;
}

static void test_transfers_by_transport(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    uint16_t port = start(&d, "16MiB", NULL);
    kvp_client *ca = kvpt_connect(&d), *cb = kvpt_connect(&d);
    kvp_register_opts oa = kvpt_layout("m-shm", KVP_TRANSPORT_AUTO);
    kvp_register_opts ob = kvpt_layout("m-inline", KVP_TRANSPORT_INLINE);
    kvp_instance *a = NULL, *b = NULL;
    assert_rc(kvp_register(ca, &oa, &a), 0);
    assert_rc(kvp_register(cb, &ob, &b), 0);
    const long long cb_bytes = (long long)kvp_instance_get_info(a)->chunk_bytes;

    assert_int_equal(kvpt_store_seq(a, 1, 5), 5);
    kvpt_retrieve_seq(a, 1, 5);
    kvpt_retrieve_seq(a, 1, 2);
    assert_int_equal(kvpt_store_seq(b, 2, 3), 3);
    kvpt_retrieve_seq(b, 2, 3);
    assert_rc(lookup(a, 1, 5), 5);
    assert_rc(lookup(b, 2, 4), 3);
    assert_int_equal(wait_value(port, "kvpool_connected_clients{front_end=\"kvpool\"}", 2), 2);
    char *m = metrics(port);
    const long long pings = value(m, "kvpool_request_duration_seconds_count{op=\"ping\"}");
    free(m);
    for (int i = 0; i < 10; i++)
        assert_rc(kvp_ping(ca), 0);

    m = metrics(port);
    assert_int_equal(value(m, "kvpool_shm_enabled"), 1);
    assert_int_equal(value(m, "kvpool_instances{front_end=\"kvpool\",transport=\"shm\"}"), 1);
    assert_int_equal(value(m, "kvpool_instances{front_end=\"kvpool\",transport=\"inline\"}"), 1);
    assert_int_equal(value(m, "kvpool_pool_capacity_bytes"), 16 << 20);
    assert_int_equal(value(m, "kvpool_pool_used_bytes"), 8 * cb_bytes);
    assert_int_equal(value(m, "kvpool_objects"), 8);
    assert_int_equal(value(m, "kvpool_store_chunks_total{transport=\"shm\"}"), 5);
    assert_int_equal(value(m, "kvpool_store_chunks_total{transport=\"inline\"}"), 3);
    assert_int_equal(value(m, "kvpool_store_bytes_total{transport=\"shm\"}"), 5 * cb_bytes);
    assert_int_equal(value(m, "kvpool_store_bytes_total{transport=\"inline\"}"), 3 * cb_bytes);
    assert_int_equal(value(m, "kvpool_retrieve_chunks_total{transport=\"shm\"}"), 7);
    assert_int_equal(value(m, "kvpool_retrieve_chunks_total{transport=\"inline\"}"), 3);
    assert_int_equal(value(m, "kvpool_retrieve_bytes_total{transport=\"shm\"}"), 7 * cb_bytes);
    assert_int_equal(value(m, "kvpool_retrieve_bytes_total{transport=\"inline\"}"), 3 * cb_bytes);
    assert_int_equal(value(m, "kvpool_registrations_total{transport=\"shm\"}"), 1);
    assert_int_equal(value(m, "kvpool_registrations_total{transport=\"inline\"}"), 1);
    /* LMCache's transports have their rows from the start, at 0 without LMCache workers. */
    assert_int_equal(value(m, "kvpool_store_chunks_total{transport=\"pickle\"}"), 0);
    assert_int_equal(value(m, "kvpool_store_chunks_total{transport=\"envelope\"}"), 0);
    assert_int_equal(value(m, "kvpool_retrieve_bytes_total{transport=\"pickle\"}"), 0);
    assert_int_equal(value(m, "kvpool_registrations_total{transport=\"envelope\"}"), 0);
    /* Two here, one in each kvpt_store_seq(). */
    assert_int_equal(value(m, "kvpool_lookups_total"), 4);
    assert_int_equal(value(m, "kvpool_lookup_hit_chunks_total"), 16);
    assert_int_equal(value(m, "kvpool_evictions_total"), 0);
    assert_int_equal(value(m, "kvpool_allocation_failures_total"), 0);
    assert_int_equal(value(m, "kvpool_connected_clients{front_end=\"kvpool\"}"), 2);
    /* Every client is a connection of kvpool's protocol: no other front end has a series. */
    assert_int_equal(value(m, "kvpool_clients{front_end=\"kvpool\"}"), 2);
    assert_null(strstr(m, "front_end=\"lmcache\""));
    assert_int_equal(value(m, "kvpool_chunk_tokens"), C);
    /* Request latencies: one sample per request, by opcode. */
    assert_int_equal(value(m, "kvpool_request_duration_seconds_count{op=\"ping\"}"), pings + 10);
    assert_int_equal(value(m, "kvpool_request_duration_seconds_count{op=\"lookup\"}"), 4);
    assert_int_equal(value(m, "kvpool_request_duration_seconds_count{op=\"register\"}"), 2);
    assert_int_equal(value(m, "kvpool_request_duration_seconds_bucket{op=\"ping\",le=\"+Inf\"}"),
                     pings + 10);
    assert_int_equal(value(m, "kvpool_request_duration_seconds_count{op=\"map_segment\"}"), 0);
    /* No LMCache front end: its family is absent. The store lock was taken by every store. */
    assert_null(strstr(m, "kvpool_lmcache_request_duration_seconds"));
    const long long holds = value(m, "kvpool_store_lock_hold_seconds_count");
    assert_true(holds > 0);
    assert_int_equal(value(m, "kvpool_store_lock_hold_seconds_bucket{le=\"+Inf\"}"), holds);
    int found = 0;
    assert_true(kvpt_metric(m, "kvpool_store_lock_hold_max_seconds", &found) > 0);
    assert_true(found);
    free(m);
    kvp_client_close(ca);
    kvp_client_close(cb);
    kvpt_daemon_stop(&d);
}

/* A 1 MiB pool holds 128 chunks of 8 KiB: what does not fit evicts, what cannot evict fails. */
static void test_evictions_and_allocation_failures(void **state)
{
    (void)state;
    static struct kvp_wire_slot slots[KVP_MAX_CHUNKS];
    struct kvpt_daemon d;
    struct kvp_slots_reply sr = {.slots = slots};
    struct kvpt_reply r;
    uint16_t port = start(&d, "1MiB", NULL);
    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts o = kvpt_layout("filler", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_rc(kvp_register(c, &o, &inst), 0);
    assert_int_equal(kvp_instance_get_info(inst)->chunk_bytes, 8192);

    assert_int_equal(kvpt_store_seq(inst, 1, 128), 128);
    assert_int_equal(kvpt_store_seq(inst, 2, 4), 4); /* evicts the 4 least recently used */
    char *m = metrics(port);
    assert_int_equal(value(m, "kvpool_evictions_total"), 4);
    assert_int_equal(value(m, "kvpool_objects"), 128);
    assert_int_equal(value(m, "kvpool_pool_used_bytes"), 1 << 20);
    free(m);

    /* 130 new chunks in one request: all 128 committed are evicted for the first 128, and the
     * last 2 find nothing evictable (the reservations are not). */
    int fd = kvpt_raw_connect_or_fail(&d);
    kvp_register_opts ro = kvpt_layout("raw", KVP_TRANSPORT_SHM);
    uint32_t h;
    assert_rc(kvpt_raw_register(fd, &ro, &h, NULL), 0);
    assert_rc(kvpt_raw_prepare(fd, KVP_OP_PREPARE_STORE, h, 3, 130 * C, &sr), 0);
    assert_int_equal(sr.nslots, 128);
    assert_int_equal(sr.no_space, 2);
    m = metrics(port);
    assert_int_equal(value(m, "kvpool_evictions_total"), 132);
    assert_int_equal(value(m, "kvpool_allocation_failures_total"), 2);
    assert_int_equal(value(m, "kvpool_objects"), 0);
    assert_int_equal(value(m, "kvpool_reserved_objects"), 128);
    free(m);
    assert_rc(kvpt_raw_ref(fd, KVP_OP_ABORT_STORE, h, sr.id, &r), 0);
    free(r.body);
    m = metrics(port);
    assert_int_equal(value(m, "kvpool_reserved_chunks_dropped_total{cause=\"abort\"}"), 128);
    assert_int_equal(value(m, "kvpool_reserved_objects"), 0);
    free(m);
    close(fd);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

/* Prepares a 2-chunk store of sequence seq on fd; returns the reservation id. */
static uint64_t reserve2(int fd, uint32_t h, uint32_t seq)
{
    static struct kvp_wire_slot slots[KVP_MAX_CHUNKS];
    struct kvp_slots_reply sr = {.slots = slots};
    assert_rc(kvpt_raw_prepare(fd, KVP_OP_PREPARE_STORE, h, seq, 2 * C, &sr), 0);
    assert_int_equal(sr.nslots, 2);
    return sr.id;
}

static void test_drop_causes_and_errors(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    struct kvpt_reply r;
    uint32_t h;
    uint16_t port = start(&d, "16MiB", "--reserve-timeout");
    kvp_register_opts o = kvpt_layout("raw-a", KVP_TRANSPORT_SHM);

    /* abort */
    int fd = kvpt_raw_connect_or_fail(&d);
    assert_rc(kvpt_raw_register(fd, &o, &h, NULL), 0);
    assert_rc(kvpt_raw_ref(fd, KVP_OP_ABORT_STORE, h, reserve2(fd, h, 1), &r), 0);
    free(r.body);
    /* unregister */
    reserve2(fd, h, 2);
    assert_rc(kvpt_raw_ref(fd, KVP_OP_UNREGISTER, h, 0, &r), 0);
    free(r.body);
    /* disconnect */
    assert_rc(kvpt_raw_register(fd, &o, &h, NULL), 0);
    reserve2(fd, h, 3);
    close(fd);
    kvpt_stat_wait(&d, "objects_reserved", 0, 5000);
    /* timeout (--reserve-timeout 1): cancelled by the expiry, then dropped by its owner,
     * counted once, under timeout */
    fd = kvpt_raw_connect_or_fail(&d);
    assert_rc(kvpt_raw_register(fd, &o, &h, NULL), 0);
    reserve2(fd, h, 4);
    assert_int_equal(kvpt_stat_wait(&d, "reservations_expired", 2, 10000), 2);
    close(fd);
    kvpt_stat_wait(&d, "objects_expired", 0, 5000);

    /* A malformed frame: answered, then the connection is closed. */
    fd = kvpt_raw_connect_or_fail(&d);
    uint8_t junk[KVP_HEADER_SIZE];
    memset(junk, 0xee, sizeof(junk));
    kvpt_raw_send_bytes(fd, junk, sizeof(junk));
    assert_true(kvpt_raw_closed(fd, 5000));
    close(fd);

    /* Three clients connected while the metrics are read. */
    int fds[3];
    for (int i = 0; i < 3; i++) {
        fds[i] = kvpt_raw_connect_or_fail(&d);
        assert_rc(kvpt_raw_call(fds[i], KVP_OP_PING, NULL, 0, &r), 0);
        free(r.body);
    }
    assert_int_equal(wait_value(port, "kvpool_connected_clients{front_end=\"kvpool\"}", 3), 3);
    char *m = metrics(port);
    assert_int_equal(value(m, "kvpool_reserved_chunks_dropped_total{cause=\"abort\"}"), 2);
    assert_int_equal(value(m, "kvpool_reserved_chunks_dropped_total{cause=\"unregister\"}"), 2);
    assert_int_equal(value(m, "kvpool_reserved_chunks_dropped_total{cause=\"disconnect\"}"), 2);
    assert_int_equal(value(m, "kvpool_reserved_chunks_dropped_total{cause=\"timeout\"}"), 2);
    assert_int_equal(value(m, "kvpool_protocol_errors_total"), 1);
    assert_int_equal(value(m, "kvpool_connected_clients{front_end=\"kvpool\"}"), 3);
    assert_int_equal(value(m, "kvpool_reserved_objects"), 0);
    assert_int_equal(value(m, "kvpool_expired_objects"), 0);
    assert_int_equal(value(m, "kvpool_pool_used_bytes"), 0);
    free(m);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
    kvpt_daemon_stop(&d);
}

int main(void)
{
    if (system("command -v promtool >/dev/null 2>&1") != 0) {
        fprintf(stderr, "skipped: promtool not found; it checks the /metrics text (Debian "
                        "package prometheus: scripts/install-deps.sh check installs it)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transfers_by_transport),
        cmocka_unit_test(test_evictions_and_allocation_failures),
        cmocka_unit_test(test_drop_causes_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
