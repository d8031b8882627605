/*
 * stats.c - storage of the counters and of the request-latency histogram declared in stats.h,
 * and the maps as data for the renderers.
 *
 * Threads: any thread increments, any thread reads; everything is a relaxed atomic, because no
 * value orders any other memory. A reader may see one counter updated and its neighbour not yet:
 * reports are a moment's approximation, never a synchronisation point. The histogram's count is
 * derived from its buckets by the reader, so a rendering is internally consistent (the +Inf
 * bucket equals _count) even though it races with recording. The store lock's hold histogram
 * works the same way, with its maximum kept by a compare-and-swap loop.
 */
#include "core/stats.h"

#include <ctype.h>
#include <string.h>

struct kvp_counters kvp_counters;

const struct kvp_stat_desc kvp_counter_desc[KVP_NCOUNTERS] = {
#define KVP_COUNTER_DESC(n, f, l, v, h) {#n, f, l, v, h},
    KVP_COUNTER_MAP(KVP_COUNTER_DESC)
#undef KVP_COUNTER_DESC
};

const struct kvp_stat_desc kvp_gauge_desc[KVP_NGAUGES] = {
#define KVP_GAUGE_DESC(n, f, l, v, h) {#n, f, l, v, h},
    KVP_GAUGE_MAP(KVP_GAUGE_DESC)
#undef KVP_GAUGE_DESC
};

void kvp_counters_read(uint64_t *v)
{
#define KVP_COUNTER_READ(n, f, l, val, h) \
    v[KVP_CTR_##n] = atomic_load_explicit(&kvp_counters.n, memory_order_relaxed);
    KVP_COUNTER_MAP(KVP_COUNTER_READ)
#undef KVP_COUNTER_READ
}

#define US 1000ull
#define MS 1000000ull
#define S 1000000000ull

const uint64_t kvp_latency_bound_ns[KVP_LATENCY_BUCKETS] = {
    50 * US, 100 * US, 250 * US, 500 * US, 1 * MS,   2500 * US, 5 * MS,    10 * MS,
    25 * MS, 50 * MS,  100 * MS, 250 * MS, 500 * MS, 1 * S,     2500 * MS, 10 * S,
};

const char *const kvp_latency_bound_le[KVP_LATENCY_BUCKETS] = {
    "5e-05", "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01",
    "0.025", "0.05",   "0.1",     "0.25",   "0.5",   "1",      "2.5",   "10",
};

void kvp_op_label(uint16_t op, char *out, size_t size)
{
    const char *name = kvp_opcode_name(op);
    size_t i = 0;
    for (; name[i] && i + 1 < size; i++)
        out[i] = (char)tolower((unsigned char)name[i]);
    out[i] = '\0';
}

/* Indexed by opcode; slot 0 is never recorded. */
static struct kvp_latency latency[KVP_OP_MAX_];

/* The LMCache front end's, by operation id, and each id's name once it has been recorded. */
static struct kvp_latency lmc_latency[KVP_LMC_OP_IDS];
static const char *_Atomic lmc_names[KVP_LMC_OP_IDS];

static void latency_add(struct kvp_latency *l, uint64_t ns)
{
    int b = 0;
    while (b < KVP_LATENCY_BUCKETS && ns > kvp_latency_bound_ns[b])
        b++;
    atomic_fetch_add_explicit(&l->bucket[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->sum_ns, ns, memory_order_relaxed);
}

static void latency_copy(struct kvp_latency *l, struct kvp_latency_copy *c)
{
    c->count = 0;
    for (int b = 0; b <= KVP_LATENCY_BUCKETS; b++) {
        c->bucket[b] = atomic_load_explicit(&l->bucket[b], memory_order_relaxed);
        c->count += c->bucket[b];
    }
    c->sum_ns = atomic_load_explicit(&l->sum_ns, memory_order_relaxed);
}

void kvp_latency_record(uint16_t op, uint64_t ns)
{
    if (op == 0 || op >= KVP_OP_MAX_)
        return;
    latency_add(&latency[op], ns);
}

void kvp_latency_read(struct kvp_latency_copy out[KVP_OP_MAX_])
{
    memset(&out[0], 0, sizeof(out[0]));
    for (int op = 1; op < KVP_OP_MAX_; op++)
        latency_copy(&latency[op], &out[op]);
}

void kvp_lmc_latency_record(unsigned op, const char *name, uint64_t ns)
{
    if (op >= KVP_LMC_OP_IDS)
        return;
    /* The name first: a reader that sees it may copy counts still at 0, never the reverse. */
    if (!atomic_load_explicit(&lmc_names[op], memory_order_relaxed))
        atomic_store_explicit(&lmc_names[op], name, memory_order_release);
    latency_add(&lmc_latency[op], ns);
}

uint32_t kvp_lmc_latency_read(struct kvp_lmc_latency_copy *out, uint32_t cap)
{
    uint32_t n = 0;
    for (unsigned op = 0; op < KVP_LMC_OP_IDS && n < cap; op++) {
        const char *name = atomic_load_explicit(&lmc_names[op], memory_order_acquire);
        if (!name)
            continue;
        out[n].op = name;
        latency_copy(&lmc_latency[op], &out[n].h);
        n++;
    }
    return n;
}

const uint64_t kvp_hold_bound_ns[KVP_HOLD_BUCKETS] = {
    1 * US,   2500,   5 * US,    10 * US, 25 * US, 50 * US,  100 * US, 250 * US,
    500 * US, 1 * MS, 2500 * US, 5 * MS,  10 * MS, 100 * MS, 1 * S,
};

const char *const kvp_hold_bound_le[KVP_HOLD_BUCKETS] = {
    "1e-06",  "2.5e-06", "5e-06",  "1e-05", "2.5e-05", "5e-05", "0.0001", "0.00025",
    "0.0005", "0.001",   "0.0025", "0.005", "0.01",    "0.1",   "1",
};

static struct {
    _Atomic uint64_t bucket[KVP_HOLD_BUCKETS + 1];
    _Atomic uint64_t sum_ns;
    _Atomic uint64_t max_ns;
} hold;

void kvp_lock_hold_record(uint64_t ns)
{
    int b = 0;
    while (b < KVP_HOLD_BUCKETS && ns > kvp_hold_bound_ns[b])
        b++;
    atomic_fetch_add_explicit(&hold.bucket[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&hold.sum_ns, ns, memory_order_relaxed);
    uint64_t max = atomic_load_explicit(&hold.max_ns, memory_order_relaxed);
    while (ns > max &&
           !atomic_compare_exchange_weak_explicit(&hold.max_ns, &max, ns, memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

void kvp_lock_hold_read(struct kvp_hold_copy *out)
{
    out->count = 0;
    for (int b = 0; b <= KVP_HOLD_BUCKETS; b++) {
        out->bucket[b] = atomic_load_explicit(&hold.bucket[b], memory_order_relaxed);
        out->count += out->bucket[b];
    }
    out->sum_ns = atomic_load_explicit(&hold.sum_ns, memory_order_relaxed);
    out->max_ns = atomic_load_explicit(&hold.max_ns, memory_order_relaxed);
}
