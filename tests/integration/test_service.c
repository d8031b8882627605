/*
 * test_service.c - kvpoold as a service: the systemd notification protocol, the json log
 * format and the configuration file, on the real daemon.
 *
 * systemd is not needed (nor, usually, PID 1 here): the test plays the service manager's part.
 * It binds an AF_UNIX datagram socket, starts kvpoold with NOTIFY_SOCKET naming it, and reads
 * what arrives: READY=1 only once the daemon serves, MAINPID= the daemon's pid, STATUS= progress
 * while the rest of the pool is reserved in the background, STOPPING=1 at SIGTERM.
 *
 * json lines are decoded with jansson, each one: a line a log shipper cannot parse is a failure.
 */
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static char dir[64]; /* this test's files: notify socket, configuration files */

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/kvpt-svc-XXXXXX");
    assert_non_null(mkdtemp(dir));
    return 0;
}

/* A failed case skips its own clean-up: no variable it set may reach the next case. */
static int teardown(void **state)
{
    char cmd[128];
    (void)state;
    unsetenv("NOTIFY_SOCKET");
    unsetenv("KVPOOL_PROGRESS_INTERVAL_MS");
    unsetenv("KVPOOL_CONFIG");
    unsetenv("KVPOOL_CHUNK_SIZE");
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* The datagram socket of a service manager, at path. */
static int notify_socket(const char *path)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* The next notification within timeout_ms into buf (NUL-terminated); false if none came. */
static bool next_msg(int fd, char *buf, size_t size, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, timeout_ms) != 1)
        return false;
    ssize_t n = recv(fd, buf, size - 1, 0);
    assert_true(n > 0);
    buf[n] = '\0';
    return true;
}

/* True if the message has the line "key=value" (value NULL: any value). */
static bool has_line(const char *msg, const char *key, const char *value)
{
    char want[256];
    int n = snprintf(want, sizeof(want), "%s=%s", key, value ? value : "");
    for (const char *l = msg; *l;) {
        const char *nl = strchr(l, '\n');
        size_t len = nl ? (size_t)(nl - l) : strlen(l);
        if (value ? len == (size_t)n && !strncmp(l, want, len) : !strncmp(l, want, (size_t)n))
            return true;
        l += len + (nl ? 1 : 0);
    }
    return false;
}

/*
 * READY=1 comes after the pool's progress, once the daemon serves: at that moment the ready line
 * is in the log and a client gets answers. STOPPING=1 follows SIGTERM.
 */
static void test_notify_protocol(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char path[128], msg[4096], pid[32];
    const char *args[] = {"--l1-size", "768MiB", "--chunk-size", "16", NULL};

    snprintf(path, sizeof(path), "%s/notify.sock", dir);
    int fd = notify_socket(path);
    setenv("NOTIFY_SOCKET", path, 1);
    setenv("KVPOOL_PROGRESS_INTERVAL_MS", "0", 1); /* a progress line after every 256 MiB */
    kvpt_daemon_spawn(&d, NULL, args);
    unsetenv("NOTIFY_SOCKET");
    unsetenv("KVPOOL_PROGRESS_INTERVAL_MS");
    snprintf(pid, sizeof(pid), "%d", (int)d.pid);

    /* The first part of the pool is one step: no progress before READY=1. */
    if (!next_msg(fd, msg, sizeof(msg), 30000))
        fail_msg("no READY=1 within 30 s");
    assert_true(has_line(msg, "READY", "1"));

    /* Ready means serving: the line is in the log and a client is answered, right now. */
    assert_int_equal(kvpt_log_count(&d, " ready: pool 805306368 bytes"), 1);
    kvpt_assert_serves(&d);
    assert_true(has_line(msg, "MAINPID", pid));
    assert_non_null(strstr(msg, "\nSTATUS=kvpoold " KVP_VERSION_STRING " ready: pool 805306368 "
                                "bytes (268431360 reserved, 536875008 more in the "
                                "background), "));
    assert_non_null(strstr(msg, d.socket));

    /* The background reservation: its progress, then its end, as STATUS= alone (a service
     * manager has nothing left to time out). */
    const char *progress[] = {"STATUS=Reserving the pool: 536870912 of 805310464 bytes (66%), ",
                              "STATUS=Reserving the pool: 805306368 of 805310464 bytes (99%), "};
    for (int i = 0; i < 2; i++) {
        assert_true(next_msg(fd, msg, sizeof(msg), 30000));
        if (strncmp(msg, progress[i], strlen(progress[i])) != 0 || strchr(msg, '\n'))
            fail_msg("expected \"%s...\" alone, got \"%s\"", progress[i], msg);
    }
    assert_true(next_msg(fd, msg, sizeof(msg), 30000));
    assert_string_equal(msg, "STATUS=Serving; the whole pool (805306368 bytes) is reserved");
    assert_false(next_msg(fd, msg, sizeof(msg), 200)); /* nothing while it serves */

    assert_int_equal(kvpt_daemon_signal_wait(&d, SIGTERM), 0);
    assert_true(next_msg(fd, msg, sizeof(msg), 5000));
    assert_true(has_line(msg, "STOPPING", "1"));
    assert_false(next_msg(fd, msg, sizeof(msg), 200));
    close(fd);
    kvpt_daemon_stop(&d);
}

