/*
 * test_l2_cli.c - the L2 tier in `kvpool status` and `kvpool watch`, against the real daemon
 * and a real redis-server: its URL and "up" with the backlog while Redis answers, "down" once
 * it was killed, and "off" for a daemon without L2.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "common/kvp_assert.h"
#include "harness.h"
#include "redis_fixture.h"

#define OUT_SIZE 65536

/* `kvpool --socket <d's socket> args`, stdout into out. Returns the exit status. */
static int cli(const struct kvpt_daemon *d, const char *args, char *out, size_t size)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s --socket %s %s </dev/null 2>/dev/null", KVP_TEST_CLI, d->socket,
             args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The line of text that starts with prefix (copied into line), failing the test if none. */
static const char *line_starting(const char *text, const char *prefix, char *line, size_t size)
{
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, prefix, strlen(prefix)) == 0) {
            size_t n = strcspn(p, "\n");
            snprintf(line, size, "%.*s", (int)(n < size ? n : size - 1), p);
            return line;
        }
    }
    fail_msg("no line starting with '%s' in:\n%s", prefix, text);
    return NULL;
}

static void test_l2_up_then_down(void **state)
{
    (void)state;
    struct kvpt_redis r = {.pid = 0};
    struct kvpt_daemon d;
    char out[OUT_SIZE], line[1024], want[512];

    kvpt_redis_require();
    kvpt_redis_start(&r, false);
    const char *args[] = {"--l1-size", "4MiB",         "--chunk-size", "16", "--l2",
                          r.url,       "--l2-timeout", "300",          NULL};
    kvpt_daemon_start(&d, args);
    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts o = kvpt_layout("l2-cli", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_rc(kvp_register(c, &o, &inst), 0);
    kvpt_store_seq(inst, 1, 4);
    assert_int_equal(kvpt_stat_poll(c, "l2_written_chunks", 4, 10000), 4);

    assert_int_equal(cli(&d, "status", out, sizeof(out)), 0);
    line_starting(out, "L2:", line, sizeof(line));
    snprintf(want, sizeof(want), "L2:         %s up (backlog 0 chunks, 0 B)", r.url);
    assert_string_equal(line, want);
    assert_int_equal(cli(&d, "watch --once -n 0.1", out, sizeof(out)), 0);
    line_starting(out, "L2 ", line, sizeof(line));
    snprintf(want, sizeof(want), "L2          %s up (backlog 0 chunks, 0 B)", r.url);
    assert_string_equal(line, want);

    /* Redis dies: the next copies fail and the tier is reported down (with the daemon's reason
     * where it gives one). */
    kvpt_redis_kill(&r);
    kvpt_store_seq(inst, 2, 4);
    assert_int_equal(kvpt_stat_poll(c, "l2_up", 0, 10000), 0);
    assert_int_equal(cli(&d, "status", out, sizeof(out)), 0);
    line_starting(out, "L2:", line, sizeof(line));
    snprintf(want, sizeof(want), "L2:         %s down", r.url);
    if (strncmp(line, want, strlen(want)) != 0 || !strstr(line, " (backlog "))
        fail_msg("'%s' does not start with '%s'", line, want);
    assert_int_equal(cli(&d, "watch --once -n 0.1", out, sizeof(out)), 0);
    line_starting(out, "L2 ", line, sizeof(line));
    assert_non_null(strstr(line, " down"));

    kvp_client_close(c);
    kvpt_daemon_stop(&d);
    kvpt_redis_stop(&r);

    /* Without --l2 the tier is off. */
    const char *no_l2[] = {"--l1-size", "4MiB", NULL};
    kvpt_daemon_start(&d, no_l2);
    assert_int_equal(cli(&d, "status", out, sizeof(out)), 0);
    assert_string_equal(line_starting(out, "L2:", line, sizeof(line)), "L2:         off");
    kvpt_daemon_stop(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_l2_up_then_down),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
