/*
 * test_small_devshm.c - the real capacity gate: a container-like /dev/shm of 64 MiB.
 *
 * The test moves itself into a private mount namespace and mounts a 64 MiB tmpfs on /dev/shm
 * (what Docker and Kubernetes give a container by default); the daemon it starts inherits that
 * view. A 1 GiB pool must then be refused as shared memory up front, with the documented WARN
 * line, and workers must get the inline transport and correct data. A pool that fits must still
 * get SHM. Exit 77 (skipped) only when the namespace cannot be created.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define C 16

static void store_and_check(kvp_instance *inst, uint32_t seq, uint32_t n)
{
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
    uint32_t *tok = kvpt_tokens(seq, n * C);
    kvp_tokens t = {.ids = tok, .count = n * C};
    void **bufs = calloc(n, sizeof(*bufs));
    for (uint32_t i = 0; i < n; i++) {
        bufs[i] = malloc(bytes);
        kvpt_fill(bufs[i], bytes, seq, i);
    }
    assert_int_equal(kvp_store(inst, &t, 0, n * C, (const void *const *)bufs, NULL), (int)n);
    for (uint32_t i = 0; i < n; i++)
        memset(bufs[i], 0, bytes);
    assert_int_equal(kvp_retrieve(inst, &t, 0, n * C, bufs), (int)n);
    for (uint32_t i = 0; i < n; i++) {
        assert_true(kvpt_check(bufs[i], bytes, seq, i));
        free(bufs[i]);
    }
    free(bufs);
    free(tok);
}

static void test_gate_refuses_big_pool(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "1GiB", "--chunk-size", "16", NULL};
    kvpt_daemon_start(&d, args);

    char line[256];
    /* The segment (header page and pool) and its warm-restart index (a header page and 64
     * bytes per pool page), which --warm-restart on (the default) keeps beside it. */
    snprintf(line, sizeof(line),
             "WARN  Insufficient /dev/shm capacity: need %llu bytes, have %llu bytes. "
             "Disabling SHM transport.",
             (1ull << 30) + 4096 + 4096 + ((1ull << 30) / 4096) * 64, 64ull << 20);
    assert_true(kvpt_log_wait(&d, line, 5000));
    assert_true(kvpt_log_wait(&d, "SHM disabled: insufficient /dev/shm capacity", 1000));
    /* Nothing was created in the small /dev/shm. */
    char path[160];
    snprintf(path, sizeof(path), "/dev/shm/%s", d.shm_name);
    assert_int_equal(access(path, F_OK), -1);

    kvp_client *c = kvpt_connect(&d);
    assert_int_equal(kvpt_stat(c, "shm_enabled"), 0);
    kvp_register_opts o = kvpt_layout("gated", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    const kvp_instance_info *info = kvp_instance_get_info(inst);
    assert_int_equal(info->transport, KVP_TRANSPORT_INLINE);
    assert_non_null(strstr(info->reason, "insufficient /dev/shm capacity"));
    assert_true(kvpt_log_wait(&d,
                              "Instance gated non-GPU context using inline transport (SHM "
                              "disabled: insufficient /dev/shm capacity",
                              5000));
    store_and_check(inst, 11, 32);

    /* A worker that insists on SHM gets a clear, immediate refusal. */
    kvp_register_opts os = kvpt_layout("insists", KVP_TRANSPORT_SHM);
    kvp_instance *si = NULL;
    assert_int_equal(kvp_register(c, &os, &si), KVP_ENOSHM);
    assert_int_equal(kvp_ping(c), 0);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

static void test_pool_that_fits_gets_shm(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "48MiB", "--chunk-size", "16", NULL};
    kvpt_daemon_start(&d, args);
    assert_int_equal(kvpt_log_count(&d, "Insufficient /dev/shm capacity"), 0);
    assert_true(kvpt_log_wait(&d, "SHM enabled", 5000));

    /* The pages are reserved, not sparse: /dev/shm's free space dropped by the pool size. */
    struct statvfs st;
    assert_int_equal(statvfs("/dev/shm", &st), 0);
    assert_true((uint64_t)st.f_bavail * st.f_frsize <= (64ull << 20) - (48ull << 20));

    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts o = kvpt_layout("fits", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    assert_int_equal(kvp_instance_get_info(inst)->transport, KVP_TRANSPORT_SHM);
    store_and_check(inst, 12, 32);

    /* Filling the rest of /dev/shm afterwards cannot hurt the pool (no SIGBUS). */
    assert_int_equal(system("dd if=/dev/zero of=/dev/shm/filler bs=1M count=64 2>/dev/null; true"),
                     0);
    store_and_check(inst, 13, 32);
    assert_int_equal(unlink("/dev/shm/filler"), 0);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

static void test_second_pool_does_not_fit(void **state)
{
    (void)state;
    struct kvpt_daemon a, b;
    const char *args[] = {"--l1-size", "40MiB", "--chunk-size", "16", NULL};
    kvpt_daemon_start(&a, args);
    assert_true(kvpt_log_wait(&a, "SHM enabled", 5000));
    /* 24 MiB left: a second 40 MiB pool is refused by the gate and runs inline. */
    kvpt_daemon_start(&b, args);
    assert_true(kvpt_log_wait(&b, "Insufficient /dev/shm capacity", 5000));
    kvp_client *c = kvpt_connect(&b);
    kvp_register_opts o = kvpt_layout("second", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    assert_int_equal(kvp_instance_get_info(inst)->transport, KVP_TRANSPORT_INLINE);
    store_and_check(inst, 14, 16);
    kvp_client_close(c);
    kvpt_daemon_stop(&b);
    kvpt_daemon_stop(&a);
}

/*
 * The memfd backend does not live in /dev/shm: a 1 GiB pool still gets the zero-copy transport
 * in the 64 MiB namespace, and a SIGKILLed daemon leaves nothing behind.
 */
static void test_memfd_backend(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "1GiB", "--chunk-size", "16", "--shm-backend",
                          "memfd",     NULL};
    kvpt_daemon_start(&d, args);
    assert_true(kvpt_log_wait(&d, "SHM enabled (memfd)", 5000));
    assert_int_equal(kvpt_log_count(&d, "Insufficient"), 0);

    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts o = kvpt_layout("memfd-worker", KVP_TRANSPORT_SHM);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    assert_int_equal(kvp_instance_get_info(inst)->transport, KVP_TRANSPORT_SHM);
    assert_true(kvpt_log_wait(&d,
                              "Instance memfd-worker non-GPU context using SHM transport "
                              "(backend=memfd, pool_size=1073741824)",
                              5000));
    store_and_check(inst, 15, 32);

    /* Zero copy for real: prepared slots point into the mapping. */
    kvp_store_plan sp;
    uint32_t *tok = kvpt_tokens(16, 2 * C);
    kvp_tokens t = {.ids = tok, .count = 2 * C};
    assert_int_equal(kvp_prepare_store(inst, &t, 0, 2 * C, &sp), 2);
    assert_non_null(sp.slots[0].data);
    assert_int_equal(kvp_abort_store(inst, &sp), 0);
    free(tok);

    /* /dev/shm holds nothing of it, before and after a SIGKILL. */
    assert_int_equal(system("test -z \"$(ls -A /dev/shm)\""), 0);
    kvp_client_close(c);
    assert_int_equal(kvpt_daemon_signal_wait(&d, SIGKILL), 128 + SIGKILL);
    assert_int_equal(system("test -z \"$(ls -A /dev/shm)\""), 0);
    kvpt_daemon_stop(&d);
}

int main(void)
{
    if (kvpt_private_devshm("size=64m,mode=1777") != 0)
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gate_refuses_big_pool),
        cmocka_unit_test(test_pool_that_fits_gets_shm),
        cmocka_unit_test(test_second_pool_does_not_fit),
        cmocka_unit_test(test_memfd_backend),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
