/*
 * frag.c - the "fragmentation" section: the store's allocation and eviction over a pool that
 * layouts of many chunk sizes share, for pools of 1, 4 and 12 GiB, and its hit ratio against a
 * byte-LRU model of the same trace.
 *
 * For each size the bench starts a daemon of its own (--shm-backend memfd, as the start-up
 * section does), registers one shm instance per chunk size from 4 KiB to 32 MiB (powers of two)
 * on one client, and then:
 *
 *   fill     stores one-chunk sequences until the pool's bytes are used, every size class
 *            taking the same share of bytes (so most objects are small), in shuffled order;
 *            no chunk byte is written (prepare and commit only: the section measures the
 *            store, not memcpy);
 *   shuffle  looks up every other stored key, in random order, so that the LRU order follows
 *            neither the addresses nor the order of the stores;
 *   idle     a probe client (its own connection and instance) looks up its one cached chunk
 *            once per millisecond, FRAG_PROBES times (about as many as it makes during the
 *            large stores, so that both p99s rest on as many samples): its idle p99;
 *   large    FRAG_CYCLES stores of 32 MiB and 8 MiB chunks, each of which has to evict a
 *            window of mixed objects and is followed by as many bytes of small chunks (the
 *            fill's mix, so the pool stays fragmented), while the probe keeps looking up from a
 *            thread of the bench: its p99 and maximum against the idle p99, and the latency of
 *            the large stores themselves. The same small stores without the large ones run
 *            first under the probe too (the control): on a 2-CPU machine the probe waits for a
 *            CPU as much as for anything else, and the control says how much.
 *
 * Each probe window also records the CPU time the hypervisor took from the VM meanwhile (steal,
 * from /proc/stat, % of all CPU time): a thread of a VM that is not run waits whatever it holds.
 *
 * The store lock's longest hold comes from the daemon's /metrics
 * (kvpool_store_lock_hold_max_seconds, since the daemon started: fill and shuffle included),
 * the holds over 1 ms during the large stores from the histogram's buckets before and after.
 *
 * Hit ratio (1 GiB pool only, after a CLEAR): a trace of lookups, each followed by a store on
 * a miss, in three phases whose chunk sizes differ (small, large, mid: the mix changes over
 * time, the case where slab allocators calcify). Keys are drawn 80 % from a hot fifth of each
 * phase's keys, whose bytes are twice the pool. The same trace runs through a byte-LRU model
 * of the pool's capacity in the bench (a hash table and a list: hit = present, then most
 * recent; miss = insert, evicting the least recent until the bytes fit). Both hit ratios and
 * their ratio are reported.
 *
 * A size is skipped, with a note, when MemAvailable is below the pool plus 2 GiB; --quick
 * runs a 256 MiB pool only, with fewer operations. Any failed request ends the run.
 *
 * Threads: the main thread drives the daemon; one probe thread at a time owns the probe's
 * client and its samples, which the main thread reads after joining it.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define FRAG_CLASSES 14 /* 4 KiB .. 32 MiB */
#define FRAG_MIN (4 * KVPB_KiB)
#define FRAG_PROBES 3000 /* idle probe lookups: as many as run during the large stores */
#define FRAG_TIMEOUT_MS 300000
#define FRAG_CYCLES 150 /* large stores, each followed by as many bytes of small chunks */

/* ---- small helpers ------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void die(const char *what, int rc, kvp_client *c)
{
    fprintf(stderr, "kvpool-bench: fragmentation: %s: %s (%s)\n", what, kvp_strerror(rc),
            c ? kvp_last_error(c) : "");
    exit(1);
}

/* One client with an shm instance per size class. */
struct sizes {
    kvp_client *c;
    kvp_instance *inst[FRAG_CLASSES];
    uint32_t tokens; /* per chunk */
    uint32_t *ids;   /* one chunk of token ids, rewritten per key */
};

