/*
 * report.c - the results as a table on stdout, and the row helpers the sections share
 * (report_files.c writes the same rows as CSV, JSON and a chart).
 *
 * All four are rendered from the same rows (struct kvpb_row), in the order the cells ran. A
 * value that does not apply to a row (a ratio to Redis for memcpy, a hit rate outside the
 * pressure mode) is NAN in memory, empty in CSV, null in JSON and "-" in the table.
 *
 * Units: GB/s means 1e9 bytes per second (as memcpy benchmarks and the reference figures
 * quote); sizes are binary (KiB, MiB). Latencies are per operation, in microseconds.
 *
 * The scale sections (start-up, many workers, Python path, daemon memory) have tables of
 * their own; their rows carry the fields added for them (pool_bytes, ms, us_per_chunk,
 * ratio_to_idle, ratio_to_c, the rss_* figures), NAN elsewhere. A row whose measurement did not
 * complete is kept with "valid": false (0 in CSV) and no figure, and prints as "invalid".
 *
 * The table ends with the project's engineering goals of docs/PERFORMANCE.md evaluated on this
 * run's rows: "goal met" or "goal missed" against a number, "reported" where a figure has no
 * number to meet. A missed goal is a number the project wants to improve, not a failed run.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static const char *const transport_names[KVPB_T_COUNT_] = {
    [KVPB_T_SHM] = "shm",
    [KVPB_T_INLINE] = "inline",
    [KVPB_T_KVPOOL] = "kvpool",
    [KVPB_T_REDIS] = "redis",
    [KVPB_T_MEMCPY] = "memcpy",
    [KVPB_T_UDS] = "uds",
    [KVPB_T_PAGED] = "paged",
    [KVPB_T_MEMSET] = "memset",
    [KVPB_T_PYSHM] = "python-shm",
    [KVPB_T_LMC_SERVER] = "lmcache-server",
    [KVPB_T_LMC_KVPOOL] = "kvpoold-lmcache",
    [KVPB_T_LMC_WORKER] = "lmcache-worker",
    [KVPB_T_HASH] = "hash",
    [KVPB_T_VLLM] = "vllm",
    [KVPB_T_VLLM_LMC] = "vllm-lmcache-server",
    [KVPB_T_VLLM_KVPOOL] = "vllm-kvpoold",
};

static const char *const op_names[KVPB_OP_COUNT_] = {
    [KVPB_OP_STORE] = "store",
    [KVPB_OP_RETRIEVE] = "retrieve",
    [KVPB_OP_COPY] = "copy",
    [KVPB_OP_PING] = "ping",
    [KVPB_OP_PING_IDLE] = "ping-idle",
    [KVPB_OP_LOOKUP] = "lookup",
    [KVPB_OP_GATHER] = "gather",
    [KVPB_OP_SCATTER] = "scatter",
    [KVPB_OP_PRESSURE] = "pressure",
    [KVPB_OP_COLD] = "first-store",
    [KVPB_OP_REGISTER] = "register",
    [KVPB_OP_SETUP] = "setup",
    [KVPB_OP_TEARDOWN] = "teardown",
    [KVPB_OP_READY] = "daemon-ready",
    [KVPB_OP_RESERVE] = "reserve",
    [KVPB_OP_TOUCH] = "first-touch",
    [KVPB_OP_LOOKUP128] = "lookup-128",
    [KVPB_OP_PING_LOAD] = "ping-under-load",
    [KVPB_OP_PING_IDLE_P99] = "ping-idle-p99",
    [KVPB_OP_RSS_BASE] = "daemon-rss-base",
    [KVPB_OP_RSS64] = "daemon-rss-64",
    [KVPB_OP_FRAG_FILL] = "frag-fill",
    [KVPB_OP_FRAG_LARGE] = "frag-large-store",
    [KVPB_OP_FRAG_IDLE] = "frag-probe-idle",
    [KVPB_OP_FRAG_PROBE] = "frag-probe-lookup",
    [KVPB_OP_FRAG_CONTROL] = "frag-probe-control",
    [KVPB_OP_HIT_RATIO] = "hit-ratio",
    [KVPB_OP_CHUNK_SIZE] = "get-chunk-size",
    [KVPB_OP_TORCH_COPY] = "torch-copy",
    [KVPB_OP_HASH_BLAKE2B] = "blake2b",
    [KVPB_OP_HASH_SIPHASH] = "siphash",
    [KVPB_OP_HASH_XXH3] = "xxh3",
    [KVPB_OP_TTFT] = "ttft",
    [KVPB_OP_TTFT_COLD] = "ttft-cold",
    [KVPB_OP_WARM_HIT] = "warm-first-hit",
    [KVPB_OP_ADOPT] = "adopt",
    [KVPB_OP_FIRST_READ] = "first-read",
    [KVPB_OP_REREAD] = "reread",
    [KVPB_OP_CHECKSUM] = "xxh3-64",
    [KVPB_OP_COLD_READY] = "cold-ready",
    [KVPB_OP_COLD_RESERVE] = "cold-reserved",
    [KVPB_OP_STORE_AGAIN] = "store-again",
    [KVPB_OP_STORE_NOWARM] = "store-no-warm",
};

const char *kvpb_transport_name(int t)
{
    return t >= 0 && t < KVPB_T_COUNT_ ? transport_names[t] : "?";
}

const char *kvpb_op_name(int op)
{
    return op >= 0 && op < KVPB_OP_COUNT_ ? op_names[op] : "?";
}

struct kvpb_row kvpb_row_blank(int transport, int op, const char *detail)
{
    return (struct kvpb_row){
        .transport = transport,
        .op = op,
        .detail = detail,
        .batch = 1,
        .workers = 1,
        .gb_per_s = NAN,
        .gb_min = NAN,
        .gb_max = NAN,
        .ops_per_s = NAN,
        .p50_us = NAN,
        .p99_us = NAN,
        .ratio_to_memcpy = NAN,
        .ratio_to_uds = NAN,
        .vs_redis = NAN,
        .hit_rate = NAN,
        .evictions_per_op = NAN,
        .load1 = NAN,
        .faults_per_op = NAN,
        .preempt_per_op = NAN,
        .copy_share = NAN,
        .ms = NAN,
        .us_per_chunk = NAN,
        .ratio_to_idle = NAN,
        .ratio_to_c = NAN,
        .rss_mib = NAN,
        .vm_rss_mib = NAN,
        .rss_anon_mib = NAN,
        .rss_file_mib = NAN,
        .rss_shmem_mib = NAN,
        .max_us = NAN,
        .lock_max_ms = NAN,
        .lock_over_1ms = NAN,
        .steal_pct = NAN,
        .model_hit_rate = NAN,
        .ratio_to_model = NAN,
        .ratio_to_limit = NAN,
        .vs_lmcache = NAN,
        .speedup = NAN,
        .server_us = NAN,
        .vs_lmcache_free = NAN,
    };
}

void kvpb_rows_push(struct kvpb_rows *rows, const struct kvpb_row *r)
{
    if (rows->n == rows->cap) {
        size_t cap = rows->cap ? 2 * rows->cap : 16;
        struct kvpb_row *v = realloc(rows->v, cap * sizeof(*v));
        if (!v) {
            fprintf(stderr, "kvpool-bench: out of memory\n");
            exit(1);
        }
        rows->v = v;
        rows->cap = cap;
    }
    rows->v[rows->n++] = *r;
}

void kvpb_row_summarise(struct kvpb_row *r, double *rep_gbps, double *rep_ops, size_t nreps,
                        double *lat_us, size_t nlat)
{
    double lo, hi;

    r->reps = (uint32_t)nreps;
    r->samples = nlat;
    kvpb_summary(rep_gbps, nreps, &r->gb_per_s, &r->gb_min, &r->gb_max);
    kvpb_summary(rep_ops, nreps, &r->ops_per_s, &lo, &hi);
    r->p50_us = kvpb_percentile(lat_us, nlat, 50.0);
    r->p99_us = kvpb_percentile(lat_us, nlat, 99.0);
}

void kvpb_cell_add(struct kvpb_cell *c, double ns, uint64_t bytes, uint64_t nops, const double *lat)
{
    if (kvpb_samples_push(&c->gbps, (double)bytes / ns) < 0 ||
        kvpb_samples_push(&c->ops, (double)nops / (ns / 1e9)) < 0 ||
        (lat && kvpb_samples_append(&c->lat, lat, nops) < 0)) {
        fprintf(stderr, "kvpool-bench: out of memory\n");
        exit(1);
    }
}

void kvpb_cell_push(struct kvpb_rows *rows, struct kvpb_row *r, struct kvpb_cell *c)
{
    double load;
    kvpb_row_summarise(r, c->gbps.v, c->ops.v, c->gbps.n, c->lat.v, c->lat.n);
    if (getloadavg(&load, 1) == 1)
        r->load1 = load;
    kvpb_rows_push(rows, r);
}

void kvpb_cell_free(struct kvpb_cell *c)
{
    kvpb_samples_free(&c->gbps);
    kvpb_samples_free(&c->ops);
    kvpb_samples_free(&c->lat);
}

/* The parts of the report; the order of the enum is the order of the table and the files. */
enum section {
    SEC_REGISTER,
    SEC_COLD,
    SEC_BULK,
    SEC_RTT,
    SEC_PAGED,
    SEC_PRESSURE,
    SEC_STARTUP,
    SEC_RESTART,
    SEC_MANY,
    SEC_PYTHON,
    SEC_MEMORY,
    SEC_FRAG,
    SEC_LMCACHE,
    SEC_VLLM,
};