/*
 * A daemon stopped while it reserves the rest of its pool says STOPPING=1 and stops at the
 * next step, without an error and without the "whole pool" status.
 */
static void test_notify_stop_during_warmup(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char path[128], msg[4096];
    const char *args[] = {"--l1-size", "4GiB", "--chunk-size", "16", NULL};

    snprintf(path, sizeof(path), "%s/notify.sock", dir);
    int fd = notify_socket(path);
    setenv("NOTIFY_SOCKET", path, 1);
    kvpt_daemon_spawn(&d, NULL, args);
    unsetenv("NOTIFY_SOCKET");
    assert_true(next_msg(fd, msg, sizeof(msg), 20000));
    assert_true(has_line(msg, "READY", "1"));
    assert_int_equal(kvpt_daemon_signal_wait(&d, SIGTERM), 0);
    bool stopping = false, whole = false;
    while (next_msg(fd, msg, sizeof(msg), 500)) {
        stopping |= has_line(msg, "STOPPING", "1");
        whole |= strstr(msg, "whole pool") != NULL;
    }
    assert_true(stopping);
    /* 4 GiB at a few GB/s: the reservation is usually still running when the signal comes. */
    if (whole)
        fprintf(stderr, "note: the reservation ended before the stop request\n");
    assert_int_equal(kvpt_log_count(&d, " ERROR "), 0);
    close(fd);
    kvpt_daemon_stop(&d);
}

/* Every line of the log, decoded; fails the test on a line that is not a JSON object. */
static json_t *log_objects(const struct kvpt_daemon *d)
{
    json_error_t e;
    FILE *f = fopen(d->log, "re");
    assert_non_null(f);
    json_t *all = json_array();
    char line[8192];
    while (fgets(line, sizeof(line), f)) {
        size_t n = strlen(line);
        assert_true(n > 0 && line[n - 1] == '\n');
        json_t *o = json_loads(line, 0, &e);
        if (!o || !json_is_object(o))
            fail_msg("log line is not a JSON object (%s): %s", e.text, line);
        json_array_append_new(all, o);
    }
    fclose(f);
    return all;
}

static const char *str_of(json_t *o, const char *key)
{
    const char *v = json_string_value(json_object_get(o, key));
    if (!v)
        fail_msg("no string \"%s\" in %s", key, json_dumps(o, 0));
    return v;
}

/* The first object whose msg starts with prefix, or NULL. */
static json_t *find_msg(json_t *all, const char *prefix)
{
    size_t i;
    json_t *o;
    json_array_foreach(all, i, o)
    {
        if (strncmp(str_of(o, "msg"), prefix, strlen(prefix)) == 0)
            return o;
    }
    return NULL;
}

/*
 * --log-format json: every line one object with ts, level, msg and pid, the ready line and a
 * registration among them, and what needs escaping (here the socket path) escaped.
 */
