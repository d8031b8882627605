/*
 * report_files.c - the results as files: CSV, JSON and a gnuplot chart (report.c prints the
 * table on stdout from the same rows).
 *
 * A value that does not apply to a row is empty in CSV and null in JSON; a row whose
 * measurement did not complete has valid = 0 / false. Names and details are fixed identifiers
 * of the bench, so nothing needs escaping.
 *
 * The chart is drawn by Debian's gnuplot when it is installed: the script and its data are
 * written next to the PNG (FILE.gp, FILE.dat) so that it can be redrawn or restyled by hand.
 * Without gnuplot the bench says so and carries on.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

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
               "hit_rate,evictions_per_op,faults_per_op,preempt_per_op,copy_share,load1,"
               "pool_bytes,ms,us_per_chunk,ratio_to_idle,ratio_to_c,rss_mib,vm_rss_mib,"
               "rss_anon_mib,rss_file_mib,rss_shmem_mib,max_us,lock_max_ms,lock_over_1ms,steal_pct,"
               "model_hit_rate,ratio_to_model,ratio_to_limit,vs_lmcache,server_us,"
               "vs_lmcache_free,speedup,valid\n");
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
        csv_num(f, r->load1, ",");
        fprintf(f, "%" PRIu64 ",", r->pool_bytes);
        csv_num(f, r->ms, ",");
        csv_num(f, r->us_per_chunk, ",");
        csv_num(f, r->ratio_to_idle, ",");
        csv_num(f, r->ratio_to_c, ",");
        csv_num(f, r->rss_mib, ",");
        csv_num(f, r->vm_rss_mib, ",");
        csv_num(f, r->rss_anon_mib, ",");
        csv_num(f, r->rss_file_mib, ",");
        csv_num(f, r->rss_shmem_mib, ",");
        csv_num(f, r->max_us, ",");
        csv_num(f, r->lock_max_ms, ",");
        csv_num(f, r->lock_over_1ms, ",");
        csv_num(f, r->steal_pct, ",");
        csv_num(f, r->model_hit_rate, ",");
        csv_num(f, r->ratio_to_model, ",");
        csv_num(f, r->ratio_to_limit, ",");
        csv_num(f, r->vs_lmcache, ",");
        csv_num(f, r->server_us, ",");
        csv_num(f, r->vs_lmcache_free, ",");
        csv_num(f, r->speedup, ",");
        fprintf(f, "%d\n", r->invalid ? 0 : 1);
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
        json_num(f, "load1", r->load1, false);
        fprintf(f, "\"pool_bytes\": %" PRIu64 ", ", r->pool_bytes);
        json_num(f, "ms", r->ms, false);
        json_num(f, "us_per_chunk", r->us_per_chunk, false);
        json_num(f, "ratio_to_idle", r->ratio_to_idle, false);
        json_num(f, "ratio_to_c", r->ratio_to_c, false);
        json_num(f, "rss_mib", r->rss_mib, false);
        json_num(f, "vm_rss_mib", r->vm_rss_mib, false);
        json_num(f, "rss_anon_mib", r->rss_anon_mib, false);
        json_num(f, "rss_file_mib", r->rss_file_mib, false);
        json_num(f, "rss_shmem_mib", r->rss_shmem_mib, false);
        json_num(f, "max_us", r->max_us, false);
        json_num(f, "lock_max_ms", r->lock_max_ms, false);
        json_num(f, "lock_over_1ms", r->lock_over_1ms, false);
        json_num(f, "steal_pct", r->steal_pct, false);
        json_num(f, "model_hit_rate", r->model_hit_rate, false);
        json_num(f, "ratio_to_model", r->ratio_to_model, false);
        json_num(f, "ratio_to_limit", r->ratio_to_limit, false);
        json_num(f, "vs_lmcache", r->vs_lmcache, false);
        json_num(f, "server_us", r->server_us, false);
        json_num(f, "vs_lmcache_free", r->vs_lmcache_free, false);
        json_num(f, "speedup", r->speedup, false);
        fprintf(f, "\"valid\": %s", r->invalid ? "false" : "true");
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
