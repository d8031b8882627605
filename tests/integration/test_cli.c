/*
 * test_cli.c - the `kvpool` command-line tool and kvpoold's own command line, as a user runs
 * them: output, exit codes and messages, against the real daemon (whose HTTP endpoint is off:
 * the command line needs only the socket).
 *
 * The tool runs through the shell (popen) with its output captured, or on a pseudo-terminal of
 * its own (forkpty) where a terminal matters: the question `clear` asks, the screen `watch`
 * redraws. What the daemon did is checked through the library, independently of the tool.
 */
#include <errno.h>
#include <poll.h>
#include <pty.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/kvp_assert.h"
#include "harness.h"

#define OUT_SIZE 65536

/* Runs cmd through the shell with redir appended, captures its output into out. Returns the
 * exit status. */
static int run_redir(const char *cmd, const char *redir, char *out, size_t size)
{
    char full[1024];
    snprintf(full, sizeof(full), "%s %s", cmd, redir);
    FILE *p = popen(full, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Runs cmd through the shell, captures stdout+stderr into out. Returns the exit status. */
static int run(const char *cmd, char *out, size_t size)
{
    return run_redir(cmd, "2>&1", out, size);
}

/* `kvpool --socket <d's socket> args` with stdout only in out (stdin is /dev/null: no
 * terminal). Returns the exit status. */
static int cli(const struct kvpt_daemon *d, const char *args, char *out, size_t size)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s --socket %s %s </dev/null", KVP_TEST_CLI, d->socket, args);
    return run_redir(cmd, "2>/dev/null", out, size);
}

/* The line of text that contains s (copied into line), failing the test if there is none. */
static const char *line_with(const char *text, const char *s, char *line, size_t size)
{
    const char *p = strstr(text, s);
    if (!p)
        fail_msg("no line with '%s' in:\n%s", s, text);
    const char *b = p, *e = strchr(p, '\n');
    while (b > text && b[-1] != '\n')
        b--;
    size_t n = e ? (size_t)(e - b) : strlen(b);
    snprintf(line, size, "%.*s", (int)(n < size ? n : size - 1), b);
    return line;
}

static int count_of(const char *text, const char *s)
{
    int n = 0;
    for (const char *p = strstr(text, s); p; p = strstr(p + 1, s))
        n++;
    return n;
}

/* ---- a pseudo-terminal for the tool ---- */

struct pty {
    pid_t pid;
    int fd;             /* the terminal's master side */
    char buf[OUT_SIZE]; /* everything the tool wrote so far */
    size_t len;
};

/* Starts `kvpool --socket <socket> <args...>` (args NULL-terminated, at most 6) on a new
 * terminal that is its stdin, stdout and stderr. */
static void pty_start(struct pty *t, const char *socket, const char *const *args)
{
    const char *argv[10] = {"kvpool", "--socket", socket};
    int n = 3;
    for (; args[n - 3] && n < 9; n++)
        argv[n] = args[n - 3];
    argv[n] = NULL;
    t->len = 0;
    t->buf[0] = '\0';
    t->pid = forkpty(&t->fd, NULL, NULL, NULL);
    assert_true(t->pid >= 0);
    if (t->pid == 0) {
        execv(KVP_TEST_CLI, (char *const *)argv);
        _exit(127);
    }
}

/* Reads what the tool writes until its output contains s (true) or timeout_ms pass or it
 * closes the terminal (false). */
static bool pty_wait_for(struct pty *t, const char *s, int timeout_ms)
{
    uint64_t deadline = kvpt_now_ms() + (uint64_t)timeout_ms;
    while (!strstr(t->buf, s)) {
        int left = (int)(deadline - kvpt_now_ms());
        struct pollfd p = {.fd = t->fd, .events = POLLIN};
        if (kvpt_now_ms() >= deadline || poll(&p, 1, left) <= 0)
            return false;
        ssize_t n = read(t->fd, t->buf + t->len, sizeof(t->buf) - 1 - t->len);
        if (n <= 0) /* EIO: the tool exited and closed its side */
            return false;
        t->len += (size_t)n;
        t->buf[t->len] = '\0';
    }
    return true;
}

/* Types text on the terminal. */
static void pty_type(struct pty *t, const char *text)
{
    assert_int_equal(write(t->fd, text, strlen(text)), (ssize_t)strlen(text));
}

/* Reads the rest of the output, waits for the tool and returns its exit status. */
static int pty_finish(struct pty *t)
{
    int st;
    pty_wait_for(t, "\x01never\x01", 10000);
    close(t->fd);
    assert_int_equal(waitpid(t->pid, &st, 0), t->pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- what the tests store ---- */

/* Stores chunks [0, n) of sequence seq through inst (chunk_bytes from inst), content
 * kvpt_fill(seq, i). */
static void store_seq(kvp_instance *inst, uint32_t seq, uint32_t n)
{
    const kvp_instance_info *info = kvp_instance_get_info(inst);
    uint32_t ntok = n * info->chunk_tokens;
    uint32_t *ids = kvpt_tokens(seq, ntok);
    kvp_tokens t = {.ids = ids, .count = ntok};
    void *bufs[8];
    assert_true(n <= 8);
    for (uint32_t i = 0; i < n; i++) {
        bufs[i] = malloc(info->chunk_bytes);
        assert_non_null(bufs[i]);
        kvpt_fill(bufs[i], info->chunk_bytes, seq, i);
    }
    assert_rc(kvp_store(inst, &t, 0, ntok, (const void *const *)bufs, NULL), n);
    for (uint32_t i = 0; i < n; i++)
        free(bufs[i]);
    free(ids);
}

/* kvp_lookup() of the first n chunks of sequence seq. */
static int lookup_seq(kvp_instance *inst, uint32_t seq, uint32_t n)
{
    uint32_t ntok = n * kvp_instance_get_info(inst)->chunk_tokens;
    uint32_t *ids = kvpt_tokens(seq, ntok);
    kvp_tokens t = {.ids = ids, .count = ntok};
    int rc = kvp_lookup(inst, &t);
    free(ids);
    return rc;
}

static const char *const small_daemon[] = {"--l1-size", "4MiB", "--chunk-size", "16", NULL};

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

    /* The daemon is gone: exit status 2 and a message naming the socket, not a hang. */
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
    snprintf(cmd, sizeof(cmd), "%s --socket %s ping", KVP_TEST_CLI, d.socket);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
    assert_non_null(strstr(out, "cannot reach kvpoold"));
    assert_non_null(strstr(out, d.socket));
}

/* Every command that needs the daemon says which socket it could not reach, with exit 2. */
static void test_unreachable_socket(void **state)
{
    (void)state;
    static const char *const cmds[] = {
        "status",      "status --json", "instances", "metrics", "watch --once -n 0.1",
        "clear --yes", "stats",         "ping"};
    const char *sock = "/nonexistent/kvpool-cli-test.sock";
    char cmd[512], out[8192];

    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        snprintf(cmd, sizeof(cmd), "%s --socket %s %s", KVP_TEST_CLI, sock, cmds[i]);
        /* stderr only: one line, nothing on stdout. */
        int rc = run_redir(cmd, "2>&1 >/dev/null", out, sizeof(out));
        if (rc != 2)
            fail_msg("'%s': exit %d, expected 2: %s", cmds[i], rc, out);
        /* The socket once, the reason once. */
        if (strcmp(out, "kvpool: cannot reach kvpoold at /nonexistent/kvpool-cli-test.sock: No "
                        "such file or directory\n") != 0)
            fail_msg("'%s': %s", cmds[i], out);
    }
    snprintf(cmd, sizeof(cmd), "KVPOOL_SOCKET=%s %s status", sock, KVP_TEST_CLI);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
    assert_non_null(strstr(out, sock));

    /* version still reports what it knows: its own and the library's versions. */
    snprintf(cmd, sizeof(cmd), "%s --socket %s version", KVP_TEST_CLI, sock);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "kvpool " KVP_VERSION_STRING "\n"));
    assert_non_null(strstr(out, "libkvpool " KVP_VERSION_STRING "\n"));
    assert_non_null(strstr(out, "kvpoold: not reachable at /nonexistent/kvpool-cli-test.sock"));
}

