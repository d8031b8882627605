/*
 * test_metrics.c - kvp_metrics_text() on a real kvp_server started in this process: the text
 * exposition format (HELP and TYPE once per family, before its samples), one family per map row
 * group of stats.h, values that follow what the test did, the histogram's invariants, and
 * Prometheus's own checker, promtool, when it is installed (the integration test
 * test_http_metrics.c requires it). Instances and clients are counted by front end: a second
 * front end's owner (made and registering through the operations layer) gets its own series,
 * and so does a transport the renderer has no special case for ("pickle", from a snapshot
 * completed by hand).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/kvp_assert.h"
#include "core/ops.h"
#include "core/owner.h"
#include "core/snapshot.h"
#include "core/stats.h"
#include "report/metrics.h"
#include "server_fixture.h"

static char *metrics(struct kvp_server *s)
{
    size_t len = 0;
    char *text = kvp_metrics_text(s, &len);
    assert_non_null(text);
    assert_int_equal(strlen(text), len);
    assert_true(len > 0 && text[len - 1] == '\n');
    return text;
}

/* The value of the sample whose name and labels are exactly series; fails if absent. */
static double sample(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; *p;) {
        const char *eol = strchr(p, '\n');
        if (strncmp(p, series, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
        p = eol ? eol + 1 : p + strlen(p);
    }
    fail_msg("no sample %s in:\n%s", series, text);
    return 0;
}

static bool has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; *p;) {
        if (strncmp(p, line, n) == 0 && p[n] == '\n')
            return true;
        const char *eol = strchr(p, '\n');
        p = eol ? eol + 1 : p + strlen(p);
    }
    return false;
}

/* Every line is HELP, TYPE or a sample of the family whose TYPE came last; a family's HELP and
 * TYPE appear once. */
static void check_format(const char *text)
{
    char family[128] = "", type[16] = "";
    char seen[256][128];
    int nseen = 0;

    for (const char *p = text; *p;) {
        const char *eol = strchr(p, '\n');
        assert_non_null(eol);
        char line[512];
        snprintf(line, sizeof(line), "%.*s", (int)(eol - p), p);
        p = eol + 1;
        if (strncmp(line, "# HELP ", 7) == 0) {
            assert_int_equal(sscanf(line + 7, "%127s", family), 1);
            for (int i = 0; i < nseen; i++)
                if (strcmp(seen[i], family) == 0)
                    fail_msg("family %s described twice", family);
            assert_true(nseen < 256);
            snprintf(seen[nseen++], sizeof(seen[0]), "%s", family);
            /* kvpool's families, and LMCache's names as aliases of them (docs/HTTP.md). */
            assert_true(strncmp(family, "kvpool_", 7) == 0 ||
                        strncmp(family, "lmcache_mp_", 11) == 0);
            type[0] = '\0';
            continue;
        }
        if (strncmp(line, "# TYPE ", 7) == 0) {
            char f[128];
            assert_int_equal(sscanf(line + 7, "%127s %15s", f, type), 2);
            assert_string_equal(f, family);
            assert_true(strcmp(type, "counter") == 0 || strcmp(type, "gauge") == 0 ||
                        strcmp(type, "histogram") == 0);
            if (strcmp(type, "counter") == 0)
                assert_non_null(strstr(family, "_total"));
            continue;
        }
        /* A sample: of the current family (histograms add _bucket, _sum, _count). */
        assert_true(type[0] != '\0');
        size_t n = strlen(family);
        assert_int_equal(strncmp(line, family, n), 0);
        const char *rest = line + n;
        if (strcmp(type, "histogram") == 0) {
            if (strncmp(rest, "_bucket", 7) == 0)
                rest += 7;
            else if (strncmp(rest, "_sum", 4) == 0)
                rest += 4;
            else if (strncmp(rest, "_count", 6) == 0)
                rest += 6;
            else
                fail_msg("histogram sample %s", line);
        }
        if (*rest == '{')
            rest = strchr(rest, '}') + 1;
        assert_true(*rest == ' ');
        char *end;
        strtod(rest + 1, &end);
        assert_true(end > rest + 1 && *end == '\0');
    }
}

