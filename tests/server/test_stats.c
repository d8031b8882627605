/*
 * test_stats.c - the maps of stats.h, which every report renders: names unique, Prometheus
 * families well formed and adjacent, every name `kvpool stats` has always printed still there,
 * and the latency histogram's buckets.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/kvp_assert.h"
#include "core/stats.h"

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

static void test_latency_buckets(void **state)
{
    (void)state;
    struct kvp_latency_copy l[KVP_OP_MAX_];

    for (int b = 1; b < KVP_LATENCY_BUCKETS; b++)
        assert_true(kvp_latency_bound_ns[b] > kvp_latency_bound_ns[b - 1]);
    /* The "le" text is the bound in seconds. */
    for (int b = 0; b < KVP_LATENCY_BUCKETS; b++)
        assert_true(llabs((long long)(strtod(kvp_latency_bound_le[b], NULL) * 1e9) -
                          (long long)kvp_latency_bound_ns[b]) < 2);

    kvp_latency_record(KVP_OP_PING, 50000);          /* on the first bound: first bucket */
    kvp_latency_record(KVP_OP_PING, 50001);          /* second */
    kvp_latency_record(KVP_OP_PING, 20000000000ull); /* beyond 10 s: +Inf */
    kvp_latency_record(0, 1);                        /* not an opcode: ignored */
    kvp_latency_record(KVP_OP_MAX_, 1);
    kvp_latency_read(l);
    assert_int_equal(l[KVP_OP_PING].bucket[0], 1);
    assert_int_equal(l[KVP_OP_PING].bucket[1], 1);
    assert_int_equal(l[KVP_OP_PING].bucket[KVP_LATENCY_BUCKETS], 1);
    assert_int_equal(l[KVP_OP_PING].count, 3);
    assert_int_equal(l[KVP_OP_PING].sum_ns, 50000 + 50001 + 20000000000ull);
    assert_int_equal(l[KVP_OP_HELLO].count, 0);
    assert_int_equal(l[0].count, 0);
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
        cmocka_unit_test(test_latency_buckets),
        cmocka_unit_test(test_op_label),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