static void sizes_open(struct sizes *z, const char *socket, uint32_t tokens, const char *tag)
{
    kvp_opts o = {.socket_path = socket, .timeout_ms = 120000};
    int rc = kvp_client_open(&o, &z->c);
    if (rc < 0)
        die("connect", rc, NULL);
    z->tokens = tokens;
    z->ids = calloc(tokens, sizeof(uint32_t));
    if (!z->ids)
        die("memory", -ENOMEM, NULL);
    for (int k = 0; k < FRAG_CLASSES; k++) {
        kvp_register_opts ro;
        char id[64];
        snprintf(id, sizeof(id), "bench-frag-%s-%d", tag, k);
        if (kvpb_register_opts(id, FRAG_MIN << k, tokens, KVP_TRANSPORT_SHM, &ro) < 0)
            die("no layout for a size class", -EINVAL, NULL);
        rc = kvp_register(z->c, &ro, &z->inst[k]);
        if (rc < 0)
            die("register", rc, z->c);
    }
}

static void sizes_close(struct sizes *z)
{
    kvp_client_close(z->c);
    free(z->ids);
}

/* The one-chunk sequence of key (class k, number n). */
static kvp_tokens key_of(struct sizes *z, int k, uint64_t n, uint32_t salt)
{
    z->ids[0] = (uint32_t)n;
    z->ids[1] = (uint32_t)(n >> 32);
    z->ids[2] = (uint32_t)k;
    z->ids[3] = salt;
    return (kvp_tokens){.ids = z->ids, .count = z->tokens};
}

/* Stores key (k, n) without writing its bytes. Returns 1 stored, 0 cached, busy or no space. */
static int put(struct sizes *z, int k, uint64_t n, uint32_t salt)
{
    kvp_tokens t = key_of(z, k, n, salt);
    kvp_store_plan plan;
    int rc = kvp_prepare_store(z->inst[k], &t, 0, t.count, &plan);
    if (rc < 0)
        die("prepare-store", rc, z->c);
    if (rc == 0)
        return 0;
    rc = kvp_commit_store(z->inst[k], &plan);
    if (rc < 0)
        die("commit-store", rc, z->c);
    return 1;
}

/* 1 when key (k, n) is cached (and refreshed by the lookup), else 0. */
static int lookup(struct sizes *z, int k, uint64_t n, uint32_t salt)
{
    kvp_tokens t = key_of(z, k, n, salt);
    int rc = kvp_lookup(z->inst[k], &t);
    if (rc < 0)
        die("lookup", rc, z->c);
    return rc > 0;
}

/* The store lock's figures from /metrics: the longest hold, the holds over 1 ms. */
struct hold {
    double max_s;
    uint64_t count, upto_1ms;
};

static struct hold read_hold(kvp_client *c)
{
    struct hold h = {NAN, 0, 0};
    char *text = NULL;
    int rc = kvp_get_metrics(c, &text);
    if (rc < 0)
        die("metrics", rc, c);
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        sscanf(l, "kvpool_store_lock_hold_max_seconds %lf", &h.max_s);
        sscanf(l, "kvpool_store_lock_hold_seconds_count %" SCNu64, &h.count);
        sscanf(l, "kvpool_store_lock_hold_seconds_bucket{le=\"0.001\"} %" SCNu64, &h.upto_1ms);
    }
    kvp_free(text);
    return h;
}

/* CPU time of all CPUs so far (/proc/stat's "cpu" line), in ticks: in all, and stolen by the
 * hypervisor (time this VM was runnable but not run). Zeros when unreadable. */
struct ticks {
    uint64_t total, steal;
};

static struct ticks read_ticks(void)
{
    struct ticks t = {0, 0};
    unsigned long long v[8];
    FILE *f = fopen("/proc/stat", "re");
    if (f && fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                    &v[4], &v[5], &v[6], &v[7]) == 8) {
        for (int i = 0; i < 8; i++)
            t.total += v[i];
        t.steal = v[7];
    }
    if (f)
        fclose(f);
    return t;
}

/* Stolen share of the CPU time between a and b, in percent; NAN without ticks. */
static double steal_pct(struct ticks a, struct ticks b)
{
    if (b.total <= a.total || b.steal < a.steal)
        return NAN;
    return 100.0 * (double)(b.steal - a.steal) / (double)(b.total - a.total);
}