static void test_format_and_families(void **state)
{
    (void)state;
    struct kvp_server s;
    fx_server_start(&s, true);
    char *text = metrics(&s);
    check_format(text);

    /* Every map row with a family is a sample. */
    char series[256];
    for (size_t i = 0; i < KVP_NCOUNTERS + KVP_NGAUGES; i++) {
        bool counter = i < KVP_NCOUNTERS;
        const struct kvp_stat_desc *d = counter ? &kvp_counter_desc[i]
                                                : &kvp_gauge_desc[i - KVP_NCOUNTERS];
        if (!d->family)
            continue;
        if (d->label[0])
            snprintf(series, sizeof(series), "kvpool_%s%s{%s=\"%s\"}", d->family,
                     counter ? "_total" : "", d->label, d->value);
        else
            snprintf(series, sizeof(series), "kvpool_%s%s", d->family, counter ? "_total" : "");
        sample(text, series);
    }
    /* The families the documentation promises by name. */
    static const char *const lines[] = {
        "# TYPE kvpool_instances gauge",
        "# TYPE kvpool_shm_enabled gauge",
        "# TYPE kvpool_pool_capacity_bytes gauge",
        "# TYPE kvpool_pool_used_bytes gauge",
        "# TYPE kvpool_objects gauge",
        "# TYPE kvpool_store_chunks_total counter",
        "# TYPE kvpool_store_bytes_total counter",
        "# TYPE kvpool_retrieve_chunks_total counter",
        "# TYPE kvpool_retrieve_bytes_total counter",
        "# TYPE kvpool_lookups_total counter",
        "# TYPE kvpool_lookup_hit_chunks_total counter",
        "# TYPE kvpool_evictions_total counter",
        "# TYPE kvpool_allocation_failures_total counter",
        "# TYPE kvpool_reserved_chunks_dropped_total counter",
        "# TYPE kvpool_protocol_errors_total counter",
        "# TYPE kvpool_connected_clients gauge",
        "# TYPE kvpool_clients gauge",
        "# TYPE kvpool_request_duration_seconds histogram",
        "# TYPE kvpool_build_info gauge",
    };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
        if (!has_line(text, lines[i]))
            fail_msg("no line '%s'", lines[i]);
    for (const char *cause = "abort\0unregister\0disconnect\0timeout\0"; *cause;
         cause += strlen(cause) + 1) {
        snprintf(series, sizeof(series), "kvpool_reserved_chunks_dropped_total{cause=\"%s\"}",
                 cause);
        sample(text, series);
    }
    assert_true(sample(text, "kvpool_build_info{version=\"" KVP_DAEMON_VERSION "\"}") == 1);
    assert_true(sample(text, "kvpool_shm_enabled") == 1);
    assert_true(sample(text, "kvpool_pool_capacity_bytes") == FX_POOL);
    assert_true(sample(text, "kvpool_chunk_tokens") == FX_CHUNK_TOKENS);
    /* The daemon's own front end has its series before it has instances or clients. */
    assert_true(sample(text, "kvpool_instances{front_end=\"kvpool\",transport=\"shm\"}") == 0);
    assert_true(sample(text, "kvpool_instances{front_end=\"kvpool\",transport=\"inline\"}") == 0);
    assert_true(sample(text, "kvpool_clients{front_end=\"kvpool\"}") == 0);
    free(text);
    fx_server_stop(&s);
}

static void test_values_follow_events(void **state)
{
    (void)state;
    struct kvp_server s;
    fx_server_start(&s, false);
    char *t0 = metrics(&s);
    double stored = sample(t0, "kvpool_store_chunks_total{transport=\"inline\"}");
    double aborts = sample(t0, "kvpool_reserved_chunks_dropped_total{cause=\"disconnect\"}");
    free(t0);

    fx_register(&s, "a", 1, KVP_REG_INLINE, NULL);
    fx_register(&s, "b", 2, KVP_REG_INLINE, NULL);
    KVP_COUNT(store_chunks_inline, 5);
    KVP_COUNT(store_chunks_aborted_disconnect, 2);
    char *t = metrics(&s);
    check_format(t);
    assert_true(sample(t, "kvpool_instances{front_end=\"kvpool\",transport=\"inline\"}") == 2);
    assert_true(sample(t, "kvpool_instances{front_end=\"kvpool\",transport=\"shm\"}") == 0);
    assert_true(sample(t, "kvpool_shm_enabled") == 0);
    assert_true(sample(t, "kvpool_store_chunks_total{transport=\"inline\"}") == stored + 5);
    assert_true(sample(t, "kvpool_reserved_chunks_dropped_total{cause=\"disconnect\"}") ==
                aborts + 2);
    free(t);
    fx_server_stop(&s);
}

