/*
 * l2.c - the L2 tier's rows (--only l2; part of the default run when Redis is available).
 *
 * Against the bench's redis-server (private Unix socket), in one run and with the same values:
 *
 *   write-behind  a worker stores N chunks into a daemon with --l2 (one L2 connection); the
 *                 time from the first store until the daemon reports every chunk written to
 *                 Redis, against one hiredis connection SETting the same N values (header and
 *                 chunk, as the daemon sends them) one after the other;
 *   L2 load       a second daemon with an empty L1 and the same --l2: a worker's lookup and
 *                 retrieve of the N chunks (each loaded from Redis into L1, then copied out of
 *                 the shared pool), against one hiredis connection GETting the same N values
 *                 into the worker's buffers;
 *   L1 hit        a retrieve of N chunks that are in L1, from the daemon with --l2 and from one
 *                 without: L2 must cost nothing there.
 *
 * Each cell is repeated (new sequences, so every repetition really goes through Redis) and the
 * median is reported; the ratios are the medians' ratios. Every retrieved byte is checked once
 * after the timed part. The daemons run as children of the bench, in its directory.
 */
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

#ifdef KVPB_HAVE_HIREDIS
#include <hiredis/hiredis.h>

#define L2_TOKENS 16 /* --chunk-size of the daemons here */
#define L2_HEADER 128
#define L2_MAX_REPS 5
#define L2_BATCH 16 /* chunks per store call */

struct l2_daemon {
    struct kvpb_child ch;
    char socket[300];
    kvp_client *c;
    kvp_instance *inst;
};

static void fill(uint8_t *p, size_t len, uint32_t seq, uint32_t i)
{
    uint64_t x = (uint64_t)seq << 32 | i;
    for (size_t k = 0; k + 8 <= len; k += 8) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        memcpy(p + k, &x, 8);
    }
}

static int start_daemon(struct l2_daemon *d, const char *exe, const char *dir, const char *name,
                        uint64_t l1, const char *l2_url)
{
    char l1s[32], log[300], shm[64];
    snprintf(d->socket, sizeof(d->socket), "%s/%s.sock", dir, name);
    snprintf(log, sizeof(log), "%s/%s.log", dir, name);
    snprintf(l1s, sizeof(l1s), "%" PRIu64, l1);
    snprintf(shm, sizeof(shm), "bench_%s_%d", name, (int)getpid());
    char *argv[24] = {(char *)exe,    "--socket", d->socket,    "--l1-size", l1s,
                      "--chunk-size", "16",       "--shm-name", shm,         "--log-level",
                      "warn",         "--http",   "off"};
    int n = 13;
    if (l2_url) {
        argv[n++] = "--l2";
        argv[n++] = (char *)l2_url;
        argv[n++] = "--l2-connections";
        argv[n++] = "1";
        argv[n++] = "--l2-queue";
        argv[n++] = "4GiB";
        argv[n++] = "--l2-timeout";
        argv[n++] = "10000";
    }
    argv[n] = NULL;
    int rc = kvpb_child_spawn(&d->ch, name, argv, log);
    if (rc == 0)
        rc = kvpb_wait_kvpoold(d->socket, &d->ch, 120000);
    kvp_opts o = {.socket_path = d->socket, .timeout_ms = 60000};
    if (rc == 0)
        rc = kvp_client_open(&o, &d->c);
    return rc;
}

/* Registers a float16 layout whose chunk is `chunk` bytes: 2 x layers x 16 tokens x hidden. */
static int reg(struct l2_daemon *d, uint64_t chunk)
{
    kvp_register_opts o = {
        .instance_id = "bench-l2",
        .model_name = "bench-l2",
        .world_size = 1,
        .block_size = 16,
        .num_layers = (uint32_t)(chunk / (2 * L2_TOKENS * 1024 * 2)),
        .hidden_dim = 1024,
        .dtype = "float16",
        .transport = KVP_TRANSPORT_AUTO,
    };
    if (d->inst)
        kvp_unregister(d->inst);
    d->inst = NULL;
    return kvp_register(d->c, &o, &d->inst);
}