static void test_json_log(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char socket[128];
    const char *args[] = {"--l1-size", "16MiB", "--chunk-size", "16", "--log-format", "json", NULL};

    /* A socket path with a quote, a backslash and a tab, all of which JSON escapes. */
    snprintf(socket, sizeof(socket), "%s/k\"v\\p\tool.sock", dir);
    kvpt_daemon_spawn(&d, socket, args);
    assert_true(kvpt_log_wait(&d, " ready: pool 16777216 bytes", 20000));
    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts o = kvpt_layout("json-worker", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    kvp_client_close(c);
    pid_t pid = d.pid;
    assert_int_equal(kvpt_daemon_signal_wait(&d, SIGTERM), 0);

    json_t *all = log_objects(&d);
    assert_true(json_array_size(all) >= 4);
    size_t i;
    json_t *line;
    json_array_foreach(all, i, line)
    {
        const char *ts = str_of(line, "ts"), *level = str_of(line, "level");
        int y, mo, dd, h, mi, s, ms;
        char z;
        assert_int_equal(strlen(ts), 24);
        assert_int_equal(sscanf(ts, "%4d-%2d-%2dT%2d:%2d:%2d.%3d%c", &y, &mo, &dd, &h, &mi, &s, &ms,
                                &z),
                         8);
        assert_int_equal(z, 'Z');
        assert_true(!strcmp(level, "debug") || !strcmp(level, "info") || !strcmp(level, "warn") ||
                    !strcmp(level, "error"));
        str_of(line, "msg");
        assert_int_equal(json_integer_value(json_object_get(line, "pid")), pid);
    }

    json_t *ready = find_msg(all, "kvpoold " KVP_VERSION_STRING " ready: pool 16777216 bytes, ");
    assert_non_null(ready);
    assert_string_equal(str_of(ready, "level"), "info");
    assert_string_equal(str_of(ready, "socket"), socket);
    assert_non_null(strstr(str_of(ready, "msg"), socket));
    assert_int_equal(json_integer_value(json_object_get(ready, "pool_bytes")), 16 << 20);
    assert_int_equal(json_integer_value(json_object_get(ready, "chunk_tokens")), 16);
    /* The registration's line, the same text as in text mode. */
    assert_non_null(find_msg(all, "Instance json-worker non-GPU context using "));
    assert_non_null(find_msg(all, "kvpoold stopped"));
    json_decref(all);
    kvpt_daemon_stop(&d);
}

/* Writes text to dir/name; returns the path (static storage). */
static const char *write_conf(const char *name, const char *text)
{
    static char path[128];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "we");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
    return path;
}

