/*
 * report.c - the results, as a table on stdout, CSV, JSON and a gnuplot chart.
 *
 * All four are rendered from the same rows (struct kvpb_row), in the order the cells ran. A
 * value that does not apply to a row (a ratio to Redis for memcpy, a hit rate outside the
 * pressure mode) is NAN in memory, empty in CSV, null in JSON and "-" in the table.
 *
 * Units: GB/s means 1e9 bytes per second (as memcpy benchmarks and the reference figures
 * quote); sizes are binary (KiB, MiB). Latencies are per operation, in microseconds.
 *
 * The chart is drawn by Debian's gnuplot when it is installed: the script and its data are
 * written next to the PNG (FILE.gp, FILE.dat) so that it can be redrawn or restyled by hand.
 * Without gnuplot the bench says so and carries on.
 *
 * The table ends with the targets of docs/PERFORMANCE.md evaluated on this run's rows.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "bench.h"

static const char *const transport_names[KVPB_T_COUNT_] = {
    [KVPB_T_SHM] = "shm",     [KVPB_T_INLINE] = "inline", [KVPB_T_KVPOOL] = "kvpool",
    [KVPB_T_REDIS] = "redis", [KVPB_T_MEMCPY] = "memcpy", [KVPB_T_UDS] = "uds",
    [KVPB_T_PAGED] = "paged",
};

static const char *const op_names[KVPB_OP_COUNT_] = {
    [KVPB_OP_STORE] = "store",         [KVPB_OP_RETRIEVE] = "retrieve",
    [KVPB_OP_COPY] = "copy",           [KVPB_OP_PING] = "ping",
    [KVPB_OP_PING_IDLE] = "ping-idle", [KVPB_OP_LOOKUP] = "lookup",
    [KVPB_OP_GATHER] = "gather",       [KVPB_OP_SCATTER] = "scatter",
    [KVPB_OP_PRESSURE] = "pressure",   [KVPB_OP_COLD] = "first-store",
    [KVPB_OP_REGISTER] = "register",   [KVPB_OP_SETUP] = "setup",
    [KVPB_OP_TEARDOWN] = "teardown",
};

const char *kvpb_transport_name(int t)
{
    return t >= 0 && t < KVPB_T_COUNT_ ? transport_names[t] : "?";
}

const char *kvpb_op_name(int op)
{
    return op >= 0 && op < KVPB_OP_COUNT_ ? op_names[op] : "?";
}

/* Display order: the groups of the table, then size, then a fixed transport order. */
static int row_group(const struct kvpb_row *r)
{
    switch (r->op) {
    case KVPB_OP_REGISTER:
        return 0;
    case KVPB_OP_COLD:
        return 1;
    case KVPB_OP_PING:
    case KVPB_OP_PING_IDLE:
    case KVPB_OP_LOOKUP:
        return 3;
    case KVPB_OP_GATHER:
    case KVPB_OP_SCATTER:
        return 4;
    case KVPB_OP_PRESSURE:
        return 5;
    default:
        return 2;
    }
}

static int transport_rank(int t)
{
    static const int rank[KVPB_T_COUNT_] = {
        [KVPB_T_MEMCPY] = 0, [KVPB_T_SHM] = 1,   [KVPB_T_INLINE] = 2, [KVPB_T_UDS] = 3,
        [KVPB_T_KVPOOL] = 4, [KVPB_T_REDIS] = 5, [KVPB_T_PAGED] = 6,
    };
    return t >= 0 && t < KVPB_T_COUNT_ ? rank[t] : KVPB_T_COUNT_;
}

