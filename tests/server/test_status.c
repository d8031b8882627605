/*
 * test_status.c - kvp_status_json() on a real kvp_server started in this process: every field
 * docs/HTTP.md promises, with values that follow from what the test did (registrations,
 * transfers counted, a client connected), for a daemon with shared memory and one without; an
 * instance and a client of a second front end (an "lmcache" owner registering through the
 * operations layer) named as such; and transports the renderer has no special case for
 * ("pickle", a value without a name), rendered from a snapshot completed by hand; and how the
 * daemon started ("warm_restart": an adopted pool after a crash and after a planned restart, a
 * cold start with the reason a pool was refused, warm restart off), from a snapshot whose
 * snap->warm is filled by hand.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/kvp_assert.h"
#include "core/ops.h"
#include "core/owner.h"
#include "core/snapshot.h"
#include "core/stats.h"
#include "core/warm_restart.h"
#include "kvp/listener.h"
#include "kvp/session.h"
#include "kvp/sessions.h"
#include "report/status_json.h"
#include "server_fixture.h"

/* The status document of s, parsed; fails the test if it is not valid JSON. */
static json_t *status(struct kvp_server *s)
{
    json_error_t err;
    char *text = kvp_status_json(s);
    assert_non_null(text);
    json_t *root = json_loads(text, 0, &err);
    if (!root)
        fail_msg("status is not JSON (%s at line %d): %s", err.text, err.line, text);
    free(text);
    assert_true(json_is_object(root));
    return root;
}

/* The member at a dotted path ("pool.used_bytes"); fails the test if it is absent. */
static json_t *at(json_t *root, const char *path)
{
    char buf[128], *save = NULL;
    snprintf(buf, sizeof(buf), "%s", path);
    json_t *v = root;
    for (char *k = strtok_r(buf, ".", &save); k; k = strtok_r(NULL, ".", &save)) {
        v = json_object_get(v, k);
        if (!v)
            fail_msg("status has no %s", path);
    }
    return v;
}

static long long num(json_t *root, const char *path)
{
    json_t *v = at(root, path);
    if (!json_is_integer(v))
        fail_msg("status %s is not an integer", path);
    return json_integer_value(v);
}

static const char *str(json_t *root, const char *path)
{
    json_t *v = at(root, path);
    if (!json_is_string(v))
        fail_msg("status %s is not a string", path);
    return json_string_value(v);
}

/* A status document text, parsed; frees the text. */
static json_t *parse(char *text)
{
    json_error_t err;
    assert_non_null(text);
    json_t *root = json_loads(text, 0, &err);
    if (!root)
        fail_msg("status is not JSON (%s at line %d): %s", err.text, err.line, text);
    free(text);
    return root;
}

/* The instance of that id in "instances", or NULL. */
static json_t *instance(json_t *root, const char *id)
{
    size_t i;
    json_t *e;
    json_array_foreach(at(root, "instances"), i, e)
    {
        if (strcmp(json_string_value(json_object_get(e, "instance_id")), id) == 0)
            return e;
    }
    return NULL;
}

/* The client of that id in "clients.list", or NULL. */
static json_t *client(json_t *root, uint64_t id)
{
    size_t i;
    json_t *e;
    json_array_foreach(at(root, "clients.list"), i, e)
    {
        if ((uint64_t)json_integer_value(json_object_get(e, "id")) == id)
            return e;
    }
    return NULL;
}

