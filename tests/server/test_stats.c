/*
 * test_stats.c - the maps of stats.h, which every report renders: names unique, Prometheus
 * families well formed and adjacent, every name `kvpool stats` has always printed still there,
 * a row for every transport; the one histogram type (histogram.h): bucket placement at each
 * bound of both scales, count = the sum of the buckets, the maximum; the families of the front
 * ends (kvp/latency.c, lmc/latency.c) and their registration (stats.h).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/kvp_assert.h"
#include "common/wire.h"
#include "core/histogram.h"
#include "core/registry.h"
#include "core/stats.h"
#include "kvp/latency.h"
#include "lmc/latency.h"
#include "lmc/messages.h"

/* Every row of both maps, for checks that span them. */
static const struct kvp_stat_desc *row(size_t i)
{
    return i < KVP_NCOUNTERS ? &kvp_counter_desc[i] : &kvp_gauge_desc[i - KVP_NCOUNTERS];
}

#define NROWS ((size_t)KVP_NCOUNTERS + KVP_NGAUGES)

static void test_names_unique_and_short(void **state)
{
    (void)state;
    for (size_t i = 0; i < NROWS; i++) {
        const char *n = row(i)->name;
        /* The STATS reply carries names of at most 47 bytes (struct kvp_stat_entry). */
        assert_true(strlen(n) > 0 && strlen(n) < 48);
        for (const char *p = n; *p; p++)
            assert_true((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_');
        for (size_t k = i + 1; k < NROWS; k++)
            if (strcmp(n, row(k)->name) == 0)
                fail_msg("statistic %s is defined twice", n);
    }
    assert_true(NROWS <= KVP_MAX_STATS);
}

/* Names that tests, scripts and `kvpool stats` users rely on: only ever added to. */
static void test_historic_names_kept(void **state)
{
    (void)state;
    static const char *const names[] = {
        "connections_accepted",
        "connections_rejected",
        "requests",
        "request_errors",
        "protocol_errors",
        "registrations",
        "registrations_shm",
        "registrations_inline",
        "lookups",
        "lookup_hit_chunks",
        "store_chunks_reserved",
        "store_chunks_committed",
        "store_chunks_cached",
        "store_chunks_busy",
        "store_chunks_no_space",
        "store_chunks_aborted",
        "reservations_expired",
        "retrieve_chunks",
        "evictions",
        "inline_bytes_in",
        "inline_bytes_out",
        "pool_size",
        "pool_used",
        "pool_largest_free",
        "objects_committed",
        "objects_reserved",
        "objects_expired",
        "objects_pinned",
        "instances",
        "connections",
        "shm_enabled",
        "chunk_tokens",
        "registrations_shm",
        "registrations_inline",
        "store_chunks_shm",
        "store_chunks_inline",
        "store_bytes_shm",
        "store_bytes_inline",
        "retrieve_chunks_shm",
        "retrieve_chunks_inline",
        "retrieve_bytes_shm",
        "retrieve_bytes_inline",
        "instances_shm",
        "instances_inline",
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        size_t k = 0;
        while (k < NROWS && strcmp(row(k)->name, names[i]) != 0)
            k++;
        if (k == NROWS)
            fail_msg("statistic %s is gone", names[i]);
    }
}

/* A family is one run of adjacent rows of one map, with one label name, distinct values. */
static void check_families(const struct kvp_stat_desc *d, size_t n, const char *map)
{
    for (size_t i = 0; i < n; i++) {
        const char *f = d[i].family;
        assert_non_null(d[i].help);
        assert_true(d[i].help[0] != '\0');
        assert_null(strpbrk(d[i].help, "\\\n"));
        assert_true((d[i].label[0] == '\0') == (d[i].value[0] == '\0'));
        if (!f)
            continue;
        size_t len = strlen(f);
        if (len >= 6 && strcmp(f + len - 6, "_total") == 0)
            fail_msg("%s family %s: the _total suffix is added by the renderer", map, f);
        if (strncmp(f, "kvpool_", 7) == 0)
            fail_msg("%s family %s: the kvpool_ prefix is added by the renderer", map, f);
        bool continues = i > 0 && d[i - 1].family && strcmp(d[i - 1].family, f) == 0;
        if (continues) {
            assert_string_equal(d[i].label, d[i - 1].label);
            assert_true(d[i].label[0] != '\0');
        }
        for (size_t k = 0; k + 1 < i; k++)
            if (d[k].family && strcmp(d[k].family, f) == 0 && !continues)
                fail_msg("%s family %s: its rows are not adjacent (%s, %s)", map, f, d[k].name,
                         d[i].name);
        for (size_t k = 0; k < i; k++)
            if (d[k].family && strcmp(d[k].family, f) == 0 && strcmp(d[k].value, d[i].value) == 0)
                fail_msg("%s family %s: %s and %s have the same label", map, f, d[k].name,
                         d[i].name);
    }
}

static void test_families(void **state)
{
    (void)state;
    check_families(kvp_counter_desc, KVP_NCOUNTERS, "counter");
    check_families(kvp_gauge_desc, KVP_NGAUGES, "gauge");
    /* A family name is in one map only: one TYPE per metric. */
    for (size_t i = 0; i < KVP_NCOUNTERS; i++)
        for (size_t k = 0; k < KVP_NGAUGES; k++)
            if (kvp_counter_desc[i].family && kvp_gauge_desc[k].family)
                assert_true(strcmp(kvp_counter_desc[i].family, kvp_gauge_desc[k].family) != 0);
}

static void test_counters_read(void **state)
{
    (void)state;
    uint64_t before[KVP_NCOUNTERS], after[KVP_NCOUNTERS];
    kvp_counters_read(before);
    KVP_COUNT(store_chunks_shm, 3);
    KVP_COUNT(evictions, 1);
    kvp_counters_read(after);
    for (size_t i = 0; i < KVP_NCOUNTERS; i++) {
        uint64_t want = before[i];
        if (i == KVP_CTR_store_chunks_shm)
            want += 3;
        if (i == KVP_CTR_evictions)
            want += 1;
        assert_int_equal(after[i], want);
    }
}

/* The row called name of a map of n rows, or NULL. */
static const struct kvp_stat_desc *row_named(const struct kvp_stat_desc *map, size_t n,
                                             const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(map[i].name, name) == 0)
            return &map[i];
    return NULL;
}

/* Every transport of registry.h has its row in each family by transport, and its instances
 * gauge, under its own name (kvp_reg_transport_name()). */
static void test_rows_by_transport(void **state)
{
    (void)state;
    static const char *const families[] = {"registrations", "store_chunks", "store_bytes",
                                           "retrieve_chunks", "retrieve_bytes"};
    for (uint8_t t = KVP_REG_SHM; t <= KVP_REG_ENVELOPE; t++) {
        const char *name = kvp_reg_transport_name(t);
        for (size_t f = 0; f < sizeof(families) / sizeof(families[0]); f++) {
            char want[64];
            snprintf(want, sizeof(want), "%s_%s", families[f], name);
            const struct kvp_stat_desc *row = row_named(kvp_counter_desc, KVP_NCOUNTERS, want);
            if (!row)
                fail_msg("no counter %s", want);
            else {
                assert_string_equal(row->family, families[f]);
                assert_string_equal(row->label, "transport");
                assert_string_equal(row->value, name);
            }
        }
        char gauge[64];
        snprintf(gauge, sizeof(gauge), "instances_%s", name);
        if (!row_named(kvp_gauge_desc, KVP_NGAUGES, gauge))
            fail_msg("no gauge %s", gauge);
    }
}

/* Records ns into a fresh histogram of bounds b and returns the bucket it landed in. */
static uint32_t bucket_of(const struct kvp_hist_bounds *b, uint64_t ns)
{
    struct kvp_hist h;
    struct kvp_hist_copy c;
    memset(&h, 0, sizeof(h));
    kvp_hist_record(&h, b, ns);
    kvp_hist_read(&h, b, &c);
    assert_int_equal(c.count, 1);
    for (uint32_t i = 0; i <= b->n; i++)
        if (c.bucket[i])
            return i;
    fail_msg("%llu ns in no bucket", (unsigned long long)ns);
    return 0;
}

/* A value on a bound is in that bound's bucket, one nanosecond more in the next; past the last
 * bound is +Inf. Bounds ascend, fit the type, and their "le" is the bound in seconds. */
static void check_scale(const struct kvp_hist_bounds *b, const char *const *le)
{
    assert_true(b->n > 0 && b->n <= KVP_HIST_MAX_BOUNDS);
    for (uint32_t i = 0; i < b->n; i++) {
        char text[32];
        if (i > 0)
            assert_true(b->ns[i] > b->ns[i - 1]);
        assert_int_equal(bucket_of(b, b->ns[i]), i);
        assert_int_equal(bucket_of(b, b->ns[i] + 1), i + 1);
        kvp_hist_le(b, i, text, sizeof(text));
        assert_string_equal(text, le[i]);
        assert_true(llabs((long long)(strtod(text, NULL) * 1e9) - (long long)b->ns[i]) < 2);
    }
    assert_int_equal(bucket_of(b, 0), 0);
    assert_int_equal(bucket_of(b, UINT64_MAX / 2), b->n);
}

static void test_histogram_scales(void **state)
{
    (void)state;
    /* The "le" values dashboards have always read. */
    static const char *const latency_le[] = {
        "5e-05", "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01",
        "0.025", "0.05",   "0.1",     "0.25",   "0.5",   "1",      "2.5",   "10",
    };
    static const char *const hold_le[] = {
        "1e-06",  "2.5e-06", "5e-06",  "1e-05", "2.5e-05", "5e-05", "0.0001", "0.00025",
        "0.0005", "0.001",   "0.0025", "0.005", "0.01",    "0.1",   "1",
    };
    assert_int_equal(kvp_latency_bounds.n, 16);
    assert_int_equal(kvp_latency_bounds.ns[0], 50000);
    assert_int_equal(kvp_latency_bounds.ns[15], 10000000000ull);
    check_scale(&kvp_latency_bounds, latency_le);
    assert_int_equal(kvp_lock_hold_bounds.n, 15);
    assert_int_equal(kvp_lock_hold_bounds.ns[0], 1000);
    assert_int_equal(kvp_lock_hold_bounds.ns[14], 1000000000ull);
    check_scale(&kvp_lock_hold_bounds, hold_le);
}

/* count is the sum of the buckets, sum the sum of the values, max the largest. */
static void test_histogram_count_sum_max(void **state)
{
    (void)state;
    static const uint64_t values[] = {3, 1000, 999999, 42, 2500000000ull, 7, 1000000000ull};
    struct kvp_hist h;
    struct kvp_hist_copy c;
    uint64_t sum = 0;

    memset(&h, 0, sizeof(h));
    kvp_hist_read(&h, &kvp_lock_hold_bounds, &c);
    assert_int_equal(c.count, 0);
    assert_int_equal(c.max_ns, 0);
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        kvp_hist_record(&h, &kvp_lock_hold_bounds, values[i]);
        sum += values[i];
    }
    kvp_hist_read(&h, &kvp_lock_hold_bounds, &c);
    uint64_t total = 0;
    for (uint32_t b = 0; b <= kvp_lock_hold_bounds.n; b++)
        total += c.bucket[b];
    assert_int_equal(c.count, total);
    assert_int_equal(c.count, 7);
    assert_int_equal(c.sum_ns, sum);
    assert_int_equal(c.max_ns, 2500000000ull);
    assert_int_equal(c.bucket[kvp_lock_hold_bounds.n], 1); /* 2.5 s: beyond 1 s */
    assert_int_equal(c.bucket[0], 4);                      /* 3, 42, 7 and 1000 (on the bound) */
}

