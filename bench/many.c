/*
 * many.c - the "many" section: 16 worker processes (a TP=8 x 2 host) storing and retrieving at
 * once over shm, against two processes copying at once, and the latency of a ping that another
 * client sends meanwhile.
 *
 * The workers are a pool of their own (worker.c), started for this section on the run's
 * daemon and stopped at its end: 16 lean workers (no raw-socket peer) with 64 MiB rotating
 * buffers each, so together they copy from and to 3 GiB that no cache holds. Each repetition,
 * in this order:
 *
 *   1. idle pings: the bench's own client pings once per millisecond, KVPB_IDLE_PINGS times,
 *      with no other load ("ping-idle-p99");
 *   2. the 16 workers store their chunks at once, every one a fresh key, then retrieve them
 *      (each must come back), while the same client keeps pinging once per millisecond from a
 *      thread of the bench ("ping-under-load");
 *   3. memcpy: two of the workers copy, at once, as many bytes together as the 16 moved (the
 *      physical limit of the 2-vCPU development VM is two cores copying).
 *
 * GB/s of a cell is the bytes of all its workers over the union of their wall times; "x
 * memcpy" is the median over repetitions of (cell / memcpy of the same repetition). The ping
 * pacing is the same with and without the load, so the two p99s differ by the load alone.
 * Each ping must succeed and each transfer must move every chunk, else the run ends with the
 * failing worker's message. A warm-up repetition (not reported, every retrieved byte checked)
 * comes first; the workers' first registration maps the pool.
 *
 * Beside each ping the same thread makes one round trip of 32 bytes over a raw Unix socket pair
 * to an echo thread of the bench ("uds" rows), idle and under the same load: what the scheduler
 * alone costs a request that must wake another thread while the CPUs are busy. The kvpool
 * ping's p99 under load against it ("x uds") says how much of the wait is the daemon's.
 *
 * Threads: the main thread drives the workers; one pinger thread at a time owns the ping
 * client, the raw socket's end and their sample arrays, which the main thread reads only after
 * joining it; the echo thread owns the other end until it reads EOF.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench.h"

#define MANY_WORKERS 16u
#define MANY_FOOTPRINT (64 * KVPB_MiB)
#define MANY_CHUNK (4 * KVPB_MiB)
#define KVPB_IDLE_PINGS 100 /* per repetition, before the load */

#define RAW_FRAME 32 /* bytes of a raw round trip: a kvpool header's size */

/* The raw socket's echo end: sends back every frame until EOF. */
static void *echo_main(void *arg)
{
    int fd = *(int *)arg;
    uint8_t b[RAW_FRAME];
    for (;;) {
        ssize_t n = recv(fd, b, sizeof(b), MSG_WAITALL);
        if (n != (ssize_t)sizeof(b) || send(fd, b, sizeof(b), MSG_NOSIGNAL) != (ssize_t)sizeof(b))
            break;
    }
    return NULL;
}

/* One raw round trip on fd; 0 or -EIO. */
static int raw_ping(int fd)
{
    uint8_t b[RAW_FRAME] = {0};
    if (send(fd, b, sizeof(b), MSG_NOSIGNAL) != (ssize_t)sizeof(b) ||
        recv(fd, b, sizeof(b), MSG_WAITALL) != (ssize_t)sizeof(b))
        return -EIO;
    return 0;
}

/* The pinger: one client pinging once per millisecond until told to stop (or max pings),
 * each ping followed by a raw round trip. */
struct pinger {
    pthread_t thread;
    kvp_client *client;
    int raw_fd;
    atomic_bool stop;
    uint32_t max;             /* 0: until stop */
    struct kvpb_samples *lat; /* microseconds, appended */
    struct kvpb_samples *raw; /* the raw round trips' */
    int rc;                   /* first failure, 0 if none */
};

static void *ping_main(void *arg)
{
    struct pinger *p = arg;
    uint32_t done = 0;

    while (!atomic_load_explicit(&p->stop, memory_order_relaxed)) {
        uint64_t t0 = kvpb_now_ns();
        int rc = kvp_ping(p->client);
        uint64_t t1 = kvpb_now_ns();
        if (rc == 0)
            rc = raw_ping(p->raw_fd);
        uint64_t t2 = kvpb_now_ns();
        if (rc < 0 || kvpb_samples_push(p->lat, (double)(t1 - t0) / 1e3) < 0 ||
            kvpb_samples_push(p->raw, (double)(t2 - t1) / 1e3) < 0) {
            p->rc = rc < 0 ? rc : -ENOMEM;
            break;
        }
        if (p->max && ++done >= p->max)
            break;
        kvpb_sleep_ms(1);
    }
    return NULL;
}

static void ping_start(struct pinger *p, kvp_client *c, int raw_fd, uint32_t max,
                       struct kvpb_samples *lat, struct kvpb_samples *raw)
{
    *p = (struct pinger){.client = c, .raw_fd = raw_fd, .max = max, .lat = lat, .raw = raw};
    atomic_init(&p->stop, false);
    if (pthread_create(&p->thread, NULL, ping_main, p) != 0) {
        fprintf(stderr, "kvpool-bench: cannot start the ping thread\n");
        exit(1);
    }
}