/* The global options work after the command too, and the later one wins. */
static void test_global_options_after_command(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char cmd[1024], out[OUT_SIZE];
    kvpt_daemon_start(&d, small_daemon);

    snprintf(cmd, sizeof(cmd), "%s ping --socket %s", KVP_TEST_CLI, d.socket);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, ": ok ("));
    snprintf(cmd, sizeof(cmd), "%s status --json -t 5000 -s %s", KVP_TEST_CLI, d.socket);
    assert_int_equal(run_redir(cmd, "2>/dev/null", out, sizeof(out)), 0);
    json_t *doc = json_loads(out, 0, NULL);
    assert_non_null(doc);
    json_decref(doc);
    snprintf(cmd, sizeof(cmd),
             "KVPOOL_SOCKET=/nonexistent/kvpool.sock %s stats --timeout=5000 "
             "--socket=%s",
             KVP_TEST_CLI, d.socket);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "pool_size 4194304\n"));
    snprintf(cmd, sizeof(cmd),
             "%s --socket /nonexistent/kvpool.sock watch --once -n 0.1 --socket %s", KVP_TEST_CLI,
             d.socket);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, d.socket));
    snprintf(cmd, sizeof(cmd), "%s --socket %s ping --socket /nonexistent/kvpool.sock",
             KVP_TEST_CLI, d.socket);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
    assert_non_null(strstr(out, "/nonexistent/kvpool.sock"));
    kvpt_daemon_stop(&d);
}

/* A bad command line is one line on stderr and exit 64, found before any connection: these
 * point at a socket nobody listens on, and still get 64, not 2. */