/* kvpool's protocol: a series per opcode, recorded by opcode, unknown opcodes ignored. */
static void test_request_latency_family(void **state)
{
    (void)state;
    const struct kvp_hist_family *f = &kvp_request_latency_family;
    struct kvp_hist_copy c;

    assert_rc(kvp_request_latency_register(), 0);
    assert_string_equal(f->name, "kvpool_request_duration_seconds");
    assert_string_equal(f->label, "op");
    assert_string_equal(f->status_key, "requests");
    assert_true(f->always);
    assert_ptr_equal(f->bounds, &kvp_latency_bounds);
    assert_int_equal(f->nseries, KVP_OP_MAX_);
    assert_null(f->values[0]);
    assert_string_equal(f->values[KVP_OP_PREPARE_STORE], "prepare_store");
    assert_string_equal(f->values[KVP_OP_HELLO], "hello");

    kvp_latency_record(KVP_OP_PING, 50000);          /* on the first bound: first bucket */
    kvp_latency_record(KVP_OP_PING, 50001);          /* second */
    kvp_latency_record(KVP_OP_PING, 20000000000ull); /* beyond 10 s: +Inf */
    kvp_latency_record(0, 1);                        /* not an opcode: ignored */
    kvp_latency_record(KVP_OP_MAX_, 1);
    kvp_hist_read(&f->series[KVP_OP_PING], f->bounds, &c);
    assert_int_equal(c.bucket[0], 1);
    assert_int_equal(c.bucket[1], 1);
    assert_int_equal(c.bucket[kvp_latency_bounds.n], 1);
    assert_int_equal(c.count, 3);
    assert_int_equal(c.sum_ns, 50000 + 50001 + 20000000000ull);
    assert_int_equal(c.max_ns, 20000000000ull);
    kvp_hist_read(&f->series[KVP_OP_HELLO], f->bounds, &c);
    assert_int_equal(c.count, 0);
    kvp_hist_read(&f->series[0], f->bounds, &c);
    assert_int_equal(c.count, 0);
}

