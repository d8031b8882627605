/*
 * test_lmc_instances.c - the LMCache front end's semantics and their time rules
 * (src/server/lmc/instances.h, transfers.h, jobs.h), driven through the calls the handlers make,
 * with a test clock (lmc_front.now_ms) instead of a worker: no socket, no thread, no virtual
 * environment. A daemon core is built by hand (a store over a heap "segment" offered as shared
 * memory, a registry, the owners), as in test_ops.c, and the front end's state over it.
 *
 *   - reaping: a pinged instance after --lmcache-reap-timeout, a never-pinged one after
 *     --lmcache-registration-grace, each reaped at the first tick one millisecond past its
 *     limit and not at the limit (a second instance due a millisecond earlier makes the reaper
 *     look at the table exactly then), everything it held released;
 *   - the ping edge: a registered id true, a reaped or unknown id false once, then true, an
 *     unregistered one true;
 *   - lookup read locks: held until LMCache's read TTL has passed, released one millisecond
 *     after it, and released earlier by the retrieve that claims them;
 *   - pending prepare/commit pairs: a commit pops its prepare, a second prepare of the key
 *     replaces the first and ends its hold (store and retrieve), a commit from another
 *     connection is refused and ends nothing;
 *   - the owner's callbacks: shm_lost (called directly, and through the registry and
 *     kvp_owners_notify() as the expiry thread does) only marks the instance; the front end's
 *     next ping or tick drops it, its next ping is false, and it registers again on its
 *     in-band transport; drop ends an instance the same way.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/log.h"
#include "common/kvp_assert.h"
#include "common/seg_header.h"
#include "core/daemon.h"
#include "core/ops.h"
#include "core/owner.h"
#include "core/stats.h"
#include "lmc/front.h"
#include "lmc/instances.h"
#include "lmc/jobs.h"
#include "lmc/transfers.h"

#define C 16u           /* tokens per chunk */
#define POOL (1u << 20) /* 1 MiB: 128 chunks of 8 KiB */
#define T0 1000000u     /* the test clock's start, in ms */
#define SHM_NAME "kvpool_l1_pool_lmctest"
#define PEER_A 0x1111u /* a connection's lmc_front.peer */
#define PEER_B 0x2222u /* another connection's */

struct fx {
    struct kvp_server *s;
    struct lmc_front f;
};

/* A daemon core offering shared memory, with --lmcache-reap-timeout reap_s and
 * --lmcache-registration-grace grace_s, and the LMCache front end's state over it; the clock at
 * T0, the request from PEER_A. */
static void fx_new(struct fx *x, uint32_t reap_s, uint32_t grace_s)
{
    struct kvp_server *s = calloc(1, sizeof(*s));
    assert_non_null(s);
    kvp_log_threshold = KVP_LOG_ERROR;
    kvp_config_defaults(&s->cfg);
    s->cfg.chunk_tokens = C;
    s->cfg.l1_size = POOL;
    s->cfg.lmcache_reap_s = reap_s;
    s->cfg.lmcache_grace_s = grace_s;
    s->seg = (struct kvp_segment)KVP_SEGMENT_INIT;
    snprintf(s->seg.name, sizeof(s->seg.name), "%s", SHM_NAME);
    s->seg.size = KVP_SEG_HEADER + POOL;
    s->seg.base = calloc(1, s->seg.size);
    s->seg.shared = true;
    assert_non_null(s->seg.base);
    assert_rc(kvp_store_init(&s->store, KVP_SEG_HEADER, POOL, POOL), 0);
    struct kvp_offer offer = {
        .shm_enabled = true,
        .shm_name = SHM_NAME,
        .shm_reason = "",
        .pool_size = POOL,
        .chunk_tokens = C,
    };
    kvp_registry_init(&s->registry, &offer);
    kvp_owners_init(&s->owners);
    x->s = s;
    assert_rc(lmc_front_init(&x->f, s), 0);
    x->f.now_ms = T0;
    x->f.peer = PEER_A;
}

/* Ends the front end (every instance released: nothing may stay reserved or pinned), then the
 * core. */