static int row_group(const struct kvpb_row *r)
{
    if (r->transport == KVPB_T_VLLM || r->transport == KVPB_T_VLLM_LMC ||
        r->transport == KVPB_T_VLLM_KVPOOL)
        return SEC_VLLM;
    if (r->transport == KVPB_T_LMC_SERVER || r->transport == KVPB_T_LMC_KVPOOL ||
        r->transport == KVPB_T_LMC_WORKER)
        return SEC_LMCACHE;
    if (strcmp(r->detail, KVPB_D_FRAG) == 0)
        return SEC_FRAG;
    if (strcmp(r->detail, KVPB_D_RESTART) == 0)
        return SEC_RESTART;
    if (r->pool_bytes)
        return SEC_STARTUP;
    if (strcmp(r->detail, KVPB_D_MANY) == 0 || r->op == KVPB_OP_PING_LOAD ||
        r->op == KVPB_OP_PING_IDLE_P99)
        return SEC_MANY;
    if (r->transport == KVPB_T_PYSHM || strcmp(r->detail, KVPB_D_CPATH) == 0)
        return SEC_PYTHON;
    switch (r->op) {
    case KVPB_OP_RSS_BASE:
    case KVPB_OP_RSS64:
        return SEC_MEMORY;
    case KVPB_OP_LOOKUP128:
        return SEC_RTT;
    case KVPB_OP_REGISTER:
        return SEC_REGISTER;
    case KVPB_OP_COLD:
        return SEC_COLD;
    case KVPB_OP_PING:
    case KVPB_OP_PING_IDLE:
    case KVPB_OP_LOOKUP:
    case KVPB_OP_HASH_BLAKE2B:
    case KVPB_OP_HASH_SIPHASH:
    case KVPB_OP_HASH_XXH3:
        return SEC_RTT;
    case KVPB_OP_GATHER:
    case KVPB_OP_SCATTER:
        return SEC_PAGED;
    case KVPB_OP_PRESSURE:
        return SEC_PRESSURE;
    default:
        return SEC_BULK;
    }
}

static int transport_rank(int t)
{
    static const int rank[KVPB_T_COUNT_] = {
        [KVPB_T_MEMCPY] = 0,       [KVPB_T_SHM] = 1,         [KVPB_T_INLINE] = 2,
        [KVPB_T_UDS] = 3,          [KVPB_T_KVPOOL] = 4,      [KVPB_T_REDIS] = 5,
        [KVPB_T_PAGED] = 6,        [KVPB_T_MEMSET] = 7,      [KVPB_T_PYSHM] = 8,
        [KVPB_T_LMC_WORKER] = 9,   [KVPB_T_LMC_SERVER] = 10, [KVPB_T_LMC_KVPOOL] = 11,
        [KVPB_T_HASH] = 12,        [KVPB_T_VLLM] = 13,       [KVPB_T_VLLM_LMC] = 14,
        [KVPB_T_VLLM_KVPOOL] = 15,
    };
    return t >= 0 && t < KVPB_T_COUNT_ ? rank[t] : KVPB_T_COUNT_;
}

/* A vLLM row's place in its model's table: shm before pickle, then the prompt length. */
static int vllm_rank(const struct kvpb_row *r)
{
    int rank = strstr(r->detail, " pickle") ? 10 : 0;
    if (strstr(r->detail, " 4k "))
        rank += 1;
    else if (strstr(r->detail, " 8k "))
        rank += 2;
    return rank;
}

static int cmp_rows(const void *pa, const void *pb)
{
    const struct kvpb_row *a = pa, *b = pb;
    int d = row_group(a) - row_group(b);
    if (d)
        return d;
    /* LMCache: the SHM transport's rows, then the pickle transport's; first-store rows first. */
    if (row_group(a) == SEC_LMCACHE) {
        if ((d = -strcmp(a->detail, b->detail)) != 0)
            return d;
        if ((a->op == KVPB_OP_COLD) != (b->op == KVPB_OP_COLD))
            return a->op == KVPB_OP_COLD ? -1 : 1;
    }
    /* vLLM: by model, then transport, then prompt length (the details' order as made). */
    if (row_group(a) == SEC_VLLM && a->chunk_bytes != b->chunk_bytes)
        return a->chunk_bytes < b->chunk_bytes ? -1 : 1;
    if (row_group(a) == SEC_VLLM && (d = vllm_rank(a) - vllm_rank(b)) != 0)
        return d;
    if (a->pool_bytes != b->pool_bytes)
        return a->pool_bytes < b->pool_bytes ? -1 : 1;
    if (a->chunk_bytes != b->chunk_bytes)
        return a->chunk_bytes < b->chunk_bytes ? -1 : 1;
    if ((d = strcmp(a->detail, b->detail)) != 0)
        return d;
    /* Round trips read best grouped by request: ping of each transport, then the next. */
    if (row_group(a) == SEC_RTT && a->op != b->op)
        return a->op - b->op;
    if ((d = transport_rank(a->transport) - transport_rank(b->transport)) != 0)
        return d;
    return a->op - b->op;
}

void kvpb_rows_sort(struct kvpb_row *rows, size_t n)
{
    qsort(rows, n, sizeof(*rows), cmp_rows);
}

/* "%.*f" of v, or "-" for NAN. */
static const char *num(char *buf, size_t size, double v, int prec)
{
    if (isnan(v))
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.*f", prec, v);
    return buf;
}

/* "0.93x" or "-". */
static const char *ratio(char *buf, size_t size, double v)
{
    if (isnan(v))
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.2fx", v);
    return buf;
}

/* The rows of the sweep's table (the many and Python sections have tables of their own). */
static bool is_bulk(const struct kvpb_row *r)
{
    return (r->op == KVPB_OP_STORE || r->op == KVPB_OP_RETRIEVE || r->op == KVPB_OP_COPY ||
            r->op == KVPB_OP_COLD) &&
           (row_group(r) == SEC_BULK || row_group(r) == SEC_COLD);
}

