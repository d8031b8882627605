/*
 * harness.c - start/stop a real kvpoold for integration tests.
 *
 * The daemon runs as a child process with stderr redirected to a log file in a temporary
 * directory; readiness is a successful ping through the client library, so a test never races
 * the daemon's start-up. Every wait is bounded, so a broken daemon fails the test instead of
 * hanging it (ctest's TIMEOUT is the last resort).
 */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/msg.h"
#include "common/wire.h"

uint64_t kvpt_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void kvpt_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

bool kvpt_shm_exists(const char *name)
{
    char path[160];
    struct stat st;
    snprintf(path, sizeof(path), "/dev/shm/%s", name);
    return stat(path, &st) == 0;
}

int kvpt_private_devshm(const char *tmpfs_opts)
{
    if (unshare(CLONE_NEWNS) != 0) {
        fprintf(stderr,
                "skipped: cannot create a mount namespace (unshare: %s); this test needs root "
                "or CAP_SYS_ADMIN\n",
                strerror(errno));
        return -1;
    }
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", "/dev/shm", "tmpfs", 0, tmpfs_opts) != 0) {
        fprintf(stderr, "skipped: cannot mount a tmpfs (%s) on /dev/shm: %s\n", tmpfs_opts,
                strerror(errno));
        return -1;
    }
    return 0;
}

/* Forks and execs argv with stderr to d->log (opened with log_flags). */
static void spawn(struct kvpt_daemon *d, const char **argv, int log_flags)
{
    pid_t parent = getpid();
    d->pid = fork();
    assert_true(d->pid >= 0);
    if (d->pid == 0) {
        /* A failed assertion skips the test's teardown: the daemon must not outlive the test,
         * nor keep its stdout (ctest's pipe) open. SIGTERM still removes the segment. */
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent)
            _exit(125);
        int fd = open(d->log, O_WRONLY | O_CREAT | log_flags | O_CLOEXEC, 0600);
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (fd < 0 || null < 0 || dup2(fd, STDERR_FILENO) < 0 || dup2(null, STDOUT_FILENO) < 0 ||
            dup2(null, STDIN_FILENO) < 0)
            _exit(126);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
}

/* Waits until d answers a ping; fails the test if it exits or does not answer in 30 s. */
static void wait_ready(struct kvpt_daemon *d)
{
    uint64_t deadline = kvpt_now_ms() + 30000;
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
        if (kvpt_now_ms() > deadline)
            fail_msg("kvpoold did not answer on %s within 30 s", d->socket);
        kvpt_sleep_ms(20);
    }
}

void kvpt_daemon_exec(struct kvpt_daemon *d, const char **argv)
{
    spawn(d, argv, O_APPEND);
    wait_ready(d);
}

bool kvpt_reap(pid_t pid, int timeout_ms, int *status)
{
    uint64_t deadline = kvpt_now_ms() + (uint64_t)timeout_ms;
    pid_t r;
    while ((r = waitpid(pid, status, WNOHANG)) == 0 && kvpt_now_ms() < deadline)
        kvpt_sleep_ms(20);
    if (r == pid)
        return true;
    kill(pid, SIGKILL);
    waitpid(pid, status, 0);
    return false;
}

/* True if args choose a backend without a named segment (memfd, none): the daemon refuses a
 * --shm-name next to it, so the harness adds none. */
static bool no_named_segment(const char *const *args)
{
    for (int i = 0; args && args[i] && args[i + 1]; i++)
        if (strcmp(args[i], "--shm-backend") == 0 &&
            (strcmp(args[i + 1], "memfd") == 0 || strcmp(args[i + 1], "none") == 0))
            return true;
    return false;
}

/*
 * Removes the segments that earlier test processes named (kvpool_l1_pool_it_PID_N, and the
 * server fixtures' kvpool_l1_pool_fx_PID_N) and left behind when they failed or killed their
 * daemon: only those whose PID no longer runs. A developer's /dev/shm would fill up otherwise.
 */