static void fx_free(struct fx *x)
{
    struct kvp_server *s = x->s;
    struct kvp_store_gauges g;
    lmc_front_destroy(&x->f);
    kvp_store_get_gauges(&s->store, &g);
    assert_rc(g.reserved + g.expired + g.pinned, 0);
    assert_rc(kvp_registry_count(&s->registry), 0);
    kvp_owners_destroy(&s->owners);
    kvp_registry_destroy(&s->registry);
    kvp_store_destroy(&s->store);
    free(s->seg.base);
    free(s);
}

static struct kvp_store_gauges gauges(const struct fx *x)
{
    struct kvp_store_gauges g;
    kvp_store_get_gauges(&x->s->store, &g);
    return g;
}

/* Registers instance iid (model "lmc-model", world size world, float16, 2 layers, hidden 64),
 * as LMCache 0.5.7 when v057 (it sends group_layouts); fails the test on a refusal. Returns the
 * segment name the answer offers ("" for the in-band transport). */
static const char *reg_v(struct fx *x, uint64_t iid, uint32_t world, bool v057)
{
    static struct lmc_reg_answer a;
    struct lmc_register m;
    memset(&m, 0, sizeof(m));
    m.instance_id = iid;
    snprintf(m.model_name, sizeof(m.model_name), "lmc-model");
    snprintf(m.dtype, sizeof(m.dtype), "float16");
    m.world_size = world;
    m.block_size = C;
    m.num_layers = 2;
    m.hidden_dim = 64;
    m.num_physical_slots = C;
    m.has_group_layouts = v057;
    lmc_inst_register(&x->f, &m, &a);
    if (a.error[0])
        fail_msg("instance %llu refused: %s", (unsigned long long)iid, a.error);
    return a.shm_name;
}

static const char *reg(struct fx *x, uint64_t iid)
{
    return reg_v(x, iid, 1, false);
}

/* The registration of instance iid, copied into *out if given; false when it has none. */
static bool registered(const struct fx *x, uint64_t iid, struct kvp_registration *out)
{
    static struct kvp_instance_view v[16];
    char id[64];
    snprintf(id, sizeof(id), "lmcache-%llu", (unsigned long long)iid);
    uint32_t n = kvp_registry_list(&x->s->registry, v, 16);
    for (uint32_t i = 0; i < n; i++) {
        if (strcmp(v[i].reg.spec.instance_id, id) == 0) {
            if (out)
                *out = v[i].reg;
            return true;
        }
    }
    return false;
}

/* The owner of instance iid's registration (its ops are the front end's callbacks). */
static struct kvp_owner *owner_of(const struct fx *x, uint64_t iid)
{
    struct kvp_registration r;
    assert_true(registered(x, iid, &r));
    for (struct kvp_owner *o = x->s->owners.head; o; o = o->next)
        if (o->id == r.owner)
            return o;
    fail_msg("no owner for instance %llu", (unsigned long long)iid);
    return NULL;
}

/* Key of sequence seq: its first nchunks full chunks, named by worker (-1: the scheduler's
 * key, no worker_id), for request rid; its tokens go to the front end's token buffer. */
static struct lmc_key key(struct fx *x, uint32_t seq, uint32_t nchunks, int worker, const char *rid)
{
    struct lmc_key k;
    memset(&k, 0, sizeof(k));
    snprintf(k.model_name, sizeof(k.model_name), "lmc-model");
    k.world_size = 1;
    k.has_worker_id = worker >= 0;
    k.worker_id = worker >= 0 ? (uint32_t)worker : 0;
    k.ntokens = nchunks * C;
    k.start = 0;
    k.end = nchunks * C;
    k.num_kv_readers = 1;
    snprintf(k.request_id, sizeof(k.request_id), "%s", rid);
    for (uint32_t i = 0; i < k.ntokens; i++) {
        uint32_t v = seq * 100000u + i;
        memcpy(x->f.tokens + 4 * i, &v, 4);
    }
    return k;
}