/* The pool mapping: how long a worker's first shm registration took. */
static void print_register(const struct kvpb_row *rows, size_t n, uint64_t pool)
{
    char sz[32];
    for (size_t i = 0; i < n; i++) {
        const struct kvpb_row *r = &rows[i];
        if (r->op != KVPB_OP_REGISTER || row_group(r) != SEC_REGISTER)
            continue;
        printf("\nFirst shm registration of a worker (maps the %s pool, whose pages the library "
               "then pre-faults\non a thread of its own): p50 %.1f ms over %u worker(s), %.2f "
               "GB/s of pool made ready\n",
               kvpb_fmt_size(pool, sz, sizeof(sz)), r->p50_us / 1e3, r->workers, r->gb_per_s);
    }
}

static bool is_rtt(const struct kvpb_row *r)
{
    return row_group(r) == SEC_RTT;
}

static bool is_paged(const struct kvpb_row *r)
{
    return (r->op == KVPB_OP_GATHER || r->op == KVPB_OP_SCATTER) && row_group(r) == SEC_PAGED;
}

/* The label of the op column: Redis' commands are named as Redis names them. */
static const char *op_label(const struct kvpb_row *r)
{
    if (r->transport == KVPB_T_REDIS && r->op == KVPB_OP_STORE)
        return "SET";
    if (r->transport == KVPB_T_REDIS && r->op == KVPB_OP_RETRIEVE)
        return "GET";
    if (r->transport == KVPB_T_REDIS && r->op == KVPB_OP_PING)
        return "PING";
    return kvpb_op_name(r->op);
}

static void print_bulk(const struct kvpb_config *cfg, const struct kvpb_row *rows, size_t n)
{
    char a[32], b[32], c[32], d[32], e[32], f[32], g[32], h[32], k[32], sz[32];
    uint64_t last = 0;
    size_t nbulk = 0;

    for (size_t i = 0; i < n; i++)
        nbulk += is_bulk(&rows[i]);
    if (!nbulk)
        return;
    if (cfg->batch == 1)
        printf("\nBulk transfers: one chunk per operation (call)");
    else
        printf("\nBulk transfers: sweep operations (calls) carry %u chunks each, latencies are "
               "per call; first-store: one chunk",
               cfg->batch);
    printf(";\nGB/s = 1e9 B/s, median [min-max] over the repetitions; faults = minor page "
           "faults per\noperation in the worker; copy = share of a shm operation's time spent "
           "in its own memcpy\n(the rest is the round trip: the commit is pipelined); x memcpy = "
           "paired median of "
           "(this / memcpy of the\nsame bytes, same repetition)\n\n");
    printf("%-8s %-11s %8s %24s %9s %9s %9s %6s %6s %8s %8s\n", "transport", "op", "chunk",
           "GB/s median [min-max]", "chunks/s", "p50 us", "p99 us", "faults", "copy", "x memcpy",
           "x redis");
    for (size_t i = 0; i < n; i++) {
        const struct kvpb_row *r = &rows[i];
        /* The one-worker memcpy of a multi-worker run is the paged section's baseline. */
        if (!is_bulk(r) || (r->op == KVPB_OP_COPY && r->workers != cfg->workers))
            continue;
        if (last && r->chunk_bytes != last)
            printf("\n");
        last = r->chunk_bytes;
        char gb[128];
        snprintf(gb, sizeof(gb), "%s [%s-%s]", num(a, 32, r->gb_per_s, 2), num(b, 32, r->gb_min, 2),
                 num(c, 32, r->gb_max, 2));
        char cp[32];
        if (isnan(r->copy_share))
            snprintf(cp, sizeof(cp), "-");
        else
            snprintf(cp, sizeof(cp), "%.0f%%", r->copy_share * 100.0);
        printf("%-8s %-11s %8s %24s %9s %9s %9s %6s %6s %8s %8s\n",
               kvpb_transport_name(r->transport), op_label(r),
               kvpb_fmt_size(r->chunk_bytes, sz, sizeof(sz)), gb,
               num(d, 32, r->ops_per_s * r->batch, 0), num(e, 32, r->p50_us, 1),
               num(f, 32, r->p99_us, 1), num(k, 32, r->faults_per_op, 1), cp,
               ratio(g, 32, r->ratio_to_memcpy), ratio(h, 32, r->vs_redis));
    }
}

static void print_rtt(const struct kvpb_row *rows, size_t n)
{
    char a[32], b[32], c[32], d[32], e[32];
    bool any = false;

    for (size_t i = 0; i < n; i++) {
        const struct kvpb_row *r = &rows[i];
        if (!is_rtt(r))
            continue;
        if (!any)
            printf("\nSmall requests: one client, round trip per request; x uds = p50 / p50 of "
                   "the raw\nUnix-socket ping-pong (32-byte frames); ping-idle: each after 500 us "
                   "of work;\nlookup-128: a cached prefix of %u chunks (32k tokens at 256 tokens "
                   "per chunk), us/chunk = p50 / %u;\nhash: one link of the key chain (one chunk's "
                   "key) alone, in this process, requests/s = links/s:\nblake2b is the daemon's, "
                   "siphash (libsodium) and xxh3 (libxxhash) keyed hashes in its place\n\n"
                   "%-8s %-10s %12s %9s %9s %9s %9s\n",
                   KVPB_LOOKUP_CHUNKS, KVPB_LOOKUP_CHUNKS, "transport", "op", "requests/s",
                   "p50 us", "p99 us", "x uds", "us/chunk");
        any = true;
        printf("%-8s %-10s %12s %9s %9s %9s %9s\n", kvpb_transport_name(r->transport), op_label(r),
               num(a, 32, r->ops_per_s, 0), num(b, 32, r->p50_us, 2), num(c, 32, r->p99_us, 2),
               ratio(d, 32, r->ratio_to_uds), num(e, 32, r->us_per_chunk, 3));
    }
}

static void print_paged(const struct kvpb_row *rows, size_t n)
{
    char a[32], b[32], c[32], d[32], e[32], f[32], sz[32];
    bool any = false;

    for (size_t i = 0; i < n; i++) {
        const struct kvpb_row *r = &rows[i];
        if (!is_paged(r))
            continue;
        if (!any)
            printf("\nPaged KV gather/scatter (one thread; x memcpy = against memcpy of the "
                   "same bytes)\n\n%-6s %-8s %8s %24s %9s %9s %9s\n",
                   "layout", "op", "chunk", "GB/s median [min-max]", "p50 us", "p99 us",
                   "x memcpy");
        any = true;
        char gb[128];
        snprintf(gb, sizeof(gb), "%s [%s-%s]", num(a, 32, r->gb_per_s, 2), num(b, 32, r->gb_min, 2),
                 num(c, 32, r->gb_max, 2));
        printf("%-6s %-8s %8s %24s %9s %9s %9s\n", r->detail, op_label(r),
               kvpb_fmt_size(r->chunk_bytes, sz, sizeof(sz)), gb, num(d, 32, r->p50_us, 1),
               num(e, 32, r->p99_us, 1), ratio(f, 32, r->ratio_to_memcpy));
    }
}

static void print_pressure(const struct kvpb_row *rows, size_t n)
{
    char a[32], b[32], c[32], d[32], e[32], f[32], sz[32];
    bool any = false;

    for (size_t i = 0; i < n; i++) {
        const struct kvpb_row *r = &rows[i];
        if (r->op != KVPB_OP_PRESSURE)
            continue;
        if (!any)
            printf("\nPressure: get (retrieve), put (store) on a miss; uniform random keys "
                   "out of a working set\nseveral times the pool, so eviction runs all the "
                   "time\n\n%-8s %8s %8s %10s %9s %11s %9s %9s\n",
                   "transport", "chunk", "GB/s", "ops/s", "hit rate", "evict/op", "p50 us",
                   "p99 us");
        any = true;
        printf("%-8s %8s %8s %10s %8s%% %11s %9s %9s\n", kvpb_transport_name(r->transport),
               kvpb_fmt_size(r->chunk_bytes, sz, sizeof(sz)), num(a, 32, r->gb_per_s, 2),
               num(b, 32, r->ops_per_s, 0), num(c, 32, r->hit_rate * 100.0, 1),
               num(d, 32, r->evictions_per_op, 2), num(e, 32, r->p50_us, 1),
               num(f, 32, r->p99_us, 1));
    }
}