/* ---- the probe ----------------------------------------------------------------------- */

struct probe {
    pthread_t thread;
    struct sizes *z;
    atomic_bool stop;
    uint32_t max; /* 0: until stop */
    struct kvpb_samples *lat;
    uint64_t misses; /* lookups that found the probe's chunk evicted */
};

static void *probe_main(void *arg)
{
    struct probe *p = arg;
    uint32_t done = 0;
    while (!atomic_load_explicit(&p->stop, memory_order_relaxed)) {
        uint64_t t0 = kvpb_now_ns();
        int hit = lookup(p->z, 0, 0, 0xfeed);
        double us = (double)(kvpb_now_ns() - t0) / 1e3;
        /* A window around an old neighbour may take it: stored again, untimed, and counted. */
        if (!hit) {
            put(p->z, 0, 0, 0xfeed);
            p->misses++;
        }
        if (kvpb_samples_push(p->lat, us) < 0)
            die("memory", -ENOMEM, NULL);
        if (p->max && ++done >= p->max)
            break;
        kvpb_sleep_ms(1);
    }
    return NULL;
}

static void probe_run(struct probe *p, struct sizes *z, uint32_t max, struct kvpb_samples *lat)
{
    *p = (struct probe){.z = z, .max = max, .lat = lat};
    atomic_init(&p->stop, false);
    if (pthread_create(&p->thread, NULL, probe_main, p) != 0)
        die("probe thread", -EAGAIN, NULL);
}

static void probe_join(struct probe *p)
{
    if (!p->max)
        atomic_store_explicit(&p->stop, true, memory_order_relaxed);
    pthread_join(p->thread, NULL);
}

/* ---- one pool size ----------------------------------------------------------------- */

static void shuffle(uint64_t *v, size_t n)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(rng() % i);
        uint64_t t = v[i - 1];
        v[i - 1] = v[j];
        v[j] = t;
    }
}

/* The fill's keys: (class << 40 | number), equal bytes per class, shuffled. */
static uint64_t *fill_keys(uint64_t pool, size_t *n)
{
    size_t total = 0;
    for (int k = 0; k < FRAG_CLASSES; k++)
        total += pool / FRAG_CLASSES / (FRAG_MIN << k);
    uint64_t *v = malloc(total * sizeof(*v));
    if (!v)
        die("memory", -ENOMEM, NULL);
    size_t i = 0;
    for (int k = 0; k < FRAG_CLASSES; k++)
        for (uint64_t m = 0; m < pool / FRAG_CLASSES / (FRAG_MIN << k); m++)
            v[i++] = (uint64_t)k << 40 | m;
    shuffle(v, total);
    *n = total;
    return v;
}