/* chunk_tokens and pool_size as the running daemon reports them. */
static void expect_served(const struct kvpt_daemon *d, uint64_t pool, uint64_t chunk_tokens)
{
    kvp_client *c = kvpt_connect(d);
    assert_int_equal(kvpt_stat(c, "chunk_tokens"), chunk_tokens);
    assert_int_equal(kvpt_stat(c, "pool_size"), pool);
    /* What a worker is told at registration, too. */
    kvp_register_opts o = kvpt_layout("conf-worker", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    assert_int_equal(kvp_instance_get_info(inst)->chunk_tokens, chunk_tokens);
    kvp_client_close(c);
}

/* --config end to end: the file's values are served; the environment and the command line win. */
static void test_config_file(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *path = write_conf("kvpoold.conf", "# a small pool\n"
                                                  "l1-size = 32MiB\n"
                                                  "chunk-size = 64   # tokens\n"
                                                  "log-format = json\n");
    char conf[128];
    snprintf(conf, sizeof(conf), "%s", path);

    const char *file_only[] = {"--config", conf, NULL};
    kvpt_daemon_start(&d, file_only);
    expect_served(&d, 32u << 20, 64);
    kvpt_daemon_stop(&d);

    /* The environment over the file; KVPOOL_CONFIG names it as well as --config. */
    setenv("KVPOOL_CONFIG", conf, 1);
    setenv("KVPOOL_CHUNK_SIZE", "48", 1);
    kvpt_daemon_start(&d, NULL);
    unsetenv("KVPOOL_CONFIG");
    unsetenv("KVPOOL_CHUNK_SIZE");
    expect_served(&d, 32u << 20, 48);
    kvpt_daemon_stop(&d);

    /* The command line over the file, the log format included: the seed's text line. */
    const char *cli[] = {"--config", conf, "--chunk-size", "32", "--log-format", "text", NULL};
    kvpt_daemon_start(&d, cli);
    expect_served(&d, 32u << 20, 32);
    assert_true(kvpt_log_wait(&d,
                              "Z INFO  kvpoold " KVP_VERSION_STRING " ready: pool 33554432 "
                              "bytes, ",
                              1000));
    assert_int_equal(kvpt_log_count(&d, "{\"ts\""), 0);
    kvpt_daemon_stop(&d);
}

/* A bad file stops the daemon with status 2 and FILE:LINE, unless the command line overrides
 * the bad value. */
static void test_config_file_errors(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char want[256], conf[128];
    snprintf(conf, sizeof(conf), "%s",
             write_conf("bad.conf", "chunk-size = 16\n"
                                    "l1-size = lots\n"));
    const char *args[] = {"--config", conf, NULL};
    kvpt_daemon_spawn(&d, NULL, args);
    assert_int_equal(kvpt_daemon_wait_exit(&d, 20000), 2);
    snprintf(want, sizeof(want), "kvpoold: invalid l1-size 'lots' (from %s:2)", conf);
    assert_true(kvpt_log_wait(&d, want, 1000));
    assert_int_equal(kvpt_log_count(&d, "Reserving"), 0);
    kvpt_daemon_stop(&d);

    const char *overridden[] = {"--config", conf, "--l1-size", "16MiB", NULL};
    kvpt_daemon_start(&d, overridden);
    snprintf(want, sizeof(want), "ignoring invalid l1-size 'lots' at %s:2", conf);
    assert_true(kvpt_log_wait(&d, want, 1000));
    expect_served(&d, 16u << 20, 16);
    kvpt_daemon_stop(&d);

    snprintf(conf, sizeof(conf), "%s", write_conf("typo.conf", "chunk_size = 16\n"));
    kvpt_daemon_spawn(&d, NULL, args);
    assert_int_equal(kvpt_daemon_wait_exit(&d, 20000), 2);
    snprintf(want, sizeof(want), "kvpoold: %s:1: unknown key 'chunk_size'", conf);
    assert_true(kvpt_log_wait(&d, want, 1000));
    kvpt_daemon_stop(&d);
}

/* contrib/kvpoold.conf, the example next to the unit, is a file the daemon accepts. */
static void test_example_config(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char conf[512];
    const char *src = __FILE__, *end = strstr(src, "tests/integration/test_service.c");
    if (!end || src[0] != '/') {
        fprintf(stderr, "skipped: the source tree is not known (__FILE__ = %s)\n", src);
        skip();
    }
    snprintf(conf, sizeof(conf), "%.*scontrib/kvpoold.conf", (int)(end - src), src);
    const char *args[] = {"--config", conf, "--l1-size", "16MiB", NULL};
    kvpt_daemon_start(&d, args);
    expect_served(&d, 16u << 20, 256);
    assert_int_equal(kvpt_log_count(&d, "ignoring"), 0);
    kvpt_daemon_stop(&d);
}

/* Every commented "# name = value" line of the example is an option with a value the daemon
 * accepts: the file with those lines uncommented starts it (what needs something of this
 * machine, Redis, the password file, the ports, is switched off on the command line, which
 * wins over the file). */
static void test_example_config_comments(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char conf[512], line[512], text[8192] = "";
    size_t len = 0;
    int uncommented = 0;
    const char *src = __FILE__, *end = strstr(src, "tests/integration/test_service.c");
    if (!end || src[0] != '/') {
        fprintf(stderr, "skipped: the source tree is not known (__FILE__ = %s)\n", src);
        skip();
    }
    snprintf(conf, sizeof(conf), "%.*scontrib/kvpoold.conf", (int)(end - src), src);
    FILE *f = fopen(conf, "re");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f)) {
        const char *l = line;
        char name[64];
        if (strncmp(l, "# ", 2) == 0 && sscanf(l + 2, "%63[a-z0-9-] =", name) == 1 &&
            strstr(l, " = ")) {
            l += 2;
            uncommented++;
        }
        len += (size_t)snprintf(text + len, sizeof(text) - len, "%s", l);
        assert_true(len < sizeof(text));
    }
    fclose(f);
    /* shm, socket, access, limits, HTTP, L2 and LMCache lines at least. */
    assert_true(uncommented >= 20);
    const char *path = write_conf("uncommented.conf", text);
    const char *args[] = {"--config",           path,   "--l1-size", "16MiB",     "--http",
                          "127.0.0.1:0",        "--l2", "off",       "--lmcache", "off",
                          "--l2-password-file", "",     NULL};
    kvpt_daemon_start(&d, args);
    expect_served(&d, 16u << 20, 256);
    kvpt_daemon_stop(&d);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_notify_protocol),
        T(test_notify_stop_during_warmup),
        T(test_json_log),
        T(test_config_file),
        T(test_config_file_errors),
        T(test_example_config),
        T(test_example_config_comments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