/* The row of a section with this op (and pool size, for start-up rows), or NULL. */
static const struct kvpb_row *find_row(const struct kvpb_row *rows, size_t n, int group, int op,
                                       uint64_t pool)
{
    for (size_t i = 0; i < n; i++)
        if (row_group(&rows[i]) == group && rows[i].op == op && rows[i].pool_bytes == pool)
            return &rows[i];
    return NULL;
}

/* The round-trip section's row of transport and op, or NULL. */
static const struct kvpb_row *find_rtt(const struct kvpb_row *rows, size_t n, int transport, int op)
{
    for (size_t i = 0; i < n; i++)
        if (row_group(&rows[i]) == SEC_RTT && rows[i].transport == transport && rows[i].op == op &&
            !rows[i].invalid)
            return &rows[i];
    return NULL;
}

/* "12.3" for a valid value, "invalid" for a row whose measurement failed, "-" without a row. */
static const char *cell(char *buf, size_t size, const struct kvpb_row *r, double v, int prec)
{
    if (!r)
        return "-";
    if (r->invalid)
        return "invalid";
    return num(buf, size, v, prec);
}

static void print_startup(const struct kvpb_row *rows, size_t n)
{
    char a[32], b[32], c[32], d[32], e[32], f[32], sz[32];
    uint64_t last = 0;
    bool any = false;

    for (size_t i = 0; i < n; i++) {
        uint64_t pool = rows[i].pool_bytes;
        if (row_group(&rows[i]) != SEC_STARTUP || pool == last)
            continue;
        last = pool;
        if (!any)
            printf("\nStart-up (--shm-backend memfd): ready = fork/exec of kvpoold until its "
                   "first answered ping;\nregister = a new client's first kvp_register (shm), "
                   "right after ready; reserved = fork/exec\nuntil the daemon's pool_reserved "
                   "statistic reaches the pool (- when it has none); memset =\nmmap + memset "
                   "of as many bytes of fresh anonymous memory (first touch), same section\n\n"
                   "%8s %10s %12s %12s %13s %13s %9s\n",
                   "pool", "ready ms", "register ms", "reserved ms", "reserve GB/s", "memset GB/s",
                   "x memset");
        any = true;
        const struct kvpb_row *rd = find_row(rows, n, SEC_STARTUP, KVPB_OP_READY, pool);
        const struct kvpb_row *rg = find_row(rows, n, SEC_STARTUP, KVPB_OP_REGISTER, pool);
        const struct kvpb_row *rs = find_row(rows, n, SEC_STARTUP, KVPB_OP_RESERVE, pool);
        const struct kvpb_row *ms = find_row(rows, n, SEC_STARTUP, KVPB_OP_TOUCH, pool);
        printf("%8s %10s %12s %12s %13s %13s %9s\n", kvpb_fmt_size(pool, sz, sizeof(sz)),
               cell(a, 32, rd, rd ? rd->ms : NAN, 1), cell(b, 32, rg, rg ? rg->ms : NAN, 1),
               cell(c, 32, rs, rs ? rs->ms : NAN, 0), cell(d, 32, rs, rs ? rs->gb_per_s : NAN, 2),
               cell(e, 32, ms, ms ? ms->gb_per_s : NAN, 2),
               rs && !rs->invalid ? ratio(f, 32, rs->ratio_to_memcpy) : "-");
    }
}

/* The restart section's row of (pool, chunk, op), or NULL. */
static const struct kvpb_row *find_restart(const struct kvpb_row *rows, size_t n, uint64_t pool,
                                           uint64_t chunk, int op)
{
    for (size_t i = 0; i < n; i++)
        if (row_group(&rows[i]) == SEC_RESTART && rows[i].op == op && rows[i].pool_bytes == pool &&
            rows[i].chunk_bytes == chunk)
            return &rows[i];
    return NULL;
}

/*
 * Warm restart: two lines per pool and chunk size. Time: what the adoption costs (the daemon's
 * own figure, and exec until the first hit) beside what a cold start costs to get the same
 * chunks back (exec until the pool is reserved, then a worker storing them again). Throughput:
 * what the verification of each adopted chunk costs its first read, against later reads, XXH3-64
 * alone and memcpy of the same bytes; and what warm restart costs a store (its checksum and
 * record at the commit), against the same stores with --warm-restart off.
 */
static void print_restart(const struct kvpb_row *rows, size_t n)
{
    char a[32], b[32], c[32], d[32], e[32], f[32], g[32], h[32], sz[32], ch[32];
    bool any = false;

    for (int table = 0; table < 2; table++) {
        for (size_t i = 0; i < n; i++) {
            const struct kvpb_row *r = &rows[i];
            if (row_group(r) != SEC_RESTART || r->op != KVPB_OP_WARM_HIT)
                continue;
            uint64_t pool = r->pool_bytes, chunk = r->chunk_bytes;
            const struct kvpb_row *ad = find_restart(rows, n, pool, chunk, KVPB_OP_ADOPT);
            const struct kvpb_row *fr = find_restart(rows, n, pool, chunk, KVPB_OP_FIRST_READ);
            const struct kvpb_row *rr = find_restart(rows, n, pool, chunk, KVPB_OP_REREAD);
            const struct kvpb_row *xx = find_restart(rows, n, pool, chunk, KVPB_OP_CHECKSUM);
            const struct kvpb_row *mc = find_restart(rows, n, pool, chunk, KVPB_OP_COPY);
            const struct kvpb_row *cr = find_restart(rows, n, pool, chunk, KVPB_OP_COLD_RESERVE);
            const struct kvpb_row *sa = find_restart(rows, n, pool, chunk, KVPB_OP_STORE_AGAIN);
            const struct kvpb_row *so = find_restart(rows, n, pool, chunk, KVPB_OP_STORE_NOWARM);
            if (!any)
                printf("\nWarm restart (a posix pool filled with chunks, SIGKILL, a new kvpoold on "
                       "the same socket):\nfirst hit = exec of the new kvpoold until a client's "
                       "lookup finds a chunk; adopt = the\nnew daemon's own figure; cold = the "
                       "pool freed (SIGTERM), a new kvpoold's exec until its pool\nis reserved, "
                       "then a worker storing the same chunks again; saved = cold - first hit\n\n"
                       "%7s %7s %7s %9s %11s %12s %9s %9s %8s\n",
                       "pool", "chunk", "chunks", "adopt ms", "adopted/s", "first hit ms",
                       "cold ms", "store ms", "saved s");
            any = true;
            if (table == 0) {
                double cold = cr && sa && !cr->invalid && !sa->invalid ? cr->ms + sa->ms : NAN;
                double saved = !r->invalid && !isnan(cold) ? (cold - r->ms) / 1e3 : NAN;
                printf("%7s %7s %7.0f %9s %11s %12s %9s %9s %8s\n",
                       kvpb_fmt_size(pool, sz, sizeof(sz)), kvpb_fmt_size(chunk, ch, sizeof(ch)),
                       ad ? (double)ad->samples : 0.0, cell(a, 32, ad, ad ? ad->ms : NAN, 0),
                       cell(b, 32, ad, ad ? ad->ops_per_s : NAN, 0), cell(c, 32, r, r->ms, 0),
                       num(d, 32, cold, 0), cell(e, 32, sa, sa ? sa->ms : NAN, 0),
                       num(f, 32, saved, 1));
                continue;
            }
            double first = fr && !fr->invalid ? fr->gb_per_s : NAN;
            double again = rr && !rr->invalid ? rr->gb_per_s : NAN;
            double on = sa && !sa->invalid ? sa->gb_per_s : NAN;
            double off = so && !so->invalid ? so->gb_per_s : NAN;
            printf("%7s %7s %10s %8s %8s %8s %8s %10s %10s %8s\n",
                   kvpb_fmt_size(pool, sz, sizeof(sz)), kvpb_fmt_size(chunk, ch, sizeof(ch)),
                   num(a, 32, first, 2), num(b, 32, again, 2), ratio(c, 32, first / again),
                   cell(d, 32, xx, xx ? xx->gb_per_s : NAN, 2),
                   cell(e, 32, mc, mc ? mc->gb_per_s : NAN, 2), num(f, 32, on, 2),
                   num(g, 32, off, 2), ratio(h, 32, on / off));
        }
        if (any && table == 0)
            printf("\nReads of the adopted chunks over shm (copy included): the first one checks "
                   "each chunk against\nits checksum, the reread does not; xxh3 = the checksum "
                   "alone, memcpy = the same bytes copied\n(the physical limits, same run). "
                   "Stores (GB/s) into the cold pool with warm restart (a checksum\nand a record "
                   "per chunk at its commit) and without (--warm-restart off)\n\n"
                   "%7s %7s %10s %8s %8s %8s %8s %10s %10s %8s\n",
                   "pool", "chunk", "1st read", "reread", "1st/re", "xxh3", "memcpy", "store on",
                   "store off", "on/off");
    }
}