static uint64_t stat_of(struct l2_daemon *d, const char *name)
{
    kvp_stat st[128];
    int n = kvp_stats(d->c, st, 128);
    for (int i = 0; i < n; i++)
        if (strcmp(st[i].name, name) == 0)
            return st[i].value;
    return 0;
}

static void stop_daemon(struct l2_daemon *d)
{
    if (d->inst)
        kvp_unregister(d->inst);
    kvp_client_close(d->c);
    kvpb_child_stop(&d->ch, 20000);
    *d = (struct l2_daemon){0};
}

static uint32_t *tokens_of(uint32_t seq, uint32_t n)
{
    uint32_t *t = malloc(sizeof(*t) * n * L2_TOKENS);
    for (uint32_t i = 0; t && i < n * L2_TOKENS; i++)
        t[i] = seq * 2654435761u + i;
    return t;
}

static int store_all(struct l2_daemon *d, const kvp_tokens *t, uint8_t **bufs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i += L2_BATCH) {
        uint32_t k = n - i < L2_BATCH ? n - i : L2_BATCH;
        kvp_store_result r;
        kvp_tokens prefix = {.ids = t->ids, .count = (i + k) * L2_TOKENS};
        int rc = kvp_store(d->inst, &prefix, i * L2_TOKENS, (i + k) * L2_TOKENS,
                           (const void *const *)(bufs + i), &r);
        if (rc < 0 || r.stored + r.cached != k)
            return rc < 0 ? rc : -ENOSPC;
    }
    return 0;
}

static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n ? (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2) : NAN;
}

struct l2_result {
    double wb, set, load, get, hit_on, hit_off; /* GB/s, medians */
    double r_wb, r_load, r_hit;                 /* medians of the paired ratios */
};

static void fail_msg_exit(const char *what, int rc)
{
    fprintf(stderr, "kvpool-bench: l2: %s: %s\n", what, kvp_strerror(rc));
    exit(1);
}

/* One chunk size: every cell, reps times. */
static void run_size(struct l2_daemon *a, struct l2_daemon *b, struct l2_daemon *o,
                     redisContext *rc, uint64_t chunk, uint32_t n, int reps, uint32_t seq0,
                     struct l2_result *res)
{
    double wb[L2_MAX_REPS], set[L2_MAX_REPS], load[L2_MAX_REPS], get[L2_MAX_REPS];
    double hon[L2_MAX_REPS], hoff[L2_MAX_REPS], rwb[L2_MAX_REPS], rload[L2_MAX_REPS];
    double rhit[L2_MAX_REPS];
    uint8_t **bufs = calloc(n, sizeof(*bufs)), **out = calloc(n, sizeof(*out));
    uint8_t *value = malloc(L2_HEADER + chunk);
    int e;