static void test_usage_errors(void **state)
{
    (void)state;
    static const struct {
        const char *args, *line;
    } cases[] = {
        {"frobnicate", "kvpool: unknown command 'frobnicate' (see 'kvpool --help')\n"},
        {"", "kvpool: missing command (see 'kvpool --help')\n"},
        {"--bogus status", "kvpool: unknown option '--bogus' (see 'kvpool --help')\n"},
        {"status --bogus", "kvpool: status: unknown option '--bogus' (see 'kvpool --help')\n"},
        {"status --once", "kvpool: status: unknown option '--once' (see 'kvpool --help')\n"},
        {"status extra", "kvpool: status: unexpected argument 'extra' (see 'kvpool --help')\n"},
        {"ping extra", "kvpool: ping: unexpected argument 'extra' (see 'kvpool --help')\n"},
        {"watch --interval", "kvpool: watch: option '--interval' needs a value (see 'kvpool "
                             "--help')\n"},
        {"watch -n 0", "kvpool: watch: invalid interval '0': expected seconds from 0.1 to 86400 "
                       "(see 'kvpool --help')\n"},
        {"--timeout 0 ping", "kvpool: invalid timeout '0': expected milliseconds >= 1 (see "
                             "'kvpool --help')\n"},
        {"ping --timeout 0", "kvpool: invalid timeout '0': expected milliseconds >= 1 (see "
                             "'kvpool --help')\n"},
        {"ping --socket", "kvpool: ping: option '--socket' needs a value (see 'kvpool --help')\n"},
        {"status -s ''", "kvpool: --socket needs a path (see 'kvpool --help')\n"},
    };
    char cmd[512], out[8192];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(cmd, sizeof(cmd), "%s --socket /nonexistent/kvpool.sock %s", KVP_TEST_CLI,
                 cases[i].args);
        int rc = run_redir(cmd, "2>&1 >/dev/null", out, sizeof(out));
        if (rc != 64 || strcmp(out, cases[i].line) != 0)
            fail_msg("'%s': exit %d, stderr '%s'; expected 64, '%s'", cases[i].args, rc, out,
                     cases[i].line);
    }
    /* clear without --yes and without a terminal to ask on refuses, before connecting. */
    snprintf(cmd, sizeof(cmd), "%s --socket /nonexistent/kvpool.sock clear </dev/null",
             KVP_TEST_CLI);
    assert_int_equal(run(cmd, out, sizeof(out)), 64);
    assert_non_null(strstr(out, "--yes"));
    assert_int_equal(count_of(out, "\n"), 1);

    snprintf(cmd, sizeof(cmd), "%s --help", KVP_TEST_CLI);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    static const char *const listed[] = {"status [--json]", "instances", "metrics",
                                         "watch",           "--once",    "clear",
                                         "--yes",           "stats",     "ping",
                                         "version",         "64"};
    for (size_t i = 0; i < sizeof(listed) / sizeof(listed[0]); i++)
        if (!strstr(out, listed[i]))
            fail_msg("--help does not mention '%s':\n%s", listed[i], out);
    snprintf(cmd, sizeof(cmd), "%s status --help", KVP_TEST_CLI);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "Usage: kvpool"));
}

/* One worker on each transport: the summary names both, with the transport and the reason. */
static void test_status_and_instances(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char out[OUT_SIZE], line[512];
    kvpt_daemon_start(&d, small_daemon);
    kvp_client *c = kvpt_connect(&d);
    kvp_instance *shm = NULL, *inl = NULL;
    kvp_register_opts o = kvpt_layout("cli-shm-worker", KVP_TRANSPORT_SHM);
    assert_rc(kvp_register(c, &o, &shm), 0);
    o = kvpt_layout("cli-inline-worker", KVP_TRANSPORT_INLINE);
    assert_rc(kvp_register(c, &o, &inl), 0);
    store_seq(shm, 1, 2);

    assert_int_equal(cli(&d, "status", out, sizeof(out)), 0);
    assert_non_null(strstr(out, "kvpoold " KVP_VERSION_STRING " at "));
    assert_non_null(strstr(out, d.socket));
    assert_non_null(strstr(out, ": serving, pid "));
    line_with(out, "Pool:", line, sizeof(line));
    assert_non_null(strstr(line, "of 4.00 MiB used"));
    assert_non_null(strstr(line, "2 objects (0 pinned, 0 reserved)"));
    assert_non_null(strstr(out, "\nChunk size: 16 tokens\n"));
    line_with(out, "SHM:", line, sizeof(line));
    assert_non_null(strstr(line, "enabled, posix segment /dev/shm/"));
    assert_non_null(strstr(line, d.shm_name));
    assert_non_null(strstr(out, "Instances:  2 (1 shm, 1 inline)\n"));
    line_with(out, "Clients:", line, sizeof(line));
    assert_string_equal(line, "Clients:    1 connected besides this command (max 256)");
    line_with(out, "TRANSPORT", line, sizeof(line));
    assert_non_null(strstr(line, "  FRONT END  TRANSPORT"));
    line_with(out, "cli-shm-worker", line, sizeof(line));
    assert_non_null(strstr(line, "test-model"));
    assert_non_null(strstr(line, "0/1"));
    assert_non_null(strstr(line, " kvpool "));
    assert_true(strlen(line) >= 4 && strcmp(line + strlen(line) - 4, " shm") == 0);
    line_with(out, "cli-inline-worker", line, sizeof(line));
    assert_non_null(strstr(line, " kvpool "));
    assert_non_null(strstr(line, " inline (requested by worker)"));
    char pid[32];
    snprintf(pid, sizeof(pid), " %d ", (int)getpid());
    assert_non_null(strstr(line, pid));

    assert_int_equal(cli(&d, "instances", out, sizeof(out)), 0);
    line_with(out, "TRANSPORT", line, sizeof(line));
    assert_true(strncmp(line, "ID ", 3) == 0);
    assert_non_null(strstr(line, "MODEL"));
    line_with(out, "cli-shm-worker", line, sizeof(line));
    assert_non_null(strstr(line, "float16"));
    assert_non_null(strstr(line, "16.0 KiB")); /* stored: 2 chunks of 8 KiB */
    line_with(out, "cli-inline-worker", line, sizeof(line));
    assert_non_null(strstr(line, " kvpool "));
    assert_non_null(strstr(line, "inline (requested by worker)"));
    assert_int_equal(count_of(out, "\n"), 3);

    kvp_client_close(c);
    assert_int_equal(cli(&d, "instances", out, sizeof(out)), 0);
    assert_string_equal(out, "No instance is registered.\n");
    kvpt_daemon_stop(&d);
}