static void sweep_stale_segments(void)
{
    DIR *dir = opendir("/dev/shm");
    if (!dir)
        return;
    struct dirent *e;
    /* cppcheck-suppress readdirCalled ; readdir_r is deprecated, and dir is private to this call */
    while ((e = readdir(dir))) {
        int pid;
        unsigned n;
        char kind[3], end;
        if (sscanf(e->d_name, "kvpool_l1_pool_%2[a-z]_%d_%u%c", kind, &pid, &n, &end) != 3 ||
            (strcmp(kind, "it") && strcmp(kind, "fx")) || pid <= 0)
            continue;
        if (kill(pid, 0) < 0 && errno == ESRCH)
            unlinkat(dirfd(dir), e->d_name, 0);
    }
    closedir(dir);
}

/* Builds the argument list of kvpt_daemon_start() and kvpt_daemon_spawn() and starts it. */
static void launch(struct kvpt_daemon *d, const char *socket, const char *const *args, bool wait)
{
    static unsigned counter;
    const char *argv[64];
    int argc = 0;
    bool has_shm_name = false, has_http = false;

    if (counter == 0)
        sweep_stale_segments();
    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "/tmp/kvpt-XXXXXX");
    assert_non_null(mkdtemp(d->dir));
    if (socket)
        snprintf(d->socket, sizeof(d->socket), "%s", socket);
    else
        snprintf(d->socket, sizeof(d->socket), "%s/kvpool.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/kvpoold.log", d->dir);
    snprintf(d->shm_name, sizeof(d->shm_name), "kvpool_l1_pool_it_%d_%u", (int)getpid(), counter++);

    argv[argc++] = KVP_TEST_KVPOOLD;
    argv[argc++] = "--socket";
    argv[argc++] = d->socket;
    /* A configuration file sets the level itself (a reload may change it). */
    bool has_config = false;
    for (int i = 0; args && args[i]; i++)
        has_config |= strcmp(args[i], "--config") == 0;
    if (!has_config) {
        argv[argc++] = "--log-level";
        argv[argc++] = "debug";
    }
    for (int i = 0; args && args[i]; i++) {
        if (strcmp(args[i], "--shm-name") == 0) {
            has_shm_name = true;
            snprintf(d->shm_name, sizeof(d->shm_name), "%s", args[i + 1]);
        }
        has_http |= strcmp(args[i], "--http") == 0;
        argv[argc++] = args[i];
    }
    if (!has_shm_name && no_named_segment(args)) {
        d->shm_name[0] = '\0';
    } else if (!has_shm_name) {
        argv[argc++] = "--shm-name";
        argv[argc++] = d->shm_name;
    }
    /* No HTTP endpoint unless the test asks for one (--http 127.0.0.1:0): the daemons of
     * concurrent tests would all want its default port. */
    if (!has_http) {
        argv[argc++] = "--http";
        argv[argc++] = "off";
    }
    argv[argc] = NULL;

    spawn(d, argv, O_TRUNC);
    if (wait)
        wait_ready(d);
}

void kvpt_daemon_start(struct kvpt_daemon *d, const char *const *args)
{
    launch(d, NULL, args, true);
}

void kvpt_daemon_spawn(struct kvpt_daemon *d, const char *socket, const char *const *args)
{
    launch(d, socket, args, false);
}