/* Joins the pinger, after telling it to stop unless it stops by itself (max pings). A failed
 * ping ends the run. */
static void ping_join(struct pinger *p)
{
    if (!p->max)
        atomic_store_explicit(&p->stop, true, memory_order_relaxed);
    pthread_join(p->thread, NULL);
    if (p->rc < 0) {
        fprintf(stderr, "kvpool-bench: many: ping: %s (%s)\n", kvp_strerror(p->rc),
                p->rc == -EIO ? "the raw socket's echo" : kvp_last_error(p->client));
        exit(1);
    }
}

/* One measured cell: per-repetition GB/s and ops/s, every latency sample. */
/* Runs cmd on its workers; adds the repetition to c when c is not NULL. Exits on a failure. */
static void run(struct kvpb_pool *pool, const struct kvpb_cmd *cmd, struct kvpb_cell *c)
{
    struct kvpb_wres res[KVPB_MAX_WORKERS];
    const double *samples[KVPB_MAX_WORKERS];
    uint64_t t0 = UINT64_MAX, t1 = 0, bytes = 0, ops = 0;

    if (kvpb_pool_run(pool, cmd, res, samples) < 0)
        exit(1);
    if (!c)
        return;
    for (uint32_t i = 0; i < cmd->nworkers; i++) {
        t0 = res[i].t_start_ns < t0 ? res[i].t_start_ns : t0;
        t1 = res[i].t_end_ns > t1 ? res[i].t_end_ns : t1;
        bytes += res[i].bytes;
        ops += res[i].nops;
        if (kvpb_samples_append(&c->lat, samples[i], res[i].nops) < 0)
            exit(1);
    }
    kvpb_cell_add(c, (double)(t1 - t0), bytes, ops, NULL);
}

/* The idle and the under-load rows of one kind of ping, the latter's p99 also against vs_p99
 * (ratio_to_uds; NAN: none); returns the under-load p99. */
static double push_pings(struct kvpb_rows *rows, int transport, uint32_t reps,
                         const struct kvpb_samples *idle, const struct kvpb_samples *busy,
                         double vs_p99)
{
    struct kvpb_row ri = kvpb_row_blank(transport, KVPB_OP_PING_IDLE_P99, "");
    struct kvpb_row rl = kvpb_row_blank(transport, KVPB_OP_PING_LOAD, "");
    ri.reps = rl.reps = reps;
    ri.samples = idle->n;
    rl.samples = busy->n;
    ri.p50_us = kvpb_percentile(idle->v, idle->n, 50.0);
    ri.p99_us = kvpb_percentile(idle->v, idle->n, 99.0);
    rl.p50_us = kvpb_percentile(busy->v, busy->n, 50.0);
    rl.p99_us = kvpb_percentile(busy->v, busy->n, 99.0);
    rl.workers = MANY_WORKERS; /* the load it ran under */
    rl.ratio_to_idle = rl.p99_us / ri.p99_us;
    rl.ratio_to_uds = rl.p99_us / vs_p99;
    kvpb_rows_push(rows, &ri);
    kvpb_rows_push(rows, &rl);
    return rl.p99_us;
}

/* A bulk row of the section; ratio against memcpy's repetitions when mc is not NULL. */
static void push_bulk(struct kvpb_rows *rows, int transport, int op, uint32_t workers,
                      uint64_t chunk, struct kvpb_cell *c, const struct kvpb_cell *mc)
{
    struct kvpb_row r = kvpb_row_blank(transport, op, KVPB_D_MANY);

    r.workers = workers;
    r.chunk_bytes = chunk;
    if (mc && mc->gbps.n == c->gbps.n)
        r.ratio_to_memcpy = kvpb_paired_ratio(c->gbps.v, mc->gbps.v, c->gbps.n);
    kvpb_cell_push(rows, &r, c);
}

void kvpb_many_phase(const struct kvpb_config *cfg, const char *socket, uint32_t chunk_tokens,
                     uint64_t pool_size, uint32_t run_id, uint64_t *next_seq,
                     struct kvpb_rows *rows)
{
    struct kvpb_config mc = *cfg;
    struct kvpb_wres res[KVPB_MAX_WORKERS];
    struct kvpb_cell store = {0}, retrieve = {0}, copy = {0};
    struct kvpb_samples idle = {0}, busy = {0}, raw_idle = {0}, raw_busy = {0};
    int raw[2] = {-1, -1};
    pthread_t echo;
    bool echoing = false;
    uint64_t chunk = cfg->quick ? 256 * KVPB_KiB : MANY_CHUNK;
    uint32_t idle_pings = cfg->quick ? 20 : KVPB_IDLE_PINGS;
    kvp_client *pc = NULL;
    char sz[32];

