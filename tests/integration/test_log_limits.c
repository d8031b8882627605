/*
 * test_log_limits.c - a flood of malformed connections does not flood the daemon's log: the
 * per-connection warning is rate-limited (a few lines per second), and what was dropped is
 * counted in a "suppressed N similar messages" line, so every event is still accounted for.
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

#include "common/wire.h"
#include "harness.h"

#define CONNS 50
#define BURST 5 /* KVP_LOG_RL_BURST */

/* Sum of N over the log's "suppressed N similar messages, the first: \"...<what>\"" lines. */
static int suppressed_total(const struct kvpt_daemon *d, const char *what)
{
    FILE *f = fopen(d->log, "re");
    char line[1024];
    int total = 0;
    assert_non_null(f);
    while (fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, "suppressed ");
        if (p && strstr(line, what))
            total += atoi(p + strlen("suppressed "));
    }
    fclose(f);
    return total;
}

static void test_malformed_flood(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "16MiB", "--chunk-size", "16", NULL};
    kvpt_daemon_start(&d, args);

    uint64_t t0 = kvpt_now_ms();
    uint8_t junk[KVP_HEADER_SIZE];
    memset(junk, 'x', sizeof(junk));
    for (int i = 0; i < CONNS; i++) {
        int fd = kvpt_raw_connect(&d);
        assert_true(fd >= 0);
        assert_int_equal(send(fd, junk, sizeof(junk), MSG_NOSIGNAL), (ssize_t)sizeof(junk));
        assert_true(kvpt_raw_closed(fd, 5000));
        close(fd);
    }
    uint64_t elapsed = kvpt_now_ms() - t0;

    /* The count of what was dropped comes out within a window or two of the last event. */
    const char *what = "): malformed frame header; closing\"";
    assert_true(kvpt_log_wait(&d, "similar messages, the first: \"Connection ", 5000));
    /* The report quotes a message as it was logged, not the call site's format string. */
    assert_int_equal(kvpt_log_count(&d, "%llu"), 0);
    int shown = kvpt_log_count(&d, "malformed frame header; closing") - kvpt_log_count(&d, what);
    int windows = (int)(elapsed / 1000) + 2;
    print_message("%d connections in %llu ms: %d lines shown, %d suppressed\n", CONNS,
                  (unsigned long long)elapsed, shown, suppressed_total(&d, what));
    assert_true(shown >= 1);
    assert_true(shown <= BURST * windows);
    assert_true(shown < CONNS);
    /* Nothing lost: every connection is either shown or counted. */
    assert_int_equal(shown + suppressed_total(&d, what), CONNS);

    /* Other kinds of message are not starved by the flood. */
    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts ro = kvpt_layout("after-flood", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &ro, &inst), 0);
    assert_true(kvpt_log_wait(&d, "Instance after-flood non-GPU context", 5000));
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed_flood),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