int kvpt_daemon_wait_exit(struct kvpt_daemon *d, int timeout_ms)
{
    int status;
    uint64_t deadline = kvpt_now_ms() + (uint64_t)timeout_ms;
    if (d->pid <= 0)
        return -1;
    for (;;) {
        if (waitpid(d->pid, &status, WNOHANG) == d->pid)
            break;
        if (kvpt_now_ms() > deadline)
            return -1;
        kvpt_sleep_ms(10);
    }
    d->pid = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int kvpt_daemon_signal_wait(struct kvpt_daemon *d, int sig)
{
    int status = 0;
    if (d->pid <= 0)
        return -1;
    kill(d->pid, sig);
    uint64_t deadline = kvpt_now_ms() + 20000;
    for (;;) {
        pid_t r = waitpid(d->pid, &status, WNOHANG);
        if (r == d->pid)
            break;
        if (kvpt_now_ms() > deadline) {
            kill(d->pid, SIGKILL);
            waitpid(d->pid, &status, 0);
            d->pid = 0;
            fail_msg("kvpoold did not exit within 20 s of signal %d", sig);
        }
        kvpt_sleep_ms(10);
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

/* The whole log as a string (the caller frees it), or NULL if it cannot be read. */
static char *read_log(const struct kvpt_daemon *d)
{
    FILE *f = fopen(d->log, "re");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        if (n == 0) {
            buf[len] = '\0';
            break;
        }
        len += n;
        if (len + 4096 > cap) {
            char *bigger = realloc(buf, cap *= 2);
            if (!bigger)
                free(buf);
            buf = bigger;
        }
    }
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
    uint64_t deadline = kvpt_now_ms() + (uint64_t)timeout_ms;
    do {
        if (kvpt_log_count(d, s) > 0)
            return true;
        kvpt_sleep_ms(10);
    } while (kvpt_now_ms() < deadline);
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

uint64_t kvpt_stat_poll(kvp_client *c, const char *name, uint64_t want, int timeout_ms)
{
    uint64_t deadline = kvpt_now_ms() + (uint64_t)timeout_ms, v;
    while ((v = kvpt_stat(c, name)) != want && kvpt_now_ms() < deadline)
        kvpt_sleep_ms(20);
    return v;
}

uint64_t kvpt_stat_wait(const struct kvpt_daemon *d, const char *name, uint64_t want,
                        int timeout_ms)
{
    kvp_client *c = kvpt_connect(d);
    uint64_t v = kvpt_stat_poll(c, name, want, timeout_ms);
    kvp_client_close(c);
    return v;
}

void kvpt_assert_serves(const struct kvpt_daemon *d)
{
    kvp_client *c = kvpt_connect(d);
    assert_int_equal(kvp_ping(c), 0);
    kvp_client_close(c);
}

int kvpt_group_start(void **state, struct kvpt_daemon *d, const char *const *args)
{
    kvpt_daemon_start(d, args);
    *state = d;
    return 0;
}

int kvpt_group_stop(void **state)
{
    /* cmocka runs the group teardown even after a failed group setup: no daemon then. */
    if (*state)
        kvpt_daemon_stop(*state);
    return 0;
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

kvp_register_opts kvpt_layout_big(const char *instance_id, uint32_t transport)
{
    kvp_register_opts o = kvpt_layout(instance_id, transport);
    o.model_name = "big-model";
    o.num_layers = 8;
    o.hidden_dim = 1024;
    o.dtype = "float32";
    return o;
}

uint32_t kvpt_store_seq(kvp_instance *inst, uint32_t seq, uint32_t n)
{
    const kvp_instance_info *info = kvp_instance_get_info(inst);
    size_t bytes = info->chunk_bytes;
    uint32_t ct = info->chunk_tokens;
    uint32_t *tok = kvpt_tokens(seq, n * ct);
    kvp_tokens t = {.ids = tok, .count = n * ct};
    void **bufs = calloc(n, sizeof(*bufs));
    kvp_store_result r;
    assert_non_null(bufs);
    for (uint32_t i = 0; i < n; i++) {
        bufs[i] = malloc(bytes);
        assert_non_null(bufs[i]);
        kvpt_fill(bufs[i], bytes, seq, i);
    }
    int rc = kvp_store(inst, &t, 0, n * ct, (const void *const *)bufs, &r);
    assert_true(rc >= 0);
    assert_int_equal(r.stored + r.cached, n);
    /* A round trip on the same connection: the (pipelined) commit is applied before it is
     * answered, so from here on every client sees the chunks. */
    assert_int_equal(kvp_lookup(inst, &t), (int)n);
    for (uint32_t i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(tok);
    return r.stored;
}

void kvpt_retrieve_seq(kvp_instance *inst, uint32_t seq, uint32_t n)
{
    const kvp_instance_info *info = kvp_instance_get_info(inst);
    size_t bytes = info->chunk_bytes;
    uint32_t ct = info->chunk_tokens;
    uint32_t *tok = kvpt_tokens(seq, n * ct);
    kvp_tokens t = {.ids = tok, .count = n * ct};
    void **bufs = calloc(n, sizeof(*bufs));
    assert_non_null(bufs);
    for (uint32_t i = 0; i < n; i++) {
        bufs[i] = calloc(1, bytes);
        assert_non_null(bufs[i]);
    }
    assert_int_equal(kvp_retrieve(inst, &t, 0, n * ct, bufs), (int)n);
    for (uint32_t i = 0; i < n; i++) {
        if (!kvpt_check(bufs[i], bytes, seq, i))
            fail_msg("chunk %u of sequence %u is not what was stored", i, seq);
        free(bufs[i]);
    }
    free(bufs);
    free(tok);
}

void kvpt_assert_seq(kvp_instance *inst, uint32_t seq, uint32_t n, uint32_t total)
{
    const kvp_instance_info *info = kvp_instance_get_info(inst);
    size_t bytes = info->chunk_bytes;
    uint32_t ct = info->chunk_tokens;
    uint32_t *tok = kvpt_tokens(seq, total * ct);
    kvp_tokens t = {.ids = tok, .count = total * ct};
    void **bufs = calloc(total, sizeof(*bufs));
    assert_non_null(bufs);
    assert_int_equal(kvp_lookup(inst, &t), (int)n);
    for (uint32_t i = 0; i < total; i++) {
        bufs[i] = calloc(1, bytes);
        assert_non_null(bufs[i]);
    }
    assert_int_equal(kvp_retrieve(inst, &t, 0, total * ct, bufs), (int)n);
    for (uint32_t i = 0; i < total; i++) {
        if (i < n && !kvpt_check(bufs[i], bytes, seq, i))
            fail_msg("chunk %u of sequence %u is not what was stored", i, seq);
        free(bufs[i]);
    }
    free(bufs);
    free(tok);
}

void kvpt_daemon_restart(struct kvpt_daemon *d, const char *const *args)
{
    const char *argv[64];
    int argc = 0;

    assert_int_equal(d->pid, 0);
    argv[argc++] = KVP_TEST_KVPOOLD;
    argv[argc++] = "--socket";
    argv[argc++] = d->socket;
    argv[argc++] = "--log-level";
    argv[argc++] = "debug";
    if (!no_named_segment(args)) {
        argv[argc++] = "--shm-name";
        argv[argc++] = d->shm_name;
    }
    argv[argc++] = "--http"; /* a later --http in args wins */
    argv[argc++] = "off";
    for (int i = 0; args && args[i] && argc < 63; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;
    kvpt_daemon_exec(d, argv);
}

void kvpt_stop_process(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    assert_int_equal(kill(pid, SIGSTOP), 0);
    uint64_t deadline = kvpt_now_ms() + 5000;
    for (;;) {
        FILE *f = fopen(path, "re");
        size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = '\0';
        /* The state follows the command name, which is in parentheses and may hold spaces. */
        const char *p = strrchr(buf, ')');
        if (p && p[1] == ' ' && (p[2] == 'T' || p[2] == 't'))
            return;
        if (kvpt_now_ms() > deadline)
            fail_msg("process %d did not stop within 5 s of SIGSTOP", (int)pid);
        kvpt_sleep_ms(1);
    }
}

uint64_t kvpt_rss_kib(pid_t pid)
{
    char path[64], line[256];
    unsigned long long kib = 0;
    bool found = false;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "re");
    assert_non_null(f);
    while (!found && fgets(line, sizeof(line), f))
        found = sscanf(line, "VmRSS: %llu kB", &kib) == 1;
    fclose(f);
    if (!found)
        fail_msg("no VmRSS in %s", path);
    return kib;
}

int kvpt_raw_connect(const struct kvpt_daemon *d)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%.100s", d->socket);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    return fd;
}

static int raw_send_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return errno == EAGAIN ? -ETIMEDOUT : -errno;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

static int raw_recv_all(int fd, void *p, size_t n)
{
    uint8_t *b = p;
    while (n) {
        ssize_t k = recv(fd, b, n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k == 0 || (k < 0 && errno == ECONNRESET))
            return -ECONNRESET;
        if (k < 0)
            return errno == EAGAIN ? -ETIMEDOUT : -errno;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

int kvpt_raw_send(int fd, uint16_t opcode, const void *body, uint32_t body_len,
                  uint64_t payload_len)
{
    return kvpt_raw_send_flags(fd, opcode, body, body_len, payload_len, 0);
}

int kvpt_raw_send_flags(int fd, uint16_t opcode, const void *body, uint32_t body_len,
                        uint64_t payload_len, uint32_t flags)
{
    static uint64_t next_id = 1;
    uint8_t hdr[KVP_HEADER_SIZE];
    struct kvp_header h = {.magic = KVP_MAGIC,
                           .version = KVP_PROTO_VERSION,
                           .opcode = opcode,
                           .request_id = next_id++,
                           .body_len = body_len,
                           .flags = flags,
                           .payload_len = payload_len};
    kvp_header_encode(&h, hdr);
    int rc = raw_send_all(fd, hdr, sizeof(hdr));
    if (rc == 0 && body_len)
        rc = raw_send_all(fd, body, body_len);
    return rc;
}

int kvpt_raw_recv(int fd, struct kvpt_reply *r)
{
    uint8_t hdr[KVP_HEADER_SIZE];
    struct kvp_header h;
    memset(r, 0, sizeof(*r));
    int rc = raw_recv_all(fd, hdr, sizeof(hdr));
    if (rc)
        return rc;
    if (kvp_header_decode(hdr, &h) != 0 || !(h.opcode & KVP_REPLY_FLAG))
        return -EPROTO;
    r->status = h.status;
    r->opcode = h.opcode;
    r->request_id = h.request_id;
    r->payload_len = h.payload_len;
    r->body_len = h.body_len;
    r->body = malloc((size_t)h.body_len + 1);
    if (!r->body)
        return -ENOMEM;
    rc = raw_recv_all(fd, r->body, h.body_len);
    if (rc) {
        free(r->body);
        r->body = NULL;
        return rc;
    }
    r->body[h.body_len] = 0;
    if (h.status < 0 && kvp_decode_error(r->body, h.body_len, r->msg, sizeof(r->msg)) != 0)
        return -EPROTO;
    return 0;
}

int kvpt_raw_call(int fd, uint16_t opcode, const void *body, uint32_t body_len,
                  struct kvpt_reply *r)
{
    int rc = kvpt_raw_send(fd, opcode, body, body_len, 0);
    if (rc == 0)
        rc = kvpt_raw_recv(fd, r);
    if (rc)
        return rc;
    if (r->opcode != (opcode | KVP_REPLY_FLAG)) {
        free(r->body);
        r->body = NULL;
        return -EPROTO;
    }
    return r->status;
}

bool kvpt_raw_closed(int fd, int timeout_ms)
{
    uint64_t deadline = kvpt_now_ms() + (uint64_t)timeout_ms;
    char buf[4096];
    struct timeval tv = {.tv_sec = 0, .tv_usec = 100000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            return true;
        if (kvpt_now_ms() > deadline)
            return false;
    }
}

int kvpt_raw_register(int fd, const kvp_register_opts *o, uint32_t *handle, uint64_t *chunk_bytes)
{
    struct kvpt_reply r = {.body = NULL};
    struct kvp_wbuf w;
    struct kvp_register_req req = {.world_size = o->world_size,
                                   .worker_rank = o->worker_rank,
                                   .block_size = o->block_size,
                                   .num_layers = o->num_layers,
                                   .hidden_dim = o->hidden_dim,
                                   .use_mla = (uint8_t)(o->use_mla != 0),
                                   .transport = (uint8_t)o->transport};
    struct kvp_register_reply reg;

    snprintf(req.instance_id, sizeof(req.instance_id), "%s", o->instance_id);
    snprintf(req.model_name, sizeof(req.model_name), "%s", o->model_name);
    snprintf(req.dtype, sizeof(req.dtype), "%s", o->dtype);
    if (o->transport == KVP_TRANSPORT_INLINE)
        snprintf(req.reason, sizeof(req.reason), "raw test client");
    /* A refusal still carries a body (the error message): free it on every path. */
    int rc = kvpt_raw_call(fd, KVP_OP_HELLO, NULL, 0, &r);
    free(r.body);
    if (rc)
        return rc;
    kvp_wbuf_init(&w);
    kvp_encode_register_req(&w, &req);
    r.body = NULL;
    rc = w.err ? w.err : kvpt_raw_call(fd, KVP_OP_REGISTER, w.data, (uint32_t)w.len, &r);
    kvp_wbuf_free(&w);
    if (rc) {
        free(r.body);
        return rc;
    }
    rc = kvp_decode_register_reply(r.body, r.body_len, &reg);
    free(r.body);
    if (rc)
        return rc;
    *handle = reg.handle;
    if (chunk_bytes)
        *chunk_bytes = reg.chunk_bytes;
    return 0;
}

int kvpt_raw_ref(int fd, uint16_t op, uint32_t handle, uint64_t id, struct kvpt_reply *r)
{
    struct kvp_wbuf w;
    struct kvp_ref_req ref = {.handle = handle, .id = id};
    memset(r, 0, sizeof(*r));
    kvp_wbuf_init(&w);
    kvp_encode_ref_req(&w, &ref);
    int rc = w.err ? w.err : kvpt_raw_call(fd, op, w.data, (uint32_t)w.len, r);
    kvp_wbuf_free(&w);
    return rc;
}

int kvpt_raw_keyed(int fd, uint16_t op, uint32_t handle, uint32_t seq, uint32_t ntokens,
                   struct kvpt_reply *r)
{
    struct kvp_wbuf w;
    uint32_t *tok = kvpt_tokens(seq, ntokens);
    memset(r, 0, sizeof(*r));
    kvp_wbuf_init(&w);
    kvp_encode_key_req(&w, handle, 0, ntokens, tok, ntokens, NULL, 0);
    int rc = w.err ? w.err : kvpt_raw_call(fd, op, w.data, (uint32_t)w.len, r);
    kvp_wbuf_free(&w);
    free(tok);
    return rc;
}

int kvpt_raw_connect_or_fail(const struct kvpt_daemon *d)
{
    int fd = kvpt_raw_connect(d);
    if (fd < 0)
        fail_msg("connect: %s", strerror(-fd));
    return fd;
}

void kvpt_raw_send_bytes(int fd, const void *p, size_t n)
{
    ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
    (void)r;
}

void kvpt_raw_ref_refused(int fd, uint16_t op, uint32_t handle, uint64_t id)
{
    struct kvpt_reply r;
    int rc = kvpt_raw_ref(fd, op, handle, id, &r);
    if (rc != -ENOENT)
        fail_msg("%s(handle 0x%x, id %llu): %d, expected -ENOENT", kvp_opcode_name(op), handle,
                 (unsigned long long)id, rc);
    free(r.body);
    assert_int_equal(kvpt_raw_call(fd, KVP_OP_PING, NULL, 0, &r), 0);
    free(r.body);
}

int kvpt_raw_prepare(int fd, uint16_t op, uint32_t handle, uint32_t seq, uint32_t ntokens,
                     struct kvp_slots_reply *sr)
{
    struct kvpt_reply r;
    int rc = kvpt_raw_keyed(fd, op, handle, seq, ntokens, &r);
    if (rc == 0 && sr)
        assert_int_equal(kvp_decode_slots_reply(r.body, r.body_len, sr), 0);
    free(r.body);
    return rc;
}

int kvpt_raw_lookup(int fd, uint32_t handle, uint32_t seq, uint32_t ntokens)
{
    struct kvpt_reply r;
    struct kvp_lookup_reply lr;
    assert_int_equal(kvpt_raw_keyed(fd, KVP_OP_LOOKUP, handle, seq, ntokens, &r), 0);
    assert_int_equal(kvp_decode_lookup_reply(r.body, r.body_len, &lr), 0);
    free(r.body);
    return (int)lr.cached;
}

int kvpt_raw_store_inline(int fd, uint32_t handle, uint64_t id, uint64_t payload_len,
                          const void *data, size_t send_len, struct kvpt_reply *r)
{
    struct kvp_wbuf w;
    struct kvp_ref_req ref = {.handle = handle, .id = id};
    kvp_wbuf_init(&w);
    kvp_encode_ref_req(&w, &ref);
    int rc = kvpt_raw_send(fd, KVP_OP_STORE_INLINE, w.data, (uint32_t)w.len, payload_len);
    kvp_wbuf_free(&w);
    if (rc == 0 && send_len)
        kvpt_raw_send_bytes(fd, data, send_len);
    rc = kvpt_raw_recv(fd, r);
    if (rc)
        fail_msg("no reply to STORE_INLINE: %s", strerror(-rc));
    assert_int_equal(r->opcode, KVP_OP_STORE_INLINE | KVP_REPLY_FLAG);
    return r->status;
}

void kvpt_assert_clean(const struct kvpt_daemon *d)
{
    kvp_client *c = kvpt_connect(d);
    assert_int_equal(kvp_ping(c), 0);
    assert_int_equal(kvpt_stat_poll(c, "connections", 1, 5000), 1);
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 0);
    assert_int_equal(kvpt_stat(c, "objects_pinned"), 0);
    assert_int_equal(kvpt_stat(c, "objects_expired"), 0);
    assert_int_equal(kvpt_stat(c, "instances"), 0);
    kvp_client_close(c);
}