/* Whether text holds a byte that a terminal takes for a control: C0 (but a line break), DEL,
 * a raw C1 byte, or a C1 control in UTF-8. Returns its offset, or -1. */
static long terminal_control_at(const char *text)
{
    const unsigned char *u = (const unsigned char *)text;
    for (long i = 0; u[i]; i++) {
        if ((u[i] < 0x20 && u[i] != '\n') || u[i] == 0x7f)
            return i;
        if (u[i] == 0xc2 && u[i + 1] >= 0x80 && u[i + 1] <= 0x9f)
            return i;
        if (u[i] >= 0x80 && u[i] <= 0x9f && (i == 0 || u[i - 1] != 0xc2) &&
            (i == 0 || (u[i - 1] & 0xe0) != 0xe0) && (i < 2 || (u[i - 2] & 0xf0) != 0xf0))
            return i; /* not a continuation byte of a well-formed sequence we print */
    }
    return -1;
}

/*
 * Worker-chosen names reach the operator's terminal only escaped: an instance id with ESC
 * sequences and a C1 control in UTF-8 (U+009B CSI), a model name with U+009D OSC, a bell and
 * an ESC-] title, in every view that prints them; an id with a raw 0x9b byte (which this
 * daemon already replaces, being no UTF-8) leaves no control either. `status --json` stays
 * JSON that means the same names.
 */
static void test_worker_names_are_escaped(void **state)
{
    (void)state;
    static const char evil_id[] = "evil\x1b[2J\xc2\x9b"
                                  "31m\x07";
    static const char evil_model[] = "m\xc2\x9d"
                                     "0;pwned\x07\x1b]2;t\x1b\\";
    struct kvpt_daemon d;
    char out[OUT_SIZE], line[1024];
    kvpt_daemon_start(&d, small_daemon);
    kvp_client *c = kvpt_connect(&d);
    kvp_instance *inst = NULL;
    kvp_register_opts o = kvpt_layout(evil_id, KVP_TRANSPORT_INLINE);
    o.model_name = evil_model;
    assert_rc(kvp_register(c, &o, &inst), 0);
    o = kvpt_layout("raw\x9b"
                    "31m",
                    KVP_TRANSPORT_INLINE);
    assert_rc(kvp_register(c, &o, &inst), 0);

    static const char *const views[] = {"status", "instances"};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(cli(&d, views[i], out, sizeof(out)), 0);
        long at = terminal_control_at(out);
        if (at >= 0)
            fail_msg("'%s' prints a terminal control (0x%02x) at %ld:\n%s", views[i],
                     (unsigned char)out[at], at, out);
        line_with(out, "evil", line, sizeof(line));
        assert_non_null(strstr(line, "evil\\x1b[2J\\u009b31m\\x07"));
        assert_non_null(strstr(line, "m\\u009d0;pwned\\x07\\x1b]2;t\\x1b\\"));
    }

    assert_int_equal(cli(&d, "status --json", out, sizeof(out)), 0);
    assert_int_equal(terminal_control_at(out), -1);
    json_error_t err;
    json_t *doc = json_loads(out, 0, &err);
    if (!doc)
        fail_msg("status --json is not JSON: %s:\n%s", err.text, out);
    json_t *listed = json_array_get(json_object_get(doc, "instances"), 0);
    assert_string_equal(json_string_value(json_object_get(listed, "model_name")), evil_model);
    assert_string_equal(json_string_value(json_object_get(listed, "instance_id")), evil_id);
    json_decref(doc);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

