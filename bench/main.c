/*
 * main.c - kvpool-bench: kvpool against the physical limit and against Redis, in one run.
 *
 * What runs, in this order (docs/PERFORMANCE.md explains the method):
 *
 *   1. Start kvpoold on a private socket (or use --socket), redis-server on a private Unix
 *      socket when it and hiredis are available, and the worker processes (worker.c).
 *   2. First pass: each worker stores one pool's worth of chunks on each transport, right after
 *      mapping the pool. Reported as its own rows ("first-store"); afterwards every page has
 *      been written through the worker's mapping and the daemon's socket path, as in a
 *      long-running deployment, and the sweep measures the steady state.
 *   3. Sweep: for each chunk size, repetitions of the cells
 *          memcpy | shm store, retrieve | inline store, retrieve | raw socket store, retrieve |
 *          Redis SET, GET
 *      interleaved (repetition r of every cell runs before repetition r + 1 of any) and in a
 *      rotating order, so a burst of load from another process on this shared machine hits
 *      every cell alike, and the ratio of each cell to memcpy is taken per repetition (paired)
 *      before the median.
 *      Repetition 0 is a warm-up: not reported, but every retrieved byte is checked in it.
 *   4. Round trips: kvpool ping and lookup against a raw Unix-socket ping-pong (and Redis PING).
 *   5. Paged gather/scatter against memcpy of the same bytes (one worker).
 *   6. Pressure: get-or-put of random keys out of a working set several times the pool.
 *   7. Table on stdout, CSV, JSON, chart; stop everything, remove the temporary directory.
 *   8. The L2 tier (l2.c), with daemons of its own on the same redis-server: write-behind and
 *      loads against raw hiredis SET/GET, L1 hits with L2 on and off; a table of its own.
 *
 * The scale sections run in their own files and add their rows to x->extra: start-up of
 * daemons of 1-12 GiB (startup.c, before anything else, so that nothing else holds memory),
 * warm restart of 1-12 GiB pools (restart.c, after the fragmentation section, for the same
 * reason), the Python binding against the C path (python.c, on the worker pool, after the pressure
 * rows), 16 workers at once with a ping meanwhile (many.c, once the run's workers have
 * stopped) and the daemon's memory with 64 clients (memory.c, last). The round-trip section
 * also looks up a cached 128-chunk prefix ("lookup-128"). The LMCache section (lmcache.c)
 * starts its own servers, after the fragmentation section and before the main daemon, and so
 * does the vLLM section (vllm.c), after it.
 *
 * Cells accumulate into struct acc (per-repetition rates in run order, every latency sample),
 * which become report rows at the end. Any failed operation aborts the run with the worker's
 * message: numbers from a run that did not do what it claims are never printed.
 */
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "bench.h"
#include "kvpool_paged.h"

/* One measured cell: a (transport, op, detail, chunk size, workers) combination. */
struct acc {
    int transport, op;
    const char *detail;
    uint64_t chunk;
    uint32_t batch; /* chunks per operation */
    uint32_t workers;
    struct kvpb_samples lat;      /* every operation's latency, microseconds */
    struct kvpb_samples rep_gbps; /* one per measured repetition, in run order */
    struct kvpb_samples rep_ops;
    uint64_t ops, hits, evictions, minflt, nivcsw;
    double copy_ns, op_ns; /* shm: time in the copy, time of the whole operations */
    double load1;
};

struct ctx {
    struct kvpb_config cfg;
    struct kvpb_pool *pool;
    kvp_client *client; /* the bench's own connection: statistics only */
    uint64_t pool_size;
    uint32_t chunk_tokens;
    uint64_t next_seq; /* next unused key number */
    uint32_t run_id;
    bool redis; /* comparator running */
    struct acc *accs;
    size_t naccs, cap;
    struct kvpb_rows extra; /* rows of the sections that build their own (bench.h) */
};

static double load1(void)
{
    double l[1];
    return getloadavg(l, 1) == 1 ? l[0] : NAN;
}

static struct acc *acc_get(struct ctx *x, int transport, int op, const char *detail, uint64_t chunk,
                           uint32_t workers)
{
    for (size_t i = 0; i < x->naccs; i++) {
        struct acc *a = &x->accs[i];
        if (a->transport == transport && a->op == op && a->chunk == chunk &&
            a->workers == workers && strcmp(a->detail, detail) == 0)
            return a;
    }
    if (x->naccs == x->cap) {
        size_t cap = x->cap ? 2 * x->cap : 64;
        struct acc *v = realloc(x->accs, cap * sizeof(*v));
        if (!v) {
            fprintf(stderr, "kvpool-bench: out of memory\n");
            exit(1);
        }
        x->accs = v;
        x->cap = cap;
    }
    struct acc *a = &x->accs[x->naccs++];
    *a = (struct acc){.transport = transport,
                      .op = op,
                      .detail = detail,
                      .chunk = chunk,
                      .batch = 1,
                      .workers = workers};
    return a;
}

