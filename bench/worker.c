/*
 * worker.c - the benchmark's worker processes and how the parent drives them.
 *
 * Why processes: kvpool serves inference workers, which are separate processes with their own
 * mapping of the pool, their own socket and their own page tables. A worker here is the same:
 * forked once at start, it opens its own kvp_client, allocates and pre-faults its rotating
 * buffers, and starts its raw-socket peer process (not with cfg->lean, as the many section's
 * 16 workers, which never use it). It then lives for the whole run, so its
 * mapping of the pool is warm after the cold pass, as a long-running worker's is.
 *
 * Control: one shared anonymous mapping (created before the fork) holds the current command,
 * one result per worker and one latency-sample array per worker. The parent writes the
 * command, then one byte into each taking-part worker's command pipe; each worker runs the
 * command and answers with one byte on its own done pipe. The pipe write/read pair orders the
 * shared-memory accesses (a system call each way); the fences document that. A worker that
 * dies closes its done pipe, so the parent sees EOF instead of waiting forever.
 *
 * Workers of one command start within microseconds of each other; each stamps its own start
 * and end (CLOCK_MONOTONIC is system-wide), and the parent takes the union as the wall time.
 *
 * Every child asks for SIGTERM when its parent dies (PR_SET_PDEATHSIG), so an interrupted
 * bench leaves no process behind.
 */
#include "worker.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

struct kvpb_shared {
    struct kvpb_cmd cmd;
    struct kvpb_wres res[KVPB_MAX_WORKERS];
    double samples[KVPB_MAX_WORKERS][KVPB_MAX_SAMPLES];
};

struct kvpb_pool {
    struct kvpb_shared *sh;
    uint32_t n;
    pid_t pid[KVPB_MAX_WORKERS];
    int cmd_fd[KVPB_MAX_WORKERS];  /* parent's write end */
    int done_fd[KVPB_MAX_WORKERS]; /* parent's read end */
};

/* File descriptors of a worker's two pipes after its start-up shuffle. */
#define KVPB_FD_CMD 3
#define KVPB_FD_DONE 4

void *kvpb_map_prefaulted(uint64_t bytes, int fill)
{
    /* cppcheck-suppress invalidFunctionArg ; an anonymous mapping takes fd -1 */
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    memset(p, fill, bytes);
    return p;
}

/* Distinct, deterministic bytes in every chunk of src, so a misplaced chunk is caught. */
static void fill_pattern(uint8_t *p, uint64_t bytes, uint32_t seed)
{
    uint64_t x = 0x243f6a8885a308d3ull ^ seed;
    for (uint64_t i = 0; i + 8 <= bytes; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

/* Starts the raw socket peer: a process at the other end of a socketpair. */
static int start_uds_peer(struct kvpb_worker *w)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return -errno;
    pid_t pid = fork();
    if (pid < 0) {
        int e = -errno;
        close(sv[0]);
        close(sv[1]);
        return e;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        close(sv[0]);
        kvpb_uds_peer_main(sv[1], w->footprint);
        _exit(0);
    }
    close(sv[1]);
    w->uds_fd = sv[0];
    w->uds_peer = pid;
    return 0;
}

static int worker_init(struct kvpb_worker *w, const char *socket, const char *redis_socket,
                       struct kvpb_wres *res)
{
    uint64_t f = w->footprint;
    int rc;

    /*
     * Keep freed memory in the process. By default glibc serves every allocation above
     * 128 KiB-32 MiB with a fresh mmap and returns it on free, so hiredis' per-command buffers
     * (a formatted SET, a GET reply) would be new pages every time, and each new page costs a
     * fault (10-25 us on the development VM, 100x bare metal). That would measure the
     * allocator, not Redis. kvpool's library makes no large allocations on its transfer path,
     * so this only gives the comparator its best case.
     */
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, -1);

    /* The peer first: forked later, it would share the buffers copy-on-write, and the first
     * write to each page would then fault in the middle of a measurement. */
    rc = w->cfg->lean ? 0 : start_uds_peer(w);
    if (rc < 0)
        return kvpb_fail(res, rc, "cannot start the raw socket peer: %s", strerror(-rc));
    w->src = kvpb_map_prefaulted(f, 0);
    w->dst = kvpb_map_prefaulted(f, 0);
    w->scratch = kvpb_map_prefaulted(f, 0);
    w->tokens = calloc((size_t)w->chunk_tokens * w->cfg->batch, sizeof(*w->tokens));
    w->long_tokens = calloc((size_t)w->chunk_tokens * KVPB_LOOKUP_CHUNKS, sizeof(*w->tokens));
    if (!w->src || !w->dst || !w->scratch || !w->tokens || !w->long_tokens)
        return kvpb_fail(res, -ENOMEM, "cannot allocate 3 x %llu bytes of buffers",
                         (unsigned long long)f);
    fill_pattern(w->src, f, w->index);
    for (uint32_t t = 4; t < w->chunk_tokens * w->cfg->batch; t++)
        w->tokens[t] = t;
    for (uint32_t t = 4; t < w->chunk_tokens * KVPB_LOOKUP_CHUNKS; t++)
        w->long_tokens[t] = t;

    kvp_opts o = {.socket_path = socket, .timeout_ms = 120000};
    rc = kvp_client_open(&o, &w->client);
    if (rc < 0)
        return kvpb_fail(res, rc, "cannot connect to kvpoold at %s: %s", socket, kvp_strerror(rc));
    if (redis_socket) {
        w->redis = kvpb_redis_connect(redis_socket, res->err, sizeof(res->err));
        if (!w->redis)
            return res->rc = -ECONNREFUSED;
    }
    return 0;
}