static void print_many(const struct kvpb_row *rows, size_t n)
{
    char a[32], b[32], c[32], d[32], e[32], f[32], g[32], h[32], sz[32];
    bool any = false;

    for (size_t i = 0; i < n; i++) {
        const struct kvpb_row *r = &rows[i];
        if (row_group(r) != SEC_MANY)
            continue;
        if (!any)
            printf("\nMany workers: worker processes storing and retrieving at once over shm "
                   "(GB/s = sum over the\nworkers), against two processes copying at once "
                   "(memcpy); x memcpy = paired median; meanwhile\nthe bench's own client pings "
                   "once per millisecond: x idle = its p99 / p99 of the same pings\njust before "
                   "the load; after each, a raw Unix-socket round trip to a thread of the bench\n"
                   "(uds): x uds = kvpool's p99 / the raw socket's under the same load\n\n"
                   "%-10s %-16s %7s %8s %24s %9s %9s %9s %7s %6s\n",
                   "transport", "op", "workers", "chunk", "GB/s median [min-max]", "p50 us",
                   "p99 us", "x memcpy", "x idle", "x uds");
        any = true;
        char gb[128];
        if (isnan(r->gb_per_s))
            snprintf(gb, sizeof(gb), "-");
        else
            snprintf(gb, sizeof(gb), "%s [%s-%s]", num(a, 32, r->gb_per_s, 2),
                     num(b, 32, r->gb_min, 2), num(c, 32, r->gb_max, 2));
        printf("%-10s %-16s %7u %8s %24s %9s %9s %9s %7s %6s\n", kvpb_transport_name(r->transport),
               op_label(r), r->workers,
               r->chunk_bytes ? kvpb_fmt_size(r->chunk_bytes, sz, sizeof(sz)) : "-", gb,
               num(d, 32, r->p50_us, 1), num(e, 32, r->p99_us, 1), ratio(f, 32, r->ratio_to_memcpy),
               ratio(g, 32, r->ratio_to_idle), ratio(h, 32, r->ratio_to_uds));
    }
}

static void print_frag(const struct kvpb_row *rows, size_t n)
{
    char a[32], b[32], c[32], d[32], e[32], f[32], g[32], sz[32];
    bool any = false;

    for (size_t i = 0; i < n; i++) {
        const struct kvpb_row *r = &rows[i];
        if (row_group(r) != SEC_FRAG)
            continue;
        if (!any)
            printf(
                "\nFragmentation: chunks of 4 KiB-32 MiB share the pool (equal bytes per size), "
                "LRU order shuffled,\nthen 8 and 32 MiB stores; a probe client looks up one "
                "chunk once per millisecond (x idle =\nits p99 / its p99 before); lock = the "
                "daemon's longest store-lock hold (ms) and holds over\n1 ms during the large "
                "stores; steal = CPU time the hypervisor took meanwhile (%% of all);\nhit ratio: "
                "kvpool / a byte-LRU model of the same trace\n\n"
                "%-8s %-18s %8s %9s %9s %9s %7s %9s %9s %7s\n",
                "pool", "op", "samples", "p50 us", "p99 us", "max us", "x idle", "lock ms", ">1ms",
                "steal");
        any = true;
        if (r->op == KVPB_OP_HIT_RATIO) {
            printf("%-8s %-18s %8" PRIu64 "   kvpool %.4f, byte-LRU %.4f: %s\n",
                   kvpb_fmt_size(r->pool_bytes, sz, sizeof(sz)), op_label(r), r->samples,
                   r->hit_rate, r->model_hit_rate, ratio(a, 32, r->ratio_to_model));
            continue;
        }
        if (r->invalid) {
            printf("%-8s %-18s invalid (see above)\n", kvpb_fmt_size(r->pool_bytes, sz, sizeof(sz)),
                   op_label(r));
            continue;
        }
        printf("%-8s %-18s %8" PRIu64 " %9s %9s %9s %7s %9s %9s %7s\n",
               kvpb_fmt_size(r->pool_bytes, sz, sizeof(sz)), op_label(r), r->samples,
               num(a, 32, r->p50_us, 1), num(b, 32, r->p99_us, 1), num(c, 32, r->max_us, 1),
               ratio(d, 32, r->ratio_to_idle), num(e, 32, r->lock_max_ms, 3),
               num(f, 32, r->lock_over_1ms, 0), num(g, 32, r->steal_pct, 1));
    }
}

static void print_python(const struct kvpb_row *rows, size_t n)
{
    char a[32], b[32], c[32], d[32], e[32], f[32], sz[32];
    bool any = false;

    for (size_t i = 0; i < n; i++) {
        const struct kvpb_row *r = &rows[i];
        if (row_group(r) != SEC_PYTHON)
            continue;
        if (!any)
            printf("\nPython path: ctx.store()/ctx.retrieve() on numpy arrays (bench/"
                   "python_path.py, /usr/bin/python3)\nagainst kvp_store()/kvp_retrieve() "
                   "from C, same chunks, same bytes, same rotating buffers,\nrepetitions "
                   "interleaved; x C = paired median of python / C\n\n"
                   "%-10s %-9s %8s %24s %9s %9s %7s\n",
                   "transport", "op", "chunk", "GB/s median [min-max]", "p50 us", "p99 us", "x C");
        any = true;
        char gb[128];
        snprintf(gb, sizeof(gb), "%s [%s-%s]", num(a, 32, r->gb_per_s, 2), num(b, 32, r->gb_min, 2),
                 num(c, 32, r->gb_max, 2));
        printf("%-10s %-9s %8s %24s %9s %9s %7s\n", kvpb_transport_name(r->transport), op_label(r),
               kvpb_fmt_size(r->chunk_bytes, sz, sizeof(sz)), gb, num(d, 32, r->p50_us, 1),
               num(e, 32, r->p99_us, 1), ratio(f, 32, r->ratio_to_c));
    }
}

