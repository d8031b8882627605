/*
 * histogram.h - the daemon's one histogram type: fixed bucket bounds, recorded without a lock,
 * copied for a snapshot; and the families of histograms that the reports render.
 *
 * A histogram counts durations (in nanoseconds) into buckets whose upper bounds are fixed when
 * the histogram is declared (struct kvp_hist_bounds): the request latencies of every front end
 * use kvp_latency_bounds (50 us to 10 s), the store lock's hold time bounds of its own (1 us to
 * 1 s, stats.h). Recording is a comparison loop and two relaxed increments, plus a relaxed
 * compare-and-swap when a value is the largest yet (the maximum is kept for every histogram;
 * a family says whether the reports show it).
 *
 * A family (struct kvp_hist_family) is what one Prometheus histogram metric is: a name, a help
 * line, a label and the label's values, one histogram per value (a front end's operations),
 * or a single histogram without a label. Whoever records declares the family in its own folder
 * and registers it with kvp_hist_family_register() (stats.h) at start-up: the native front end its
 * opcodes (kvp/latency.c), the LMCache front end its operations (lmc/latency.c), the core the
 * store lock (stats.c). Snapshots (snapshot.h) copy every registered family and the renderers
 * (report/metrics.c, report/status_json.c) write whatever they find, so no layer below a front
 * end ever knows that front end's operations. The registry of families is in stats.h.
 *
 * Threads: any thread records and reads, without a lock; a reader may see one bucket updated
 * and the sum not yet: a report is a moment's approximation, never a synchronisation point.
 */
#ifndef KVP_HISTOGRAM_H
#define KVP_HISTOGRAM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* The most finite bounds a histogram has; the last bucket, +Inf, is implicit. */
#define KVP_HIST_MAX_BOUNDS 16

/* The upper bounds of a histogram's buckets, in nanoseconds, strictly ascending. Prometheus's
 * "le" label is the bound in seconds, written with "%g" ("5e-05", "0.00025", "10"). */
struct kvp_hist_bounds {
    uint32_t n; /* finite bounds, at most KVP_HIST_MAX_BOUNDS */
    uint64_t ns[KVP_HIST_MAX_BOUNDS];
};

/* The request-latency scale of every front end: 50 us (a PING) to 10 s (a stalled 32 MiB
 * transfer). */
extern const struct kvp_hist_bounds kvp_latency_bounds;

/* One histogram: counts per bucket (not cumulative; bucket[n] is +Inf), the sum and the
 * largest value recorded. Zero-initialised storage is an empty histogram. */
struct kvp_hist {
    _Atomic uint64_t bucket[KVP_HIST_MAX_BOUNDS + 1];
    _Atomic uint64_t sum_ns;
    _Atomic uint64_t max_ns;
};

/* A copy of a histogram. count is the sum of the copied buckets, so it always equals the +Inf
 * bucket of a cumulative rendering, even while values are being recorded. */
struct kvp_hist_copy {
    uint64_t bucket[KVP_HIST_MAX_BOUNDS + 1]; /* the first b->n + 1 are used */
    uint64_t sum_ns;
    uint64_t count;
    uint64_t max_ns;
};

/* Records a value of ns nanoseconds into h, whose buckets are b: the first bucket whose bound
 * is at least ns, else +Inf. No lock. */
void kvp_hist_record(struct kvp_hist *h, const struct kvp_hist_bounds *b, uint64_t ns);

/* Copies h (buckets b) into out (relaxed loads; count derived from the buckets). */
void kvp_hist_read(struct kvp_hist *h, const struct kvp_hist_bounds *b, struct kvp_hist_copy *out);

/* Formats bound i of b as Prometheus's "le" label value writes it ("5e-05"); out holds at
 * least 24 bytes. */
void kvp_hist_le(const struct kvp_hist_bounds *b, uint32_t i, char *out, unsigned size);

/* ---- families: what the reports render ---- */

/*
 * One histogram metric. Declared (const, static storage) by the module that records it, with
 * its series in storage of its own (zeroed static arrays). Label values are the daemon's own
 * names (operation names), never a client's string, so the number of series is bounded.
 */
struct kvp_hist_family {
    const char *name;  /* Prometheus name: "kvpool_request_duration_seconds" */
    const char *help;  /* one line, no backslash or line feed */
    const char *label; /* the label's name ("op"), or NULL: one histogram, no label */
    /* values[i] is series i's label value; NULL: i is no series (an id that names nothing).
     * NULL with label == NULL. */
    const char *const *values;
    uint32_t nseries; /* series[0..nseries); 1 without a label */
    struct kvp_hist *series;
    const struct kvp_hist_bounds *bounds;
    /* Every series is reported from the start, at 0; else only those recorded at least once
     * (and the family not at all before its first value). */
    bool always;
    /* A gauge of the largest value beside the histogram ("kvpool_store_lock_hold_max_seconds")
     * and its help, or NULL. */
    const char *max_name;
    const char *max_help;
    /* The key under which the status JSON lists the series' counts and total seconds
     * ("requests"), or NULL for none. */
    const char *status_key;
};

/* Records ns into series i of f. An i that names no series (i >= nseries, or values[i] NULL
 * in a labelled family) is ignored. No lock. */
void kvp_hist_family_record(const struct kvp_hist_family *f, uint32_t i, uint64_t ns);

#endif /* KVP_HISTOGRAM_H */