static void test_fresh_daemon_with_shm(void **state)
{
    (void)state;
    struct kvp_server s;
    fx_server_start(&s, true);
    json_t *st = status(&s);

    assert_string_equal(str(st, "version"), KVP_DAEMON_VERSION);
    assert_string_equal(str(st, "state"), "serving");
    assert_int_equal(num(st, "pid"), getpid());
    assert_true(num(st, "uptime_s") >= 0);
    assert_int_equal(num(st, "chunk_tokens"), FX_CHUNK_TOKENS);
    assert_string_equal(str(st, "socket"), s.cfg.socket_path);
    assert_non_null(strstr(str(st, "started_at"), "Z"));

    assert_int_equal(num(st, "pool.capacity_bytes"), FX_POOL);
    assert_int_equal(num(st, "pool.used_bytes"), 0);
    assert_int_equal(num(st, "pool.largest_free_bytes"), FX_POOL);
    assert_int_equal(num(st, "pool.objects"), 0);
    assert_int_equal(num(st, "pool.reserved_objects"), 0);
    assert_int_equal(num(st, "pool.pinned_objects"), 0);

    assert_true(json_is_true(at(st, "shm.enabled")));
    assert_string_equal(str(st, "shm.backend"), "posix");
    assert_string_equal(str(st, "shm.name"), s.seg.name);
    assert_int_equal(num(st, "shm.pool_size"), FX_POOL);
    assert_int_equal(num(st, "shm.segment_size"), FX_POOL + 4096);
    assert_true(json_is_null(at(st, "shm.disabled_reason")));
    /* What the gate saw before the segment took its share. */
    assert_true(num(st, "shm.dev_shm_free_bytes") >= FX_POOL + 4096);
    assert_true(json_is_null(at(st, "shm.memory_available_bytes")));

    assert_int_equal(json_array_size(at(st, "instances")), 0);
    assert_int_equal(num(st, "clients.connected"), 0);
    assert_int_equal(num(st, "clients.max"), 256);
    assert_int_equal(json_array_size(at(st, "clients.list")), 0);

    /* Every counter and gauge of the maps, by its STATS name. */
    for (size_t i = 0; i < KVP_NCOUNTERS; i++)
        assert_true(json_is_integer(json_object_get(at(st, "counters"), kvp_counter_desc[i].name)));
    for (size_t i = 0; i < KVP_NGAUGES; i++)
        assert_true(json_is_integer(json_object_get(at(st, "gauges"), kvp_gauge_desc[i].name)));
    assert_int_equal(num(st, "gauges.shm_enabled"), 1);
    assert_int_equal(num(st, "requests.prepare_store.count"), 0);
    assert_true(json_is_number(at(st, "requests.ping.seconds_total")));
    json_decref(st);
    fx_server_stop(&s);
}

static void test_instances_and_transfers(void **state)
{
    (void)state;
    struct kvp_server s;
    fx_server_start(&s, true);
    json_t *st0 = status(&s);
    long long shm_chunks0 = num(st0, "counters.store_chunks_shm");
    json_decref(st0);

    uint32_t a = fx_register(&s, "worker-shm", 7, KVP_REG_SHM, NULL);
    fx_register(&s, "worker-inline", 8, KVP_REG_INLINE, "requested by worker");
    kvp_registry_count_io(&s.registry, a, true, 3, 3 * 4096);
    kvp_registry_count_io(&s.registry, a, false, 2, 2 * 4096);
    KVP_COUNT(store_chunks_shm, 3);

    json_t *st = status(&s);
    assert_int_equal(json_array_size(at(st, "instances")), 2);
    json_t *i1 = instance(st, "worker-shm"), *i2 = instance(st, "worker-inline");
    assert_non_null(i1);
    assert_non_null(i2);
    assert_string_equal(str(i1, "transport"), "shm");
    assert_true(json_is_null(at(i1, "fallback_reason")));
    assert_string_equal(str(i2, "transport"), "inline");
    assert_string_equal(str(i2, "fallback_reason"), "requested by worker");
    assert_string_equal(str(i1, "model_name"), "fixture-model");
    assert_string_equal(str(i1, "dtype"), "float16");
    assert_int_equal(num(i1, "world_size"), 2);
    assert_int_equal(num(i1, "worker_rank"), 1);
    assert_int_equal(num(i1, "pid"), 1007);
    assert_int_equal(num(i1, "client_id"), 7);
    assert_string_equal(str(i1, "front_end"), "kvpool");
    assert_string_equal(str(i2, "front_end"), "kvpool");
    assert_false(json_is_true(at(i1, "use_mla")));
    /* [2, layers, chunk tokens, hidden] */
    json_t *shape = at(i1, "chunk_shape");
    assert_int_equal(json_array_size(shape), 4);
    assert_int_equal(json_integer_value(json_array_get(shape, 0)), 2);
    assert_int_equal(json_integer_value(json_array_get(shape, 1)), 2);
    assert_int_equal(json_integer_value(json_array_get(shape, 2)), FX_CHUNK_TOKENS);
    assert_int_equal(json_integer_value(json_array_get(shape, 3)), 64);
    assert_int_equal(num(i1, "chunk_bytes"), 2 * 2 * FX_CHUNK_TOKENS * 64 * 2);
    assert_non_null(strstr(str(i1, "connected_since"), "T"));
    assert_int_equal(num(i1, "stored_chunks"), 3);
    assert_int_equal(num(i1, "stored_bytes"), 3 * 4096);
    assert_int_equal(num(i1, "retrieved_chunks"), 2);
    assert_int_equal(num(i1, "retrieved_bytes"), 2 * 4096);
    assert_int_equal(num(i2, "stored_chunks"), 0);
    assert_int_equal(num(st, "gauges.instances"), 2);
    assert_int_equal(num(st, "gauges.instances_shm"), 1);
    assert_int_equal(num(st, "gauges.instances_inline"), 1);
    assert_int_equal(num(st, "counters.store_chunks_shm"), shm_chunks0 + 3);
    json_decref(st);

    /* A slot taken again starts from zero. */
    assert_rc(kvp_registry_remove(&s.registry, a, "test"), 0);
    a = fx_register(&s, "worker-shm-2", 9, KVP_REG_SHM, NULL);
    st = status(&s);
    assert_null(instance(st, "worker-shm"));
    assert_int_equal(num(instance(st, "worker-shm-2"), "stored_chunks"), 0);
    json_decref(st);
    fx_server_stop(&s);
}

