/*
 * test_http_status.c - GET /api/status and /api/healthcheck of a real kvpoold over real HTTP,
 * after a known sequence of operations by two real workers (the client library): one on the
 * shm transport, one that forced inline. Every count in the document must equal what the
 * workers did; each instance names its transport, the inline one its reason.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/kvp_assert.h"
#include "harness.h"
#include "http_client.h"

#define C 16 /* tokens per chunk */

static uint16_t start(struct kvpt_daemon *d)
{
    const char *args[] = {"--l1-size",   "16MiB", "--chunk-size", "16", "--http",
                          "127.0.0.1:0", NULL};
    kvpt_daemon_start(d, args);
    uint16_t port = kvpt_http_port_in_log(d->log, 5000);
    if (!port)
        fail_msg("no 'HTTP endpoint on' line in %s", d->log);
    return port;
}

static json_t *status(uint16_t port)
{
    int code;
    json_t *st = kvpt_http_json(port, "/api/status", &code);
    assert_int_equal(code, 200);
    assert_non_null(st);
    return st;
}

/* The member at a dotted path; fails the test if it is absent. */
static json_t *at(json_t *v, const char *path)
{
    char buf[128], *save = NULL;
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *k = strtok_r(buf, ".", &save); k; k = strtok_r(NULL, ".", &save)) {
        v = json_object_get(v, k);
        if (!v)
            fail_msg("status has no %s", path);
    }
    return v;
}

static long long num(json_t *v, const char *path)
{
    json_t *n = at(v, path);
    if (!json_is_integer(n))
        fail_msg("%s is not an integer", path);
    return json_integer_value(n);
}

static const char *str(json_t *v, const char *path)
{
    json_t *s = at(v, path);
    if (!json_is_string(s))
        fail_msg("%s is not a string", path);
    return json_string_value(s);
}

static json_t *instance(json_t *st, const char *id)
{
    size_t i;
    json_t *e;
    json_array_foreach(at(st, "instances"), i, e)
    {
        if (strcmp(str(e, "instance_id"), id) == 0)
            return e;
    }
    fail_msg("no instance %s in the status", id);
    return NULL;
}

/* The entry of clients.list with this id. */
static json_t *client(json_t *st, long long id)
{
    size_t i;
    json_t *e;
    json_array_foreach(at(st, "clients.list"), i, e)
    {
        if (num(e, "id") == id)
            return e;
    }
    fail_msg("no client %lld in the status", id);
    return NULL;
}