static void print_memory(const struct kvpb_row *rows, size_t n)
{
    char a[32], b[32], c[32], d[32], e[32];
    bool any = false;

    for (size_t i = 0; i < n; i++) {
        const struct kvpb_row *r = &rows[i];
        if (row_group(r) != SEC_MEMORY)
            continue;
        if (!any)
            printf("\nDaemon memory (/proc/PID/status of kvpoold, MiB): the pool is shared memory "
                   "(RssShmem);\nbeyond the pool = RssAnon + RssFile. clients = connections "
                   "besides the bench's own\n\n%-16s %7s %9s %9s %9s %9s %12s\n",
                   "op", "clients", "VmRSS", "RssAnon", "RssFile", "RssShmem", "beyond pool");
        any = true;
        printf("%-16s %7u %9s %9s %9s %9s %12s\n", op_label(r),
               r->op == KVPB_OP_RSS64 ? r->workers : 0, cell(a, 32, r, r->vm_rss_mib, 1),
               cell(b, 32, r, r->rss_anon_mib, 1), cell(c, 32, r, r->rss_file_mib, 1),
               cell(d, 32, r, r->rss_shmem_mib, 1), cell(e, 32, r, r->rss_mib, 1));
    }
}

static void print_lmcache(const struct kvpb_row *rows, size_t n)
{
    char a[32], b[32], c[32], d[32], e[32], f[32], g[32], h[32], o[32], x[32], sz[32];
    bool any = false;
    const char *last = NULL;

    for (size_t i = 0; i < n; i++) {
        const struct kvpb_row *r = &rows[i];
        if (row_group(r) != SEC_LMCACHE)
            continue;
        if (!any)
            printf("\nLMCache front end: LMCache's own worker (EngineDrivenTransferContext, one "
                   "process, bfloat16 paged KV)\nagainst `lmcache server` and kvpoold --lmcache, "
                   "same worker, same bytes, repetitions interleaved;\nx limit = paired median "
                   "of GB/s / the worker's own copy of the same bytes (shm: gather for a\nstore, "
                   "scatter for a retrieve; pickle: gather + pickle.dumps, pickle.loads + "
                   "scatter;\n0.5.7 envelope: gather + encode_tensors, decode_tensors + "
                   "scatter);\nx lmcache = kvpoold / lmcache server, paired (round trips: lmcache "
                   "server's p50 / kvpoold's);\nown us = kvpoold's LMCache thread's run time per "
                   "operation; x if free = lmcache server's p50 /\n(kvpoold's p50 - own us): "
                   "what a server taking no time of its own would reach\n\n%-15s %-14s %-14s %8s "
                   "%24s %9s %9s %9s %8s %9s %8s %9s\n",
                   "transport", "transfer", "op", "chunk", "GB/s median [min-max]", "ops/s",
                   "p50 us", "p99 us", "x limit", "x lmcache", "own us", "x if free");
        any = true;
        if (last && strcmp(last, r->detail) != 0)
            printf("\n");
        last = r->detail;
        char gb[128];
        if (isnan(r->gb_per_s))
            snprintf(gb, sizeof(gb), "-");
        else
            snprintf(gb, sizeof(gb), "%s [%s-%s]", num(a, 32, r->gb_per_s, 2),
                     num(b, 32, r->gb_min, 2), num(c, 32, r->gb_max, 2));
        printf("%-15s %-14s %-14s %8s %24s %9s %9s %9s %8s %9s %8s %9s\n",
               kvpb_transport_name(r->transport), r->detail + strlen("lmcache "), op_label(r),
               r->chunk_bytes ? kvpb_fmt_size(r->chunk_bytes, sz, sizeof(sz)) : "-", gb,
               num(d, 32, r->ops_per_s, 0), num(e, 32, r->p50_us, 1), num(f, 32, r->p99_us, 1),
               ratio(g, 32, r->ratio_to_limit), ratio(h, 32, r->vs_lmcache),
               num(o, 32, r->server_us, 0), ratio(x, 32, r->vs_lmcache_free));
    }
}

static void print_vllm(const struct kvpb_row *rows, size_t n)
{
    char a[32], b[32], c[32], d[32], o[32], v[32], w[32], sz[32];
    bool any = false;
    const struct kvpb_row *last = NULL;

    for (size_t i = 0; i < n; i++) {
        const struct kvpb_row *r = &rows[i];
        if (row_group(r) != SEC_VLLM)
            continue;
        if (!any)
            printf("\nvLLM: time to first token (vLLM's CPU engine, prefix caching off, one token, "
                   "bfloat16) of a prompt\ncomputed in full without a connector (vllm), and "
                   "through LMCache's connector whose server holds its\nfull chunks (ttft) after "
                   "the run that stored them (ttft-cold); engines and runs interleaved;\nx "
                   "recompute = the time without a connector / this one, paired; x lmcache = "
                   "lmcache server's\ntime / kvpoold's, paired (> 1: kvpoold faster); own us = "
                   "kvpoold's LMCache thread's time per\nrequest; RSS = the server's VmRSS "
                   "(RssAnon) at the end of the phase, MiB\n\n%-20s %-20s %-10s %6s %10s "
                   "%10s %11s %10s %8s %17s\n",
                   "model prompt xfer", "transport", "op", "chunk", "p50 ms", "p99 ms",
                   "x recompute", "x lmcache", "own us", "RSS MiB");
        any = true;
        if (last && strcmp(last->detail, r->detail) != 0)
            printf("\n");
        last = r;
        char rss[80] = "-";
        if (!isnan(r->vm_rss_mib))
            snprintf(rss, sizeof(rss), "%s (%s)", num(v, 32, r->vm_rss_mib, 0),
                     num(w, 32, r->rss_anon_mib, 0));
        printf("%-20s %-20s %-10s %6s %10s %10s %11s %10s %8s %17s\n", r->detail + strlen("vllm "),
               kvpb_transport_name(r->transport), op_label(r),
               kvpb_fmt_size(r->chunk_bytes, sz, sizeof(sz)), num(a, 32, r->p50_us / 1e3, 1),
               num(b, 32, r->p99_us / 1e3, 1), ratio(c, 32, r->speedup),
               ratio(d, 32, r->vs_lmcache), num(o, 32, r->server_us, 0), rss);
    }
}

/* Worst value of a target over the rows it covers. */
struct target {
    double worst;
    const struct kvpb_row *at;
};

static void consider(struct target *t, double v, const struct kvpb_row *r, bool lower_is_worse)
{
    if (isnan(v))
        return;
    if (!t->at || (lower_is_worse ? v < t->worst : v > t->worst)) {
        t->worst = v;
        t->at = r;
    }
}

static void print_target(const char *what, const struct target *t, double goal, bool lower_is_worse)
{
    char sz[32];
    if (!t->at) {
        printf("  %-48s n/a (not measured in this run)\n", what);
        return;
    }
    bool met = lower_is_worse ? t->worst >= goal : t->worst <= goal;
    printf("  %-48s worst %6.2fx (%s %s%s%s)  %s\n", what, t->worst,
           kvpb_transport_name(t->at->transport), op_label(t->at), t->at->chunk_bytes ? " " : "",
           t->at->chunk_bytes ? kvpb_fmt_size(t->at->chunk_bytes, sz, sizeof(sz)) : "",
           met ? "goal met" : "goal missed");
}

/* A target line whose value is not a ratio: what, the measured value, the verdict. */
static void print_target_text(const char *what, const char *value, const char *verdict)
{
    printf("  %-48s %s%s%s\n", what, value, verdict[0] ? "  " : "", verdict);
}

/*
 * The targets of the scale sections on a time or a size: the worst row of an op (milliseconds
 * or MiB, whichever the row carries), which pool sizes it covers, and rows that failed.
 */
