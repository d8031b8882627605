/*
 * test_metrics.c - kvp_metrics_text() on a real kvp_server started in this process: the text
 * exposition format (HELP and TYPE once per family, before its samples), one family per map row
 * group of stats.h, values that follow what the test did, the histogram's invariants, and
 * Prometheus's own checker, promtool, when it is installed (the integration test
 * test_http_metrics.c requires it). Instances and clients are counted by front end: a second
 * front end's owner (made and registering through the operations layer) gets its own series,
 * and so does a transport the renderer has no special case for ("pickle", from a snapshot
 * completed by hand). Histograms: one renderer for every registered family (stats.h): kvpool's
 * opcodes, LMCache's operations once served, the store lock with its maximum, and a family this
 * test registers itself, with and without a label. How the daemon started (warm restart) from a
 * snapshot whose snap->warm is filled by hand: adopted after a crash, after a planned restart,
 * and a cold start; promtool checks that text too.
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
#include "common/wire.h"
#include "core/ops.h"
#include "core/owner.h"
#include "core/snapshot.h"
#include "core/stats.h"
#include "core/warm_restart.h"
#include "kvp/latency.h"
#include "lmc/latency.h"
#include "lmc/messages.h"
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
        "# TYPE kvpool_store_lock_hold_seconds histogram",
        "# TYPE kvpool_store_lock_hold_max_seconds gauge",
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
    assert_true(sample(text, "kvpool_connected_clients{front_end=\"kvpool\"}") == 0);
    /* The clients are counted by front end only: no unlabelled sample beside them. */
    assert_null(strstr(text, "\nkvpool_connected_clients "));
    /* Every transport has its rows, each under its own name. */
    for (const char *t = "shm\0inline\0pickle\0envelope\0"; *t; t += strlen(t) + 1) {
        static const char *const fams[] = {"registrations", "store_chunks", "store_bytes",
                                           "retrieve_chunks", "retrieve_bytes"};
        for (size_t f = 0; f < sizeof(fams) / sizeof(fams[0]); f++) {
            snprintf(series, sizeof(series), "kvpool_%s_total{transport=\"%s\"}", fams[f], t);
            sample(text, series);
        }
    }
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
        char name[32], series[160], le[32];
        double prev = 0;
        kvp_op_label((uint16_t)op, name, sizeof(name));
        for (uint32_t b = 0; b < kvp_latency_bounds.n; b++) {
            kvp_hist_le(&kvp_latency_bounds, b, le, sizeof(le));
            snprintf(series, sizeof(series),
                     "kvpool_request_duration_seconds_bucket{op=\"%s\",le=\"%s\"}", name, le);
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
    assert_true(sample(t, "kvpool_connected_clients{front_end=\"kvpool\"}") == 1);
    assert_true(sample(t, "kvpool_connected_clients{front_end=\"lmcache\"}") == 2);
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
    assert_true(sample(t, "kvpool_connected_clients{front_end=\"kvpool\"}") == 1);
    free(t);
    kvp_owner_destroy(&own);
    t = metrics(&s);
    assert_true(sample(t, "kvpool_instances{front_end=\"kvpool\",transport=\"shm\"}") == 0);
    assert_true(sample(t, "kvpool_clients{front_end=\"kvpool\"}") == 0);
    assert_true(sample(t, "kvpool_connected_clients{front_end=\"kvpool\"}") == 0);
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

/* The store lock's family: no label, its maximum as a gauge beside it. */
static void test_lock_hold(void **state)
{
    (void)state;
    struct kvp_server s;
    fx_server_start(&s, true);
    /* Every snapshot takes the store lock too: counts only grow by at least what is recorded
     * here, but no real hold of this test lasts a second. */
    char *t0 = metrics(&s);
    double c0 = sample(t0, "kvpool_store_lock_hold_seconds_count");
    double over0 = sample(t0, "kvpool_store_lock_hold_seconds_bucket{le=\"+Inf\"}") -
                   sample(t0, "kvpool_store_lock_hold_seconds_bucket{le=\"1\"}");
    double b0 = sample(t0, "kvpool_store_lock_hold_seconds_bucket{le=\"5e-06\"}");
    free(t0);
    kvp_lock_hold_record(3000);        /* 3 us */
    kvp_lock_hold_record(5000000000u); /* 5 s: the longest, beyond 1 s */
    char *t = metrics(&s);
    check_format(t);
    double c = sample(t, "kvpool_store_lock_hold_seconds_count");
    assert_true(c >= c0 + 2);
    assert_true(sample(t, "kvpool_store_lock_hold_seconds_bucket{le=\"+Inf\"}") == c);
    assert_true(sample(t, "kvpool_store_lock_hold_seconds_bucket{le=\"+Inf\"}") -
                    sample(t, "kvpool_store_lock_hold_seconds_bucket{le=\"1\"}") ==
                over0 + 1);
    assert_true(sample(t, "kvpool_store_lock_hold_seconds_bucket{le=\"5e-06\"}") >= b0 + 1);
    assert_true(sample(t, "kvpool_store_lock_hold_seconds_sum") >= 5.000003);
    assert_true(sample(t, "kvpool_store_lock_hold_max_seconds") == 5.0);
    /* No label: the series are the family's name alone. */
    assert_null(strstr(t, "kvpool_store_lock_hold_seconds_count{"));
    free(t);
    fx_server_stop(&s);
}

/* LMCache's family: absent until its first request, then its served operations only, with
 * the front end's names. */
static void test_lmc_family(void **state)
{
    (void)state;
    struct kvp_server s;
    fx_server_start(&s, true);
    char *t = metrics(&s);
    assert_null(strstr(t, "kvpool_lmcache_request_duration_seconds"));
    free(t);
    kvp_lmc_latency_record(LMC_OP_PREPARE_STORE, "prepare_store", 700000); /* 0.7 ms */
    kvp_lmc_latency_record(LMC_OP_PREPARE_STORE, "prepare_store", 20000);  /* 20 us */
    kvp_lmc_latency_record(LMC_OP_UNKNOWN, "?", 1);                        /* not recorded */
    t = metrics(&s);
    check_format(t);
    assert_true(has_line(t, "# TYPE kvpool_lmcache_request_duration_seconds histogram"));
    assert_true(sample(t, "kvpool_lmcache_request_duration_seconds_count{op=\"prepare_store\"}") ==
                2);
    assert_true(sample(t, "kvpool_lmcache_request_duration_seconds_bucket{op=\"prepare_store\","
                          "le=\"5e-05\"}") == 1);
    assert_true(sample(t, "kvpool_lmcache_request_duration_seconds_bucket{op=\"prepare_store\","
                          "le=\"0.001\"}") == 2);
    assert_null(strstr(t, "kvpool_lmcache_request_duration_seconds_count{op=\"lookup\"}"));
    assert_null(strstr(t, "op=\"?\""));
    /* No maximum for the request latencies: only a family that asks for one has it. */
    assert_null(strstr(t, "kvpool_lmcache_request_duration_seconds_max"));
    free(t);
    fx_server_stop(&s);
}

/* Whatever registers a family gets it rendered, by what it declares: this test's own, one with
 * a label (a series only once recorded, a maximum per series, a value that needs escaping) and
 * one without. */
static struct kvp_hist test_series[3];
static const char *const test_values[3] = {"first", NULL, "a\"b"};
static const struct kvp_hist_family test_family = {
    .name = "kvpool_test_duration_seconds",
    .help = "a family registered by test_metrics.c",
    .label = "step",
    .values = test_values,
    .nseries = 3,
    .series = test_series,
    .bounds = &kvp_latency_bounds,
    .max_name = "kvpool_test_duration_max_seconds",
    .max_help = "the longest step",
};
static struct kvp_hist plain_series;
static const struct kvp_hist_family plain_family = {
    .name = "kvpool_test_plain_seconds",
    .help = "a family without a label",
    .nseries = 1,
    .series = &plain_series,
    .bounds = &kvp_lock_hold_bounds,
    .always = true,
};

static void test_registered_family(void **state)
{
    (void)state;
    struct kvp_server s;
    fx_server_start(&s, true);
    assert_rc(kvp_hist_family_register(&test_family), 0);
    assert_rc(kvp_hist_family_register(&plain_family), 0);
    char *t = metrics(&s);
    check_format(t);
    /* Nothing recorded: the labelled family is absent, the "always" one is there at 0. */
    assert_null(strstr(t, "kvpool_test_duration_seconds"));
    assert_true(sample(t, "kvpool_test_plain_seconds_count") == 0);
    assert_true(sample(t, "kvpool_test_plain_seconds_bucket{le=\"1e-06\"}") == 0);
    assert_true(sample(t, "kvpool_test_plain_seconds_bucket{le=\"+Inf\"}") == 0);
    free(t);

    kvp_hist_family_record(&test_family, 0, 2000000);  /* 2 ms */
    kvp_hist_family_record(&test_family, 0, 100000);   /* 0.1 ms */
    kvp_hist_family_record(&test_family, 1, 1);        /* no series: ignored */
    kvp_hist_family_record(&test_family, 2, 30000);    /* 30 us */
    kvp_hist_family_record(&test_family, 3, 1);        /* beyond the family: ignored */
    kvp_hist_family_record(&plain_family, 0, 2500000); /* 2.5 ms */
    t = metrics(&s);
    check_format(t);
    assert_true(has_line(t, "# HELP kvpool_test_duration_seconds a family registered by "
                            "test_metrics.c"));
    assert_true(has_line(t, "# TYPE kvpool_test_duration_seconds histogram"));
    assert_true(sample(t, "kvpool_test_duration_seconds_bucket{step=\"first\",le=\"5e-05\"}") == 0);
    assert_true(sample(t, "kvpool_test_duration_seconds_bucket{step=\"first\",le=\"0.0001\"}") ==
                1);
    assert_true(sample(t, "kvpool_test_duration_seconds_bucket{step=\"first\",le=\"0.0025\"}") ==
                2);
    assert_true(sample(t, "kvpool_test_duration_seconds_bucket{step=\"first\",le=\"+Inf\"}") == 2);
    assert_true(sample(t, "kvpool_test_duration_seconds_count{step=\"first\"}") == 2);
    assert_true(sample(t, "kvpool_test_duration_seconds_sum{step=\"first\"}") == 0.0021);
    assert_true(sample(t, "kvpool_test_duration_seconds_count{step=\"a\\\"b\"}") == 1);
    assert_true(has_line(t, "# TYPE kvpool_test_duration_max_seconds gauge"));
    assert_true(sample(t, "kvpool_test_duration_max_seconds{step=\"first\"}") == 0.002);
    assert_true(sample(t, "kvpool_test_duration_max_seconds{step=\"a\\\"b\"}") == 0.00003);
    assert_true(sample(t, "kvpool_test_plain_seconds_count") == 1);
    assert_true(sample(t, "kvpool_test_plain_seconds_bucket{le=\"0.0025\"}") == 1);
    assert_true(sample(t, "kvpool_test_plain_seconds_bucket{le=\"0.001\"}") == 0);
    assert_null(strstr(t, "kvpool_test_plain_seconds_max"));
    free(t);
    fx_server_stop(&s);
}

/* Runs promtool check metrics on text, when it is installed. */
static void promtool_check(const char *text)
{
    if (system("command -v promtool >/dev/null 2>&1") != 0)
        return;
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
}

/* The metrics of s rendered from a snapshot whose warm-restart report is *w. */
static char *metrics_with_warm(struct kvp_server *s, const struct kvp_warm_report *w)
{
    struct kvp_snapshot snap;
    size_t len;
    assert_rc(kvp_snapshot_take(s, 0, &snap), 0);
    snap.warm = *w;
    char *t = kvp_metrics_render(&snap, &len);
    kvp_snapshot_free(&snap);
    assert_non_null(t);
    assert_int_equal(strlen(t), len);
    check_format(t);
    return t;
}

/* How the daemon started: gauges of the start, one info series whose labels say how, the drops
 * by reason (all three always); the counters and the gauge that change while it serves are
 * rows of the maps. */
static void test_warm_restart(void **state)
{
    (void)state;
    struct kvp_server s;
    fx_server_start(&s, true);

    /* The fixture's own start found nothing to adopt. */
    char *t = metrics(&s);
    assert_true(sample(t, "kvpool_warm_restart_info{kind=\"cold\",planned=\"false\"}") == 1);
    assert_true(sample(t, "kvpool_warm_restart_adopted_chunks") == 0);
    assert_true(sample(t, "kvpool_warm_restart_verified_chunks_total") == 0);
    assert_true(sample(t, "kvpool_warm_restart_corrupt_chunks_total") == 0);
    assert_true(sample(t, "kvpool_warm_restart_unverified_chunks") == 0);
    assert_true(has_line(t, "# TYPE kvpool_warm_restart_verified_chunks_total counter"));
    assert_true(has_line(t, "# TYPE kvpool_warm_restart_corrupt_chunks_total counter"));
    assert_true(has_line(t, "# TYPE kvpool_warm_restart_unverified_chunks gauge"));
    free(t);

    struct kvp_warm_report w = {.enabled = true,
                                .adopted = true,
                                .previous_pid = 4863,
                                .adopted_chunks = 509,
                                .adopted_bytes = 509ull * 8192,
                                .dropped_chunks = 6,
                                .dropped_bad_seal = 3,
                                .dropped_out_of_range = 2,
                                .dropped_overlap = 1,
                                .duration_ms = 1250};
    t = metrics_with_warm(&s, &w);
    static const char *const families[] = {
        "# TYPE kvpool_warm_restart_info gauge",
        "# TYPE kvpool_warm_restart_adopted_chunks gauge",
        "# TYPE kvpool_warm_restart_adopted_bytes gauge",
        "# TYPE kvpool_warm_restart_dropped_chunks gauge",
        "# TYPE kvpool_warm_restart_duration_seconds gauge",
    };
    for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++)
        if (!has_line(t, families[i]))
            fail_msg("no line '%s' in:\n%s", families[i], t);
    assert_true(sample(t, "kvpool_warm_restart_info{kind=\"adopted\",planned=\"false\"}") == 1);
    assert_null(strstr(t, "kvpool_warm_restart_info{kind=\"cold\""));
    assert_true(sample(t, "kvpool_warm_restart_adopted_chunks") == 509);
    assert_true(sample(t, "kvpool_warm_restart_adopted_bytes") == 509.0 * 8192);
    assert_true(sample(t, "kvpool_warm_restart_dropped_chunks{reason=\"bad_seal\"}") == 3);
    assert_true(sample(t, "kvpool_warm_restart_dropped_chunks{reason=\"out_of_range\"}") == 2);
    assert_true(sample(t, "kvpool_warm_restart_dropped_chunks{reason=\"overlap\"}") == 1);
    assert_true(sample(t, "kvpool_warm_restart_duration_seconds") == 1.25);
    promtool_check(t);
    free(t);

    w.planned = true;
    t = metrics_with_warm(&s, &w);
    assert_true(sample(t, "kvpool_warm_restart_info{kind=\"adopted\",planned=\"true\"}") == 1);
    free(t);

    /* Refused (or off): cold, nothing adopted, every reason at 0. */
    w = (struct kvp_warm_report){.enabled = true, .previous_pid = 77, .planned = true};
    snprintf(w.reason, sizeof(w.reason), "another kvpoold (pid 77) still uses it");
    t = metrics_with_warm(&s, &w);
    assert_true(sample(t, "kvpool_warm_restart_info{kind=\"cold\",planned=\"false\"}") == 1);
    assert_true(sample(t, "kvpool_warm_restart_adopted_chunks") == 0);
    for (const char *r = "bad_seal\0out_of_range\0overlap\0"; *r; r += strlen(r) + 1) {
        char series[128];
        snprintf(series, sizeof(series), "kvpool_warm_restart_dropped_chunks{reason=\"%s\"}", r);
        assert_true(sample(t, series) == 0);
    }
    /* No reason text becomes a label. */
    assert_null(strstr(t, "still uses it"));
    promtool_check(t);
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
        cmocka_unit_test(test_format_and_families),
        cmocka_unit_test(test_values_follow_events),
        cmocka_unit_test(test_histogram),
        cmocka_unit_test(test_front_ends),
        cmocka_unit_test(test_transport_label),
        cmocka_unit_test(test_lock_hold),
        cmocka_unit_test(test_lmc_family),
        cmocka_unit_test(test_registered_family),
        cmocka_unit_test(test_promtool),
        cmocka_unit_test(test_warm_restart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