/* Reads one daemon statistic, or returns 0 when it does not exist. */
static uint64_t daemon_stat(struct ctx *x, const char *name)
{
    kvp_stat st[128];
    int n = kvp_stats(x->client, st, 128);
    for (int i = 0; i < n && i < 128; i++)
        if (strcmp(st[i].name, name) == 0)
            return st[i].value;
    return 0;
}

/*
 * Runs one command on the workers; when `measured`, adds the repetition to the cell. Exits the
 * program on any failure (after the caller's atexit clean-up).
 */
static void run(struct ctx *x, const struct kvpb_cmd *cmd, bool measured, const char *detail)
{
    struct kvpb_wres res[KVPB_MAX_WORKERS];
    const double *samples[KVPB_MAX_WORKERS];
    uint32_t n = cmd->nworkers;

    if (kvpb_pool_run(x->pool, cmd, res, samples) < 0)
        exit(1);
    if (!measured)
        return;
    struct acc *a = acc_get(x, cmd->transport, cmd->op, detail, cmd->chunk_bytes, n);
    a->batch = cmd->op == KVPB_OP_LOOKUP128 ? KVPB_LOOKUP_CHUNKS : cmd->batch;
    uint64_t t0 = UINT64_MAX, t1 = 0, bytes = 0, ops = 0;
    for (uint32_t i = 0; i < n; i++) {
        t0 = res[i].t_start_ns < t0 ? res[i].t_start_ns : t0;
        t1 = res[i].t_end_ns > t1 ? res[i].t_end_ns : t1;
        bytes += res[i].bytes;
        ops += res[i].nops;
        a->hits += res[i].hits;
        a->minflt += res[i].minflt;
        a->nivcsw += res[i].nivcsw;
        if (kvpb_samples_append(&a->lat, samples[i], res[i].nops) < 0)
            exit(1);
        a->copy_ns += (double)res[i].copy_ns;
        for (uint32_t k = 0; k < res[i].nops; k++)
            a->op_ns += samples[i][k] * 1e3;
    }
    double secs = (double)(t1 - t0) / 1e9;
    a->ops += ops;
    if (kvpb_samples_push(&a->rep_gbps, bytes ? (double)bytes / secs / 1e9 : NAN) < 0 ||
        kvpb_samples_push(&a->rep_ops, (double)ops / secs) < 0)
        exit(1);
    a->load1 = load1();
}

/* Operations per worker and repetition: about --rep-bytes, in calls of `batch` chunks. */
static uint32_t ops_per_rep(const struct ctx *x, uint64_t chunk, uint32_t batch)
{
    uint64_t bytes = x->cfg.rep_bytes;
    /* Everything one repetition stores must still be in the pool when it is retrieved. */
    uint64_t room = x->pool_size / (2ull * x->cfg.workers);
    if (bytes > room)
        bytes = room;
    uint64_t n = bytes / chunk / batch;
    /* At least 4 operations for a median per repetition, as far as the pool allows. */
    uint64_t fit = room / chunk / batch;
    if (n < 4)
        n = fit < 4 ? fit : 4;
    if (n < 1)
        n = 1;
    if (n > KVPB_MAX_SAMPLES)
        n = KVPB_MAX_SAMPLES;
    return (uint32_t)n;
}

/*
 * Registers instances for `chunk` on every worker; returns true when all have shm. The first
 * call of the run is the workers' first shm registration, which maps the pool: its duration is
 * recorded as the "register" row.
 */
static bool setup_size(struct ctx *x, uint64_t chunk)
{
    struct kvpb_cmd cmd = {.transport = KVPB_T_SHM,
                           .op = KVPB_OP_SETUP,
                           .chunk_bytes = chunk,
                           .nworkers = x->cfg.workers,
                           .run_id = x->run_id};
    struct kvpb_wres res[KVPB_MAX_WORKERS];
    static bool first = true;
    bool shm = true;

    if (kvpb_pool_run(x->pool, &cmd, res, NULL) < 0)
        exit(1);
    for (uint32_t i = 0; i < x->cfg.workers; i++)
        shm = shm && res[i].shm;
    if (first && shm) {
        struct acc *a = acc_get(x, KVPB_T_SHM, KVPB_OP_REGISTER, "maps the pool", 0,
                                x->cfg.workers);
        for (uint32_t i = 0; i < x->cfg.workers; i++) {
            double us = (double)(res[i].t_end_ns - res[i].t_start_ns) / 1e3;
            kvpb_samples_push(&a->lat, us);
            /* GB/s here is the rate at which the pool became usable. */
            kvpb_samples_push(&a->rep_gbps, (double)x->pool_size / (us * 1e3));
            kvpb_samples_push(&a->rep_ops, 1e6 / us);
            a->ops++;
        }
        a->load1 = load1();
    }
    first = false;
    return shm;
}

/* A command of one chunk per operation; the sweep sets .batch itself. */
static struct kvpb_cmd mk(struct ctx *x, int transport, int op, uint64_t chunk, uint32_t nops,
                          uint32_t nworkers)
{
    return (struct kvpb_cmd){.transport = transport,
                             .op = op,
                             .chunk_bytes = chunk,
                             .nops = nops,
                             .nworkers = nworkers,
                             .run_id = x->run_id,
                             .batch = 1};
}