static void test_healthcheck(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    struct kvpt_http_reply r;
    char ctype[64];
    uint16_t port = start(&d);

    /* The paths and answers of LMCache's server, so that existing probes work. */
    assert_rc(kvpt_http_request(port, "GET", "/api/healthcheck", &r), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(kvpt_http_header(&r, "Content-Type", ctype, sizeof(ctype)));
    assert_string_equal(ctype, "application/json");
    json_t *h = json_loads(r.body, 0, NULL);
    assert_non_null(h);
    assert_string_equal(str(h, "status"), "healthy");
    json_decref(h);
    kvpt_http_free(&r);
    kvpt_daemon_stop(&d);
}

static void test_counts_follow_operations(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    uint16_t port = start(&d);

    kvp_client *ca = kvpt_connect(&d), *cb = kvpt_connect(&d);
    kvp_register_opts oa = kvpt_layout("http-shm", KVP_TRANSPORT_AUTO);
    kvp_register_opts ob = kvpt_layout("http-inline", KVP_TRANSPORT_INLINE);
    kvp_instance *a = NULL, *b = NULL;
    assert_rc(kvp_register(ca, &oa, &a), 0);
    assert_rc(kvp_register(cb, &ob, &b), 0);
    assert_int_equal(kvp_instance_get_info(a)->transport, KVP_TRANSPORT_SHM);
    assert_int_equal(kvp_instance_get_info(b)->transport, KVP_TRANSPORT_INLINE);
    const long long cb_bytes = (long long)kvp_instance_get_info(a)->chunk_bytes;
    assert_int_equal(cb_bytes, 2 * 2 * C * 64 * 2); /* K and V, 2 layers, float16 */

    assert_int_equal(kvpt_store_seq(a, 1, 4), 4);
    kvpt_assert_seq(a, 1, 4, 4);
    assert_int_equal(kvpt_store_seq(b, 2, 3), 3);
    kvpt_assert_seq(b, 2, 3, 3);
    /* The retrieves' unpins are pipelined: a round trip on the same connection is answered
     * only after them. */
    assert_rc(kvp_ping(ca), 0);

    /* The harness's readiness check closed its connection: wait until the daemon saw it. */
    json_t *st = status(port);
    for (int i = 0; i < 250 && num(st, "clients.connected") != 2; i++) {
        json_decref(st);
        kvpt_sleep_ms(20);
        st = status(port);
    }
    assert_string_equal(str(st, "state"), "serving");
    assert_int_equal(num(st, "chunk_tokens"), C);
    assert_string_equal(str(st, "socket"), d.socket);
    assert_true(num(st, "uptime_s") >= 0);
    assert_true(strlen(str(st, "version")) > 0);

    assert_int_equal(num(st, "pool.capacity_bytes"), 16 << 20);
    assert_int_equal(num(st, "pool.objects"), 7);
    assert_int_equal(num(st, "pool.used_bytes"), 7 * cb_bytes);
    assert_int_equal(num(st, "pool.reserved_objects"), 0);
    assert_int_equal(num(st, "pool.pinned_objects"), 0);

    assert_true(json_is_true(at(st, "shm.enabled")));
    assert_string_equal(str(st, "shm.backend"), "posix");
    assert_string_equal(str(st, "shm.name"), d.shm_name);
    assert_int_equal(num(st, "shm.pool_size"), 16 << 20);
    assert_true(json_is_null(at(st, "shm.disabled_reason")));
    assert_true(num(st, "shm.dev_shm_free_bytes") >= (16 << 20) + 4096);

    assert_int_equal(json_array_size(at(st, "instances")), 2);
    json_t *ia = instance(st, "http-shm"), *ib = instance(st, "http-inline");
    assert_string_equal(str(ia, "transport"), "shm");
    assert_true(json_is_null(at(ia, "fallback_reason")));
    assert_string_equal(str(ib, "transport"), "inline");
    assert_string_equal(str(ib, "fallback_reason"), "requested by worker");
    assert_string_equal(str(ia, "model_name"), "test-model");
    assert_string_equal(str(ia, "dtype"), "float16");
    assert_int_equal(num(ia, "world_size"), 1);
    assert_int_equal(num(ia, "worker_rank"), 0);
    assert_int_equal(json_array_size(at(ia, "chunk_shape")), 4);
    assert_int_equal(num(ia, "chunk_bytes"), cb_bytes);
    assert_int_equal(num(ia, "pid"), getpid());
    assert_int_equal(num(ib, "pid"), getpid());
    /* An instance has been connected since its worker connected (not since the epoch). */
    const char *since_a = str(ia, "connected_since");
    assert_string_equal(since_a, str(client(st, num(ia, "client_id")), "connected_since"));
    assert_string_equal(str(ib, "connected_since"),
                        str(client(st, num(ib, "client_id")), "connected_since"));
    assert_true(strncmp(since_a, "1970-", 5) != 0);
    assert_int_equal(num(ia, "stored_chunks"), 4);
    assert_int_equal(num(ia, "stored_bytes"), 4 * cb_bytes);
    assert_int_equal(num(ia, "retrieved_chunks"), 4);
    assert_int_equal(num(ia, "retrieved_bytes"), 4 * cb_bytes);
    assert_int_equal(num(ib, "stored_chunks"), 3);
    assert_int_equal(num(ib, "stored_bytes"), 3 * cb_bytes);
    assert_int_equal(num(ib, "retrieved_chunks"), 3);
    assert_int_equal(num(ib, "retrieved_bytes"), 3 * cb_bytes);
    assert_true(num(ia, "client_id") != num(ib, "client_id"));
    /* Both came through kvpool's own protocol, and so did their clients. */
    assert_string_equal(str(ia, "front_end"), "kvpool");
    assert_string_equal(str(ib, "front_end"), "kvpool");
    assert_string_equal(str(client(st, num(ia, "client_id")), "front_end"), "kvpool");

    assert_int_equal(num(st, "clients.connected"), 2);
    assert_int_equal(json_array_size(at(st, "clients.list")), 2);
    json_t *c0 = json_array_get(at(st, "clients.list"), 0);
    assert_int_equal(num(c0, "pid"), getpid());
    assert_int_equal(num(c0, "instances"), 1);
    assert_string_equal(str(c0, "front_end"), "kvpool");

    assert_int_equal(num(st, "counters.registrations_shm"), 1);
    assert_int_equal(num(st, "counters.registrations_inline"), 1);
    assert_int_equal(num(st, "counters.store_chunks_shm"), 4);
    assert_int_equal(num(st, "counters.store_chunks_inline"), 3);
    assert_int_equal(num(st, "counters.store_bytes_shm"), 4 * cb_bytes);
    assert_int_equal(num(st, "counters.store_bytes_inline"), 3 * cb_bytes);
    assert_int_equal(num(st, "counters.store_chunks_committed"), 7);
    assert_int_equal(num(st, "counters.retrieve_chunks_shm"), 4);
    assert_int_equal(num(st, "counters.retrieve_chunks_inline"), 3);
    assert_int_equal(num(st, "counters.retrieve_bytes_shm"), 4 * cb_bytes);
    assert_int_equal(num(st, "counters.retrieve_bytes_inline"), 3 * cb_bytes);
    /* Two here, one in each kvpt_store_seq(). */
    assert_int_equal(num(st, "counters.lookups"), 4);
    assert_int_equal(num(st, "counters.lookup_hit_chunks"), 14);
    assert_int_equal(num(st, "counters.evictions"), 0);
    assert_int_equal(num(st, "counters.store_chunks_no_space"), 0);
    assert_int_equal(num(st, "gauges.instances_shm"), 1);
    assert_int_equal(num(st, "gauges.instances_inline"), 1);
    assert_int_equal(num(st, "gauges.connections"), 2);
    assert_int_equal(num(st, "requests.register.count"), 2);
    assert_int_equal(num(st, "requests.lookup.count"), 4);
    assert_int_equal(num(st, "requests.store_inline.count"), 1);
    assert_int_equal(num(st, "requests.retrieve_inline.count"), 1);
    assert_int_equal(num(st, "requests.prepare_retrieve.count"), 1);
    json_decref(st);

    /* Workers that leave are gone from the status at once. */
    kvp_client_close(ca);
    kvp_client_close(cb);
    kvpt_stat_wait(&d, "instances", 0, 5000);
    st = status(port);
    assert_int_equal(json_array_size(at(st, "instances")), 0);
    assert_int_equal(num(st, "pool.objects"), 7);
    json_decref(st);
    kvpt_daemon_stop(&d);
}

/* The memfd backend has no name and no /dev/shm measure; it reports the memory it saw. */
static void test_memfd_backend(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "16MiB",  "--chunk-size", "16", "--shm-backend",
                          "memfd",     "--http", "127.0.0.1:0",  NULL};
    kvpt_daemon_start(&d, args);
    uint16_t port = kvpt_http_port_in_log(d.log, 5000);
    assert_true(port > 0);
    json_t *st = status(port);
    assert_true(json_is_true(at(st, "shm.enabled")));
    assert_string_equal(str(st, "shm.backend"), "memfd");
    assert_true(json_is_null(at(st, "shm.name")));
    assert_true(json_is_null(at(st, "shm.dev_shm_free_bytes")));
    assert_true(num(st, "shm.memory_available_bytes") > (16 << 20));
    json_decref(st);
    kvpt_daemon_stop(&d);
}