static void one_pool(const struct kvpb_config *cfg, const char *kvpoold, const char *dir,
                     uint64_t size, struct kvpb_rows *rows)
{
    char l1[32], tokens[16], socket[256], log[256], sz[32];
    struct kvpb_child ch = {0};
    struct sizes z = {0}, pz = {0};
    struct kvpb_samples idle = {0}, busy = {0}, large = {0}, control = {0};
    double waited = 0;

    snprintf(socket, sizeof(socket), "%s/frag-%" PRIu64 ".sock", dir, size >> 20);
    snprintf(log, sizeof(log), "%s/frag-%" PRIu64 ".log", dir, size >> 20);
    snprintf(l1, sizeof(l1), "%" PRIu64, size);
    snprintf(tokens, sizeof(tokens), "%u", cfg->chunk_tokens);
    char *const argv[] = {
        (char *)kvpoold, "--socket", socket,        "--l1-size", l1,       "--chunk-size", tokens,
        "--shm-backend", "memfd",    "--log-level", "warn",      "--http", "off",          NULL,
    };
    if (kvpb_child_spawn(&ch, "kvpoold", argv, log) < 0 ||
        kvpb_wait_kvpoold(socket, &ch, FRAG_TIMEOUT_MS) < 0)
        exit(1);
    sizes_open(&z, socket, cfg->chunk_tokens, "main");
    sizes_open(&pz, socket, cfg->chunk_tokens, "probe");
    if (kvpb_wait_pool_reserved(z.c, FRAG_TIMEOUT_MS, &waited) < 0)
        exit(1);

    /* Fill, shuffle. */
    size_t nkeys;
    uint64_t *keys = fill_keys(size, &nkeys), t0 = kvpb_now_ns();
    for (size_t i = 0; i < nkeys; i++)
        put(&z, (int)(keys[i] >> 40), keys[i] & ((1ull << 40) - 1), 1);
    double fill_s = (double)(kvpb_now_ns() - t0) / 1e9;
    shuffle(keys, nkeys);
    t0 = kvpb_now_ns();
    for (size_t i = 0; i < nkeys; i += 2)
        lookup(&z, (int)(keys[i] >> 40), keys[i] & ((1ull << 40) - 1), 1);
    double shuffle_s = (double)(kvpb_now_ns() - t0) / 1e9;
    free(keys);

    /* The probe's chunk, then its idle latency. */
    put(&pz, 0, 0, 0xfeed);
    struct probe p;
    struct ticks t_idle = read_ticks();
    probe_run(&p, &pz, cfg->quick ? 50 : FRAG_PROBES, &idle);
    probe_join(&p);
    double steal[3] = {steal_pct(t_idle, read_ticks()), NAN, NAN}; /* idle, control, large */

    /* The same refill load without the large stores first (the control: what the probe sees
     * from the CPUs being busy), then large stores under the probe, each followed by as many
     * bytes of small chunks again (the fill's mix), so the pool stays fragmented for the next. */
    uint64_t cycles = cfg->quick ? 20 : FRAG_CYCLES, no_space = 0, refill = 0, probe_misses = 0;
    struct hold h0 = read_hold(z.c);
    for (int with_large = 0; with_large < 2; with_large++) {
        struct ticks t_phase = read_ticks();
        probe_run(&p, &pz, 0, with_large ? &busy : &control);
        for (uint64_t i = 0; i < cycles; i++) {
            int k = i % 2 ? FRAG_CLASSES - 3 : FRAG_CLASSES - 1; /* 8 MiB, 32 MiB */
            if (with_large) {
                uint64_t s0 = kvpb_now_ns();
                if (!put(&z, k, 1000000 + i, 2))
                    no_space++;
                if (kvpb_samples_push(&large, (double)(kvpb_now_ns() - s0) / 1e3) < 0)
                    die("memory", -ENOMEM, NULL);
            }
            /* Class j with probability 2^-(j+1): equal bytes per class, as in the fill. */
            for (uint64_t b = 0; b < (FRAG_MIN << k);) {
                int j = __builtin_ctzll(rng() | (1ull << (FRAG_CLASSES - 1)));
                put(&z, j, 2000000 + refill++, 2);
                b += FRAG_MIN << j;
            }
        }
        probe_join(&p);
        steal[1 + with_large] = steal_pct(t_phase, read_ticks());
        probe_misses += p.misses;
        if (!with_large)
            h0 = read_hold(z.c);
    }
    struct hold h1 = read_hold(z.c);
    struct kvpb_row rf = kvpb_row_blank(KVPB_T_KVPOOL, KVPB_OP_FRAG_FILL, KVPB_D_FRAG);
    rf.pool_bytes = size;
    rf.samples = nkeys;
    rf.ops_per_s = (double)nkeys / fill_s;
    rf.ms = fill_s * 1e3;
    rf.lock_max_ms = h1.max_s * 1e3;
    kvpb_rows_push(rows, &rf);

    struct kvpb_row rl = kvpb_row_blank(KVPB_T_SHM, KVPB_OP_FRAG_LARGE, KVPB_D_FRAG);
    rl.pool_bytes = size;
    rl.samples = large.n;
    rl.p50_us = kvpb_percentile(large.v, large.n, 50.0);
    rl.p99_us = kvpb_percentile(large.v, large.n, 99.0);
    rl.max_us = large.n ? large.v[large.n - 1] : NAN;
    rl.lock_max_ms = h1.max_s * 1e3;
    rl.lock_over_1ms = (double)((h1.count - h1.upto_1ms) - (h0.count - h0.upto_1ms));
    rl.invalid = no_space != 0;
    kvpb_rows_push(rows, &rl);

    struct kvpb_row ri = kvpb_row_blank(KVPB_T_KVPOOL, KVPB_OP_FRAG_IDLE, KVPB_D_FRAG);
    struct kvpb_row rp = kvpb_row_blank(KVPB_T_KVPOOL, KVPB_OP_FRAG_PROBE, KVPB_D_FRAG);
    ri.pool_bytes = rp.pool_bytes = size;
    ri.samples = idle.n;
    rp.samples = busy.n;
    ri.p50_us = kvpb_percentile(idle.v, idle.n, 50.0);
    ri.p99_us = kvpb_percentile(idle.v, idle.n, 99.0);
    ri.max_us = idle.n ? idle.v[idle.n - 1] : NAN;
    rp.p50_us = kvpb_percentile(busy.v, busy.n, 50.0);
    rp.p99_us = kvpb_percentile(busy.v, busy.n, 99.0);
    rp.max_us = busy.n ? busy.v[busy.n - 1] : NAN;
    rp.ratio_to_idle = rp.p99_us / ri.p99_us;
    rp.hit_rate = busy.n ? 1.0 - (double)probe_misses / (double)busy.n : NAN;
    ri.steal_pct = steal[0];
    rp.steal_pct = steal[2];
    struct kvpb_row rc = kvpb_row_blank(KVPB_T_KVPOOL, KVPB_OP_FRAG_CONTROL, KVPB_D_FRAG);
    rc.pool_bytes = size;
    rc.samples = control.n;
    rc.p50_us = kvpb_percentile(control.v, control.n, 50.0);
    rc.p99_us = kvpb_percentile(control.v, control.n, 99.0);
    rc.max_us = control.n ? control.v[control.n - 1] : NAN;
    rc.ratio_to_idle = rc.p99_us / ri.p99_us;
    rc.steal_pct = steal[1];
    kvpb_rows_push(rows, &ri);
    kvpb_rows_push(rows, &rc);
    kvpb_rows_push(rows, &rp);

    printf(
        "  %s: fill %zu chunks (4 KiB-32 MiB) %.1f s, shuffle %.1f s; %" PRIu64
        " large stores (with %" PRIu64
        " small ones between) p50 %.0f us max %.0f us%s; probe lookup p99 %.0f us (idle %.0f us, "
        "%.2fx; %.0f us under the small stores alone), max %.0f us, %" PRIu64
        " misses; store lock: longest hold %.3f ms, %.0f holds over 1 ms; steal %.1f / %.1f / %.1f "
        "%%"
        " (idle / control / large)\n",
        kvpb_fmt_size(size, sz, sizeof(sz)), nkeys, fill_s, shuffle_s, cycles, refill, rl.p50_us,
        rl.max_us, no_space ? " (SOME FOUND NO SPACE: invalid)" : "", rp.p99_us, ri.p99_us,
        rp.ratio_to_idle, rc.p99_us, rp.max_us, probe_misses, rl.lock_max_ms, rl.lock_over_1ms,
        steal[0], steal[1], steal[2]);
    fflush(stdout);

    sizes_close(&pz);
    sizes_close(&z);
    kvpb_child_stop(&ch, 10000);
    kvpb_samples_free(&idle);
    kvpb_samples_free(&busy);
    kvpb_samples_free(&large);
    kvpb_samples_free(&control);
}