/*
 * While the daemon reserves a 4 GiB pool in the background, the pool line says how much is
 * reserved so far (whenever a status lands in that window, which is not forced); once the log
 * says the reservation ended, it no longer does, and the JSON says the whole pool is reserved.
 */
static void test_status_while_reserving(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char out[OUT_SIZE], line[512];
    const char *args[] = {"--l1-size", "4GiB", "--chunk-size", "16", NULL};
    kvpt_daemon_start(&d, args);
    int seen = 0;
    for (int i = 0; i < 400 && kvpt_log_count(&d, "INFO  Reserved ") == 0; i++) {
        assert_int_equal(cli(&d, "status", out, sizeof(out)), 0);
        line_with(out, "Pool:", line, sizeof(line));
        const char *so_far = strstr(line, " reserved so far");
        if (so_far) {
            seen++;
            assert_non_null(strstr(line, "of 4.00 GiB used"));
            assert_non_null(strstr(line, " of 4.00 GiB reserved so far"));
        }
        kvpt_sleep_ms(10);
    }
    assert_true(kvpt_log_wait(&d, "INFO  Reserved ", 60000));
    assert_int_equal(cli(&d, "status", out, sizeof(out)), 0);
    line_with(out, "Pool:", line, sizeof(line));
    assert_null(strstr(line, "so far"));
    assert_int_equal(cli(&d, "status --json", out, sizeof(out)), 0);
    json_t *doc = json_loads(out, 0, NULL);
    assert_non_null(doc);
    json_t *pool = json_object_get(doc, "pool");
    assert_true(json_is_false(json_object_get(pool, "warming")));
    assert_int_equal(json_integer_value(json_object_get(pool, "reserved_bytes")), 4ll << 30);
    json_decref(doc);
    fprintf(stderr, "note: %d status(es) caught the reservation in progress\n", seen);
    kvpt_daemon_stop(&d);
}

/* Without shared memory the summary says why; --json is the daemon's document, and its
 * numbers are what the test did. */
static void test_status_json(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "4MiB", "--chunk-size", "16", "--shm-name", "", NULL};
    char out[OUT_SIZE], line[512];
    json_error_t err;
    kvpt_daemon_start(&d, args);

    kvp_client *c = kvpt_connect(&d);
    kvp_instance *a = NULL, *b = NULL;
    kvp_register_opts o = kvpt_layout("cli-json-a", KVP_TRANSPORT_AUTO);
    assert_rc(kvp_register(c, &o, &a), 0);
    o = kvpt_layout("cli-json-b", KVP_TRANSPORT_INLINE);
    assert_rc(kvp_register(c, &o, &b), 0);
    store_seq(a, 7, 3);
    assert_rc(lookup_seq(a, 7, 4), 3);
    assert_rc(lookup_seq(b, 8, 2), 0);

    assert_int_equal(cli(&d, "status", out, sizeof(out)), 0);
    line_with(out, "SHM:", line, sizeof(line));
    assert_non_null(strstr(line, "SHM:        disabled by configuration (every worker"));
    assert_null(strstr(line, "SHM disabled")); /* said once, not "disabled: SHM disabled" */
    line_with(out, "cli-json-a", line, sizeof(line));
    assert_non_null(strstr(line, "inline (SHM disabled by configuration)"));
    line_with(out, "Totals:", line, sizeof(line));
    assert_non_null(strstr(line, "lookup hit ratio 50.0%")); /* 3 of 4 + 2 chunks */

    assert_int_equal(cli(&d, "status --json", out, sizeof(out)), 0);
    json_t *doc = json_loads(out, 0, &err);
    if (!doc)
        fail_msg("status --json is not JSON: %s at line %d:\n%s", err.text, err.line, out);
    assert_string_equal(json_string_value(json_object_get(doc, "version")), KVP_VERSION_STRING);
    assert_string_equal(json_string_value(json_object_get(doc, "state")), "serving");
    assert_int_equal(json_integer_value(json_object_get(doc, "pid")), d.pid);
    json_t *list = json_object_get(doc, "instances");
    assert_int_equal(json_array_size(list), 2);
    for (size_t i = 0; i < 2; i++)
        assert_string_equal(json_string_value(
                                json_object_get(json_array_get(list, i), "transport")),
                            "inline");
    json_t *counters = json_object_get(doc, "counters");
    json_t *pool = json_object_get(doc, "pool");
    assert_int_equal(json_integer_value(json_object_get(counters, "lookups")), 2);
    assert_int_equal(json_integer_value(json_object_get(counters, "lookup_chunks")), 6);
    assert_int_equal(json_integer_value(json_object_get(counters, "lookup_hit_chunks")), 3);
    assert_int_equal(json_integer_value(json_object_get(counters, "store_chunks_inline")), 3);
    assert_int_equal(json_integer_value(json_object_get(counters, "store_chunks_shm")), 0);
    assert_int_equal(json_integer_value(json_object_get(counters, "registrations_inline")), 2);
    assert_int_equal(json_integer_value(json_object_get(pool, "objects")), 3);
    assert_int_equal(json_integer_value(json_object_get(pool, "capacity_bytes")), 4 << 20);
    assert_false(json_is_true(json_object_get(json_object_get(doc, "shm"), "enabled")));
    json_decref(doc);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

