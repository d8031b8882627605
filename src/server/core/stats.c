/*
 * stats.c - storage of the counters declared in stats.h, the maps as data for the renderers,
 * and the registry of histogram families with the core's own family, the store lock's hold
 * time.
 *
 * Threads: any thread increments, any thread reads; every counter is a relaxed atomic, because
 * no value orders any other memory. A reader may see one counter updated and its neighbour not
 * yet: reports are a moment's approximation, never a synchronisation point.
 *
 * The registry is append-only: a front end registers its family once, at start-up, under
 * families_lock (which orders registrations only); snapshots read it without that lock, through
 * the count's release/acquire pair, so a report never waits for a registration.
 */
#include "core/stats.h"

#include <errno.h>
#include <pthread.h>

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

/* ---- the registry of histogram families ---- */

#define US 1000ull
#define MS 1000000ull
#define S 1000000000ull

const struct kvp_hist_bounds kvp_lock_hold_bounds = {
    .n = 15,
    .ns = {1 * US, 2500, 5 * US, 10 * US, 25 * US, 50 * US, 100 * US, 250 * US, 500 * US, 1 * MS,
           2500 * US, 5 * MS, 10 * MS, 100 * MS, 1 * S},
};

static struct kvp_hist lock_hold;

const struct kvp_hist_family kvp_lock_hold_family = {
    .name = "kvpool_store_lock_hold_seconds",
    .help = "How long the store lock was held, each time it was taken (every store, lookup, "
            "retrieve and eviction takes it)",
    .nseries = 1,
    .series = &lock_hold,
    .bounds = &kvp_lock_hold_bounds,
    .always = true,
    .max_name = "kvpool_store_lock_hold_max_seconds",
    .max_help = "The longest hold of the store lock since kvpoold started",
};

void kvp_lock_hold_record(uint64_t ns)
{
    kvp_hist_record(&lock_hold, &kvp_lock_hold_bounds, ns);
}

/* Registered families, the store lock's first; slots below nfamilies never change again. */
static const struct kvp_hist_family *families[KVP_HIST_FAMILIES] = {&kvp_lock_hold_family};
static _Atomic uint32_t nfamilies = 1;
static pthread_mutex_t families_lock = PTHREAD_MUTEX_INITIALIZER;

int kvp_hist_family_register(const struct kvp_hist_family *f)
{
    int rc = 0;
    pthread_mutex_lock(&families_lock);
    uint32_t n = atomic_load_explicit(&nfamilies, memory_order_relaxed);
    uint32_t i = 0;
    while (i < n && families[i] != f)
        i++;
    if (i == n && n == KVP_HIST_FAMILIES) {
        rc = -ENOSPC;
    } else if (i == n) {
        families[n] = f;
        /* Release: a reader that sees the new count sees the slot filled. */
        atomic_store_explicit(&nfamilies, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&families_lock);
    return rc;
}

uint32_t kvp_hist_families(const struct kvp_hist_family **out, uint32_t cap)
{
    uint32_t n = atomic_load_explicit(&nfamilies, memory_order_acquire);
    if (n > cap)
        n = cap;
    for (uint32_t i = 0; i < n; i++)
        out[i] = families[i];
    return n;
}