static void phase_cold(struct ctx *x, bool *shm)
{
    uint64_t c = x->cfg.pressure_chunk;
    char sz[32];

    *shm = setup_size(x, c);
    /*
     * One pool's worth per worker and transport: every page of the pool passes through the
     * worker's fresh mapping (shm) and through the daemon's socket receive (inline). Both can
     * be slow the first time on a virtual machine; the sweep then measures the steady state.
     */
    uint64_t n = x->pool_size / c * x->cfg.workers;
    printf("first pass: %" PRIu64 " x %s chunks per worker and transport\n",
           n > KVPB_MAX_SAMPLES ? KVPB_MAX_SAMPLES : n, kvpb_fmt_size(c, sz, sizeof(sz)));
    fflush(stdout);
    for (int t = KVPB_T_SHM; t <= KVPB_T_INLINE; t++) {
        if ((t == KVPB_T_SHM && (!*shm || !x->cfg.do_shm)) ||
            (t == KVPB_T_INLINE && !x->cfg.do_inline))
            continue;
        struct kvpb_cmd cmd = mk(x, t, KVPB_OP_COLD, c,
                                 (uint32_t)(n > KVPB_MAX_SAMPLES ? KVPB_MAX_SAMPLES : n),
                                 x->cfg.workers);
        cmd.seq_base = x->next_seq;
        x->next_seq += cmd.nops;
        run(x, &cmd, true, "first pass");
    }
}

/* The sweep's units: memcpy, or a transport's store followed by its retrieve (which reads
 * back what the store wrote). */
enum { UNIT_MEMCPY, UNIT_SHM, UNIT_INLINE, UNIT_UDS, UNIT_REDIS, UNIT_COUNT_ };

static void sweep_unit(struct ctx *x, int unit, uint64_t c, uint32_t nops, bool have_shm,
                       bool measured)
{
    static const int transport[UNIT_COUNT_] = {KVPB_T_MEMCPY, KVPB_T_SHM, KVPB_T_INLINE, KVPB_T_UDS,
                                               KVPB_T_REDIS};
    const struct kvpb_config *cfg = &x->cfg;

    if ((unit == UNIT_SHM && (!have_shm || !cfg->do_shm)) ||
        (unit == UNIT_INLINE && !cfg->do_inline) || (unit == UNIT_UDS && !cfg->do_uds) ||
        (unit == UNIT_REDIS && !x->redis))
        return;
    struct kvpb_cmd cmd = mk(x, transport[unit], unit == UNIT_MEMCPY ? KVPB_OP_COPY : KVPB_OP_STORE,
                             c, nops, cfg->workers);
    cmd.batch = cfg->batch;
    cmd.verify = !measured;
    cmd.seq_base = x->next_seq;
    x->next_seq += nops;
    run(x, &cmd, measured, "");
    if (unit == UNIT_MEMCPY)
        return;
    cmd.op = KVPB_OP_RETRIEVE;
    run(x, &cmd, measured, "");
}

static void phase_sweep(struct ctx *x, bool shm)
{
    const struct kvpb_config *cfg = &x->cfg;
    char sz[32];

    for (uint32_t s = 0; s < cfg->nsizes; s++) {
        uint64_t c = cfg->sizes[s];
        uint32_t nops = ops_per_rep(x, c, cfg->batch);
        uint64_t t0 = kvpb_now_ns();
        bool have_shm = setup_size(x, c) && shm;

        printf("sweep %s: %u calls of %u chunk(s) per worker and repetition, %u+1 "
               "repetitions ...",
               kvpb_fmt_size(c, sz, sizeof(sz)), nops, cfg->batch, cfg->reps);
        fflush(stdout);
        /*
         * Repetition r starts with unit r (mod the count): whatever a unit suffers from coming
         * first after a pause, or right after another one, every unit suffers alike.
         */
        for (uint32_t rep = 0; rep <= cfg->reps; rep++)
            for (int k = 0; k < UNIT_COUNT_; k++)
                sweep_unit(x, (int)((k + rep) % UNIT_COUNT_), c, nops, have_shm, rep > 0);
        printf(" %.1f s\n", (double)(kvpb_now_ns() - t0) / 1e9);
        fflush(stdout);
    }
}

/*
 * The key hash of one chunk alone, by the daemon's BLAKE2b and by two faster keyed hashes
 * (keyhash.c): one cell each, n samples per repetition, in this process.
 */