/* Stores nchunks chunks of sequence seq through instance iid (prepare, then commit). */
static void store(struct fx *x, uint64_t iid, uint32_t seq, uint32_t nchunks)
{
    struct lmc_slots sl;
    struct lmc_key k = key(x, seq, nchunks, 0, "store");
    lmc_prepare_store(&x->f, iid, &k, &sl);
    assert_rc(sl.n, nchunks);
    assert_false(sl.no_buffers);
    k = key(x, seq, nchunks, 0, "store");
    assert_true(lmc_commit_store(&x->f, iid, &k, NULL, 0));
}

/* What counter id counts now (the daemon's counters are global: tests compare deltas). */
static uint64_t ctr(enum kvp_counter_id id)
{
    uint64_t v[KVP_NCOUNTERS];
    kvp_counters_read(v);
    return v[id];
}

static uint64_t tick_at(struct fx *x, uint64_t now)
{
    x->f.now_ms = now;
    return lmc_state_tick(&x->f);
}

static bool ping_at(struct fx *x, uint64_t now, uint64_t iid)
{
    x->f.now_ms = now;
    return lmc_inst_ping(&x->f, true, iid);
}

/* ---- reaping ---- */

/* A pinged instance is reaped once it has been silent longer than --lmcache-reap-timeout: not
 * at the timeout, one millisecond after. Instance 2 pinged a millisecond before instance 1, so
 * the reaper looks at the table when 2 is due, which is exactly when 1 has been silent for the
 * whole timeout. */
static void test_reap_pinged(void **state)
{
    (void)state;
    struct fx x;
    fx_new(&x, 2, 10); /* reap after 2000 ms of silence once pinged, 10000 before */
    assert_string_equal(reg(&x, 1), SHM_NAME);
    reg(&x, 2);
    /* The reaper looks now and, both being never pinged, next at T0 + 10001: the pings must
     * bring that forward. */
    tick_at(&x, T0);
    assert_true(ping_at(&x, T0 + 99, 2));
    assert_true(ping_at(&x, T0 + 100, 1));
    /* Instance 1 holds a reservation, which its reaping must abort. */
    struct lmc_slots sl;
    struct lmc_key k = key(&x, 1, 2, 0, "r");
    lmc_prepare_store(&x.f, 1, &k, &sl);
    assert_rc(sl.n, 2);
    assert_rc(gauges(&x).reserved, 2);

    uint64_t reaped = ctr(KVP_CTR_lmcache_reaped);
    /* Not before: instance 2 silent 1999 ms, instance 1 1998 ms... */
    tick_at(&x, T0 + 2098);
    assert_true(registered(&x, 1, NULL));
    assert_true(registered(&x, 2, NULL));
    /* ... 2 silent 2001 ms (reaped), 1 exactly 2000 ms (kept) ... */
    tick_at(&x, T0 + 2100);
    assert_false(registered(&x, 2, NULL));
    assert_true(registered(&x, 1, NULL));
    assert_rc(gauges(&x).reserved, 2);
    /* ... and 1 one millisecond later, everything it held released. */
    uint64_t wait = tick_at(&x, T0 + 2101);
    assert_false(registered(&x, 1, NULL));
    assert_rc(gauges(&x).reserved, 0);
    assert_rc(ctr(KVP_CTR_lmcache_reaped) - reaped, 2);
    assert_true(wait >= 1 && wait <= 1000);
    /* Its requests are answered at once, negatively. */
    k = key(&x, 1, 2, 0, "r");
    lmc_prepare_store(&x.f, 1, &k, &sl);
    assert_rc(sl.n, 0);
    assert_false(lmc_commit_store(&x.f, 1, &k, NULL, 0));
    fx_free(&x);
}

/* A never-pinged instance is reaped after --lmcache-registration-grace, not the (shorter) reap
 * timeout; its prepare refreshes it like a ping, without making it a pinged one. */