static void print_target_worst(const char *what, const struct kvpb_row *rows, size_t n,
                               bool (*covers)(const struct kvpb_row *),
                               double (*value)(const struct kvpb_row *), const char *unit,
                               double goal)
{
    const struct kvpb_row *worst = NULL, *bad = NULL;
    char text[256], sz[32], pools[96] = "";
    double w = NAN;

    for (size_t i = 0; i < n; i++) {
        const struct kvpb_row *r = &rows[i];
        if (!covers(r))
            continue;
        if (r->pool_bytes && strlen(pools) + 16 < sizeof(pools))
            snprintf(pools + strlen(pools), sizeof(pools) - strlen(pools), "%s%s",
                     pools[0] ? ", " : "", kvpb_fmt_size(r->pool_bytes, sz, sizeof(sz)));
        if (r->invalid || isnan(value(r))) {
            bad = bad ? bad : r;
            continue;
        }
        if (!worst || value(r) > w) {
            w = value(r);
            worst = r;
        }
    }
    if (!worst && !bad) {
        print_target_text(what, "n/a (not measured in this run)", "");
        return;
    }
    if (bad) {
        snprintf(text, sizeof(text), "%s %s did not complete (see above)", kvpb_op_name(bad->op),
                 bad->pool_bytes ? kvpb_fmt_size(bad->pool_bytes, sz, sizeof(sz)) : "");
        print_target_text(what, text, "goal missed");
        return;
    }
    snprintf(text, sizeof(text), "worst %.1f %s%s%s%s", w, unit, pools[0] ? " (pools " : "", pools,
             pools[0] ? ")" : "");
    print_target_text(what, text, w <= goal ? "goal met" : "goal missed");
}

static bool covers_ready(const struct kvpb_row *r)
{
    return r->op == KVPB_OP_READY;
}

static double ready_ms(const struct kvpb_row *r)
{
    return r->ms;
}

/* Every first shm registration: the start-up section's, and the workers' in the main run. */
static bool covers_register(const struct kvpb_row *r)
{
    return r->op == KVPB_OP_REGISTER;
}

static double register_ms(const struct kvpb_row *r)
{
    return r->pool_bytes ? r->ms : r->p99_us / 1e3;
}

static bool covers_frag_large(const struct kvpb_row *r)
{
    return r->op == KVPB_OP_FRAG_LARGE;
}

static double lock_max_ms(const struct kvpb_row *r)
{
    return r->lock_max_ms;
}

static bool covers_frag_probe(const struct kvpb_row *r)
{
    return r->op == KVPB_OP_FRAG_PROBE;
}

static double max_ms(const struct kvpb_row *r)
{
    return r->max_us / 1e3;
}

static bool covers_rss(const struct kvpb_row *r)
{
    return r->op == KVPB_OP_RSS64;
}

static double rss_mib(const struct kvpb_row *r)
{
    return r->rss_mib;
}

/* "reported" lines: the worst (lowest) ratio of the rows of an op, with where it was. */
static void print_reported(const char *what, const struct kvpb_row *rows, size_t n, int op,
                           int group, size_t field)
{
    const struct kvpb_row *at = NULL;
    double worst = NAN;
    char text[160], sz[32];

    for (size_t i = 0; i < n; i++) {
        const struct kvpb_row *r = &rows[i];
        double v = *(const double *)(const void *)((const char *)r + field);
        if (r->op != op || row_group(r) != group || r->invalid || isnan(v))
            continue;
        if (!at || v < worst) {
            worst = v;
            at = r;
        }
    }
    if (!at) {
        print_target_text(what, "n/a (not measured in this run)", "");
        return;
    }
    if (at->pool_bytes)
        snprintf(text, sizeof(text), "lowest %.2fx (%s pool)", worst,
                 kvpb_fmt_size(at->pool_bytes, sz, sizeof(sz)));
    else if (at->chunk_bytes)
        snprintf(text, sizeof(text), "lowest %.2fx (%s %s)", worst, op_label(at),
                 kvpb_fmt_size(at->chunk_bytes, sz, sizeof(sz)));
    else
        snprintf(text, sizeof(text), "%.2f", worst);
    print_target_text(what, text, "reported");
}

/*
 * What the one-chunk lookup would cost with another key hash: its p50 less the daemon's BLAKE2b
 * link, plus the other hash's, against the raw socket's ping (all p50s of this run).
 */
static void print_hash_swap(const struct kvpb_row *rows, size_t n)
{
    const struct kvpb_row *look = find_rtt(rows, n, KVPB_T_KVPOOL, KVPB_OP_LOOKUP);
    const struct kvpb_row *uds = find_rtt(rows, n, KVPB_T_UDS, KVPB_OP_PING);
    const struct kvpb_row *b2 = find_rtt(rows, n, KVPB_T_HASH, KVPB_OP_HASH_BLAKE2B);
    const struct kvpb_row *sip = find_rtt(rows, n, KVPB_T_HASH, KVPB_OP_HASH_SIPHASH);
    const struct kvpb_row *xx = find_rtt(rows, n, KVPB_T_HASH, KVPB_OP_HASH_XXH3);
    char text[160];

    if (!look || !uds || !b2 || !sip || !xx || !(uds->p50_us > 0)) {
        print_target_text("  lookup with a faster key hash", "n/a (not measured in this run)", "");
        return;
    }
    snprintf(text, sizeof(text), "blake2b %.2f of %.2f us; siphash %.2fx, xxh3 %.2fx", b2->p50_us,
             look->p50_us, (look->p50_us - b2->p50_us + sip->p50_us) / uds->p50_us,
             (look->p50_us - b2->p50_us + xx->p50_us) / uds->p50_us);
    print_target_text("  lookup with a faster key hash (x raw socket)", text, "reported");
}