    if (!bufs || !out || !value)
        exit(1);
    for (uint32_t i = 0; i < n; i++) {
        bufs[i] = malloc(chunk);
        out[i] = malloc(chunk);
        if (!bufs[i] || !out[i])
            exit(1);
        memset(out[i], 0, chunk); /* faulted in before any timing */
    }
    if ((e = reg(a, chunk)) < 0 || (e = reg(b, chunk)) < 0 || (e = reg(o, chunk)) < 0)
        fail_msg_exit("register", e);
    /* Repetition -1 warms up: the daemons' pools are small enough that each repetition evicts
     * the one before, so from then on the slots it uses are pages this process has touched
     * through its mapping already, as in a long-running worker (a first touch costs more than
     * the copy). */
    for (int r = -1; r < reps; r++) {
        uint32_t seq = seq0 + (uint32_t)(r + 1);
        uint32_t *ids = tokens_of(seq, n);
        kvp_tokens t = {.ids = ids, .count = n * L2_TOKENS};
        for (uint32_t i = 0; i < n; i++)
            fill(bufs[i], chunk, seq, i);
        double bytes = (double)n * (double)(chunk + L2_HEADER);

        /* Write-behind: from the first store to the last chunk in Redis. */
        uint64_t written = stat_of(a, "l2_written_chunks");
        uint64_t t0 = kvpb_now_ns();
        if ((e = store_all(a, &t, bufs, n)) < 0)
            fail_msg_exit("store", e);
        uint64_t failed = stat_of(a, "l2_write_failed") + stat_of(a, "l2_write_dropped");
        while (stat_of(a, "l2_written_chunks") < written + n) {
            if (stat_of(a, "l2_write_failed") + stat_of(a, "l2_write_dropped") != failed ||
                kvpb_now_ns() - t0 > 120000000000ull)
                fail_msg_exit("write-behind did not complete", -EIO);
            usleep(200); /* two cores: the poll must not take one from the daemon or Redis */
        }
        double wb_r = bytes / (double)(kvpb_now_ns() - t0);

        /* Raw SET of the same values, one connection. */
        t0 = kvpb_now_ns();
        for (uint32_t i = 0; i < n; i++) {
            memset(value, 0, L2_HEADER);
            memcpy(value + L2_HEADER, bufs[i], chunk);
            redisReply *rep = redisCommand(rc, "SET bench:l2:%u:%u %b", seq, i, value,
                                           (size_t)(L2_HEADER + chunk));
            if (!rep || rep->type == REDIS_REPLY_ERROR)
                fail_msg_exit("SET", -EIO);
            freeReplyObject(rep);
        }
        double set_r = bytes / (double)(kvpb_now_ns() - t0);

        /* L2 load: an empty L1 behind lookup + retrieve. */
        t0 = kvpb_now_ns();
        int got = kvp_lookup(b->inst, &t);
        if (got != (int)n)
            fail_msg_exit("lookup through L2", got < 0 ? got : -ENOENT);
        got = kvp_retrieve(b->inst, &t, 0, n * L2_TOKENS, (void **)out);
        if (got != (int)n)
            fail_msg_exit("retrieve through L2", got < 0 ? got : -ENOENT);
        double load_r = (double)n * (double)chunk / (double)(kvpb_now_ns() - t0);
        for (uint32_t i = 0; i < n; i++)
            if (memcmp(out[i], bufs[i], chunk) != 0)
                fail_msg_exit("a chunk loaded from L2 differs", -EIO);

        /* Raw GET of the same values into the same buffers. */
        t0 = kvpb_now_ns();
        for (uint32_t i = 0; i < n; i++) {
            redisReply *rep = redisCommand(rc, "GET bench:l2:%u:%u", seq, i);
            if (!rep || rep->type != REDIS_REPLY_STRING || rep->len != L2_HEADER + chunk)
                fail_msg_exit("GET", -EIO);
            memcpy(out[i], rep->str + L2_HEADER, chunk);
            freeReplyObject(rep);
        }
        double get_r = (double)n * (double)chunk / (double)(kvpb_now_ns() - t0);

        /* L1 hits, with and without L2 behind. */
        if ((e = store_all(o, &t, bufs, n)) < 0)
            fail_msg_exit("store without L2", e);
        /* Each daemon's pages are touched once through this process' mapping first, and the
         * order alternates, so that neither side pays the first touch or goes first always. */
        struct l2_daemon *hit[2] = {a, o};
        double gbps[2] = {0, 0};
        for (int k = 0; k < 4; k++) {
            int h = (k + r + 2) % 2;
            t0 = kvpb_now_ns();
            got = kvp_retrieve(hit[h]->inst, &t, 0, n * L2_TOKENS, (void **)out);
            if (got != (int)n)
                fail_msg_exit("L1 retrieve", got < 0 ? got : -ENOENT);
            if (k >= 2)
                gbps[h] = (double)n * (double)chunk / (double)(kvpb_now_ns() - t0);
        }
        freeReplyObject(redisCommand(rc, "FLUSHALL"));
        free(ids);
        if (r < 0)
            continue;
        wb[r] = wb_r;
        set[r] = set_r;
        load[r] = load_r;
        get[r] = get_r;
        hon[r] = gbps[0];
        hoff[r] = gbps[1];
        /* Paired ratios: a burst of load from elsewhere hits both sides of a repetition. */
        rwb[r] = wb_r / set_r;
        rload[r] = load_r / get_r;
        rhit[r] = gbps[0] / gbps[1];
    }
    res->wb = median(wb, reps);
    res->set = median(set, reps);
    res->load = median(load, reps);
    res->get = median(get, reps);
    res->hit_on = median(hon, reps);
    res->hit_off = median(hoff, reps);
    res->r_wb = median(rwb, reps);
    res->r_load = median(rload, reps);
    res->r_hit = median(rhit, reps);
    for (uint32_t i = 0; i < n; i++) {
        free(bufs[i]);
        free(out[i]);
    }
    free(bufs);
    free(out);
    free(value);
}