static int cmp_rows(const void *pa, const void *pb)
{
    const struct kvpb_row *a = pa, *b = pb;
    int d = row_group(a) - row_group(b);
    if (d)
        return d;
    if (a->chunk_bytes != b->chunk_bytes)
        return a->chunk_bytes < b->chunk_bytes ? -1 : 1;
    if ((d = strcmp(a->detail, b->detail)) != 0)
        return d;
    /* Round trips read best grouped by request: ping of each transport, then the next. */
    if (row_group(a) == 3 && a->op != b->op)
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

static bool is_bulk(const struct kvpb_row *r)
{
    return r->op == KVPB_OP_STORE || r->op == KVPB_OP_RETRIEVE || r->op == KVPB_OP_COPY ||
           r->op == KVPB_OP_COLD;
}

/* The pool mapping: how long a worker's first shm registration took. */
static void print_register(const struct kvpb_row *rows, size_t n, uint64_t pool)
{
    char sz[32];
    for (size_t i = 0; i < n; i++) {
        const struct kvpb_row *r = &rows[i];
        if (r->op != KVPB_OP_REGISTER)
            continue;
        printf("\nFirst shm registration of a worker (maps and pre-faults the %s pool): "
               "p50 %.1f ms over %u worker(s), %.2f GB/s of pool made ready\n",
               kvpb_fmt_size(pool, sz, sizeof(sz)), r->p50_us / 1e3, r->workers, r->gb_per_s);
    }
}

static bool is_rtt(const struct kvpb_row *r)
{
    return r->op == KVPB_OP_PING || r->op == KVPB_OP_LOOKUP || r->op == KVPB_OP_PING_IDLE;
}

static bool is_paged(const struct kvpb_row *r)
{
    return r->op == KVPB_OP_GATHER || r->op == KVPB_OP_SCATTER;
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

    if (cfg->batch == 1)
        printf("\nBulk transfers: one chunk per operation (call)");
    else
        printf("\nBulk transfers: sweep operations (calls) carry %u chunks each, latencies are "
               "per call; first-store: one chunk",
               cfg->batch);
    printf(";\nGB/s = 1e9 B/s, median [min-max] over the repetitions; faults = minor page "
           "faults per\noperation in the worker; copy = share of a shm operation's time spent "
           "in its own memcpy\n(the rest is the two round trips); x memcpy = paired median of "
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
    char a[32], b[32], c[32], d[32];
    bool any = false;

    for (size_t i = 0; i < n; i++) {
        const struct kvpb_row *r = &rows[i];
        if (!is_rtt(r))
            continue;
        if (!any)
            printf("\nSmall requests: one client, round trip per request; x uds = p50 / p50 of "
                   "the raw\nUnix-socket ping-pong (32-byte frames); ping-idle: each after 500 us "
                   "of work\n\n%-8s %-9s %12s %9s %9s %9s\n",
                   "transport", "op", "requests/s", "p50 us", "p99 us", "x uds");
        any = true;
        printf("%-8s %-9s %12s %9s %9s %9s\n", kvpb_transport_name(r->transport), op_label(r),
               num(a, 32, r->ops_per_s, 0), num(b, 32, r->p50_us, 2), num(c, 32, r->p99_us, 2),
               ratio(d, 32, r->ratio_to_uds));
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
           met ? "met" : "MISSED");
}

static void print_targets(const struct kvpb_row *rows, size_t n)
{
    struct target shm = {0}, inl = {0}, rtt = {0}, redis = {0};

    for (size_t i = 0; i < n; i++) {
        const struct kvpb_row *r = &rows[i];
        bool xfer = r->op == KVPB_OP_STORE || r->op == KVPB_OP_RETRIEVE;
        if (xfer && r->transport == KVPB_T_SHM && r->chunk_bytes >= 4 * KVPB_MiB) {
            consider(&shm, r->ratio_to_memcpy, r, true);
            consider(&redis, r->vs_redis, r, true);
        }
        if (xfer && r->transport == KVPB_T_INLINE)
            consider(&inl, r->ratio_to_memcpy, r, true);
        if ((r->op == KVPB_OP_PING || r->op == KVPB_OP_LOOKUP) && r->transport == KVPB_T_KVPOOL)
            consider(&rtt, r->ratio_to_uds, r, false);
    }
    printf("\nTargets (docs/PERFORMANCE.md), evaluated on this run\n");
    print_target("shm store/retrieve >= 0.80x memcpy (>= 4 MiB)", &shm, 0.80, true);
    print_target("inline store/retrieve >= 0.35x memcpy", &inl, 0.35, true);
    print_target("ping/lookup p50 <= 2x raw socket ping-pong", &rtt, 2.0, false);
    print_target("shm >= 5x Redis SET/GET (>= 4 MiB)", &redis, 5.0, true);
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
    print_targets(rows, n);
    fflush(stdout);
}

/* ------------------------------------------------------------------------------------------ */
/* Files                                                                                      */

static FILE *open_out(const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        fprintf(stderr, "kvpool-bench: cannot write %s: %s\n", path, strerror(errno));
    return f;
}

static int close_out(FILE *f, const char *path)
{
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        fprintf(stderr, "kvpool-bench: error writing %s\n", path);
        return -EIO;
    }
    printf("wrote %s\n", path);
    return 0;
}

/* CSV: an empty field for NAN. */
static void csv_num(FILE *f, double v, const char *sep)
{
    if (isnan(v))
        fprintf(f, "%s", sep);
    else
        fprintf(f, "%.6g%s", v, sep);
}

int kvpb_report_csv(const char *path, const struct kvpb_row *rows, size_t n)
{
    FILE *f = open_out(path);
    if (!f)
        return -errno;
    fprintf(f, "transport,op,detail,chunk_bytes,batch,workers,reps,samples,gb_per_s,gb_per_s_min,"
               "gb_per_s_max,ops_per_s,p50_us,p99_us,ratio_to_memcpy,ratio_to_uds,vs_redis,"
               "hit_rate,evictions_per_op,faults_per_op,preempt_per_op,copy_share,load1\n");
    for (size_t i = 0; i < n; i++) {
        const struct kvpb_row *r = &rows[i];
        fprintf(f, "%s,%s,%s,%" PRIu64 ",%u,%u,%u,%" PRIu64 ",", kvpb_transport_name(r->transport),
                kvpb_op_name(r->op), r->detail, r->chunk_bytes, r->batch, r->workers, r->reps,
                r->samples);
        csv_num(f, r->gb_per_s, ",");
        csv_num(f, r->gb_min, ",");
        csv_num(f, r->gb_max, ",");
        csv_num(f, r->ops_per_s, ",");
        csv_num(f, r->p50_us, ",");
        csv_num(f, r->p99_us, ",");
        csv_num(f, r->ratio_to_memcpy, ",");
        csv_num(f, r->ratio_to_uds, ",");
        csv_num(f, r->vs_redis, ",");
        csv_num(f, r->hit_rate, ",");
        csv_num(f, r->evictions_per_op, ",");
        csv_num(f, r->faults_per_op, ",");
        csv_num(f, r->preempt_per_op, ",");
        csv_num(f, r->copy_share, ",");
        csv_num(f, r->load1, "\n");
    }
    return close_out(f, path);
}

static void json_num(FILE *f, const char *key, double v, bool last)
{
    if (isnan(v) || isinf(v))
        fprintf(f, "\"%s\": null%s", key, last ? "" : ", ");
    else
        fprintf(f, "\"%s\": %.6g%s", key, v, last ? "" : ", ");
}

int kvpb_report_json(const char *path, const struct kvpb_row *rows, size_t n)
{
    FILE *f = open_out(path);
    if (!f)
        return -errno;
    fprintf(f, "[\n");
    for (size_t i = 0; i < n; i++) {
        const struct kvpb_row *r = &rows[i];
        /* Names and details are fixed identifiers: nothing to escape. */
        fprintf(f,
                "  {\"transport\": \"%s\", \"op\": \"%s\", \"detail\": \"%s\", "
                "\"chunk_bytes\": %" PRIu64 ", \"batch\": %u, \"workers\": %u, "
                "\"reps\": %u, \"samples\": %" PRIu64 ", ",
                kvpb_transport_name(r->transport), kvpb_op_name(r->op), r->detail, r->chunk_bytes,
                r->batch, r->workers, r->reps, r->samples);
        json_num(f, "gb_per_s", r->gb_per_s, false);
        json_num(f, "gb_per_s_min", r->gb_min, false);
        json_num(f, "gb_per_s_max", r->gb_max, false);
        json_num(f, "ops_per_s", r->ops_per_s, false);
        json_num(f, "p50_us", r->p50_us, false);
        json_num(f, "p99_us", r->p99_us, false);
        json_num(f, "ratio_to_memcpy", r->ratio_to_memcpy, false);
        json_num(f, "ratio_to_uds", r->ratio_to_uds, false);
        json_num(f, "vs_redis", r->vs_redis, false);
        json_num(f, "hit_rate", r->hit_rate, false);
        json_num(f, "evictions_per_op", r->evictions_per_op, false);
        json_num(f, "faults_per_op", r->faults_per_op, false);
        json_num(f, "preempt_per_op", r->preempt_per_op, false);
        json_num(f, "copy_share", r->copy_share, false);
        json_num(f, "load1", r->load1, true);
        fprintf(f, "}%s\n", i + 1 < n ? "," : "");
    }
    fprintf(f, "]\n");
    return close_out(f, path);
}

/* ------------------------------------------------------------------------------------------ */
/* Chart                                                                                      */

/* The series of the chart, in legend order, with their gnuplot style. */
static const struct {
    int transport, op;
    const char *title, *style;
} series[] = {
    {KVPB_T_MEMCPY, KVPB_OP_COPY, "memcpy (physical limit)", "lw 3 lc rgb '#000000' pt 7"},
    {KVPB_T_SHM, KVPB_OP_STORE, "kvpool shm store", "lw 2 lc rgb '#1f77b4' pt 5"},
    {KVPB_T_SHM, KVPB_OP_RETRIEVE, "kvpool shm retrieve", "lw 2 lc rgb '#1f77b4' dt 2 pt 4"},
    {KVPB_T_INLINE, KVPB_OP_STORE, "kvpool inline store", "lw 2 lc rgb '#2ca02c' pt 9"},
    {KVPB_T_INLINE, KVPB_OP_RETRIEVE, "kvpool inline retrieve", "lw 2 lc rgb '#2ca02c' dt 2 pt 8"},
    {KVPB_T_UDS, KVPB_OP_STORE, "raw Unix socket, send", "lw 1 lc rgb '#7f7f7f' pt 13"},
    {KVPB_T_UDS, KVPB_OP_RETRIEVE, "raw Unix socket, receive", "lw 1 lc rgb '#7f7f7f' dt 2 pt 12"},
    {KVPB_T_REDIS, KVPB_OP_STORE, "Redis SET (hiredis)", "lw 2 lc rgb '#d62728' pt 11"},
    {KVPB_T_REDIS, KVPB_OP_RETRIEVE, "Redis GET (hiredis)", "lw 2 lc rgb '#d62728' dt 2 pt 10"},
};
#define NSERIES (sizeof(series) / sizeof(series[0]))

static bool in_chart(const struct kvpb_row *r, int s, uint32_t workers)
{
    return r->transport == series[s].transport && r->op == series[s].op && !r->detail[0] &&
           r->workers == workers && r->chunk_bytes > 0;
}

static int run_gnuplot(const char *gnuplot, const char *script)
{
    char cmd[2200];
    snprintf(cmd, sizeof(cmd), "'%s' '%s' 2>&1", gnuplot, script);
    int st = system(cmd);
    return st == 0 ? 0 : -1;
}

int kvpb_report_chart(const char *png, const struct kvpb_config *cfg,
                      const struct kvpb_run_info *info, const struct kvpb_row *rows, size_t n)
{
    char gp[1024], dat[1024], gnuplot[512], sz[32];
    bool used[NSERIES] = {false};
    FILE *f;

    if (!kvpb_find_exe("gnuplot", gnuplot, sizeof(gnuplot))) {
        printf("chart: skipped (gnuplot not installed; scripts/install-deps.sh bench installs "
               "gnuplot-nox)\n");
        return 1;
    }
    if (strchr(png, '\'')) {
        fprintf(stderr, "kvpool-bench: --png path must not contain a quote\n");
        return -EINVAL;
    }
    snprintf(gp, sizeof(gp), "%s.gp", png);
    snprintf(dat, sizeof(dat), "%s.dat", png);

    /* One data block per series (gnuplot "index"), x in MiB. */
    if (!(f = open_out(dat)))
        return -errno;
    for (size_t s = 0; s < NSERIES; s++) {
        fprintf(f, "# %s\n# chunk_MiB gb_per_s gb_min gb_max\n", series[s].title);
        for (size_t i = 0; i < n; i++)
            if (in_chart(&rows[i], (int)s, cfg->workers)) {
                fprintf(f, "%.6g %.4f %.4f %.4f\n", (double)rows[i].chunk_bytes / KVPB_MiB,
                        rows[i].gb_per_s, rows[i].gb_min, rows[i].gb_max);
                used[s] = true;
            }
        /* gnuplot needs at least one point per index; an unused series is not plotted. */
        if (!used[s])
            fprintf(f, "0 0 0 0\n");
        fprintf(f, "\n\n");
    }
    if (close_out(f, dat) < 0)
        return -EIO;

    for (int attempt = 0; attempt < 2; attempt++) {
        if (!(f = open_out(gp)))
            return -errno;
        fprintf(f, "# Redraw with: gnuplot '%s'\n", gp);
        fprintf(f, "set terminal %s size 1200,700 font 'sans,11'\n",
                attempt == 0 ? "pngcairo" : "png");
        fprintf(f, "set output '%s'\n", png);
        fprintf(f,
                "set title \"kvpool-bench: throughput against chunk size (%u worker%s; "
                "median of %u repetitions, bars = min-max)\\n%s, %d CPUs\" noenhanced\n",
                cfg->workers, cfg->workers > 1 ? "s" : "", cfg->reps, info->cpu, info->ncpu);
        fprintf(f, "set logscale x 2\nset xlabel 'chunk size'\nset ylabel 'GB/s (1e9 bytes/s)'\n"
                   "set yrange [0:*]\nset grid\nset key outside right top noenhanced\n");
        fprintf(f, "set xtics (");
        for (uint32_t i = 0; i < cfg->nsizes; i++)
            fprintf(f, "%s\"%s\" %.6g", i ? ", " : "", kvpb_fmt_size(cfg->sizes[i], sz, sizeof(sz)),
                    (double)cfg->sizes[i] / KVPB_MiB);
        fprintf(f, ")\n");
        fprintf(f, "plot ");
        bool first = true;
        for (size_t s = 0; s < NSERIES; s++) {
            if (!used[s])
                continue;
            fprintf(f, "%s'%s' index %zu using 1:2:3:4 with yerrorlines %s title '%s'",
                    first ? "" : ", \\\n     ", dat, s, series[s].style, series[s].title);
            first = false;
        }
        fprintf(f, "\n");
        if (close_out(f, gp) < 0)
            return -EIO;
        if (first) {
            printf("chart: nothing to draw (no sweep rows)\n");
            return 1;
        }
        if (run_gnuplot(gnuplot, gp) == 0) {
            printf("wrote %s\n", png);
            return 0;
        }
        /* Older gnuplot builds lack pngcairo: retry with the libgd terminal. */
    }
    fprintf(stderr, "kvpool-bench: gnuplot failed to draw %s\n", png);
    return -EIO;
}