static void print_targets(const struct kvpb_row *rows, size_t n)
{
    struct target shm = {0}, inl = {0}, rtt = {0}, redis = {0}, py = {0}, load = {0};
    struct target load_uds = {0};
    struct target probe = {0}, hit = {0}, lmc_lim = {0}, lmc_vs = {0}, lmc_rtt = {0};
    struct target lmc_pickle = {0}, lmc_free = {0}, vllm_vs = {0};
    struct target lmc57_shm = {0}, lmc57_env = {0}, lmc57_env_lim = {0};
    char sz[32];

    for (size_t i = 0; i < n; i++) {
        const struct kvpb_row *r = &rows[i];
        bool xfer = r->op == KVPB_OP_STORE || r->op == KVPB_OP_RETRIEVE;
        bool sweep = xfer && row_group(r) == SEC_BULK;
        if (sweep && r->transport == KVPB_T_SHM && r->chunk_bytes >= 4 * KVPB_MiB) {
            consider(&shm, r->ratio_to_memcpy, r, true);
            consider(&redis, r->vs_redis, r, true);
        }
        if (sweep && r->transport == KVPB_T_INLINE)
            consider(&inl, r->ratio_to_memcpy, r, true);
        if ((r->op == KVPB_OP_PING || r->op == KVPB_OP_LOOKUP) && r->transport == KVPB_T_KVPOOL)
            consider(&rtt, r->ratio_to_uds, r, false);
        if (xfer && r->transport == KVPB_T_PYSHM && r->chunk_bytes >= 4 * KVPB_MiB)
            consider(&py, r->ratio_to_c, r, true);
        if (r->op == KVPB_OP_PING_LOAD && r->transport == KVPB_T_KVPOOL) {
            consider(&load, r->ratio_to_idle, r, false);
            consider(&load_uds, r->ratio_to_uds, r, false);
        }
        if (r->op == KVPB_OP_FRAG_PROBE)
            consider(&probe, r->ratio_to_idle, r, false);
        if (r->op == KVPB_OP_HIT_RATIO)
            consider(&hit, r->ratio_to_model, r, true);
        if (r->transport == KVPB_T_LMC_KVPOOL) {
            bool lshm = strcmp(r->detail, KVPB_D_LMC_SHM) == 0;
            bool lpickle = strcmp(r->detail, KVPB_D_LMC_PICKLE) == 0;
            if (xfer && lshm && r->chunk_bytes >= 4 * KVPB_MiB)
                consider(&lmc_lim, r->ratio_to_limit, r, true);
            if (xfer && lshm)
                consider(&lmc_vs, r->vs_lmcache, r, true);
            if (xfer && strcmp(r->detail, KVPB_D_LMC057_SHM) == 0)
                consider(&lmc57_shm, r->vs_lmcache, r, true);
            if (xfer && strcmp(r->detail, KVPB_D_LMC057_ENV) == 0) {
                consider(&lmc57_env, r->vs_lmcache, r, true);
                consider(&lmc57_env_lim, r->ratio_to_limit, r, true);
            }
            if (xfer && lpickle && r->chunk_bytes >= 4 * KVPB_MiB) {
                consider(&lmc_pickle, r->vs_lmcache, r, true);
                consider(&lmc_free, r->vs_lmcache_free, r, true);
            }
            if (r->op == KVPB_OP_PING || r->op == KVPB_OP_CHUNK_SIZE)
                consider(&lmc_rtt, r->vs_lmcache, r, true);
        }
        if (r->transport == KVPB_T_VLLM_KVPOOL && r->op == KVPB_OP_TTFT)
            consider(&vllm_vs, r->vs_lmcache, r, true);
    }
    printf("\nGoals (docs/PERFORMANCE.md: the project's engineering targets; a missed goal is a "
           "number to improve, not a failed run), evaluated on this run\n");
    print_target("shm store/retrieve >= 0.80x memcpy (>= 4 MiB)", &shm, 0.80, true);
    print_target("inline store/retrieve >= 0.35x memcpy", &inl, 0.35, true);
    print_target("ping/lookup p50 <= 1.5x raw socket ping-pong", &rtt, 1.5, false);
    print_hash_swap(rows, n);
    print_target("shm >= 5x Redis SET/GET (>= 4 MiB)", &redis, 5.0, true);
    print_target_worst("daemon ready <= 1000 ms (1, 4, 12 GiB)", rows, n, covers_ready, ready_ms,
                       "ms", 1000.0);
    print_target_worst("register <= 50 ms", rows, n, covers_register, register_ms, "ms", 50.0);
    print_reported("pool reservation GB/s vs memset (first touch)", rows, n, KVPB_OP_RESERVE,
                   SEC_STARTUP, offsetof(struct kvpb_row, ratio_to_memcpy));
    print_reported("warm restart: cold start / first hit", rows, n, KVPB_OP_WARM_HIT, SEC_RESTART,
                   offsetof(struct kvpb_row, speedup));
    print_reported("warm restart: first read / reread GB/s", rows, n, KVPB_OP_FIRST_READ,
                   SEC_RESTART, offsetof(struct kvpb_row, ratio_to_limit));
    print_reported("warm restart: store with it / without", rows, n, KVPB_OP_STORE_AGAIN,
                   SEC_RESTART, offsetof(struct kvpb_row, ratio_to_limit));
    const struct kvpb_row *l128 = find_row(rows, n, SEC_RTT, KVPB_OP_LOOKUP128, 0);
    char text[128];
    if (l128 && !isnan(l128->us_per_chunk)) {
        snprintf(text, sizeof(text), "p50 %.1f us, %.3f us per chunk", l128->p50_us,
                 l128->us_per_chunk);
        print_target_text("lookup of a 128-chunk prefix", text, "reported");
    } else {
        print_target_text("lookup of a 128-chunk prefix", "n/a (not measured in this run)", "");
    }
    print_reported("many workers: store vs 2-process memcpy", rows, n, KVPB_OP_STORE, SEC_MANY,
                   offsetof(struct kvpb_row, ratio_to_memcpy));
    print_reported("many workers: retrieve vs 2-process memcpy", rows, n, KVPB_OP_RETRIEVE,
                   SEC_MANY, offsetof(struct kvpb_row, ratio_to_memcpy));
    print_target("ping p99 under 16 workers' load <= 5x idle", &load, 5.0, false);
    print_target("  that p99 <= 1.5x a raw socket's under the load", &load_uds, 1.5, false);
    print_target_worst("daemon RSS beyond the pool, 64 clients <= 16 MiB", rows, n, covers_rss,
                       rss_mib, "MiB", 16.0);
    print_target("python within 10% of C (>= 4 MiB)", &py, 0.90, true);
    print_target_worst("store lock longest hold < 1 ms (fragmentation)", rows, n, covers_frag_large,
                       lock_max_ms, "ms", 1.0);
    print_target("probe lookup p99 during large stores <= 3x idle", &probe, 3.0, false);
    print_target_worst("probe lookup max during large stores < 5 ms", rows, n, covers_frag_probe,
                       max_ms, "ms", 5.0);
    print_target("hit ratio >= 0.95x a byte-LRU model (mixed sizes)", &hit, 0.95, true);
    /* The LMCache front end's rows (kvpoold-lmcache) against the limit and lmcache server. */
    print_target("LMCache shm >= 0.90x worker's copy (>= 4 MiB)", &lmc_lim, 0.90, true);
    print_target("LMCache shm >= 1x lmcache server (every size)", &lmc_vs, 1.0, true);
    print_target("LMCache round trips >= 10x faster than lmcache", &lmc_rtt, 10.0, true);
    print_target("LMCache pickle >= 2x lmcache server (>= 4 MiB)", &lmc_pickle, 2.0, true);
    if (lmc_free.at) {
        snprintf(text, sizeof(text), "worst %.2fx (%s %s)", lmc_free.worst, op_label(lmc_free.at),
                 kvpb_fmt_size(lmc_free.at->chunk_bytes, sz, sizeof(sz)));
        print_target_text("  the same if kvpoold's own thread took no time", text, "bound");
    } else {
        print_target_text("  the same if kvpoold's own thread took no time",
                          "n/a (not measured in this run)", "");
    }
    print_target("LMCache 0.5.7 shm >= 1x lmcache (every size)", &lmc57_shm, 1.0, true);
    print_target("LMCache 0.5.7 envelope >= 1x lmcache (all sizes)", &lmc57_env, 1.0, true);
    if (lmc57_env_lim.at) {
        snprintf(text, sizeof(text), "worst %.2fx (%s %s)", lmc57_env_lim.worst,
                 op_label(lmc57_env_lim.at),
                 kvpb_fmt_size(lmc57_env_lim.at->chunk_bytes, sz, sizeof(sz)));
        print_target_text("  0.5.7 envelope vs the worker's own copy", text, "reported");
    } else {
        print_target_text("  0.5.7 envelope vs the worker's own copy",
                          "n/a (not measured in this run)", "");
    }
    print_target("vLLM cached-prefix TTFT >= 1x lmcache server", &vllm_vs, 1.0, true);
}

void kvpb_report_table(const struct kvpb_config *cfg, const struct kvpb_run_info *info,
                       const struct kvpb_row *rows, size_t n)
{
    char pool[32], foot[32];

    printf("\n==== kvpool-bench ====\n");
    printf("machine: %s, %d CPUs, %s; load average %.2f at start, %.2f at end\n", info->cpu,
           info->ncpu, info->kernel, info->load_start, info->load_end);
    printf("daemon:  %s; pool %s, %u tokens per chunk\n", info->daemon,
           kvpb_fmt_size(info->pool_size, pool, sizeof(pool)), info->chunk_tokens);
    printf("redis:   %s\n", info->redis);
    printf("method:  %u worker process(es), %u measured repetitions per cell after a warm-up "
           "(which checks every byte),\n         buffers rotate over %s so copies are not "
           "cache-hot; run took %.0f s\n",
           cfg->workers, cfg->reps, kvpb_fmt_size(cfg->footprint, foot, sizeof(foot)),
           info->seconds);
    print_register(rows, n, info->pool_size);
    print_bulk(cfg, rows, n);
    print_rtt(rows, n);
    print_paged(rows, n);
    print_pressure(rows, n);
    print_startup(rows, n);
    print_restart(rows, n);
    print_many(rows, n);
    print_python(rows, n);
    print_memory(rows, n);
    print_frag(rows, n);
    print_lmcache(rows, n);
    print_vllm(rows, n);
    print_targets(rows, n);
    fflush(stdout);
}
