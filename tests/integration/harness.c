/*
 * harness.c - start/stop a real kvpoold for integration tests.
 *
 * The daemon runs as a child process with stderr redirected to a log file in a temporary
 * directory; readiness is a successful ping through the client library, so a test never races
 * the daemon's start-up. Every wait is bounded, so a broken daemon fails the test instead of
 * hanging it (ctest's TIMEOUT is the last resort).
 */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

void kvpt_daemon_start(struct kvpt_daemon *d, const char *const *args)
{
    static unsigned counter;
    const char *argv[64];
    int argc = 0;
    bool has_shm_name = false;

    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "/tmp/kvpt-XXXXXX");
    assert_non_null(mkdtemp(d->dir));
    snprintf(d->socket, sizeof(d->socket), "%s/kvpool.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/kvpoold.log", d->dir);
    snprintf(d->shm_name, sizeof(d->shm_name), "kvpool_l1_pool_it_%d_%u", (int)getpid(),
             counter++);

    argv[argc++] = KVP_TEST_KVPOOLD;
    argv[argc++] = "--socket";
    argv[argc++] = d->socket;
    argv[argc++] = "--log-level";
    argv[argc++] = "debug";
    for (int i = 0; args && args[i]; i++) {
        if (strcmp(args[i], "--shm-name") == 0) {
            has_shm_name = true;
            snprintf(d->shm_name, sizeof(d->shm_name), "%s", args[i + 1]);
        }
        argv[argc++] = args[i];
    }
    if (!has_shm_name) {
        argv[argc++] = "--shm-name";
        argv[argc++] = d->shm_name;
    }
    argv[argc] = NULL;

    pid_t parent = getpid();
    d->pid = fork();
    assert_true(d->pid >= 0);
    if (d->pid == 0) {
        /* A failed assertion skips the test's teardown: the daemon must not outlive the test,
         * nor keep its stdout (ctest's pipe) open. SIGTERM still removes the segment. */
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent)
            _exit(125);
        int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (fd < 0 || null < 0 || dup2(fd, STDERR_FILENO) < 0 || dup2(null, STDOUT_FILENO) < 0 ||
            dup2(null, STDIN_FILENO) < 0)
            _exit(126);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }

    uint64_t deadline = now_ms() + 30000;
    for (;;) {
        kvp_client *c = NULL;
        kvp_opts o = {.socket_path = d->socket, .timeout_ms = 2000};
        if (kvp_client_open(&o, &c) == 0) {
            int rc = kvp_ping(c);
            kvp_client_close(c);
            if (rc == 0)
                return;
        }
        int status;
        if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
            char cmd[256];
            snprintf(cmd, sizeof(cmd), "cat %s >&2", d->log);
            if (system(cmd) != 0)
                fprintf(stderr, "(no daemon log)\n");
            d->pid = 0;
            fail_msg("kvpoold exited during start-up (status 0x%x)", status);
        }
        if (now_ms() > deadline)
            fail_msg("kvpoold did not answer on %s within 30 s", d->socket);
        sleep_ms(20);
    }
}

int kvpt_daemon_signal_wait(struct kvpt_daemon *d, int sig)
{
    int status = 0;
    if (d->pid <= 0)
        return -1;
    kill(d->pid, sig);
    uint64_t deadline = now_ms() + 20000;
    for (;;) {
        pid_t r = waitpid(d->pid, &status, WNOHANG);
        if (r == d->pid)
            break;
        if (now_ms() > deadline) {
            kill(d->pid, SIGKILL);
            waitpid(d->pid, &status, 0);
            d->pid = 0;
            fail_msg("kvpoold did not exit within 20 s of signal %d", sig);
        }
        sleep_ms(10);
    }
    d->pid = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void kvpt_daemon_stop(struct kvpt_daemon *d)
{
    char cmd[160];
    if (d->pid > 0)
        assert_int_equal(kvpt_daemon_signal_wait(d, SIGTERM), 0);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", d->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", d->dir);
}