/* LMCache's: a series per operation of lmc/messages.h, by its id, named by the table. */
static void test_lmc_latency_family(void **state)
{
    (void)state;
    const struct kvp_hist_family *f = &lmc_latency_family;
    struct kvp_hist_copy c;

    assert_rc(lmc_latency_register(), 0);
    assert_string_equal(f->name, "kvpool_lmcache_request_duration_seconds");
    assert_false(f->always);
    assert_null(f->status_key);
    assert_string_equal(f->values[LMC_OP_PREPARE_STORE], "prepare_store");
    assert_string_equal(f->values[LMC_OP_POLL_KV_EVENTS], "poll_kv_events");
    assert_null(f->values[LMC_OP_UNKNOWN]);
    assert_null(f->values[50]); /* between the frozen table and the named operations */

    kvp_lmc_latency_record(LMC_OP_LOOKUP, "lookup", 700000);
    kvp_lmc_latency_record(LMC_OP_UNKNOWN, "?", 1);    /* no operation: ignored */
    kvp_lmc_latency_record(50, "nothing", 1);          /* an id that names nothing */
    kvp_lmc_latency_record(LMC_LATENCY_IDS, "far", 1); /* beyond the table */
    kvp_hist_read(&f->series[LMC_OP_LOOKUP], f->bounds, &c);
    assert_int_equal(c.count, 1);
    assert_int_equal(c.bucket[4], 1); /* 0.7 ms: le 0.001 */
    kvp_hist_read(&f->series[50], f->bounds, &c);
    assert_int_equal(c.count, 0);
    kvp_hist_read(&f->series[0], f->bounds, &c);
    assert_int_equal(c.count, 0);
}