static void test_reap_never_pinged(void **state)
{
    (void)state;
    struct fx x;
    fx_new(&x, 2, 5); /* 2000 ms once pinged, 5000 ms before */
    tick_at(&x, T0);  /* nothing to reap, until a registration says when */
    reg(&x, 2);       /* registered at T0 */
    x.f.now_ms = T0 + 1;
    reg(&x, 1); /* registered at T0 + 1 */
    /* Past the reap timeout, well within the grace. */
    tick_at(&x, T0 + 2500);
    assert_true(registered(&x, 1, NULL));
    assert_true(registered(&x, 2, NULL));
    tick_at(&x, T0 + 5000); /* 2 silent 5000 ms: kept */
    assert_true(registered(&x, 2, NULL));
    tick_at(&x, T0 + 5001); /* 2 silent 5001 ms: reaped; 1 silent 5000 ms: kept */
    assert_false(registered(&x, 2, NULL));
    assert_true(registered(&x, 1, NULL));
    /* A prepare refreshes 1 (still never pinged: the grace applies again from now). */
    struct lmc_slots sl;
    struct lmc_key k = key(&x, 3, 1, 0, "r");
    x.f.now_ms = T0 + 5001;
    lmc_prepare_store(&x.f, 1, &k, &sl);
    assert_rc(sl.n, 1);
    tick_at(&x, T0 + 10001);
    assert_true(registered(&x, 1, NULL));
    tick_at(&x, T0 + 10002);
    assert_false(registered(&x, 1, NULL));
    assert_rc(gauges(&x).reserved, 0);
    /* The ping edge of a reaped instance. */
    assert_false(ping_at(&x, T0 + 10003, 1));
    assert_true(ping_at(&x, T0 + 10004, 1));
    assert_false(ping_at(&x, T0 + 10005, 2));
    assert_true(ping_at(&x, T0 + 10006, 2));
    fx_free(&x);
}

/* --lmcache-reap-timeout 0: nothing is reaped, pinged or not. */
static void test_reap_off(void **state)
{
    (void)state;
    struct fx x;
    fx_new(&x, 0, 1);
    reg(&x, 1);
    reg(&x, 2);
    assert_true(ping_at(&x, T0, 1));
    tick_at(&x, T0 + 86400000u);
    assert_true(registered(&x, 1, NULL));
    assert_true(registered(&x, 2, NULL));
    fx_free(&x);
}

/* ---- the ping edge ---- */

static void test_ping_edge(void **state)
{
    (void)state;
    struct fx x;
    fx_new(&x, 2, 10);
    /* The scheduler's ping names no instance. */
    assert_true(lmc_inst_ping(&x.f, false, 0));
    /* A registered instance: true, every time. */
    reg(&x, 5);
    assert_true(ping_at(&x, T0, 5));
    assert_true(ping_at(&x, T0 + 1, 5));
    /* An id this kvpoold never registered (a worker of an earlier one): false once, then
     * true, and its worker registers again. */
    uint64_t unknown = ctr(KVP_CTR_lmcache_unknown_pings);
    assert_false(ping_at(&x, T0 + 2, 77));
    assert_rc(ctr(KVP_CTR_lmcache_unknown_pings) - unknown, 1);
    assert_true(ping_at(&x, T0 + 3, 77));
    assert_true(ping_at(&x, T0 + 4, 77));
    reg(&x, 77);
    assert_true(ping_at(&x, T0 + 5, 77));
    /* Unregistered by its worker: true (as upstream). */
    lmc_inst_unregister(&x.f, 5);
    assert_false(registered(&x, 5, NULL));
    assert_true(ping_at(&x, T0 + 6, 5));
    /* Reaped: false once, then true; registered again, true. */
    tick_at(&x, T0 + 5 + 2001);
    assert_false(registered(&x, 77, NULL));
    assert_false(ping_at(&x, T0 + 5000, 77));
    assert_true(ping_at(&x, T0 + 5001, 77));
    reg(&x, 77);
    assert_true(ping_at(&x, T0 + 5002, 77));
    assert_true(registered(&x, 77, NULL));
    fx_free(&x);
}

/* ---- lookup read locks ---- */

