/*
 * histogram.c - the one histogram type (see histogram.h): recording, copying, the "le" text of
 * a bound, and the request-latency scale every front end shares.
 *
 * Every value is a relaxed atomic: no value orders any other memory. A histogram's count is not
 * stored but derived from its buckets by the reader, so that a rendering is internally
 * consistent (the +Inf bucket equals _count) even though it races with recording. The maximum
 * is kept by a compare-and-swap loop that only runs when a value is the largest seen, which
 * after the first few values is rare.
 *
 * Threads: any.
 */
#include "core/histogram.h"

#include <stdio.h>

#define US 1000ull
#define MS 1000000ull
#define S 1000000000ull

const struct kvp_hist_bounds kvp_latency_bounds = {
    .n = 16,
    .ns = {50 * US, 100 * US, 250 * US, 500 * US, 1 * MS, 2500 * US, 5 * MS, 10 * MS, 25 * MS,
           50 * MS, 100 * MS, 250 * MS, 500 * MS, 1 * S, 2500 * MS, 10 * S},
};

void kvp_hist_record(struct kvp_hist *h, const struct kvp_hist_bounds *b, uint64_t ns)
{
    uint32_t i = 0;
    while (i < b->n && ns > b->ns[i])
        i++;
    atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
    uint64_t max = atomic_load_explicit(&h->max_ns, memory_order_relaxed);
    while (ns > max &&
           !atomic_compare_exchange_weak_explicit(&h->max_ns, &max, ns, memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

void kvp_hist_read(struct kvp_hist *h, const struct kvp_hist_bounds *b, struct kvp_hist_copy *out)
{
    *out = (struct kvp_hist_copy){.count = 0};
    for (uint32_t i = 0; i <= b->n; i++) {
        out->bucket[i] = atomic_load_explicit(&h->bucket[i], memory_order_relaxed);
        out->count += out->bucket[i];
    }
    out->sum_ns = atomic_load_explicit(&h->sum_ns, memory_order_relaxed);
    out->max_ns = atomic_load_explicit(&h->max_ns, memory_order_relaxed);
}

void kvp_hist_le(const struct kvp_hist_bounds *b, uint32_t i, char *out, unsigned size)
{
    /* "%g" writes what Prometheus clients write for these bounds: "5e-05", "0.00025", "2.5". */
    snprintf(out, size, "%g", (double)b->ns[i] / 1e9);
}

void kvp_hist_family_record(const struct kvp_hist_family *f, uint32_t i, uint64_t ns)
{
    if (i >= f->nseries || (f->label && !f->values[i]))
        return;
    kvp_hist_record(&f->series[i], f->bounds, ns);
}