static void test_without_shm(void **state)
{
    (void)state;
    struct kvp_server s;
    fx_server_start(&s, false);
    fx_register(&s, "forced", 1, 0, NULL); /* auto */
    json_t *st = status(&s);
    assert_false(json_is_true(at(st, "shm.enabled")));
    assert_string_equal(str(st, "shm.backend"), "none");
    assert_true(json_is_null(at(st, "shm.name")));
    assert_true(json_is_null(at(st, "shm.segment_size")));
    assert_string_equal(str(st, "shm.disabled_reason"), "SHM disabled by configuration");
    /* No gate ran: nothing was measured. */
    assert_true(json_is_null(at(st, "shm.dev_shm_free_bytes")));
    json_t *i = instance(st, "forced");
    assert_string_equal(str(i, "transport"), "inline");
    assert_string_equal(str(i, "fallback_reason"), "SHM disabled by configuration");
    assert_int_equal(num(st, "gauges.shm_enabled"), 0);
    json_decref(st);
    fx_server_stop(&s);
}

/* JSON strings are UTF-8; a worker's id need not be. */
static void test_non_utf8_names(void **state)
{
    (void)state;
    struct kvp_server s;
    fx_server_start(&s, true);
    fx_register(&s, "bad\xff\xfe-id \"quoted\"\n", 1, KVP_REG_INLINE, "reason \xc3(");
    json_t *st = status(&s);
    json_t *i = instance(st, "bad?"
                             "?-id \"quoted\"\n");
    assert_non_null(i);
    assert_string_equal(str(i, "fallback_reason"), "reason ?(");
    json_decref(st);
    fx_server_stop(&s);
}

static void test_clients(void **state)
{
    (void)state;
    struct kvp_server s;
    int sv[2];
    fx_server_start(&s, true);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    assert_rc(kvp_session_spawn(kvp_listener_sessions(s.kvp), sv[0]), 0);

    json_t *st = status(&s);
    assert_int_equal(num(st, "clients.connected"), 1);
    json_t *c = json_array_get(at(st, "clients.list"), 0);
    assert_non_null(c);
    assert_int_equal(num(c, "pid"), getpid());
    assert_int_equal(num(c, "uid"), getuid());
    assert_int_equal(num(c, "instances"), 0);
    assert_true(num(c, "id") > 0);
    assert_string_equal(str(c, "front_end"), "kvpool");
    json_decref(st);

    /* The connection ends: the list empties. */
    close(sv[1]);
    for (int i = 0; i < 500; i++) {
        st = status(&s);
        long long n = num(st, "clients.connected");
        json_decref(st);
        if (n == 0)
            break;
        usleep(10000);
    }
    st = status(&s);
    assert_int_equal(num(st, "clients.connected"), 0);
    json_decref(st);
    fx_server_stop(&s);
}