/* The Prometheus text over the socket, the same families GET /metrics serves. */
static void test_metrics(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char out[OUT_SIZE], cmd[1024];
    kvpt_daemon_start(&d, small_daemon);
    kvp_client *c = kvpt_connect(&d);
    kvp_instance *inst = NULL;
    kvp_register_opts o = kvpt_layout("cli-metrics", KVP_TRANSPORT_SHM);
    assert_rc(kvp_register(c, &o, &inst), 0);
    store_seq(inst, 3, 2);

    assert_int_equal(cli(&d, "metrics", out, sizeof(out)), 0);
    assert_true(strlen(out) > 1000);
    assert_true(strlen(out) < sizeof(out) - 1);
    assert_non_null(strstr(out, "# TYPE kvpool_lookups_total counter\n"));
    assert_non_null(strstr(out, "# TYPE kvpool_pool_capacity_bytes gauge\n"));
    assert_non_null(strstr(out, "\nkvpool_pool_capacity_bytes 4194304\n"));
    assert_non_null(strstr(out, "\nkvpool_objects 2\n"));
    assert_non_null(strstr(out, "\nkvpool_store_chunks_total{transport=\"shm\"} 2\n"));
    assert_non_null(strstr(out, "kvpool_request_duration_seconds_count{op=\"status\"}"));
    assert_non_null(strstr(out, "kvpool_request_duration_seconds_count{op=\"metrics\"}"));
    /* kvpool's families, and LMCache's names as aliases of them (docs/HTTP.md). */
    assert_non_null(strstr(out, "\nlmcache_mp_l1_write_chunks_total 2\n"));
    for (const char *p = out; *p; p = strchr(p, '\n') + 1) {
        if (*p != '#' && strncmp(p, "kvpool_", 7) != 0 && strncmp(p, "lmcache_mp_", 11) != 0)
            fail_msg("a line that is neither a comment nor a kvpool_ or lmcache_mp_ sample: %.80s",
                     p);
        if (!strchr(p, '\n'))
            fail_msg("the text does not end with a newline");
    }

    /* promtool, where installed, agrees that it is valid exposition text. */
    if (system("command -v promtool >/dev/null 2>&1") == 0) {
        snprintf(cmd, sizeof(cmd), "%s --socket %s metrics | promtool check metrics", KVP_TEST_CLI,
                 d.socket);
        int rc = run(cmd, out, sizeof(out));
        if (rc != 0)
            fail_msg("promtool check metrics: exit %d: %s", rc, out);
    } else {
        fprintf(stderr, "note: promtool is not installed; its check is skipped\n");
    }
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

/*
 * clear --yes drops exactly the committed chunks nobody pins: pinned ones survive (and keep
 * their bytes), a reservation in progress can still be committed, everything else is gone.
 */
static void test_clear(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char out[OUT_SIZE];
    kvpt_daemon_start(&d, small_daemon);
    kvp_client *c = kvpt_connect(&d);
    kvp_instance *inst = NULL;
    kvp_register_opts o = kvpt_layout("cli-clear", KVP_TRANSPORT_SHM);
    assert_rc(kvp_register(c, &o, &inst), 0);
    uint32_t ct = kvp_instance_get_info(inst)->chunk_tokens;
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;

    store_seq(inst, 1, 4); /* chunks 0 and 1 get pinned below */
    store_seq(inst, 2, 3);
    uint32_t *ids1 = kvpt_tokens(1, 4 * ct), *ids3 = kvpt_tokens(3, ct);
    kvp_tokens t1 = {.ids = ids1, .count = 4 * ct}, t3 = {.ids = ids3, .count = ct};
    kvp_retrieve_plan pin;
    assert_rc(kvp_prepare_retrieve(inst, &t1, 0, 2 * ct, &pin), 2);
    kvp_store_plan res;
    assert_rc(kvp_prepare_store(inst, &t3, 0, ct, &res), 1);
    assert_rc(kvpt_stat(c, "objects_committed"), 7);

    assert_int_equal(cli(&d, "clear --yes", out, sizeof(out)), 0);
    assert_string_equal(out, "Dropped 5 committed objects.\n");
    assert_true(kvpt_log_wait(&d, "Cleared 5 committed objects", 2000));
    assert_rc(kvpt_stat(c, "objects_committed"), 2);
    assert_rc(kvpt_stat(c, "objects_pinned"), 2);
    assert_rc(kvpt_stat(c, "objects_reserved"), 1);
    assert_rc(kvpt_stat(c, "pool_used"), 3 * bytes);

    /* The pinned chunks are still there, bytes intact; the rest is gone. */
    for (uint32_t i = 0; i < 2; i++)
        assert_true(kvpt_check(pin.slots[i].data, bytes, 1, i));
    assert_rc(lookup_seq(inst, 1, 4), 2);
    assert_rc(lookup_seq(inst, 2, 3), 0);
    /* The reservation was not touched: its store completes. */
    memset(res.slots[0].data, 0x5a, bytes);
    assert_rc(kvp_commit_store(inst, &res), 1);
    assert_rc(lookup_seq(inst, 3, 1), 1);
    assert_rc(kvp_commit_retrieve(inst, &pin), 0);

    /* Unpinned now: the next clear takes them too. */
    assert_int_equal(cli(&d, "clear -y", out, sizeof(out)), 0);
    assert_string_equal(out, "Dropped 3 committed objects.\n");
    assert_rc(lookup_seq(inst, 1, 4), 0);
    assert_rc(kvpt_stat(c, "objects_committed"), 0);
    assert_rc(kvpt_stat(c, "pool_used"), 0);
    assert_int_equal(cli(&d, "clear --yes", out, sizeof(out)), 0);
    assert_string_equal(out, "Dropped 0 committed objects.\n");

    /* Without --yes and without a terminal nothing happens. */
    store_seq(inst, 4, 2);
    assert_int_equal(cli(&d, "clear", out, sizeof(out)), 64);
    assert_rc(kvpt_stat(c, "objects_committed"), 2);
    free(ids1);
    free(ids3);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

/* On a terminal, clear asks first and takes only a yes. */
static void test_clear_asks_on_a_terminal(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    static struct pty t;
    static const char *const clear_args[] = {"clear", NULL};
    kvpt_daemon_start(&d, small_daemon);
    kvp_client *c = kvpt_connect(&d);
    kvp_instance *inst = NULL;
    kvp_register_opts o = kvpt_layout("cli-ask", KVP_TRANSPORT_SHM);
    assert_rc(kvp_register(c, &o, &inst), 0);
    store_seq(inst, 1, 3);

    pty_start(&t, d.socket, clear_args);
    if (!pty_wait_for(&t, "Drop 3 committed objects? [y/N] ", 10000))
        fail_msg("no question; the tool wrote: %s", t.buf);
    pty_type(&t, "n\n");
    assert_int_equal(pty_finish(&t), 0);
    assert_non_null(strstr(t.buf, "Nothing dropped."));
    assert_rc(kvpt_stat(c, "objects_committed"), 3);

    pty_start(&t, d.socket, clear_args);
    if (!pty_wait_for(&t, "[y/N] ", 10000))
        fail_msg("no question; the tool wrote: %s", t.buf);
    pty_type(&t, "y\n");
    assert_int_equal(pty_finish(&t), 0);
    assert_non_null(strstr(t.buf, "Dropped 3 committed objects."));
    assert_rc(kvpt_stat(c, "objects_committed"), 0);

    /* Nothing to drop: no question at all. */
    pty_start(&t, d.socket, clear_args);
    assert_int_equal(pty_finish(&t), 0);
    assert_non_null(strstr(t.buf, "Nothing to drop"));
    assert_null(strstr(t.buf, "[y/N]"));
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

/*
 * watch --once: one frame, rates over one interval. The lookups made during it hit one chunk of
 * two, so the interval's hit ratio is exactly 50%, whatever else falls into it.
 */
static void test_watch_once(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char cmd[512], out[OUT_SIZE], line[512];
    kvpt_daemon_start(&d, small_daemon);
    kvp_client *c = kvpt_connect(&d);
    kvp_instance *inst = NULL;
    kvp_register_opts o = kvpt_layout("cli-watch", KVP_TRANSPORT_SHM);
    assert_rc(kvp_register(c, &o, &inst), 0);
    store_seq(inst, 5, 1);

    snprintf(cmd, sizeof(cmd), "%s --socket %s watch --once --interval 2 2>&1", KVP_TEST_CLI,
             d.socket);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    /* Spread over the first half of the interval, so that some fall inside it even if the
     * tool is slow to start. */
    kvpt_sleep_ms(300);
    for (int i = 0; i < 20; i++) {
        assert_rc(lookup_seq(inst, 5, 2), 1);
        kvpt_sleep_ms(50);
    }
    size_t n = fread(out, 1, sizeof(out) - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);

    assert_int_equal(count_of(out, "kvpoold " KVP_VERSION_STRING " at "), 1);
    assert_null(strstr(out, "\033[")); /* not a terminal: no screen control */
    assert_non_null(strstr(out, ", rates over the last "));
    line_with(out, "Lookups", line, sizeof(line));
    assert_non_null(strstr(line, "/s"));
    assert_non_null(strstr(line, "hit ratio 50.0%"));
    line_with(out, "Requests", line, sizeof(line));
    assert_null(strstr(line, "Requests    0.0/s"));
    /* By front end, this watch's own status request left out. */
    assert_non_null(strstr(line, ", lmcache 0.0/s; not counting this watch)"));
    line_with(out, "Stores", line, sizeof(line));
    assert_non_null(strstr(line, "(shm "));
    /* Every transport's byte rate, LMCache's in-band ones too. */
    assert_non_null(strstr(line, ", inline "));
    assert_non_null(strstr(line, ", pickle "));
    assert_non_null(strstr(line, ", envelope "));
    line_with(out, "Retrieves", line, sizeof(line));
    assert_non_null(strstr(line, ", pickle "));
    line_with(out, "Evictions", line, sizeof(line));
    line_with(out, "Pool", line, sizeof(line));
    assert_non_null(strstr(line, "8.00 KiB of 4.00 MiB used (0.2%), 1 objects"));
    line_with(out, "Instances", line, sizeof(line));
    assert_non_null(strstr(line, "1 (1 shm, 0 inline); clients connected besides this watch: 1"));
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

/* On a terminal, watch redraws the screen every interval until interrupted. */
static void test_watch_on_a_terminal(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    static struct pty t;
    static const char *const args[] = {"watch", "--interval", "0.2", NULL};
    kvpt_daemon_start(&d, small_daemon);

    pty_start(&t, d.socket, args);
    if (!pty_wait_for(&t, "\033[H\033[2Jkvpoold", 10000))
        fail_msg("no first frame: %s", t.buf);
    size_t first = (size_t)(strstr(t.buf, "\033[H\033[2J") - t.buf);
    t.buf[first] = ' '; /* look for the next one */
    if (!pty_wait_for(&t, "\033[H\033[2Jkvpoold", 10000))
        fail_msg("no second frame: %s", t.buf);
    kill(t.pid, SIGINT);
    assert_int_equal(pty_finish(&t), 128 + SIGINT);
    kvpt_daemon_stop(&d);
}

/* Without --socket and $KVPOOL_SOCKET, the tool finds the daemon at the default path, as the
 * library does, and names it. */
static void test_default_socket(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char dir[] = "/tmp/kvpool-cli-xdg-XXXXXX", sock[128], cmd[512], out[OUT_SIZE], want[256];
    assert_non_null(mkdtemp(dir));
    snprintf(sock, sizeof(sock), "%s/kvpool/kvpool.sock", dir);
    assert_int_equal(setenv("XDG_RUNTIME_DIR", dir, 1), 0);
    kvpt_daemon_spawn(&d, sock, small_daemon);
    unsetenv("XDG_RUNTIME_DIR");

    snprintf(cmd, sizeof(cmd), "env -u KVPOOL_SOCKET XDG_RUNTIME_DIR=%s %s", dir, KVP_TEST_CLI);
    char ping[600];
    snprintf(ping, sizeof(ping), "%s ping", cmd);
    uint64_t deadline = kvpt_now_ms() + 20000;
    while (run(ping, out, sizeof(out)) != 0 && kvpt_now_ms() < deadline)
        kvpt_sleep_ms(50);
    assert_non_null(strstr(out, sock));

    snprintf(ping, sizeof(ping), "%s version", cmd);
    assert_int_equal(run(ping, out, sizeof(out)), 0);
    snprintf(want, sizeof(want), "kvpoold %s at %s\n", KVP_VERSION_STRING, sock);
    assert_non_null(strstr(out, want));
    snprintf(ping, sizeof(ping), "%s status", cmd);
    assert_int_equal(run(ping, out, sizeof(out)), 0);
    snprintf(want, sizeof(want), "kvpoold %s at %s: serving", KVP_VERSION_STRING, sock);
    assert_non_null(strstr(out, want));
    kvpt_daemon_stop(&d);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* version: this program, the library, and the daemon it reaches. */
static void test_version(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char out[OUT_SIZE], want[256];
    kvpt_daemon_start(&d, small_daemon);
    assert_int_equal(cli(&d, "version", out, sizeof(out)), 0);
    snprintf(want, sizeof(want), "kvpool %s\nlibkvpool %s\nkvpoold %s at %s\n", KVP_VERSION_STRING,
             KVP_VERSION_STRING, KVP_VERSION_STRING, d.socket);
    assert_string_equal(out, want);
    kvpt_daemon_stop(&d);
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
        cmocka_unit_test(test_unreachable_socket),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_global_options_after_command),
        cmocka_unit_test(test_status_and_instances),
        cmocka_unit_test(test_status_json),
        cmocka_unit_test(test_worker_names_are_escaped),
        cmocka_unit_test(test_status_while_reserving),
        cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_clear),
        cmocka_unit_test(test_clear_asks_on_a_terminal),
        cmocka_unit_test(test_watch_once),
        cmocka_unit_test(test_watch_on_a_terminal),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_default_socket),
        cmocka_unit_test(test_daemon_command_line),
        cmocka_unit_test(test_shm_disabled_by_configuration),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