static void test_read_lock_ttl(void **state)
{
    (void)state;
    struct fx x;
    fx_new(&x, 0, 1); /* no reaping: only the read TTL runs */
    reg(&x, 1);
    store(&x, 1, 1, 2);
    assert_rc(gauges(&x).committed, 2);
    assert_rc(gauges(&x).pinned, 0);

    /* The scheduler's lookup pins the chunks found for the request's reader. */
    uint64_t t1 = T0 + 500;
    x.f.now_ms = t1;
    struct lmc_key k = key(&x, 1, 2, -1, "req-1");
    lmc_lookup(&x.f, &k);
    assert_rc(gauges(&x).pinned, 2);
    assert_rc(lmc_query(&x.f, "req-1"), 2);
    assert_rc(lmc_query(&x.f, "req-1"), 0); /* once */
    /* Held for the read TTL, not a millisecond less ... */
    tick_at(&x, t1 + LMC_READ_TTL_MS - 1);
    assert_rc(gauges(&x).pinned, 2);
    uint64_t wait = tick_at(&x, t1 + LMC_READ_TTL_MS);
    assert_rc(gauges(&x).pinned, 2);
    assert_rc(wait, 1); /* the tick wants to run again when the lock is due */
    /* ... and released one millisecond after. */
    tick_at(&x, t1 + LMC_READ_TTL_MS + 1);
    assert_rc(gauges(&x).pinned, 0);

    /* A retrieve of the request claims the locks before that: its own pins replace them. */
    uint64_t t2 = t1 + LMC_READ_TTL_MS + 10;
    x.f.now_ms = t2;
    k = key(&x, 1, 2, -1, "req-2");
    lmc_lookup(&x.f, &k);
    assert_rc(gauges(&x).pinned, 2);
    struct lmc_slots sl;
    k = key(&x, 1, 2, 0, "req-2");
    assert_true(lmc_prepare_retrieve(&x.f, 1, &k, &sl));
    assert_rc(sl.n, 2);
    k = key(&x, 1, 2, 0, "req-2");
    assert_true(lmc_commit_retrieve(&x.f, 1, &k));
    assert_rc(gauges(&x).pinned, 0);
    /* free_lookup_locks and end_session end a lookup's locks too. */
    k = key(&x, 1, 2, -1, "req-3");
    lmc_lookup(&x.f, &k);
    assert_rc(gauges(&x).pinned, 2);
    lmc_free_lookup_locks(&x.f, &k);
    assert_rc(gauges(&x).pinned, 0);
    k = key(&x, 1, 2, -1, "req-4");
    lmc_lookup(&x.f, &k);
    assert_rc(gauges(&x).pinned, 2);
    lmc_end_session(&x.f, "req-4");
    assert_rc(gauges(&x).pinned, 0);
    fx_free(&x);
}

/* ---- pending prepare/commit pairs ---- */

static void test_commit_pops_prepare(void **state)
{
    (void)state;
    struct fx x;
    fx_new(&x, 120, 3600);
    reg(&x, 1);
    struct lmc_slots sl;
    struct lmc_key k = key(&x, 1, 3, 0, "r");
    lmc_prepare_store(&x.f, 1, &k, &sl);
    assert_rc(sl.n, 3);
    assert_rc(gauges(&x).reserved, 3);
    assert_true(lmc_commit_store(&x.f, 1, &k, NULL, 0));
    assert_rc(gauges(&x).committed, 3);
    assert_rc(gauges(&x).reserved, 0);
    /* Popped: a second commit finds nothing pending. */
    assert_false(lmc_commit_store(&x.f, 1, &k, NULL, 0));
    /* Stored again: nothing to write, and nothing pending. */
    lmc_prepare_store(&x.f, 1, &k, &sl);
    assert_rc(sl.n, 0);
    assert_false(lmc_commit_store(&x.f, 1, &k, NULL, 0));
    fx_free(&x);
}