/* The registry: the store lock's first, then in registration order, each once; full at
 * KVP_HIST_FAMILIES. Runs last: it fills the registry. */
static void test_family_registry(void **state)
{
    (void)state;
    const struct kvp_hist_family *got[KVP_HIST_FAMILIES];
    static struct kvp_hist one[KVP_HIST_FAMILIES];
    static struct kvp_hist_family extra[KVP_HIST_FAMILIES];

    assert_rc(kvp_request_latency_register(), 0);
    assert_rc(lmc_latency_register(), 0);
    assert_rc(kvp_request_latency_register(), 0); /* again: nothing */
    assert_rc(kvp_hist_family_register(&lmc_latency_family), 0);
    uint32_t n = kvp_hist_families(got, KVP_HIST_FAMILIES);
    assert_int_equal(n, 3);
    assert_ptr_equal(got[0], &kvp_lock_hold_family);
    assert_ptr_equal(got[1], &kvp_request_latency_family);
    assert_ptr_equal(got[2], &lmc_latency_family);
    assert_int_equal(kvp_hist_families(got, 1), 1);
    assert_string_equal(kvp_lock_hold_family.max_name, "kvpool_store_lock_hold_max_seconds");
    assert_null(kvp_lock_hold_family.label);

    /* The lock hold's family records through kvp_lock_hold_record(). */
    struct kvp_hist_copy c0, c1;
    kvp_hist_read(kvp_lock_hold_family.series, &kvp_lock_hold_bounds, &c0);
    kvp_lock_hold_record(3000);
    kvp_hist_read(kvp_lock_hold_family.series, &kvp_lock_hold_bounds, &c1);
    assert_int_equal(c1.count, c0.count + 1);
    assert_int_equal(c1.bucket[2], c0.bucket[2] + 1); /* 3 us: le 5e-06 */
    assert_true(c1.max_ns >= 3000);

    /* Full. */
    for (uint32_t i = 0; i < KVP_HIST_FAMILIES; i++)
        extra[i] = (struct kvp_hist_family){.name = "kvpool_test_seconds",
                                            .help = "test",
                                            .nseries = 1,
                                            .series = &one[i],
                                            .bounds = &kvp_latency_bounds};
    for (uint32_t i = 0; i < KVP_HIST_FAMILIES - n; i++)
        assert_rc(kvp_hist_family_register(&extra[i]), 0);
    assert_rc(kvp_hist_family_register(&extra[KVP_HIST_FAMILIES - n]), -ENOSPC);
    assert_int_equal(kvp_hist_families(got, KVP_HIST_FAMILIES), KVP_HIST_FAMILIES);
    assert_rc(kvp_hist_family_register(&lmc_latency_family), 0); /* already there */
}

static void test_op_label(void **state)
{
    (void)state;
    char buf[32];
    kvp_op_label(KVP_OP_PREPARE_STORE, buf, sizeof(buf));
    assert_string_equal(buf, "prepare_store");
    kvp_op_label(KVP_OP_PREPARE_STORE, buf, 5);
    assert_string_equal(buf, "prep");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_unique_and_short),
        cmocka_unit_test(test_historic_names_kept),
        cmocka_unit_test(test_families),
        cmocka_unit_test(test_counters_read),
        cmocka_unit_test(test_rows_by_transport),
        cmocka_unit_test(test_histogram_scales),
        cmocka_unit_test(test_histogram_count_sum_max),
        cmocka_unit_test(test_request_latency_family),
        cmocka_unit_test(test_lmc_latency_family),
        cmocka_unit_test(test_op_label),
        cmocka_unit_test(test_family_registry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
