/*
 * redis_fixture.c - real redis-server processes for the L2 tests (see redis_fixture.h).
 *
 * Every server runs in the foreground as a child of the test, with PR_SET_PDEATHSIG so that it
 * cannot outlive the test (a crash, a ctest timeout), in its own temporary directory with
 * persistence off. Its Unix socket is always there (the tests' own hiredis connection uses it);
 * a loopback port is added when the daemon under test must reach it over TCP or when it is a
 * cluster node. Ports are picked by binding port 0 first.
 */
#include "redis_fixture.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static bool on_path(const char *prog)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "command -v %s >/dev/null 2>&1", prog);
    return system(cmd) == 0;
}

void kvpt_redis_require(void)
{
    if (!on_path("redis-server") || !on_path("redis-cli")) {
        fprintf(stderr, "skipped: redis-server and redis-cli are not installed "
                        "(scripts/install-deps.sh build installs them)\n");
        exit(77);
    }
}

/* True if port can be bound on the loopback address now. */
static bool port_free(uint16_t port)
{
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                            .sin_port = htons(port)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

/*
 * A free loopback port for redis-server, below the usual ephemeral range (so that no client
 * socket takes it meanwhile) and with port + 10000 free too: a cluster node also listens there
 * (its cluster bus).
 */
static uint16_t free_port(void)
{
    static unsigned next;
    if (!next)
        next = 20000 + (unsigned)(getpid() * 37 % 9000);
    for (int tries = 0; tries < 9000; tries++) {
        uint16_t p = (uint16_t)(20000 + (next++ - 20000) % 9000);
        if (port_free(p) && port_free((uint16_t)(p + 10000)))
            return p;
    }
    fail_msg("no free loopback port pair in 20000..38999");
    return 0;
}

/* Every server started, so that an exit (a failed assertion included) removes them all. */
static struct kvpt_redis *started[8];

static void cleanup_all(void)
{
    for (size_t i = 0; i < sizeof(started) / sizeof(started[0]); i++)
        if (started[i])
            kvpt_redis_stop(started[i]);
}

static void remember(struct kvpt_redis *r)
{
    static bool registered;
    if (!registered)
        atexit(cleanup_all);
    registered = true;
    for (size_t i = 0; i < sizeof(started) / sizeof(started[0]); i++) {
        if (started[i] == r)
            return;
        if (!started[i]) {
            started[i] = r;
            return;
        }
    }
}

/* fork + exec of argv with stdout and stderr appended to log; the child dies with us. */
static pid_t spawn(const char *const *argv, const char *log)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* Runs argv to completion (at most 120 s); returns its exit status. */
static int run(const char *const *argv, const char *log)
{
    pid_t pid = spawn(argv, log);
    int status;
    for (int i = 0; i < 12000; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        kvpt_sleep_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    fail_msg("%s did not finish within 120 s (log: %s)", argv[0], log);
    return -1;
}

static void launch(struct kvpt_redis *r)
{
    char port[16], log[160];
    const char *argv[40];
    int n = 0;

    snprintf(port, sizeof(port), "%u", (unsigned)r->port);
    snprintf(log, sizeof(log), "%s/redis.log", r->dir);
    argv[n++] = "redis-server";
    argv[n++] = "--port";
    argv[n++] = port;
    argv[n++] = "--bind";
    argv[n++] = "127.0.0.1";
    argv[n++] = "--unixsocket";
    argv[n++] = r->sock;
    argv[n++] = "--unixsocketperm";
    argv[n++] = "700";
    argv[n++] = "--dir";
    argv[n++] = r->dir;
    argv[n++] = "--save";
    argv[n++] = "";
    argv[n++] = "--appendonly";
    argv[n++] = "no";
    argv[n++] = "--daemonize";
    argv[n++] = "no";
    for (int i = 0; r->extra[i]; i++)
        argv[n++] = r->extra[i];
    argv[n] = NULL;
    r->pid = spawn(argv, log);

    /* Ready when it answers PING on its socket. */
    for (int i = 0; i < 1000; i++) {
        struct timeval tv = {.tv_sec = 1};
        redisContext *c = redisConnectUnixWithTimeout(r->sock, tv);
        if (c && !c->err) {
            redisReply *rep = redisCommand(c, "PING");
            /* A server with --requirepass answers too: with NOAUTH. */
            bool ok = rep && (rep->type == REDIS_REPLY_STATUS ||
                              (rep->type == REDIS_REPLY_ERROR && strstr(rep->str, "NOAUTH")));
            if (rep)
                freeReplyObject(rep);
            redisFree(c);
            if (ok)
                return;
        } else if (c) {
            redisFree(c);
        }
        int status;
        if (waitpid(r->pid, &status, WNOHANG) == r->pid) {
            r->pid = 0;
            char cmd[200];
            snprintf(cmd, sizeof(cmd), "tail -n 5 %s >&2", log);
            (void)!system(cmd);
            fail_msg("redis-server exited at start-up (log: %s)", log);
        }
        kvpt_sleep_ms(10);
    }
    fail_msg("redis-server did not answer within 10 s (log: %s)", log);
}

void kvpt_redis_start(struct kvpt_redis *r, bool tcp)
{
    snprintf(r->dir, sizeof(r->dir), "/tmp/kvpt-redis-XXXXXX");
    assert_non_null(mkdtemp(r->dir));
    remember(r);
    snprintf(r->sock, sizeof(r->sock), "%s/redis.sock", r->dir);
    r->port = tcp ? free_port() : 0;
    if (tcp)
        snprintf(r->url, sizeof(r->url), "redis://127.0.0.1:%u", (unsigned)r->port);
    else
        snprintf(r->url, sizeof(r->url), "unix://%s", r->sock);
    launch(r);
}

void kvpt_redis_restart(struct kvpt_redis *r)
{
    assert_int_equal(r->pid, 0);
    launch(r);
}

void kvpt_redis_kill(struct kvpt_redis *r)
{
    if (r->pid <= 0)
        return;
    kill(r->pid, SIGKILL);
    waitpid(r->pid, NULL, 0);
    r->pid = 0;
}

void kvpt_redis_stop(struct kvpt_redis *r)
{
    char cmd[128];
    kvpt_redis_kill(r);
    if (!r->dir[0])
        return;
    snprintf(cmd, sizeof(cmd), "rm -rf %s", r->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", r->dir);
    r->dir[0] = '\0';
}

redisContext *kvpt_redis_connect(const struct kvpt_redis *r)
{
    struct timeval tv = {.tv_sec = 10};
    redisContext *c = redisConnectUnixWithTimeout(r->sock, tv);
    if (!c || c->err)
        fail_msg("cannot connect to redis at %s: %s", r->sock, c ? c->errstr : "no memory");
    redisSetTimeout(c, tv);
    return c;
}

redisReply *kvpt_redis_cmd(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (!r)
        fail_msg("redis command '%s' failed: %s", fmt, c->errstr);
    return r;
}

size_t kvpt_redis_keys(redisContext *c, const char *pattern, char **names, size_t max)
{
    redisReply *r = kvpt_redis_cmd(c, "KEYS %s", pattern);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    size_t n = r->elements;
    for (size_t i = 0; names && i < n && i < max; i++)
        names[i] = strdup(r->element[i]->str);
    freeReplyObject(r);
    return n;
}

/* True when node r says cluster_state:ok. */
static bool cluster_ok(const struct kvpt_redis *r)
{
    redisContext *c = kvpt_redis_connect(r);
    redisReply *rep = kvpt_redis_cmd(c, "CLUSTER INFO");
    bool ok = rep->type == REDIS_REPLY_STRING && strstr(rep->str, "cluster_state:ok");
    freeReplyObject(rep);
    redisFree(c);
    return ok;
}

/* Waits until every node is ok and `redis-cli --cluster check` sees one slot map. */
static void cluster_wait(struct kvpt_cluster *cl)
{
    char addr[32], log[160];
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", (unsigned)cl->node[0].port);
    snprintf(log, sizeof(log), "%s/cluster-check.log", cl->node[0].dir);
    const char *check[] = {"redis-cli", "--cluster", "check", addr, NULL};
    for (int i = 0; i < 300; i++) {
        if (cluster_ok(&cl->node[0]) && cluster_ok(&cl->node[1]) && cluster_ok(&cl->node[2]) &&
            run(check, log) == 0)
            return;
        kvpt_sleep_ms(100);
    }
    fail_msg("the cluster did not settle within 30 s (log: %s)", log);
}

void kvpt_cluster_start(struct kvpt_cluster *cl)
{
    char addr[3][32], conf[3][160], log[160];
    memset(cl, 0, sizeof(*cl));
    for (int i = 0; i < 3; i++) {
        struct kvpt_redis *r = &cl->node[i];
        snprintf(r->dir, sizeof(r->dir), "/tmp/kvpt-redis-XXXXXX");
        assert_non_null(mkdtemp(r->dir));
        remember(r);
        snprintf(r->sock, sizeof(r->sock), "%s/redis.sock", r->dir);
        snprintf(conf[i], sizeof(conf[i]), "%s/nodes.conf", r->dir);
        r->port = free_port();
        snprintf(r->url, sizeof(r->url), "redis://127.0.0.1:%u", (unsigned)r->port);
        r->extra[0] = "--cluster-enabled";
        r->extra[1] = "yes";
        r->extra[2] = "--cluster-config-file";
        r->extra[3] = conf[i];
        r->extra[4] = "--cluster-node-timeout";
        r->extra[5] = "5000";
        r->extra[6] = NULL;
        launch(r);
        snprintf(addr[i], sizeof(addr[i]), "127.0.0.1:%u", (unsigned)r->port);
    }
    snprintf(cl->url, sizeof(cl->url), "redis-cluster://%s", addr[0]);
    snprintf(log, sizeof(log), "%s/cluster-create.log", cl->node[0].dir);
    const char *create[] = {"redis-cli", "--cluster",          "create", addr[0],         addr[1],
                            addr[2],     "--cluster-replicas", "0",      "--cluster-yes", NULL};
    int rc = run(create, log);
    if (rc != 0)
        fail_msg("redis-cli --cluster create exited %d (log: %s)", rc, log);
    cluster_wait(cl);
}

void kvpt_cluster_stop(struct kvpt_cluster *cl)
{
    for (int i = 0; i < 3; i++)
        kvpt_redis_stop(&cl->node[i]);
}

void kvpt_cluster_id(const struct kvpt_cluster *cl, int i, char *id)
{
    redisContext *c = kvpt_redis_connect(&cl->node[i]);
    redisReply *r = kvpt_redis_cmd(c, "CLUSTER MYID");
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    assert_int_equal(r->len, 40);
    memcpy(id, r->str, 41);
    freeReplyObject(r);
    redisFree(c);
}

void kvpt_cluster_reshard(struct kvpt_cluster *cl, int from, int to, int nslots)
{
    char src[41], dst[41], addr[32], slots[16], log[160];
    kvpt_cluster_id(cl, from, src);
    kvpt_cluster_id(cl, to, dst);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", (unsigned)cl->node[0].port);
    snprintf(slots, sizeof(slots), "%d", nslots);
    snprintf(log, sizeof(log), "%s/cluster-reshard.log", cl->node[0].dir);
    const char *argv[] = {"redis-cli",       "--cluster", "reshard",       addr,
                          "--cluster-from",  src,         "--cluster-to",  dst,
                          "--cluster-slots", slots,       "--cluster-yes", NULL};
    int rc = run(argv, log);
    if (rc != 0)
        fail_msg("redis-cli --cluster reshard exited %d (log: %s)", rc, log);
    cluster_wait(cl);
}