static void test_second_prepare_replaces(void **state)
{
    (void)state;
    struct fx x;
    fx_new(&x, 120, 3600);
    reg(&x, 1);
    struct lmc_slots sl;

    /* A store: the first reservation expired (--reserve-timeout), so a second prepare of the
     * key reserves afresh; the first's hold must end (its expired chunks freed) and the
     * commit publish the second. */
    struct lmc_key k = key(&x, 1, 2, 0, "r");
    lmc_prepare_store(&x.f, 1, &k, &sl);
    assert_rc(sl.n, 2);
    assert_rc(kvp_store_expire(&x.s->store, kvp_mono_ms() + 1, 0), 2);
    assert_rc(gauges(&x).expired, 2);
    lmc_prepare_store(&x.f, 1, &k, &sl);
    assert_rc(sl.n, 2);
    assert_rc(gauges(&x).expired, 0);
    assert_rc(gauges(&x).reserved, 2);
    assert_true(lmc_commit_store(&x.f, 1, &k, NULL, 0));
    assert_rc(gauges(&x).committed, 2);
    assert_rc(gauges(&x).reserved, 0);

    /* A retrieve: the second prepare's pins replace the first's, which are released, so one
     * commit unpins everything. */
    assert_true(lmc_prepare_retrieve(&x.f, 1, &k, &sl));
    assert_true(lmc_prepare_retrieve(&x.f, 1, &k, &sl));
    assert_rc(gauges(&x).pinned, 2);
    assert_true(lmc_commit_retrieve(&x.f, 1, &k));
    assert_rc(gauges(&x).pinned, 0);
    fx_free(&x);
}

static void test_foreign_commit_refused(void **state)
{
    (void)state;
    struct fx x;
    fx_new(&x, 120, 3600);
    reg(&x, 1);
    struct lmc_slots sl;
    struct lmc_key k = key(&x, 1, 2, 0, "r");
    lmc_prepare_store(&x.f, 1, &k, &sl);
    assert_rc(sl.n, 2);
    /* Another connection cannot publish the worker's unwritten reservation ... */
    uint64_t foreign = ctr(KVP_CTR_lmcache_foreign_commits);
    x.f.peer = PEER_B;
    assert_false(lmc_commit_store(&x.f, 1, &k, NULL, 0));
    assert_rc(ctr(KVP_CTR_lmcache_foreign_commits) - foreign, 1);
    assert_rc(gauges(&x).reserved, 2);
    assert_rc(gauges(&x).committed, 0);
    /* ... and the worker's own commit still can. */
    x.f.peer = PEER_A;
    assert_true(lmc_commit_store(&x.f, 1, &k, NULL, 0));
    assert_rc(gauges(&x).committed, 2);

    /* Nor drop its pins. */
    assert_true(lmc_prepare_retrieve(&x.f, 1, &k, &sl));
    assert_rc(gauges(&x).pinned, 2);
    x.f.peer = PEER_B;
    assert_false(lmc_commit_retrieve(&x.f, 1, &k));
    assert_rc(ctr(KVP_CTR_lmcache_foreign_commits) - foreign, 2);
    assert_rc(gauges(&x).pinned, 2);
    x.f.peer = PEER_A;
    assert_true(lmc_commit_retrieve(&x.f, 1, &k));
    assert_rc(gauges(&x).pinned, 0);
    fx_free(&x);
}

/* ---- the owner's callbacks ---- */

/* The callback, as the core calls it, only marks the instance: the front end's next ping
 * drops it (its reservation aborted, its registration gone) and answers false; the next ping
 * is true. */
static void test_shm_lost_callback(void **state)
{
    (void)state;
    struct fx x;
    fx_new(&x, 120, 3600);
    assert_string_equal(reg(&x, 1), SHM_NAME);
    reg(&x, 2);
    struct lmc_slots sl;
    struct lmc_key k = key(&x, 1, 2, 0, "r");
    lmc_prepare_store(&x.f, 1, &k, &sl);
    assert_rc(sl.n, 2);

    struct kvp_owner *o = owner_of(&x, 1);
    assert_non_null(o->ops);
    assert_non_null(o->ops->shm_lost);
    o->ops->shm_lost(o);
    /* Nothing is released by the callback itself. */
    assert_true(registered(&x, 1, NULL));
    assert_rc(gauges(&x).reserved, 2);

    assert_false(ping_at(&x, T0 + 10, 1));
    assert_false(registered(&x, 1, NULL));
    assert_rc(gauges(&x).reserved, 0);
    assert_true(ping_at(&x, T0 + 11, 1));
    /* The other instance was not told. */
    assert_true(registered(&x, 2, NULL));
    assert_true(ping_at(&x, T0 + 12, 2));
    /* Its requests meanwhile are answered negatively. */
    k = key(&x, 1, 2, 0, "r");
    lmc_prepare_store(&x.f, 1, &k, &sl);
    assert_rc(sl.n, 0);
    fx_free(&x);
}