/* ---- hit ratio against a byte-LRU model ------------------------------------------------ */

struct lru_node {
    uint64_t key, bytes;
    uint32_t prev, next; /* list indices; 0 is the sentinel */
    uint32_t hnext;      /* hash chain, 0 = end */
    bool live;
};

struct lru_model {
    struct lru_node *v; /* v[0] sentinel */
    uint32_t n, cap;
    uint32_t *bucket;
    uint32_t mask;
    uint32_t free_head;
    uint64_t bytes, capacity;
};

static uint32_t hash_of(const struct lru_model *m, uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return (uint32_t)key & m->mask;
}

static void model_init(struct lru_model *m, uint32_t cap, uint64_t capacity)
{
    *m = (struct lru_model){.cap = cap, .capacity = capacity, .n = 1};
    uint32_t nb = 1;
    while (nb < cap * 2)
        nb *= 2;
    m->v = calloc(cap + 1, sizeof(*m->v));
    m->bucket = calloc(nb, sizeof(uint32_t));
    if (!m->v || !m->bucket)
        die("memory", -ENOMEM, NULL);
    m->mask = nb - 1;
}

static void model_unlink(struct lru_model *m, uint32_t i)
{
    m->v[m->v[i].prev].next = m->v[i].next;
    m->v[m->v[i].next].prev = m->v[i].prev;
}