static void time_key_hashes(struct ctx *x, uint32_t n, bool measured)
{
    static const int ops[] = {KVPB_OP_HASH_BLAKE2B, KVPB_OP_HASH_SIPHASH, KVPB_OP_HASH_XXH3};
    double *s = malloc(n * sizeof(*s));

    if (!s) {
        fprintf(stderr, "kvpool-bench: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        int rc = kvpb_time_key_hash(ops[i], x->chunk_tokens, n, s);
        if (rc < 0) {
            printf("note: key hash %s not timed: %s\n", kvpb_op_name(ops[i]), strerror(-rc));
            break;
        }
        if (!measured)
            continue;
        struct acc *a = acc_get(x, KVPB_T_HASH, ops[i], "", 0, 1);
        double us = 0;
        for (uint32_t k = 0; k < n; k++)
            us += s[k];
        a->ops += n;
        if (kvpb_samples_append(&a->lat, s, n) < 0 || kvpb_samples_push(&a->rep_gbps, NAN) < 0 ||
            kvpb_samples_push(&a->rep_ops, us > 0 ? (double)n / us * 1e6 : NAN) < 0)
            exit(1);
        a->load1 = load1();
    }
    free(s);
}

static void phase_rtt(struct ctx *x)
{
    const struct kvpb_config *cfg = &x->cfg;
    uint32_t n = cfg->rtt_count;
    uint64_t c = cfg->sizes[0];

    for (uint32_t s = 1; s < cfg->nsizes; s++)
        c = cfg->sizes[s] < c ? cfg->sizes[s] : c;
    setup_size(x, c);
    /* The 128 chunks of the long prefix must fit the pool with room to spare. */
    bool long_lookup = (uint64_t)KVPB_LOOKUP_CHUNKS * c <= x->pool_size / 2;
    printf("round trips: %u per repetition, %u+1 repetitions\n", n, cfg->reps);
    if (!long_lookup)
        printf("note: lookup-128 skipped: %u chunks of %s need more than half the pool\n",
               KVPB_LOOKUP_CHUNKS, kvpb_fmt_size(c, (char[32]){0}, 32));
    fflush(stdout);
    for (uint32_t rep = 0; rep <= cfg->reps; rep++) {
        bool m = rep > 0;
        struct kvpb_cmd cmd = mk(x, KVPB_T_UDS, KVPB_OP_PING, 0, n, 1);
        run(x, &cmd, m, "");
        cmd = mk(x, KVPB_T_KVPOOL, KVPB_OP_PING, 0, n, 1);
        run(x, &cmd, m, "");
        /* Each of these waits 500 us first: fewer of them fit in the same time. */
        cmd = mk(x, KVPB_T_UDS, KVPB_OP_PING_IDLE, 0, n / 5 ? n / 5 : 1, 1);
        run(x, &cmd, m, "");
        cmd.transport = KVPB_T_KVPOOL;
        run(x, &cmd, m, "");
        /* Looks up one cached chunk of the instances registered above. */
        cmd = mk(x, KVPB_T_KVPOOL, KVPB_OP_LOOKUP, 0, n, 1);
        cmd.seq_base = x->next_seq++;
        run(x, &cmd, m, "");
        /* A 32k-token prefix: 128 chunks, stored once per repetition before the clock. */
        if (long_lookup) {
            cmd = mk(x, KVPB_T_KVPOOL, KVPB_OP_LOOKUP128, 0, n / 5 ? n / 5 : 1, 1);
            cmd.seq_base = x->next_seq++;
            run(x, &cmd, m, "");
        }
        if (x->redis) {
            cmd = mk(x, KVPB_T_REDIS, KVPB_OP_PING, 0, n, 1);
            run(x, &cmd, m, "");
        }
        time_key_hashes(x, n, m);
    }
}

static void phase_paged(struct ctx *x)
{
    static const uint32_t layouts[] = {KVP_PAGED_NHD, KVP_PAGED_HND};
    static const char *const names[] = {"NHD", "HND"};
    const struct kvpb_config *cfg = &x->cfg;
    char sz[32];

    printf("paged gather/scatter: NHD and HND, %u+1 repetitions per size\n", cfg->reps);
    fflush(stdout);
    for (uint32_t s = 0; s < cfg->nsizes; s++) {
        uint64_t c = cfg->sizes[s];
        uint32_t nops = ops_per_rep(x, c, 1);
        for (size_t l = 0; l < 2; l++) {
            struct kvpb_cmd cmd = mk(x, KVPB_T_PAGED, KVPB_OP_SETUP, c, 0, 1);
            cmd.layout = layouts[l];
            if (kvpb_pool_run(x->pool, &cmd, (struct kvpb_wres[KVPB_MAX_WORKERS]){0}, NULL) < 0) {
                fprintf(stderr, "kvpool-bench: paged set-up for %s failed\n",
                        kvpb_fmt_size(c, sz, sizeof(sz)));
                exit(1);
            }
            for (uint32_t rep = 0; rep <= cfg->reps; rep++) {
                bool m = rep > 0;
                /* The sweep's memcpy ran with every worker; paged runs on one. */
                if (cfg->workers > 1 && l == 0) {
                    cmd = mk(x, KVPB_T_MEMCPY, KVPB_OP_COPY, c, nops, 1);
                    run(x, &cmd, m, "");
                }
                cmd = mk(x, KVPB_T_PAGED, KVPB_OP_GATHER, c, nops, 1);
                cmd.layout = layouts[l];
                run(x, &cmd, m, names[l]);
                cmd.op = KVPB_OP_SCATTER;
                cmd.verify = !m;
                run(x, &cmd, m, names[l]);
            }
        }
    }
}

static void phase_pressure(struct ctx *x, bool shm)
{
    const struct kvpb_config *cfg = &x->cfg;
    uint64_t c = cfg->pressure_chunk;
    uint32_t N = cfg->workers;
    uint64_t pool_chunks = x->pool_size / c;
    uint64_t ws = pool_chunks * cfg->pressure_factor / N;
    uint64_t per_rep = pool_chunks / N;
    char sz[32], psz[32];

    if (per_rep > KVPB_MAX_SAMPLES)
        per_rep = KVPB_MAX_SAMPLES;
    if (!setup_size(x, c))
        shm = false;
    printf("pressure: %s chunks, working set %" PRIu64 " chunks = %ux the %s pool, "
           "%" PRIu64 " get-or-put per worker and repetition\n",
           kvpb_fmt_size(c, sz, sizeof(sz)), ws * N, cfg->pressure_factor,
           kvpb_fmt_size(x->pool_size, psz, sizeof(psz)), per_rep);
    fflush(stdout);
    for (int t = KVPB_T_SHM; t <= KVPB_T_INLINE; t++) {
        if (t == KVPB_T_SHM && !shm)
            continue;
        uint64_t base = x->next_seq;
        x->next_seq += ws * N + 1;
        for (uint32_t rep = 0; rep <= cfg->pressure_reps; rep++) {
            bool m = rep > 0;
            struct kvpb_cmd cmd = mk(x, t, KVPB_OP_PRESSURE, c, (uint32_t)per_rep, N);
            cmd.seq_base = base;
            cmd.ws_chunks = ws;
            cmd.rng_seed = rep + 1;
            cmd.verify = !m;
            /* The warm-up fills the pool twice over: the measured reps run in steady state. */
            if (!m)
                cmd.nops = (uint32_t)(2 * per_rep);
            uint64_t ev0 = daemon_stat(x, "evictions");
            run(x, &cmd, m, "");
            if (m)
                acc_get(x, t, KVPB_OP_PRESSURE, "", c, N)->evictions += daemon_stat(x,
                                                                                    "evictions") -
                                                                        ev0;
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Rows                                                                                       */

static const struct acc *find_acc(const struct ctx *x, int transport, int op, uint64_t chunk,
                                  uint32_t workers)
{
    for (size_t i = 0; i < x->naccs; i++) {
        const struct acc *a = &x->accs[i];
        if (a->transport == transport && a->op == op && a->chunk == chunk &&
            a->workers == workers && a->detail[0] == '\0')
            return a;
    }
    return NULL;
}

/* Median over repetitions of a/b, paired by repetition when both have the same count. */
static double paired_ratio(const struct acc *a, const struct acc *b)
{
    double r[4096], ma, mb, lo, hi;
    size_t n = a->rep_gbps.n;

    if (n && n == b->rep_gbps.n && n <= 4096) {
        for (size_t i = 0; i < n; i++)
            r[i] = a->rep_gbps.v[i] / b->rep_gbps.v[i];
        return kvpb_percentile(r, n, 50.0);
    }
    struct kvpb_samples ca = {0}, cb = {0};
    kvpb_samples_append(&ca, a->rep_gbps.v, a->rep_gbps.n);
    kvpb_samples_append(&cb, b->rep_gbps.v, b->rep_gbps.n);
    kvpb_summary(ca.v, ca.n, &ma, &lo, &hi);
    kvpb_summary(cb.v, cb.n, &mb, &lo, &hi);
    kvpb_samples_free(&ca);
    kvpb_samples_free(&cb);
    return ma / mb;
}

/* Median latency of a cell without reordering its samples (NAN when there is no cell). */
static double p50_of(const struct acc *a)
{
    struct kvpb_samples c = {0};
    if (!a)
        return NAN;
    kvpb_samples_append(&c, a->lat.v, a->lat.n);
    double p = kvpb_percentile(c.v, c.n, 50.0);
    kvpb_samples_free(&c);
    return p;
}

static size_t make_rows(struct ctx *x, struct kvpb_row *rows)
{
    double uds_p50 = p50_of(find_acc(x, KVPB_T_UDS, KVPB_OP_PING, 0, 1));
    double uds_idle_p50 = p50_of(find_acc(x, KVPB_T_UDS, KVPB_OP_PING_IDLE, 0, 1));

    for (size_t i = 0; i < x->naccs; i++) {
        const struct acc *a = &x->accs[i];
        struct kvpb_row *r = &rows[i];
        struct kvpb_samples g = {0}, o = {0};
        double lo, hi, ops_lo, ops_hi;

        kvpb_samples_append(&g, a->rep_gbps.v, a->rep_gbps.n);
        kvpb_samples_append(&o, a->rep_ops.v, a->rep_ops.n);
        *r = kvpb_row_blank(a->transport, a->op, a->detail);
        r->chunk_bytes = a->chunk;
        r->batch = a->batch;
        r->workers = a->workers;
        r->reps = (uint32_t)g.n;
        r->samples = a->lat.n;
        r->load1 = a->load1;
        kvpb_summary(g.v, g.n, &r->gb_per_s, &lo, &hi);
        r->gb_min = lo;
        r->gb_max = hi;
        kvpb_summary(o.v, o.n, &r->ops_per_s, &ops_lo, &ops_hi);
        kvpb_samples_free(&g);
        kvpb_samples_free(&o);
        /* Percentiles sort the samples: the cell is not used after this. */
        r->p50_us = kvpb_percentile(x->accs[i].lat.v, a->lat.n, 50.0);
        r->p99_us = kvpb_percentile(x->accs[i].lat.v, a->lat.n, 99.0);

        if (a->chunk && a->transport != KVPB_T_KVPOOL) {
            const struct acc *m = find_acc(x, KVPB_T_MEMCPY, KVPB_OP_COPY, a->chunk, a->workers);
            if (m)
                r->ratio_to_memcpy = paired_ratio(a, m);
        }
        if (a->op == KVPB_OP_PING || a->op == KVPB_OP_LOOKUP || a->op == KVPB_OP_LOOKUP128)
            r->ratio_to_uds = r->p50_us / uds_p50;
        if (a->op == KVPB_OP_LOOKUP128)
            r->us_per_chunk = r->p50_us / KVPB_LOOKUP_CHUNKS;
        if (a->transport == KVPB_T_HASH)
            r->us_per_chunk = r->p50_us;
        if (a->op == KVPB_OP_PING_IDLE) {
            r->ratio_to_uds = r->p50_us / uds_idle_p50;
            r->ops_per_s = NAN; /* the wall time is mostly the deliberate wait */
        }
        if ((a->transport == KVPB_T_SHM || a->transport == KVPB_T_INLINE) &&
            (a->op == KVPB_OP_STORE || a->op == KVPB_OP_RETRIEVE)) {
            const struct acc *rd = find_acc(x, KVPB_T_REDIS, a->op, a->chunk, a->workers);
            if (rd)
                r->vs_redis = paired_ratio(a, rd);
        }
        if (a->copy_ns > 0 && a->op_ns > 0)
            r->copy_share = a->copy_ns / a->op_ns;
        r->faults_per_op = a->ops ? (double)a->minflt / (double)a->ops : NAN;
        r->preempt_per_op = a->ops ? (double)a->nivcsw / (double)a->ops : NAN;
        if (a->op == KVPB_OP_PRESSURE && a->ops) {
            r->hit_rate = (double)a->hits / (double)a->ops;
            r->evictions_per_op = (double)a->evictions / (double)a->ops;
        }
    }
    return x->naccs;
}

/* ------------------------------------------------------------------------------------------ */

static struct {
    char dir[64];
    struct kvpb_child kvpoold, redis;
    struct kvpb_pool *pool;
    bool keep_dir;
} g_run;

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* atexit: stop everything that was started, whatever the exit path. */
static void cleanup(void)
{
    kvpb_pool_stop(g_run.pool);
    g_run.pool = NULL;
    kvpb_child_stop(&g_run.redis, 5000);
    if (g_run.kvpoold.pid > 0) {
        int st = kvpb_child_stop(&g_run.kvpoold, 20000);
        if (st != 0) {
            fprintf(stderr, "kvpool-bench: kvpoold exited with status %d\n", st);
            kvpb_child_print_log(&g_run.kvpoold, 20);
            g_run.keep_dir = true;
        }
    }
    if (g_run.dir[0] && !g_run.keep_dir)
        nftw(g_run.dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    else if (g_run.dir[0])
        fprintf(stderr, "kvpool-bench: logs kept in %s\n", g_run.dir);
}

static void machine_info(struct kvpb_run_info *info)
{
    struct utsname u;
    char line[256];
    FILE *f = fopen("/proc/cpuinfo", "r");

    snprintf(info->cpu, sizeof(info->cpu), "unknown CPU");
    while (f && fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model name", 10) == 0 && strchr(line, ':')) {
            char *v = strchr(line, ':') + 2;
            v[strcspn(v, "\n")] = '\0';
            snprintf(info->cpu, sizeof(info->cpu), "%s", v);
            break;
        }
    }
    if (f)
        fclose(f);
    info->ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (uname(&u) == 0)
        snprintf(info->kernel, sizeof(info->kernel), "%.20s %.100s", u.sysname, u.release);
    info->load_start = load1();
}

int main(int argc, char **argv)
{
    struct ctx x = {0};
    struct kvpb_run_info info = {0};
    char socket[256], redis_socket[256] = "", exe[512], version[128] = "";
    uint64_t t_start = kvpb_now_ns();
    int rc;

    kvpb_parse_args(argc, argv, &x.cfg);
    machine_info(&info);
    x.run_id = (uint32_t)(kvpb_now_ns() ^ ((uint64_t)getpid() << 20));

    snprintf(g_run.dir, sizeof(g_run.dir), "/tmp/kvpool-bench.XXXXXX");
    if (!mkdtemp(g_run.dir)) {
        perror("kvpool-bench: mkdtemp");
        return 1;
    }
    atexit(cleanup);

    /* Start-up first: its daemons need up to 14 GiB, which nothing else may hold meanwhile. */
    if (x.cfg.do_startup) {
        if (!kvpb_find_exe(x.cfg.kvpoold, exe, sizeof(exe))) {
            fprintf(stderr, "kvpool-bench: cannot find kvpoold (%s); use --kvpoold PATH\n",
                    x.cfg.kvpoold);
            return 1;
        }
        kvpb_startup_phase(&x.cfg, exe, g_run.dir, &x.extra);
    }
    /* Fragmentation next, for the same reason: its daemons hold up to 12 GiB. */
    if (x.cfg.do_frag) {
        if (!kvpb_find_exe(x.cfg.kvpoold, exe, sizeof(exe))) {
            fprintf(stderr, "kvpool-bench: cannot find kvpoold (%s); use --kvpoold PATH\n",
                    x.cfg.kvpoold);
            return 1;
        }
        kvpb_frag_phase(&x.cfg, exe, g_run.dir, &x.extra);
    }
    /* Warm restart: its daemons hold pools of up to 12 GiB in /dev/shm, one at a time. */
    if (x.cfg.do_restart) {
        if (!kvpb_find_exe(x.cfg.kvpoold, exe, sizeof(exe))) {
            fprintf(stderr, "kvpool-bench: cannot find kvpoold (%s); use --kvpoold PATH\n",
                    x.cfg.kvpoold);
            return 1;
        }
        kvpb_restart_phase(&x.cfg, exe, g_run.dir, &x.extra);
    }
    /* The LMCache section starts servers of its own (two 1 GiB pools at a time): also before
     * the main daemon. */
    if (x.cfg.do_lmcache) {
        if (!kvpb_find_exe(x.cfg.kvpoold, exe, sizeof(exe))) {
            fprintf(stderr, "kvpool-bench: cannot find kvpoold (%s); use --kvpoold PATH\n",
                    x.cfg.kvpoold);
            return 1;
        }
        kvpb_lmcache_phase(&x.cfg, exe, g_run.dir, x.run_id, &x.extra);
    }
    /* The vLLM section: its own servers and vLLM engines (about 2 GiB each, three at a time). */
    if (x.cfg.do_vllm) {
        if (!kvpb_find_exe(x.cfg.kvpoold, exe, sizeof(exe))) {
            fprintf(stderr, "kvpool-bench: cannot find kvpoold (%s); use --kvpoold PATH\n",
                    x.cfg.kvpoold);
            return 1;
        }
        kvpb_vllm_phase(&x.cfg, exe, g_run.dir, x.run_id, &x.extra);
    }

    /* The daemon. */
    if (x.cfg.socket) {
        snprintf(socket, sizeof(socket), "%s", x.cfg.socket);
        if (kvpb_wait_kvpoold(socket, NULL, 5000) < 0)
            return 1;
        snprintf(info.daemon, sizeof(info.daemon), "running kvpoold at %s", socket);
    } else {
        if (!kvpb_find_exe(x.cfg.kvpoold, exe, sizeof(exe))) {
            fprintf(stderr, "kvpool-bench: cannot find kvpoold (%s); use --kvpoold PATH\n",
                    x.cfg.kvpoold);
            return 1;
        }
        printf("starting %s (pool %s)\n", exe, kvpb_fmt_size(x.cfg.l1_size, (char[32]){0}, 32));
        fflush(stdout);
        rc = kvpb_kvpoold_start(&g_run.kvpoold, exe, g_run.dir, x.cfg.l1_size, x.cfg.chunk_tokens,
                                socket, sizeof(socket));
        if (rc < 0)
            return 1;
        snprintf(info.daemon, sizeof(info.daemon),
                 "kvpoold started by the bench, --l1-size %" PRIu64 " --chunk-size %u",
                 x.cfg.l1_size, x.cfg.chunk_tokens);
    }
    kvp_opts o = {.socket_path = socket, .timeout_ms = 60000};
    if ((rc = kvp_client_open(&o, &x.client)) < 0) {
        fprintf(stderr, "kvpool-bench: cannot connect to %s: %s\n", socket, kvp_strerror(rc));
        return 1;
    }
    /* Measurements start on a pool that is wholly reserved, as a long-running daemon's is. */
    double waited;
    if ((rc = kvpb_wait_pool_reserved(x.client, 600000, &waited)) < 0)
        return 1;
    if (rc > 0)
        printf("the daemon's pool is reserved (waited %.0f ms after its first answer)\n", waited);
    x.pool_size = daemon_stat(&x, "pool_size");
    x.chunk_tokens = (uint32_t)daemon_stat(&x, "chunk_tokens");
    if (!x.pool_size || !x.chunk_tokens) {
        fprintf(stderr, "kvpool-bench: the daemon reports no pool_size/chunk_tokens\n");
        return 1;
    }
    info.pool_size = x.pool_size;
    info.chunk_tokens = x.chunk_tokens;
    if (!daemon_stat(&x, "shm_enabled"))
        printf("note: the daemon offers no shared memory (see its log): shm rows are "
               "skipped\n");

    /* Redis, when wanted and available. */
    if (!x.cfg.do_redis) {
        snprintf(info.redis, sizeof(info.redis), "skipped (not selected)");
    } else if (!kvpb_redis_compiled()) {
        snprintf(info.redis, sizeof(info.redis),
                 "skipped (kvpool-bench was built without "
                 "hiredis; install libhiredis-dev and rebuild)");
    } else if (!kvpb_find_exe(x.cfg.redis_server ? x.cfg.redis_server : "redis-server", exe,
                              sizeof(exe))) {
        snprintf(info.redis, sizeof(info.redis),
                 "skipped (redis-server not found; "
                 "scripts/install-deps.sh bench installs it)");
    } else if (kvpb_redis_start(&g_run.redis, exe, g_run.dir, redis_socket, sizeof(redis_socket),
                                version, sizeof(version)) < 0) {
        snprintf(info.redis, sizeof(info.redis), "skipped (redis-server failed to start)");
    } else {
        x.redis = true;
        snprintf(info.redis, sizeof(info.redis), "%s, private Unix socket, hiredis", version);
    }
    printf("redis comparator: %s\n", info.redis);

    bool need_pool = x.cfg.do_sweep || x.cfg.do_rtt || x.cfg.do_paged || x.cfg.do_pressure ||
                     x.cfg.do_python;
    if (need_pool) {
        g_run.pool = x.pool = kvpb_pool_start(&x.cfg, socket, x.redis ? redis_socket : NULL,
                                              x.chunk_tokens);
        if (!x.pool)
            return 1;
    }

    bool shm = false;
    if (x.cfg.do_sweep || x.cfg.do_pressure)
        phase_cold(&x, &shm);
    if (x.cfg.do_sweep)
        phase_sweep(&x, shm);
    if (x.cfg.do_rtt)
        phase_rtt(&x);
    if (x.cfg.do_paged)
        phase_paged(&x);
    if (x.cfg.do_pressure)
        phase_pressure(&x, shm);
    if (x.cfg.do_python)
        kvpb_python_phase(&x.cfg, x.pool, socket, g_run.dir, x.pool_size, x.run_id, &x.next_seq,
                          &x.extra);

    kvpb_pool_stop(x.pool);
    g_run.pool = x.pool = NULL;
    if (x.cfg.do_many)
        kvpb_many_phase(&x.cfg, socket, x.chunk_tokens, x.pool_size, x.run_id, &x.next_seq,
                        &x.extra);
    /* Last, on a daemon whose pool the sections above have filled. */
    if (x.cfg.do_memory)
        kvpb_memory_phase(&x.cfg, socket, x.cfg.socket ? 0 : g_run.kvpoold.pid, x.chunk_tokens,
                          &x.extra);
    kvp_client_close(x.client);
    info.load_end = load1();
    info.seconds = (double)(kvpb_now_ns() - t_start) / 1e9;

    struct kvpb_row *rows = calloc(x.naccs + x.extra.n + 1, sizeof(*rows));
    if (!rows)
        return 1;
    size_t n = make_rows(&x, rows);
    for (size_t i = 0; i < x.extra.n; i++)
        rows[n++] = x.extra.v[i];
    free(x.extra.v);
    kvpb_rows_sort(rows, n);
    kvpb_report_table(&x.cfg, &info, rows, n);
    /* The L2 rows start daemons of their own: after the table, against the same Redis. */
    char kvpoold_exe[512];
    if (x.cfg.do_l2 && !x.redis)
        printf("\nL2 tier: skipped (it needs the Redis comparator: %s)\n", info.redis);
    else if (x.cfg.do_l2 && kvpb_find_exe(x.cfg.kvpoold, kvpoold_exe, sizeof(kvpoold_exe)))
        kvpb_l2_phase(&x.cfg, kvpoold_exe, g_run.dir, redis_socket);
    rc = 0;
    if (x.cfg.csv && kvpb_report_csv(x.cfg.csv, rows, n) < 0)
        rc = 1;
    if (x.cfg.json && kvpb_report_json(x.cfg.json, rows, n) < 0)
        rc = 1;
    if (x.cfg.png && kvpb_report_chart(x.cfg.png, &x.cfg, &info, rows, n) < 0)
        rc = 1;
    for (size_t i = 0; i < x.naccs; i++) {
        kvpb_samples_free(&x.accs[i].lat);
        kvpb_samples_free(&x.accs[i].rep_gbps);
        kvpb_samples_free(&x.accs[i].rep_ops);
    }
    free(x.accs);
    free(rows);
    return rc;
}