static void test_histogram(void **state)
{
    (void)state;
    struct kvp_server s;
    fx_server_start(&s, true);
    char *t0 = metrics(&s);
    double c0 = sample(t0, "kvpool_request_duration_seconds_count{op=\"lookup\"}");
    double b0 = sample(t0, "kvpool_request_duration_seconds_bucket{op=\"lookup\",le=\"0.001\"}");
    free(t0);

    kvp_latency_record(KVP_OP_LOOKUP, 700000);         /* 0.7 ms */
    kvp_latency_record(KVP_OP_LOOKUP, 3000000);        /* 3 ms */
    kvp_latency_record(KVP_OP_LOOKUP, 30000000000ull); /* 30 s */
    char *t = metrics(&s);
    check_format(t);
    assert_true(sample(t, "kvpool_request_duration_seconds_count{op=\"lookup\"}") == c0 + 3);
    assert_true(sample(t, "kvpool_request_duration_seconds_bucket{op=\"lookup\",le=\"0.001\"}") ==
                b0 + 1);
    assert_true(sample(t, "kvpool_request_duration_seconds_bucket{op=\"lookup\",le=\"10\"}") ==
                c0 + 2);
    /* Cumulative, and +Inf is the count, for every opcode. */
    for (int op = 1; op < KVP_OP_MAX_; op++) {
        char name[32], series[160];
        double prev = 0;
        kvp_op_label((uint16_t)op, name, sizeof(name));
        for (int b = 0; b < KVP_LATENCY_BUCKETS; b++) {
            snprintf(series, sizeof(series),
                     "kvpool_request_duration_seconds_bucket{op=\"%s\",le=\"%s\"}", name,
                     kvp_latency_bound_le[b]);
            double v = sample(t, series);
            assert_true(v >= prev);
            prev = v;
        }
        snprintf(series, sizeof(series),
                 "kvpool_request_duration_seconds_bucket{op=\"%s\",le=\"+Inf\"}", name);
        double inf = sample(t, series);
        assert_true(inf >= prev);
        snprintf(series, sizeof(series), "kvpool_request_duration_seconds_count{op=\"%s\"}", name);
        assert_true(sample(t, series) == inf);
    }
    assert_true(sample(t, "kvpool_request_duration_seconds_sum{op=\"lookup\"}") >= 30.0037);
    free(t);
    fx_server_stop(&s);
}

/* The instances and clients of a second front end, registered through the operations layer
 * as the LMCache front end does: series of their own, beside kvpool's. */
static void test_front_ends(void **state)
{
    (void)state;
    struct kvp_server s;
    struct kvp_owner lmc[2], own;
    struct kvp_reg_spec q;
    struct kvp_registration reg;
    char msg[256];
    bool existing;

    fx_server_start(&s, true);
    kvp_owner_init(&own, &s, "kvpool", 4242, 1000);
    fx_spec(&q, "native", KVP_REG_SHM, NULL);
    assert_rc(kvp_op_register(&own, &q, NULL, &reg, &existing, msg, sizeof(msg)), 0);
    for (int i = 0; i < 2; i++) {
        char id[32];
        kvp_owner_init(&lmc[i], &s, "lmcache", -1, 0);
        snprintf(id, sizeof(id), "lmcache-%d", i);
        fx_spec(&q, id, i == 0 ? KVP_REG_SHM : KVP_REG_INLINE, NULL);
        assert_rc(kvp_op_register(&lmc[i], &q, NULL, &reg, &existing, msg, sizeof(msg)), 0);
    }
    char *t = metrics(&s);
    check_format(t);
    assert_true(sample(t, "kvpool_instances{front_end=\"kvpool\",transport=\"shm\"}") == 1);
    assert_true(sample(t, "kvpool_instances{front_end=\"kvpool\",transport=\"inline\"}") == 0);
    assert_true(sample(t, "kvpool_instances{front_end=\"lmcache\",transport=\"shm\"}") == 1);
    assert_true(sample(t, "kvpool_instances{front_end=\"lmcache\",transport=\"inline\"}") == 1);
    assert_true(sample(t, "kvpool_clients{front_end=\"kvpool\"}") == 1);
    assert_true(sample(t, "kvpool_clients{front_end=\"lmcache\"}") == 2);
    /* The family is described once, whatever the number of front ends. */
    assert_non_null(strstr(t, "# TYPE kvpool_instances gauge\n"));
    assert_null(strstr(strstr(t, "# TYPE kvpool_instances gauge\n") + 1,
                       "# TYPE kvpool_instances gauge\n"));
    free(t);

    /* Its owners go: its series go with them, kvpool's stay. */
    kvp_owner_destroy(&lmc[0]);
    kvp_owner_destroy(&lmc[1]);
    t = metrics(&s);
    check_format(t);
    assert_null(strstr(t, "front_end=\"lmcache\""));
    assert_true(sample(t, "kvpool_clients{front_end=\"kvpool\"}") == 1);
    free(t);
    kvp_owner_destroy(&own);
    t = metrics(&s);
    assert_true(sample(t, "kvpool_instances{front_end=\"kvpool\",transport=\"shm\"}") == 0);
    assert_true(sample(t, "kvpool_clients{front_end=\"kvpool\"}") == 0);
    free(t);
    fx_server_stop(&s);
}