/*
 * An instance registered through another front end: its owner is made and registers through the
 * operations layer, as the LMCache front end does. It is listed with its front end, and so is
 * its client, next to a kvpool connection's; when its owner goes, both leave the report.
 */
static void test_second_front_end(void **state)
{
    (void)state;
    struct kvp_server s;
    int sv[2];
    char msg[256];
    bool existing;
    struct kvp_reg_spec q;
    struct kvp_registration reg;
    struct kvp_owner lmc;

    fx_server_start(&s, true);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    assert_rc(kvp_session_spawn(kvp_listener_sessions(s.kvp), sv[0]), 0);
    fx_register(&s, "native", 1000, KVP_REG_SHM, NULL); /* an id no owner has */
    kvp_owner_init(&lmc, &s, "lmcache", -1, 0);
    fx_spec(&q, "lmcache-42", KVP_REG_INLINE, "workers without the segment");
    assert_rc(kvp_op_register(&lmc, &q, NULL, &reg, &existing, msg, sizeof(msg)), 0);
    kvp_registry_count_io(&s.registry, reg.handle, true, 2, 2 * 4096);

    json_t *st = status(&s);
    json_t *i = instance(st, "lmcache-42");
    assert_non_null(i);
    assert_string_equal(str(i, "front_end"), "lmcache");
    assert_string_equal(str(i, "transport"), "inline");
    assert_string_equal(str(i, "fallback_reason"), "workers without the segment");
    assert_true(json_is_null(at(i, "pid")));
    assert_int_equal(num(i, "client_id"), lmc.id);
    assert_int_equal(num(i, "stored_chunks"), 2);
    assert_non_null(strstr(str(i, "connected_since"), "T"));
    assert_string_equal(str(instance(st, "native"), "front_end"), "kvpool");
    assert_int_equal(num(st, "gauges.instances"), 2);
    assert_int_equal(num(st, "gauges.instances_inline"), 1);

    /* Both clients are listed, each with its front end; the kvpool connection is the one
     * "connected" counts (--max-clients bounds it). */
    assert_int_equal(json_array_size(at(st, "clients.list")), 2);
    json_t *c = client(st, lmc.id);
    assert_non_null(c);
    assert_string_equal(str(c, "front_end"), "lmcache");
    assert_true(json_is_null(at(c, "pid")));
    assert_int_equal(num(c, "instances"), 1);
    size_t k;
    json_t *e;
    int native = 0;
    json_array_foreach(at(st, "clients.list"), k, e)
    {
        native += strcmp(json_string_value(json_object_get(e, "front_end")), "kvpool") == 0;
    }
    assert_int_equal(native, 1);
    assert_int_equal(num(st, "clients.connected"), 1);
    /* Counted from the owners, by front end: the connection, the LMCache worker. */
    assert_int_equal(num(st, "gauges.connections"), 1);
    assert_int_equal(num(st, "clients.by_front_end.kvpool"), 1);
    assert_int_equal(num(st, "clients.by_front_end.lmcache"), 1);
    assert_int_equal(num(st, "gauges.instances_pickle"), 0);
    json_decref(st);

    /* Its owner goes: its instance and its client leave the report. */
    kvp_owner_destroy(&lmc);
    st = status(&s);
    assert_null(instance(st, "lmcache-42"));
    assert_non_null(instance(st, "native"));
    assert_null(client(st, lmc.id));
    assert_int_equal(json_array_size(at(st, "clients.list")), 1);
    json_decref(st);
    close(sv[1]);
    fx_server_stop(&s);
}

/*
 * Transports are named, never folded into "inline": an instance on LMCache's pickle transport
 * (the snapshot is completed by hand) is "pickle" with its reason, one on its envelope transport
 * "envelope", and a value without a name is "unknown" rather than a crash or a wrong name.
 */