/* Readers of /api/status and /metrics while workers come, store, retrieve and go: every answer
 * is whole and well formed (run under TSan, any race between the reports and the data path
 * fails the run). */
struct reader {
    uint16_t port;
    atomic_int answers, bad;
    atomic_bool stop;
};

static void *read_reports(void *arg)
{
    struct reader *r = arg;
    while (!atomic_load(&r->stop)) {
        int code;
        json_t *st = kvpt_http_json(r->port, "/api/status", &code);
        if (code != 200 || !st || !json_is_array(json_object_get(st, "instances")))
            r->bad++;
        json_decref(st);
        struct kvpt_http_reply m;
        if (kvpt_http_request(r->port, "GET", "/metrics", &m) != 0 || m.status != 200 ||
            !strstr(m.body, "kvpool_request_duration_seconds_count{op=\"map_segment\"}"))
            r->bad++;
        kvpt_http_free(&m);
        r->answers++;
    }
    return NULL;
}

static void test_reports_while_workers_run(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    struct reader r = {.port = start(&d)};
    pthread_t tid;
    assert_int_equal(pthread_create(&tid, NULL, read_reports, &r), 0);

    for (uint32_t round = 0; round < 20 || r.answers < 5; round++) {
        kvp_client *c = kvpt_connect(&d);
        char id[32];
        snprintf(id, sizeof(id), "churn-%u", round);
        kvp_register_opts o = kvpt_layout(id,
                                          round % 2 ? KVP_TRANSPORT_INLINE : KVP_TRANSPORT_AUTO);
        kvp_instance *inst = NULL;
        assert_rc(kvp_register(c, &o, &inst), 0);
        assert_int_equal(kvpt_store_seq(inst, 100 + round, 3), 3);
        kvpt_assert_seq(inst, 100 + round, 3, 3);
        kvp_client_close(c);
    }
    atomic_store(&r.stop, true);
    pthread_join(tid, NULL);
    assert_int_equal(r.bad, 0);
    assert_true(r.answers >= 5);
    kvpt_daemon_stop(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_healthcheck),
        cmocka_unit_test(test_counts_follow_operations),
        cmocka_unit_test(test_memfd_backend),
        cmocka_unit_test(test_reports_while_workers_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