void kvpb_l2_phase(const struct kvpb_config *cfg, const char *kvpoold, const char *dir,
                   const char *redis_socket)
{
    static const uint64_t sizes[] = {1u << 20, 4u << 20};
    uint64_t total = cfg->quick ? 8u << 20 : 128u << 20; /* bytes per cell and repetition */
    int reps = cfg->quick ? 1 : L2_MAX_REPS, nsizes = cfg->quick ? 1 : 2;
    struct l2_daemon a = {0}, b = {0}, o = {0};
    char url[300];
    int e;

    printf("\nL2 tier (write-behind and loads through Redis, %s per cell; medians of %d, ratios "
           "paired per repetition)\n",
           kvpb_fmt_size(total, (char[32]){0}, 32), reps);
    fflush(stdout);
    /* As the workers do (worker.c): hiredis' buffers for large values must not go back to
     * the kernel after every command, or the raw comparator measures page faults, not Redis. */
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, -1);
    snprintf(url, sizeof(url), "unix://%s", redis_socket);
    /* Room for one repetition and a quarter: the next one evicts it (see run_size()). */
    uint64_t l1 = total + total / 4 + (16u << 20);
    if ((e = start_daemon(&a, kvpoold, dir, "l2-writer", l1, url)) < 0 ||
        (e = start_daemon(&b, kvpoold, dir, "l2-reader", l1, url)) < 0 ||
        (e = start_daemon(&o, kvpoold, dir, "l2-off", l1, NULL)) < 0)
        fail_msg_exit("start the daemons", e);
    struct timeval tv = {.tv_sec = 60};
    redisContext *rc = redisConnectUnixWithTimeout(redis_socket, tv);
    if (!rc || rc->err)
        fail_msg_exit("connect to redis-server", -ECONNREFUSED);
    freeReplyObject(redisCommand(rc, "FLUSHALL"));

    printf("%-10s %-28s %10s %12s %8s\n", "chunk", "cell", "GB/s", "vs", "ratio");
    for (int s = 0; s < nsizes; s++) {
        uint64_t chunk = cfg->quick ? 256u << 10 : sizes[s];
        struct l2_result r;
        run_size(&a, &b, &o, rc, chunk, (uint32_t)(total / chunk), reps, 1000u * (uint32_t)s + 7,
                 &r);
        char sz[32];
        kvpb_fmt_size(chunk, sz, sizeof(sz));
        printf("%-10s %-28s %10.2f %12s %8.2f\n", sz, "write-behind", r.wb, "SET", r.r_wb);
        printf("%-10s %-28s %10.2f %12.2f %8s\n", sz, "  raw hiredis SET", r.set, r.set, "");
        printf("%-10s %-28s %10.2f %12s %8.2f\n", sz, "L2 load (lookup + retrieve)", r.load, "GET",
               r.r_load);
        printf("%-10s %-28s %10.2f %12.2f %8s\n", sz, "  raw hiredis GET", r.get, r.get, "");
        printf("%-10s %-28s %10.2f %12s %8.2f\n", sz, "L1-hit retrieve, L2 on", r.hit_on, "L2 off",
               r.r_hit);
        printf("%-10s %-28s %10.2f %12.2f %8s\n", sz, "  L1-hit retrieve, L2 off", r.hit_off,
               r.hit_off, "");
        fflush(stdout);
    }
    redisFree(rc);
    stop_daemon(&a);
    stop_daemon(&b);
    stop_daemon(&o);
}

#else

void kvpb_l2_phase(const struct kvpb_config *cfg, const char *kvpoold, const char *dir,
                   const char *redis_socket)
{
    (void)cfg, (void)kvpoold, (void)dir, (void)redis_socket;
    printf("L2 tier: skipped (kvpool-bench was built without hiredis)\n");
}

#endif