/* A transport without a special case in the renderer: its own label value, never folded into
 * inline; and a label value that would need escaping is escaped. */
static void test_transport_label(void **state)
{
    (void)state;
    struct kvp_server s;
    struct kvp_snapshot snap;
    size_t len;

    fx_server_start(&s, false);
    assert_rc(kvp_snapshot_take(&s, 0, &snap), 0);
    assert_true(snap.ninstance_groups + 4 <= KVP_SNAP_GROUPS);
    struct kvp_instance_group *g = &snap.instance_groups[snap.ninstance_groups];
    g[0] = (struct kvp_instance_group){.frontend = "lmcache",
                                       .transport = KVP_REG_PICKLE,
                                       .count = 3};
    g[1] = (struct kvp_instance_group){.frontend = "lmcache", .transport = 77, .count = 1};
    g[2] = (struct kvp_instance_group){.frontend = "a\"b\\c", .transport = KVP_REG_SHM, .count = 1};
    g[3] = (struct kvp_instance_group){.frontend = "lmcache",
                                       .transport = KVP_REG_ENVELOPE,
                                       .count = 2};
    snap.ninstance_groups += 4;
    char *t = kvp_metrics_render(&snap, &len);
    kvp_snapshot_free(&snap);
    assert_non_null(t);
    check_format(t);
    assert_true(sample(t, "kvpool_instances{front_end=\"lmcache\",transport=\"pickle\"}") == 3);
    assert_true(sample(t, "kvpool_instances{front_end=\"lmcache\",transport=\"unknown\"}") == 1);
    assert_true(sample(t, "kvpool_instances{front_end=\"lmcache\",transport=\"envelope\"}") == 2);
    assert_true(sample(t, "kvpool_instances{front_end=\"a\\\"b\\\\c\",transport=\"shm\"}") == 1);
    assert_true(sample(t, "kvpool_instances{front_end=\"kvpool\",transport=\"inline\"}") == 0);
    free(t);
    fx_server_stop(&s);
}

/* Prometheus's own linter, when installed (Debian: prometheus). */
static void test_promtool(void **state)
{
    (void)state;
    if (system("command -v promtool >/dev/null 2>&1") != 0) {
        fprintf(stderr, "note: promtool not installed (Debian package prometheus); the "
                        "integration test test_http_metrics runs it\n");
        return;
    }
    struct kvp_server s;
    fx_server_start(&s, true);
    fx_register(&s, "p", 1, KVP_REG_SHM, NULL);
    /* A second front end's labels, with an instance and a client. */
    struct kvp_owner lmc;
    struct kvp_reg_spec q;
    struct kvp_registration reg;
    char msg[256];
    bool existing;
    kvp_owner_init(&lmc, &s, "lmcache", -1, 0);
    fx_spec(&q, "lmcache-1", KVP_REG_INLINE, NULL);
    assert_rc(kvp_op_register(&lmc, &q, NULL, &reg, &existing, msg, sizeof(msg)), 0);
    char *text = metrics(&s);
    kvp_owner_destroy(&lmc);
    char path[] = "/tmp/kvp-metrics-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "promtool check metrics < %s", path);
    int rc = system(cmd);
    unlink(path);
    if (rc != 0)
        fail_msg("promtool check metrics failed (status %d) on:\n%s", rc, text);
    free(text);
    fx_server_stop(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format_and_families), cmocka_unit_test(test_values_follow_events),
        cmocka_unit_test(test_histogram),           cmocka_unit_test(test_front_ends),
        cmocka_unit_test(test_transport_label),     cmocka_unit_test(test_promtool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
