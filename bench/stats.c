/*
 * stats.c - the few statistics the benchmark reports, and its clock.
 *
 * Latency percentiles are computed over every per-operation sample of a cell (all measured
 * repetitions, all workers), with linear interpolation between the two closest ranks (the
 * "type 7" definition of R and numpy), so p99 of 100 samples is not simply the maximum.
 * Throughput is summarised per repetition instead: each repetition gives one GB/s figure, and
 * the report quotes their median with the minimum and maximum as the spread. On a shared
 * 2-core machine a single slow repetition (another process scheduled in) moves the mean a lot
 * and the median hardly at all.
 *
 * Also the clock and the size formatting that every module shares. No state, no threads.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

uint64_t kvpb_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int reserve(struct kvpb_samples *s, size_t more)
{
    if (s->n + more <= s->cap)
        return 0;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < s->n + more)
        cap *= 2;
    double *v = realloc(s->v, cap * sizeof(*v));
    if (!v)
        return -ENOMEM;
    s->v = v;
    s->cap = cap;
    return 0;
}

int kvpb_samples_push(struct kvpb_samples *s, double x)
{
    return kvpb_samples_append(s, &x, 1);
}

int kvpb_samples_append(struct kvpb_samples *s, const double *x, size_t n)
{
    if (n == 0)
        return 0;
    if (reserve(s, n) < 0)
        return -ENOMEM;
    memcpy(s->v + s->n, x, n * sizeof(*x));
    s->n += n;
    return 0;
}

void kvpb_samples_free(struct kvpb_samples *s)
{
    free(s->v);
    *s = (struct kvpb_samples){0};
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double kvpb_percentile(double *v, size_t n, double p)
{
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof(*v), cmp_double);
    double h = (double)(n - 1) * p / 100.0;
    size_t lo = (size_t)floor(h);
    size_t hi = lo + 1 < n ? lo + 1 : lo;
    return v[lo] + (h - (double)lo) * (v[hi] - v[lo]);
}

void kvpb_summary(double *v, size_t n, double *median, double *min, double *max)
{
    *median = kvpb_percentile(v, n, 50.0);
    *min = n ? v[0] : NAN;
    *max = n ? v[n - 1] : NAN;
}

const char *kvpb_fmt_size(uint64_t bytes, char *buf, size_t size)
{
    if (bytes >= KVPB_GiB && bytes % KVPB_GiB == 0)
        snprintf(buf, size, "%" PRIu64 " GiB", bytes / KVPB_GiB);
    else if (bytes >= KVPB_MiB && bytes % KVPB_MiB == 0)
        snprintf(buf, size, "%" PRIu64 " MiB", bytes / KVPB_MiB);
    else if (bytes >= KVPB_KiB && bytes % KVPB_KiB == 0)
        snprintf(buf, size, "%" PRIu64 " KiB", bytes / KVPB_KiB);
    else
        snprintf(buf, size, "%" PRIu64 " B", bytes);
    return buf;
}

double kvpb_paired_ratio(const double *a, const double *b, size_t n)
{
    struct kvpb_samples r = {0};
    double m = NAN;
    for (size_t i = 0; i < n; i++)
        if (kvpb_samples_push(&r, a[i] / b[i]) < 0)
            goto out;
    m = kvpb_percentile(r.v, r.n, 50.0);
out:
    kvpb_samples_free(&r);
    return m;
}