static void model_front(struct lru_model *m, uint32_t i)
{
    m->v[i].next = m->v[0].next;
    m->v[i].prev = 0;
    m->v[m->v[0].next].prev = i;
    m->v[0].next = i;
}

static void model_drop(struct lru_model *m, uint32_t i)
{
    uint32_t *pp = &m->bucket[hash_of(m, m->v[i].key)];
    while (*pp != i)
        pp = &m->v[*pp].hnext;
    *pp = m->v[i].hnext;
    model_unlink(m, i);
    m->bytes -= m->v[i].bytes;
    m->v[i].live = false;
    m->v[i].hnext = m->free_head;
    m->free_head = i;
}

/* One access: true on a hit (refreshed), else the key is inserted as most recent. */
static bool model_access(struct lru_model *m, uint64_t key, uint64_t bytes)
{
    uint32_t b = hash_of(m, key);
    for (uint32_t i = m->bucket[b]; i; i = m->v[i].hnext)
        if (m->v[i].key == key) {
            model_unlink(m, i);
            model_front(m, i);
            return true;
        }
    if (bytes > m->capacity)
        return false;
    while (m->bytes + bytes > m->capacity)
        model_drop(m, m->v[0].prev);
    uint32_t i = m->free_head ? m->free_head : m->n++;
    if (i > m->cap)
        die("model table full", -ENOMEM, NULL);
    if (m->free_head)
        m->free_head = m->v[i].hnext;
    m->v[i] = (struct lru_node){.key = key, .bytes = bytes, .hnext = m->bucket[b], .live = true};
    m->bucket[b] = i;
    model_front(m, i);
    m->bytes += bytes;
    return false;
}

