/*
 * test_cli.c - the `kvpool` command-line tool and kvpoold's own command line, as a user runs
 * them: exit codes and messages.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "harness.h"

/* Runs cmd through the shell, captures stdout+stderr into out. Returns the exit status. */
static int run(const char *cmd, char *out, size_t size)
{
    char full[1024];
    snprintf(full, sizeof(full), "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_ping_and_stats(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "4MiB", NULL};
    char cmd[512], out[8192];
    kvpt_daemon_start(&d, args);

    snprintf(cmd, sizeof(cmd), "%s --socket %s ping", KVP_TEST_CLI, d.socket);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "ok"));

    snprintf(cmd, sizeof(cmd), "KVPOOL_SOCKET=%s %s stats", d.socket, KVP_TEST_CLI);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "pool_size 4194304\n"));
    assert_non_null(strstr(out, "shm_enabled 1\n"));
    assert_non_null(strstr(out, "evictions "));

    kvpt_daemon_stop(&d);

    /* The daemon is gone: a clear message and a non-zero exit, not a hang. */
    assert_int_equal(run(cmd, out, sizeof(out)), 1);
    snprintf(cmd, sizeof(cmd), "%s --socket %s ping", KVP_TEST_CLI, d.socket);
    assert_int_equal(run(cmd, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "cannot reach kvpoold"));
}

static void test_usage_errors(void **state)
{
    (void)state;
    char cmd[512], out[8192];
    snprintf(cmd, sizeof(cmd), "%s frobnicate", KVP_TEST_CLI);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
    snprintf(cmd, sizeof(cmd), "%s --help", KVP_TEST_CLI);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "ping"));
    assert_non_null(strstr(out, "stats"));
}

static void test_daemon_command_line(void **state)
{
    (void)state;
    char cmd[512], out[16384];
    snprintf(cmd, sizeof(cmd), "%s --help", KVP_TEST_KVPOOLD);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    const char *opts[] = {"--socket",     "--socket-mode",  "--l1-size",     "--chunk-size",
                          "--shm-name",   "--log-level",    "--max-clients", "--reserve-timeout",
                          "--io-timeout", "KVPOOL_L1_SIZE", "Default: 1GiB", "Default: 256"};
    for (size_t i = 0; i < sizeof(opts) / sizeof(opts[0]); i++)
        assert_non_null(strstr(out, opts[i]));

    snprintf(cmd, sizeof(cmd), "%s --l1-size 12parsecs", KVP_TEST_KVPOOLD);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
    assert_non_null(strstr(out, "invalid l1-size '12parsecs'"));

    snprintf(cmd, sizeof(cmd), "KVPOOL_CHUNK_SIZE=0 %s", KVP_TEST_KVPOOLD);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
    assert_non_null(strstr(out, "KVPOOL_CHUNK_SIZE"));

    snprintf(cmd, sizeof(cmd), "%s --no-such-option", KVP_TEST_KVPOOLD);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
    assert_non_null(strstr(out, "--no-such-option"));
}

/* --shm-name "" runs inline only and says so. */
static void test_shm_disabled_by_configuration(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "4MiB", "--shm-name", "", NULL};
    kvpt_daemon_start(&d, args);
    assert_true(kvpt_log_wait(&d, "SHM disabled by configuration", 2000));
    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts o = kvpt_layout("cfg-inline", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    assert_int_equal(kvp_instance_get_info(inst)->transport, KVP_TRANSPORT_INLINE);
    assert_true(kvpt_log_wait(&d,
                              "Instance cfg-inline non-GPU context using inline transport "
                              "(SHM disabled by configuration)",
                              2000));
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ping_and_stats),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_daemon_command_line),
        cmocka_unit_test(test_shm_disabled_by_configuration),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
