/*
 * test_shm_gate.c - the /dev/shm capacity gate (src/server/core/shm_gate.h).
 *
 * kvp_shm_gate_decide() is fed injected statvfs outcomes; its log lines are part of the
 * daemon's documented output, so they are compared exactly. kvp_shm_gate_probe() runs on real
 * directories.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/kvp_assert.h"
#include "core/shm_gate.h"

#define UNVERIFIABLE_PREFIX \
    "Cannot verify /dev/shm capacity required for SHM transport; disabling SHM mode."

static enum kvp_gate_verdict decide(uint64_t need, int err, uint64_t free_bytes, char *log,
                                    char *reason)
{
    struct kvp_gate_probe probe = {.err = err, .free_bytes = free_bytes};
    /* Poison the outputs: the gate must always write them. */
    memset(log, 'x', 512);
    log[511] = '\0';
    memset(reason, 'x', 512);
    reason[511] = '\0';
    return kvp_shm_gate_decide(need, &probe, log, 512, reason, 512);
}

static void test_enough_space_is_ok(void **state)
{
    (void)state;
    char log[512], reason[512];

    assert_int_equal(decide(1 << 20, 0, 2 << 20, log, reason), KVP_GATE_OK);
    assert_string_equal(log, "");
    assert_string_equal(reason, "");

    /* Exactly enough is enough. */
    assert_int_equal(decide(1073745920ull, 0, 1073745920ull, log, reason), KVP_GATE_OK);
    assert_string_equal(log, "");
    assert_string_equal(reason, "");
}

static void test_insufficient(void **state)
{
    (void)state;
    char log[512], reason[512];

    assert_int_equal(decide(1073745920ull, 0, 67108864ull, log, reason), KVP_GATE_INSUFFICIENT);
    assert_string_equal(log, "Insufficient /dev/shm capacity: need 1073745920 bytes, have "
                             "67108864 bytes. Disabling SHM transport.");
    assert_non_null(strstr(reason, "1073745920"));
    assert_non_null(strstr(reason, "67108864"));

    /* One byte short. */
    assert_int_equal(decide(4097, 0, 4096, log, reason), KVP_GATE_INSUFFICIENT);
    assert_string_equal(log, "Insufficient /dev/shm capacity: need 4097 bytes, have 4096 bytes. "
                             "Disabling SHM transport.");

    /* Full 64-bit values are printed without truncation. */
    assert_int_equal(decide(UINT64_MAX, 0, 0, log, reason), KVP_GATE_INSUFFICIENT);
    assert_string_equal(log, "Insufficient /dev/shm capacity: need 18446744073709551615 bytes, "
                             "have 0 bytes. Disabling SHM transport.");
    assert_true(reason[0] != '\0');
}

static void check_unverifiable(int err)
{
    char log[512], reason[512];

    /* free_bytes is meaningless when statvfs failed, even if it looks large. */
    assert_int_equal(decide(1 << 20, err, UINT64_MAX, log, reason), KVP_GATE_UNVERIFIABLE);
    if (strncmp(log, UNVERIFIABLE_PREFIX, strlen(UNVERIFIABLE_PREFIX)) != 0)
        fail_msg("log line \"%s\" does not start with \"%s\"", log, UNVERIFIABLE_PREFIX);
    if (!strstr(log, strerror(err)))
        fail_msg("log line \"%s\" does not contain \"%s\"", log, strerror(err));
    if (!strstr(reason, strerror(err)))
        fail_msg("reason \"%s\" does not contain \"%s\"", reason, strerror(err));
}

static void test_unverifiable_eacces(void **state)
{
    (void)state;
    check_unverifiable(EACCES);
}

static void test_unverifiable_enoent(void **state)
{
    (void)state;
    check_unverifiable(ENOENT);
}

static void test_small_buffers_truncate(void **state)
{
    (void)state;
    char log[16], reason[8];
    struct kvp_gate_probe probe = {.err = 0, .free_bytes = 1};

    memset(log, 'x', sizeof(log));
    memset(reason, 'x', sizeof(reason));
    assert_int_equal(kvp_shm_gate_decide(1 << 20, &probe, log, sizeof(log), reason, sizeof(reason)),
                     KVP_GATE_INSUFFICIENT);
    /* Truncated, but terminated inside the buffers. */
    assert_int_equal(strlen(log), sizeof(log) - 1);
    assert_int_equal(strlen(reason), sizeof(reason) - 1);
    assert_memory_equal(log, "Insufficient /d", sizeof(log));
}