/* The loss as the daemon delivers it: the registry stops offering shared memory, the owners
 * with an instance on it are told, and the front end's next tick drops them; each registers
 * again on its in-band transport (pickle for 0.5.6, the envelope for 0.5.7). */
static void test_shm_lost_notified(void **state)
{
    (void)state;
    struct fx x;
    uint64_t owners[8];
    uint32_t nowners;
    struct kvp_registration r;
    fx_new(&x, 120, 3600);
    assert_string_equal(reg_v(&x, 1, 1, false), SHM_NAME);
    assert_string_equal(reg_v(&x, 2, 1, true), SHM_NAME);
    store(&x, 1, 1, 1);

    assert_rc(kvp_registry_lose_shm(&x.s->registry, "the test lost it", owners, 8, &nowners), 2);
    assert_rc(nowners, 2);
    assert_rc(kvp_owners_notify(&x.s->owners, KVP_OWNER_SHM_LOST, owners, nowners), 2);
    assert_true(registered(&x, 1, NULL));
    tick_at(&x, T0 + 100);
    assert_false(registered(&x, 1, NULL));
    assert_false(registered(&x, 2, NULL));

    assert_false(ping_at(&x, T0 + 200, 1));
    assert_true(ping_at(&x, T0 + 300, 1));
    assert_string_equal(reg_v(&x, 1, 1, false), "");
    assert_true(registered(&x, 1, &r));
    assert_rc(r.transport, KVP_REG_PICKLE);
    assert_false(ping_at(&x, T0 + 200, 2));
    assert_true(ping_at(&x, T0 + 300, 2));
    assert_string_equal(reg_v(&x, 2, 1, true), "");
    assert_true(registered(&x, 2, &r));
    assert_rc(r.transport, KVP_REG_ENVELOPE);
    /* In band now: a prepare_store reserves nothing, the commit will carry the chunks. */
    struct lmc_slots sl;
    struct lmc_key k = key(&x, 1, 2, 0, "r");
    lmc_prepare_store(&x.f, 1, &k, &sl);
    assert_true(sl.no_buffers);
    assert_rc(sl.n, 0);
    /* Told again (a late notification), an instance in band loses nothing. */
    struct kvp_owner *o = owner_of(&x, 1);
    o->ops->shm_lost(o);
    tick_at(&x, T0 + 400);
    assert_true(registered(&x, 1, NULL));
    fx_free(&x);
}

/* The daemon ending an owner (drop): the instance is dropped at the next tick, its next ping
 * false. */
static void test_drop_callback(void **state)
{
    (void)state;
    struct fx x;
    fx_new(&x, 120, 3600);
    reg(&x, 1);
    reg(&x, 2);
    struct kvp_owner *o = owner_of(&x, 1);
    assert_rc(kvp_owners_notify(&x.s->owners, KVP_OWNER_DROP, &o->id, 1), 1);
    assert_true(registered(&x, 1, NULL));
    tick_at(&x, T0 + 1);
    assert_false(registered(&x, 1, NULL));
    assert_true(registered(&x, 2, NULL));
    assert_false(ping_at(&x, T0 + 2, 1));
    assert_true(ping_at(&x, T0 + 3, 1));
    fx_free(&x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reap_pinged),
        cmocka_unit_test(test_reap_never_pinged),
        cmocka_unit_test(test_reap_off),
        cmocka_unit_test(test_ping_edge),
        cmocka_unit_test(test_read_lock_ttl),
        cmocka_unit_test(test_commit_pops_prepare),
        cmocka_unit_test(test_second_prepare_replaces),
        cmocka_unit_test(test_foreign_commit_refused),
        cmocka_unit_test(test_shm_lost_callback),
        cmocka_unit_test(test_shm_lost_notified),
        cmocka_unit_test(test_drop_callback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