static char *read_log(const struct kvpt_daemon *d)
{
    FILE *f = fopen(d->log, "re");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 4096 > cap)
            buf = realloc(buf, cap *= 2);
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        if (n == 0)
            break;
        len += n;
    }
    buf[len] = '\0';
    fclose(f);
    return buf;
}

int kvpt_log_count(const struct kvpt_daemon *d, const char *s)
{
    char *log = read_log(d);
    int n = 0;
    for (char *p = log; p && (p = strstr(p, s)); p += strlen(s))
        n++;
    free(log);
    return n;
}

bool kvpt_log_wait(const struct kvpt_daemon *d, const char *s, int timeout_ms)
{
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    do {
        if (kvpt_log_count(d, s) > 0)
            return true;
        sleep_ms(10);
    } while (now_ms() < deadline);
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "echo '--- daemon log:' >&2; cat %s >&2", d->log);
    if (system(cmd) != 0)
        fprintf(stderr, "(no daemon log)\n");
    return false;
}

kvp_client *kvpt_connect(const struct kvpt_daemon *d)
{
    kvp_client *c = NULL;
    kvp_opts o = {.socket_path = d->socket, .timeout_ms = 20000};
    int rc = kvp_client_open(&o, &c);
    if (rc)
        fail_msg("kvp_client_open(%s): %s", d->socket, kvp_strerror(rc));
    return c;
}

uint64_t kvpt_stat(kvp_client *c, const char *name)
{
    kvp_stat st[128];
    int n = kvp_stats(c, st, 128);
    assert_true(n > 0);
    for (int i = 0; i < n && i < 128; i++)
        if (strcmp(st[i].name, name) == 0)
            return st[i].value;
    fail_msg("no statistic named %s", name);
    return 0;
}

uint64_t kvpt_stat_wait(const struct kvpt_daemon *d, const char *name, uint64_t want,
                        int timeout_ms)
{
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms, v;
    kvp_client *c = kvpt_connect(d);
    for (;;) {
        v = kvpt_stat(c, name);
        if (v == want || now_ms() > deadline)
            break;
        sleep_ms(20);
    }
    kvp_client_close(c);
    return v;
}

kvp_register_opts kvpt_layout(const char *instance_id, uint32_t transport)
{
    return (kvp_register_opts){
        .instance_id = instance_id,
        .model_name = "test-model",
        .world_size = 1,
        .worker_rank = 0,
        .block_size = 16,
        .num_layers = 2,
        .hidden_dim = 64,
        .dtype = "float16",
        .use_mla = 0,
        .transport = transport,
    };
}

uint32_t *kvpt_tokens(uint32_t seq_id, uint32_t n)
{
    uint32_t *t = malloc(sizeof(*t) * (n ? n : 1));
    assert_non_null(t);
    for (uint32_t i = 0; i < n; i++)
        t[i] = seq_id * 1000003u + i * 7u + 1u;
    return t;
}

/* xorshift64*: cheap, deterministic, and different for every (seed, chunk, position). */
static uint64_t mix(uint64_t x)
{
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    return x * 2685821657736338717ull;
}

void kvpt_fill(void *buf, size_t len, uint32_t seed, uint32_t chunk)
{
    uint64_t s = mix(((uint64_t)seed << 32 | chunk) + 0x9e3779b97f4a7c15ull);
    uint8_t *p = buf;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        s = mix(s);
        memcpy(p + i, &s, 8);
    }
    for (s = mix(s); i < len; i++)
        p[i] = (uint8_t)(s >> (8 * (i % 8)));
}

bool kvpt_check(const void *buf, size_t len, uint32_t seed, uint32_t chunk)
{
    uint8_t *want = malloc(len);
    assert_non_null(want);
    kvpt_fill(want, len, seed, chunk);
    bool same = memcmp(want, buf, len) == 0;
    free(want);
    return same;
}