static void test_transport_names(void **state)
{
    (void)state;
    struct kvp_server s;
    struct kvp_snapshot snap;

    fx_server_start(&s, false);
    fx_register(&s, "p", 1, KVP_REG_INLINE, NULL);
    fx_register(&s, "x", 2, KVP_REG_INLINE, NULL);
    fx_register(&s, "i", 3, KVP_REG_INLINE, NULL);
    fx_register(&s, "e", 4, KVP_REG_INLINE, NULL);
    assert_rc(kvp_snapshot_take(&s, KVP_SNAP_LISTS, &snap), 0);
    assert_int_equal(snap.ninstances, 4);
    for (uint32_t n = 0; n < snap.ninstances; n++) {
        struct kvp_registration *r = &snap.instances[n].reg;
        if (strcmp(r->spec.instance_id, "p") == 0) {
            r->transport = KVP_REG_PICKLE;
            snprintf(r->frontend, sizeof(r->frontend), "lmcache");
            snprintf(r->reason, sizeof(r->reason), "no shared memory in the worker");
        } else if (strcmp(r->spec.instance_id, "x") == 0) {
            r->transport = 200;
        } else if (strcmp(r->spec.instance_id, "e") == 0) {
            r->transport = KVP_REG_ENVELOPE;
            snprintf(r->frontend, sizeof(r->frontend), "lmcache");
        }
    }
    json_t *st = parse(kvp_status_json_render(&s, &snap));
    kvp_snapshot_free(&snap);
    assert_string_equal(str(instance(st, "p"), "transport"), "pickle");
    assert_string_equal(str(instance(st, "p"), "front_end"), "lmcache");
    assert_string_equal(str(instance(st, "p"), "fallback_reason"),
                        "no shared memory in the worker");
    assert_string_equal(str(instance(st, "x"), "transport"), "unknown");
    assert_string_equal(str(instance(st, "i"), "transport"), "inline");
    assert_string_equal(str(instance(st, "e"), "transport"), "envelope");
    json_decref(st);

    assert_string_equal(kvp_reg_transport_name(KVP_REG_SHM), "shm");
    assert_string_equal(kvp_reg_transport_name(KVP_REG_INLINE), "inline");
    assert_string_equal(kvp_reg_transport_name(KVP_REG_PICKLE), "pickle");
    assert_string_equal(kvp_reg_transport_name(KVP_REG_ENVELOPE), "envelope");
    assert_string_equal(kvp_reg_transport_name(255), "unknown");
    fx_server_stop(&s);
}

/* The status of s rendered from a snapshot whose warm-restart report is *w. */
static json_t *status_with_warm(struct kvp_server *s, const struct kvp_warm_report *w)
{
    struct kvp_snapshot snap;
    assert_rc(kvp_snapshot_take(s, KVP_SNAP_LISTS, &snap), 0);
    snap.warm = *w;
    json_t *st = parse(kvp_status_json_render(s, &snap));
    kvp_snapshot_free(&snap);
    return st;
}

/*
 * "warm_restart": every field the documentation names, with the values of the report; null for
 * what does not apply (no previous pid on a cold start that found nothing, no reason when a
 * pool was adopted). A fresh daemon of the fixture found no pool to adopt: a cold start.
 */
