/*
 * test_reload.c - SIGHUP reloads the --config file, as PostgreSQL and nginx do, and never stops
 * the daemon: the reloadable options change at once (the log level and format here), a change
 * that needs a restart is named and left alone, a file with an error is reported and changes
 * nothing, the command line still wins over the file, and throughout the daemon serves the same
 * cache to the same connections. SIGTERM still stops it.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

/* The configuration file, rewritten in place (the daemon reads it again on SIGHUP). */
static char conf[256];

static void write_conf(const char *text)
{
    char tmp[300];
    snprintf(tmp, sizeof(tmp), "%s.new", conf);
    FILE *f = fopen(tmp, "we");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(rename(tmp, conf), 0); /* the daemon never reads half a file */
}

/* SIGHUP, then the nth "SIGHUP: reading" line and the line that ends that reload. */
static void reload(const struct kvpt_daemon *d, int nth, const char *end)
{
    assert_int_equal(kill(d->pid, SIGHUP), 0);
    for (int i = 0; i < 100 && kvpt_log_count(d, "SIGHUP: reading the configuration") < nth; i++)
        kvpt_sleep_ms(50);
    assert_int_equal(kvpt_log_count(d, "SIGHUP: reading the configuration"), nth);
    assert_true(kvpt_log_wait(d, end, 5000));
}

/* A client connects and goes: a DEBUG line each way when debug is on. */
static void connect_once(const struct kvpt_daemon *d)
{
    kvp_client *c = kvpt_connect(d);
    assert_int_equal(kvp_ping(c), 0);
    kvp_client_close(c);
}

static void test_sighup_reloads(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char tmpl[] = "/tmp/kvpt-reload-XXXXXX", want[512];
    assert_non_null(mkdtemp(tmpl));
    snprintf(conf, sizeof(conf), "%s/kvpoold.conf", tmpl);
    write_conf("l1-size = 16MiB\nchunk-size = 16\nlog-level = info\n");
    const char *args[] = {"--config", conf, "--max-clients", "64", NULL};
    kvpt_daemon_start(&d, args);
    pid_t pid = d.pid;

    /* A worker with a cached sequence, connected throughout. */
    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts o = kvpt_layout("reload-worker", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    assert_int_equal(kvpt_store_seq(inst, 1, 4), 4);
    connect_once(&d);
    assert_int_equal(kvpt_log_count(&d, " DEBUG "), 0);

    /* The level goes to debug at once; the pool size waits for a restart; the command line's
     * max-clients wins over the file's, so it is no change at all. */
    write_conf("l1-size = 32MiB\nchunk-size = 16\nlog-level = debug\nmax-clients = 8\n");
    reload(&d, 1, "Reloaded the configuration: ");
    assert_int_equal(kvpt_log_count(&d, "INFO  Reload: log-level changed from info to debug"), 1);
    assert_int_equal(kvpt_log_count(&d, "WARN  Reload: l1-size changed from 16777216 to 33554432 "
                                        "in the configuration; it takes effect at the next start"),
                     1);
    assert_int_equal(kvpt_log_count(&d, "max-clients"), 0);
    assert_int_equal(kvpt_log_count(&d, "Reloaded the configuration: 1 change(s) applied, 1 "
                                        "waiting for a restart"),
                     1);
    connect_once(&d);
    assert_true(kvpt_log_wait(&d, " DEBUG Connection ", 5000));

    /* Still the same daemon, serving the same cache to the same connection. */
    assert_int_equal(d.pid, pid);
    assert_int_equal(kill(pid, 0), 0);
    assert_int_equal(kvpt_log_count(&d, " ready: "), 1);
    kvpt_assert_seq(inst, 1, 4, 4);
    assert_int_equal(kvpt_stat(c, "pool_size"), 16u << 20);

    /* A file with an error: reported, nothing changes (debug stays on). */
    write_conf("l1-size = 16MiB\nchunk-size = 16\nlog-level = loud\n");
    reload(&d, 2, "Configuration not reloaded: it has an error (above); nothing changed");
    snprintf(want, sizeof(want), "ERROR invalid log-level 'loud' (from %s:3)", conf);
    assert_int_equal(kvpt_log_count(&d, want), 1);
    int opened = kvpt_log_count(&d, " DEBUG Connection ");
    connect_once(&d);
    for (int i = 0; i < 100 && kvpt_log_count(&d, " DEBUG Connection ") == opened; i++)
        kvpt_sleep_ms(50);
    assert_true(kvpt_log_count(&d, " DEBUG Connection ") > opened);

    /* So is a key given twice. */
    write_conf("log-level = info\nlog-level = warn\n");
    reload(&d, 3, "Configuration not reloaded");
    snprintf(want, sizeof(want), "%s:2: log-level is set twice, at line 1 and at line 2", conf);
    assert_int_equal(kvpt_log_count(&d, want), 1);

    /* Back to info, and to json lines: both at once. */
    write_conf("l1-size = 16MiB\nchunk-size = 16\nlog-level = info\nlog-format = json\n");
    reload(&d, 4, "\"msg\":\"Reloaded the configuration: 2 change(s) applied, 0 waiting");
    opened = kvpt_log_count(&d, "Connection ");
    connect_once(&d);
    kvpt_sleep_ms(200);
    assert_int_equal(kvpt_log_count(&d, "Connection "), opened);
    kvpt_assert_seq(inst, 1, 4, 4);

    kvp_client_close(c);
    assert_int_equal(kvpt_daemon_signal_wait(&d, SIGTERM), 0); /* SIGTERM still stops it */
    assert_true(kvpt_log_wait(&d, "\"msg\":\"kvpoold stopped\"", 1000));
    kvpt_daemon_stop(&d);
    unlink(conf);
    rmdir(tmpl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sighup_reloads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