static void worker_fini(struct kvpb_worker *w)
{
    kvpb_ops_teardown(w);
    kvp_client_close(w->client);
    kvpb_redis_close(w->redis);
    if (w->uds_fd >= 0) {
        close(w->uds_fd); /* the peer sees EOF and exits */
        waitpid(w->uds_peer, NULL, 0);
    }
}

static void worker_main(struct kvpb_shared *sh, uint32_t index, const struct kvpb_config *cfg,
                        const char *socket, const char *redis_socket, uint32_t chunk_tokens)
{
    struct kvpb_worker w = {
        .index = index,
        .cfg = cfg,
        .chunk_tokens = chunk_tokens,
        .footprint = cfg->footprint,
        .uds_fd = -1,
    };
    struct kvpb_wres *res = &sh->res[index];
    char b = 'r';

    *res = (struct kvpb_wres){0};
    worker_init(&w, socket, redis_socket, res);
    /* Release: the parent reads res after this byte. */
    atomic_thread_fence(memory_order_release);
    if (write(KVPB_FD_DONE, &b, 1) != 1 || res->rc < 0)
        goto out;

    for (;;) {
        ssize_t r = read(KVPB_FD_CMD, &b, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r != 1)
            break; /* the parent closed the pipe: the run is over */
        /* Acquire: the command was written before the byte. */
        atomic_thread_fence(memory_order_acquire);
        struct kvpb_cmd cmd = sh->cmd;
        *res = (struct kvpb_wres){0};
        if (cmd.op == KVPB_OP_SETUP)
            kvpb_ops_setup(&w, &cmd, res);
        else if (cmd.op == KVPB_OP_TEARDOWN)
            kvpb_ops_teardown(&w);
        else
            kvpb_ops_run(&w, &cmd, res, sh->samples[index]);
        atomic_thread_fence(memory_order_release);
        if (write(KVPB_FD_DONE, &b, 1) != 1)
            break;
    }
out:
    worker_fini(&w);
}

/* Reads one byte from a worker's done pipe. Returns 0, or -EPIPE if the worker died. */
static int wait_done(struct kvpb_pool *p, uint32_t i)
{
    char b;
    for (;;) {
        ssize_t r = read(p->done_fd[i], &b, 1);
        if (r == 1)
            return 0;
        if (r < 0 && errno == EINTR)
            continue;
        return -EPIPE;
    }
}