static void test_probe_dev_shm(void **state)
{
    (void)state;
    struct kvp_gate_probe probe = {.err = -1, .free_bytes = 1};

    kvp_shm_gate_probe(KVP_SHM_DIR, &probe);
    if (probe.err == ENOENT) {
        fprintf(stderr, "no %s on this machine\n", KVP_SHM_DIR);
        skip();
    }
    assert_int_equal(probe.err, 0);
    /* A probe of a real tmpfs must agree with the decision it feeds. */
    char log[512], reason[512];
    assert_int_equal(decide(probe.free_bytes + 1, 0, probe.free_bytes, log, reason),
                     KVP_GATE_INSUFFICIENT);
}

static void test_probe_missing_dir(void **state)
{
    (void)state;
    struct kvp_gate_probe probe = {.err = 0, .free_bytes = 12345};

    kvp_shm_gate_probe("/nonexistent/kvpool-test-dir", &probe);
    assert_int_equal(probe.err, ENOENT);
    assert_int_equal(probe.free_bytes, 0);

    char log[512], reason[512];
    struct kvp_gate_probe copy = probe;
    assert_int_equal(kvp_shm_gate_decide(1, &copy, log, sizeof(log), reason, sizeof(reason)),
                     KVP_GATE_UNVERIFIABLE);
    assert_non_null(strstr(log, strerror(ENOENT)));
}

static void test_probe_regular_dir(void **state)
{
    (void)state;
    struct kvp_gate_probe probe = {.err = -1};

    /* "/" always exists and has a non-zero size, whatever its free space. */
    kvp_shm_gate_probe("/", &probe);
    assert_int_equal(probe.err, 0);

    /* A path through a regular file fails with ENOTDIR. */
    kvp_shm_gate_probe("/proc/self/status/x", &probe);
    assert_int_equal(probe.err, ENOTDIR);
}

/* The memfd backend's gate: available memory instead of /dev/shm. */
static void test_memory_gate(void **state)
{
    (void)state;
    char log[512], reason[512];
    struct kvp_gate_probe probe = {.err = 0, .free_bytes = 100};

    assert_int_equal(kvp_mem_gate_decide(100, &probe, log, sizeof(log), reason, sizeof(reason)),
                     KVP_GATE_OK);
    assert_string_equal(log, "");
    assert_int_equal(kvp_mem_gate_decide(101, &probe, log, sizeof(log), reason, sizeof(reason)),
                     KVP_GATE_INSUFFICIENT);
    assert_string_equal(log, "Insufficient memory for the memfd segment: need 101 bytes, have "
                             "100 bytes. Disabling SHM transport.");
    assert_non_null(strstr(reason, "SHM disabled: insufficient memory"));
    probe.err = ENOENT;
    assert_int_equal(kvp_mem_gate_decide(1, &probe, log, sizeof(log), reason, sizeof(reason)),
                     KVP_GATE_UNVERIFIABLE);
    assert_non_null(strstr(log, "Cannot verify available memory"));

    /* A real probe on this machine finds some memory. */
    kvp_mem_gate_probe(&probe);
    assert_int_equal(probe.err, 0);
    assert_true(probe.free_bytes > (1u << 20));
}

static void test_cgroup_headroom(void **state)
{
    (void)state;
    assert_true(kvp_cgroup_headroom("max\n", "12345\n") == UINT64_MAX);
    assert_true(kvp_cgroup_headroom("1000\n", "400\n") == 600);
    assert_true(kvp_cgroup_headroom("1000\n", "1000\n") == 0);
    assert_true(kvp_cgroup_headroom("1000\n", "2000\n") == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_enough_space_is_ok),
        cmocka_unit_test(test_insufficient),
        cmocka_unit_test(test_unverifiable_eacces),
        cmocka_unit_test(test_unverifiable_enoent),
        cmocka_unit_test(test_small_buffers_truncate),
        cmocka_unit_test(test_probe_dev_shm),
        cmocka_unit_test(test_probe_missing_dir),
        cmocka_unit_test(test_probe_regular_dir),
        cmocka_unit_test(test_memory_gate),
        cmocka_unit_test(test_cgroup_headroom),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