static void test_warm_restart(void **state)
{
    (void)state;
    struct kvp_server s;
    fx_server_start(&s, true);

    json_t *st = status(&s);
    assert_string_equal(str(st, "warm_restart.kind"), "cold");
    assert_false(json_is_true(at(st, "warm_restart.planned")));
    assert_int_equal(num(st, "warm_restart.adopted_chunks"), 0);
    assert_int_equal(num(st, "warm_restart.dropped.bad_seal"), 0);
    assert_true(json_is_boolean(at(st, "warm_restart.enabled")));
    assert_true(
        json_is_integer(json_object_get(at(st, "counters"), "warm_restart_verified_chunks")));
    assert_true(
        json_is_integer(json_object_get(at(st, "counters"), "warm_restart_corrupt_chunks")));
    assert_true(
        json_is_integer(json_object_get(at(st, "gauges"), "warm_restart_unverified_chunks")));
    json_decref(st);

    /* Adopted after a crash, with drops of every kind. */
    struct kvp_warm_report w = {.enabled = true,
                                .adopted = true,
                                .planned = false,
                                .previous_pid = 4863,
                                .adopted_chunks = 509,
                                .adopted_bytes = 509ull * 8192,
                                .dropped_chunks = 6,
                                .dropped_bad_seal = 3,
                                .dropped_out_of_range = 2,
                                .dropped_overlap = 1,
                                .duration_ms = 12};
    st = status_with_warm(&s, &w);
    json_t *o = at(st, "warm_restart");
    assert_int_equal(json_object_size(o), 10);
    assert_true(json_is_true(at(st, "warm_restart.enabled")));
    assert_string_equal(str(st, "warm_restart.kind"), "adopted");
    assert_true(json_is_false(at(st, "warm_restart.planned")));
    assert_int_equal(num(st, "warm_restart.previous_pid"), 4863);
    assert_true(json_is_null(at(st, "warm_restart.reason")));
    assert_int_equal(num(st, "warm_restart.adopted_chunks"), 509);
    assert_int_equal(num(st, "warm_restart.adopted_bytes"), 509 * 8192);
    assert_int_equal(num(st, "warm_restart.dropped_chunks"), 6);
    assert_int_equal(num(st, "warm_restart.dropped.bad_seal"), 3);
    assert_int_equal(num(st, "warm_restart.dropped.out_of_range"), 2);
    assert_int_equal(num(st, "warm_restart.dropped.overlap"), 1);
    assert_int_equal(json_object_size(at(st, "warm_restart.dropped")), 3);
    assert_int_equal(num(st, "warm_restart.duration_ms"), 12);
    json_decref(st);

    /* Left on purpose by its predecessor (SIGUSR2). */
    w.planned = true;
    w.dropped_chunks = w.dropped_bad_seal = w.dropped_out_of_range = w.dropped_overlap = 0;
    st = status_with_warm(&s, &w);
    assert_true(json_is_true(at(st, "warm_restart.planned")));
    assert_int_equal(num(st, "warm_restart.dropped_chunks"), 0);
    json_decref(st);

    /* A pool found and refused: a cold start, with the reason (a worker-free string, but kept
     * valid UTF-8 all the same) and the pid of the daemon that left it. */
    w = (struct kvp_warm_report){.enabled = true, .previous_pid = 77, .duration_ms = 1};
    snprintf(w.reason, sizeof(w.reason),
             "pool of 67108864 bytes, this kvpoold is configured for "
             "134217728 \xff");
    st = status_with_warm(&s, &w);
    assert_string_equal(str(st, "warm_restart.kind"), "cold");
    assert_true(json_is_false(at(st, "warm_restart.planned")));
    assert_int_equal(num(st, "warm_restart.previous_pid"), 77);
    assert_string_equal(str(st, "warm_restart.reason"),
                        "pool of 67108864 bytes, this kvpoold is configured for 134217728 ?");
    assert_int_equal(num(st, "warm_restart.adopted_chunks"), 0);
    json_decref(st);

    /* Off (--warm-restart off, or no named segment): nothing to report but that. A planned flag
     * without an adoption means nothing. */
    w = (struct kvp_warm_report){.enabled = false, .planned = true};
    st = status_with_warm(&s, &w);
    assert_false(json_is_true(at(st, "warm_restart.enabled")));
    assert_string_equal(str(st, "warm_restart.kind"), "cold");
    assert_true(json_is_false(at(st, "warm_restart.planned")));
    assert_true(json_is_null(at(st, "warm_restart.previous_pid")));
    assert_true(json_is_null(at(st, "warm_restart.reason")));
    json_decref(st);
    fx_server_stop(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fresh_daemon_with_shm),
        cmocka_unit_test(test_instances_and_transfers),
        cmocka_unit_test(test_without_shm),
        cmocka_unit_test(test_non_utf8_names),
        cmocka_unit_test(test_clients),
        cmocka_unit_test(test_second_front_end),
        cmocka_unit_test(test_transport_names),
        cmocka_unit_test(test_warm_restart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