struct kvpb_pool *kvpb_pool_start(const struct kvpb_config *cfg, const char *socket,
                                  const char *redis_socket, uint32_t chunk_tokens)
{
    struct kvpb_pool *p = calloc(1, sizeof(*p));
    int cmd[KVPB_MAX_WORKERS][2], done[KVPB_MAX_WORKERS][2];
    int rc = 0;

    if (!p)
        return NULL;
    /* cppcheck-suppress invalidFunctionArg ; an anonymous mapping takes fd -1 */
    p->sh = mmap(NULL, sizeof(*p->sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p->sh == MAP_FAILED) {
        free(p);
        return NULL;
    }
    for (uint32_t i = 0; i < cfg->workers; i++) {
        if (pipe2(cmd[i], O_CLOEXEC) < 0 || pipe2(done[i], O_CLOEXEC) < 0) {
            perror("kvpool-bench: pipe");
            exit(1);
        }
    }
    /* Buffered output would be printed again by every child. */
    fflush(stdout);
    fflush(stderr);
    for (uint32_t i = 0; i < cfg->workers; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("kvpool-bench: fork");
            exit(1);
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGTERM);
            /* Keep only this worker's pipe ends, at fixed numbers. */
            int a = fcntl(cmd[i][0], F_DUPFD, 16), d = fcntl(done[i][1], F_DUPFD, 16);
            if (a < 0 || d < 0 || dup2(a, KVPB_FD_CMD) < 0 || dup2(d, KVPB_FD_DONE) < 0)
                _exit(1);
            close_range(KVPB_FD_DONE + 1, ~0u, 0);
            worker_main(p->sh, i, cfg, socket, redis_socket, chunk_tokens);
            _exit(0);
        }
        p->pid[i] = pid;
        p->n++;
    }
    for (uint32_t i = 0; i < cfg->workers; i++) {
        close(cmd[i][0]);
        close(done[i][1]);
        p->cmd_fd[i] = cmd[i][1];
        p->done_fd[i] = done[i][0];
    }
    for (uint32_t i = 0; i < p->n; i++) {
        if (wait_done(p, i) < 0) {
            fprintf(stderr, "kvpool-bench: worker %u died during start-up\n", i);
            rc = -1;
            continue;
        }
        atomic_thread_fence(memory_order_acquire);
        if (p->sh->res[i].rc < 0) {
            fprintf(stderr, "kvpool-bench: worker %u: %s\n", i, p->sh->res[i].err);
            rc = -1;
        }
    }
    if (rc < 0) {
        kvpb_pool_stop(p);
        return NULL;
    }
    return p;
}

int kvpb_pool_run(struct kvpb_pool *p, const struct kvpb_cmd *cmd, struct kvpb_wres *res,
                  const double **samples)
{
    uint32_t n = cmd->nworkers ? cmd->nworkers : 1;
    char b = 'c';
    int rc = 0;

    if (n > p->n)
        return -EINVAL;
    p->sh->cmd = *cmd;
    /* Release: the workers read the command after the byte. */
    atomic_thread_fence(memory_order_release);
    for (uint32_t i = 0; i < n; i++)
        if (write(p->cmd_fd[i], &b, 1) != 1)
            return -EPIPE;
    for (uint32_t i = 0; i < n; i++) {
        if (wait_done(p, i) < 0) {
            fprintf(stderr, "kvpool-bench: worker %u died during %s %s\n", i,
                    kvpb_transport_name(cmd->transport), kvpb_op_name(cmd->op));
            rc = -EPIPE;
        }
    }
    atomic_thread_fence(memory_order_acquire);
    for (uint32_t i = 0; i < n; i++) {
        res[i] = p->sh->res[i];
        if (samples)
            samples[i] = p->sh->samples[i];
        if (rc == 0 && res[i].rc < 0) {
            fprintf(stderr, "kvpool-bench: worker %u, %s %s: %s\n", i,
                    kvpb_transport_name(cmd->transport), kvpb_op_name(cmd->op), res[i].err);
            rc = res[i].rc;
        }
    }
    return rc;
}

void kvpb_pool_stop(struct kvpb_pool *p)
{
    if (!p)
        return;
    for (uint32_t i = 0; i < p->n; i++)
        close(p->cmd_fd[i]);
    for (uint32_t i = 0; i < p->n; i++) {
        close(p->done_fd[i]);
        waitpid(p->pid[i], NULL, 0);
    }
    munmap(p->sh, sizeof(*p->sh));
    free(p);
}