    mc.workers = MANY_WORKERS;
    mc.footprint = cfg->quick ? KVPB_MiB : MANY_FOOTPRINT;
    mc.batch = 1;
    mc.lean = true;
    /* Everything one repetition stores must still be in the pool when it is retrieved. */
    uint64_t room = pool_size / (2ull * MANY_WORKERS);
    uint64_t nops = room / chunk;
    if (nops > cfg->rep_bytes / chunk)
        nops = cfg->rep_bytes / chunk;
    if (nops < 1) {
        printf("many: skipped: a %s pool holds less than %u x 2 chunks of %s\n",
               kvpb_fmt_size(pool_size, sz, sizeof(sz)), MANY_WORKERS,
               kvpb_fmt_size(chunk, (char[32]){0}, 32));
        return;
    }
    uint64_t t_start = kvpb_now_ns();
    printf("many: %u worker processes, %" PRIu64 " x %s chunks each per repetition, "
           "%u+1 repetitions; starting them ...",
           MANY_WORKERS, nops, kvpb_fmt_size(chunk, sz, sizeof(sz)), cfg->reps);
    fflush(stdout);
    struct kvpb_pool *pool = kvpb_pool_start(&mc, socket, NULL, chunk_tokens);
    if (!pool)
        exit(1);
    struct kvpb_cmd cmd = {.transport = KVPB_T_SHM,
                           .op = KVPB_OP_SETUP,
                           .chunk_bytes = chunk,
                           .nworkers = MANY_WORKERS,
                           .run_id = run_id,
                           .batch = 1};
    if (kvpb_pool_run(pool, &cmd, res, NULL) < 0)
        exit(1);
    for (uint32_t i = 0; i < MANY_WORKERS; i++)
        if (!res[i].shm) {
            printf(" skipped: worker %u got no shared memory (see the daemon's log)\n", i);
            goto out_stop;
        }
    printf(" %.1f s\n", (double)(kvpb_now_ns() - t_start) / 1e9);
    fflush(stdout);
    kvp_opts o = {.socket_path = socket, .timeout_ms = 60000};
    int rc = kvp_client_open(&o, &pc);
    if (rc < 0) {
        fprintf(stderr, "kvpool-bench: many: cannot connect: %s\n", kvp_strerror(rc));
        exit(1);
    }
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, raw) < 0 ||
        pthread_create(&echo, NULL, echo_main, &raw[1]) != 0) {
        fprintf(stderr, "kvpool-bench: many: cannot start the raw socket's echo\n");
        exit(1);
    }
    echoing = true;

    for (uint32_t rep = 0; rep <= cfg->reps; rep++) {
        bool m = rep > 0;
        struct pinger p;
        if (m) {
            ping_start(&p, pc, raw[0], idle_pings, &idle, &raw_idle);
            ping_join(&p);
        }
        cmd = (struct kvpb_cmd){.transport = KVPB_T_SHM,
                                .op = KVPB_OP_STORE,
                                .chunk_bytes = chunk,
                                .nops = (uint32_t)nops,
                                .seq_base = *next_seq,
                                .verify = !m,
                                .nworkers = MANY_WORKERS,
                                .run_id = run_id,
                                .batch = 1};
        *next_seq += nops;
        if (m)
            ping_start(&p, pc, raw[0], 0, &busy, &raw_busy);
        run(pool, &cmd, m ? &store : NULL);
        cmd.op = KVPB_OP_RETRIEVE;
        run(pool, &cmd, m ? &retrieve : NULL);
        if (m)
            ping_join(&p);
        /* Two processes copy together as many bytes as the 16 workers stored. */
        cmd = (struct kvpb_cmd){.transport = KVPB_T_MEMCPY,
                                .op = KVPB_OP_COPY,
                                .chunk_bytes = chunk,
                                .nops = (uint32_t)(nops * MANY_WORKERS / 2),
                                .nworkers = 2,
                                .run_id = run_id,
                                .batch = 1};
        run(pool, &cmd, m ? &copy : NULL);
    }
    printf("many: %.1f s\n", (double)(kvpb_now_ns() - t_start) / 1e9);

    push_bulk(rows, KVPB_T_MEMCPY, KVPB_OP_COPY, 2, chunk, &copy, NULL);
    push_bulk(rows, KVPB_T_SHM, KVPB_OP_STORE, MANY_WORKERS, chunk, &store, &copy);
    push_bulk(rows, KVPB_T_SHM, KVPB_OP_RETRIEVE, MANY_WORKERS, chunk, &retrieve, &copy);
    /* The daemon's share of the wait under load: kvpool's p99 against the raw socket's. */
    double raw_p99 = push_pings(rows, KVPB_T_UDS, cfg->reps, &raw_idle, &raw_busy, NAN);
    push_pings(rows, KVPB_T_KVPOOL, cfg->reps, &idle, &busy, raw_p99);
out_stop:
    if (echoing) {
        shutdown(raw[0], SHUT_RDWR);
        pthread_join(echo, NULL);
    }
    if (raw[0] >= 0) {
        close(raw[0]);
        close(raw[1]);
    }
    kvpb_samples_free(&raw_idle);
    kvpb_samples_free(&raw_busy);
    kvp_client_close(pc);
    kvpb_pool_stop(pool);
    kvpb_cell_free(&store);
    kvpb_cell_free(&retrieve);
    kvpb_cell_free(&copy);
    kvpb_samples_free(&idle);
    kvpb_samples_free(&busy);
}