static void hit_ratio(const struct kvpb_config *cfg, const char *kvpoold, const char *dir,
                      uint64_t size, struct kvpb_rows *rows)
{
    /* Three phases: small, large, mid chunk sizes (classes of 4 KiB << k). */
    static const int phase_classes[3][3] = {{2, 4, 6}, {10, 12, 13}, {5, 8, 11}};
    char l1[32], tokens[16], socket[256], log[256], sz[32];
    struct kvpb_child ch = {0};
    struct sizes z = {0};
    struct lru_model m;
    double waited = 0;
    uint64_t ops_per_phase = cfg->quick ? 3000 : 30000, hits = 0, mhits = 0, ops = 0;

    snprintf(socket, sizeof(socket), "%s/hit.sock", dir);
    snprintf(log, sizeof(log), "%s/hit.log", dir);
    snprintf(l1, sizeof(l1), "%" PRIu64, size);
    snprintf(tokens, sizeof(tokens), "%u", cfg->chunk_tokens);
    char *const argv[] = {
        (char *)kvpoold, "--socket", socket,        "--l1-size", l1,       "--chunk-size", tokens,
        "--shm-backend", "memfd",    "--log-level", "warn",      "--http", "off",          NULL,
    };
    if (kvpb_child_spawn(&ch, "kvpoold", argv, log) < 0 ||
        kvpb_wait_kvpoold(socket, &ch, FRAG_TIMEOUT_MS) < 0)
        exit(1);
    sizes_open(&z, socket, cfg->chunk_tokens, "hit");
    if (kvpb_wait_pool_reserved(z.c, FRAG_TIMEOUT_MS, &waited) < 0)
        exit(1);
    kvp_stat st[256];
    uint64_t pool = size;
    int ns = kvp_stats(z.c, st, 256);
    for (int i = 0; i < ns && i < 256; i++)
        if (strcmp(st[i].name, "pool_size") == 0)
            pool = st[i].value;
    model_init(&m, 1u << 20, pool);

    uint64_t t0 = kvpb_now_ns();
    for (int ph = 0; ph < 3; ph++) {
        /* Keys of each class: bytes of the phase = 2x the pool, a third per class. */
        uint64_t nk[3];
        for (int j = 0; j < 3; j++) {
            nk[j] = 2 * pool / 3 / (FRAG_MIN << phase_classes[ph][j]);
            if (nk[j] < 5)
                nk[j] = 5;
        }
        for (uint64_t o = 0; o < ops_per_phase; o++) {
            int j = (int)(rng() % 3), k = phase_classes[ph][j];
            uint64_t hot = nk[j] / 5 ? nk[j] / 5 : 1;
            uint64_t n = rng() % 100 < 80 ? rng() % hot : rng() % nk[j];
            uint64_t key = (uint64_t)k << 40 | n;
            bool h = lookup(&z, k, n, 3);
            if (!h)
                put(&z, k, n, 3);
            hits += h;
            mhits += model_access(&m, key, FRAG_MIN << k);
            ops++;
        }
    }
    double secs = (double)(kvpb_now_ns() - t0) / 1e9;

    struct kvpb_row r = kvpb_row_blank(KVPB_T_KVPOOL, KVPB_OP_HIT_RATIO, KVPB_D_FRAG);
    r.pool_bytes = size;
    r.samples = ops;
    r.hit_rate = (double)hits / (double)ops;
    r.model_hit_rate = (double)mhits / (double)ops;
    r.ratio_to_model = r.hit_rate / r.model_hit_rate;
    r.ops_per_s = (double)ops / secs;
    kvpb_rows_push(rows, &r);
    printf("  hit ratio, %s pool, %" PRIu64 " lookups (+ a store on each miss) in 3 phases of "
           "chunk sizes: kvpool %.4f, byte-LRU model %.4f: %.3fx\n",
           kvpb_fmt_size(size, sz, sizeof(sz)), ops, r.hit_rate, r.model_hit_rate,
           r.ratio_to_model);
    fflush(stdout);
    free(m.v);
    free(m.bucket);
    sizes_close(&z);
    kvpb_child_stop(&ch, 10000);
}

void kvpb_frag_phase(const struct kvpb_config *cfg, const char *kvpoold, const char *dir,
                     struct kvpb_rows *rows)
{
    static const uint64_t full[] = {1 * KVPB_GiB, 4 * KVPB_GiB, 12 * KVPB_GiB};
    static const uint64_t quick[] = {256 * KVPB_MiB};
    const uint64_t *sizes = cfg->quick ? quick : full;
    size_t n = cfg->quick ? 1 : 3;
    char sz[32];
    uint64_t t0 = kvpb_now_ns();

    /* Registering maps the whole pool; nothing here reads or writes chunk bytes, so the
     * library's pre-fault thread would only load the machine. */
    setenv("KVPOOL_PREFAULT", "0", 1);
    printf("fragmentation: chunks of 4 KiB to 32 MiB sharing one pool, LRU order shuffled, "
           "then large stores (--shm-backend memfd)\n");
    for (size_t i = 0; i < n; i++) {
        if (kvpb_mem_available() < sizes[i] + 2 * KVPB_GiB) {
            printf("  %s: skipped: MemAvailable is below the pool plus 2 GiB\n",
                   kvpb_fmt_size(sizes[i], sz, sizeof(sz)));
            continue;
        }
        one_pool(cfg, kvpoold, dir, sizes[i], rows);
    }
    hit_ratio(cfg, kvpoold, dir, sizes[0], rows);
    unsetenv("KVPOOL_PREFAULT");
    printf("fragmentation: %.1f s\n", (double)(kvpb_now_ns() - t0) / 1e9);
}
