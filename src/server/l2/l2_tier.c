/*
 * l2_tier.c - the L2 tier's logic over a backend (see l2.h for what the daemon sees): the
 * write-behind queue, read-through loads, the pins that protect chunks while they are sent,
 * the up/down state and its log lines.
 *
 * Write-behind. A commit queues the new chunks' keys (kvp_l2_stored()): a ring of at most
 * --l2-queue bytes of chunks (and a bounded number of entries); a full ring drops its oldest
 * entries, counted, so a worker never waits for L2. Background threads (--l2-connections,
 * each with its own backend connection) take entries in order, pin the chunk by its key (a
 * chunk evicted meanwhile is skipped, counted), send header and data straight from the pool,
 * and unpin. A pinned chunk is never evicted, so its slot cannot be reused while it is sent.
 *
 * Read-through. A lookup asks L2 about the chunks after the L1 run (one EXISTS round) and
 * queues loads for those it finds. A load reserves a slot through the store's normal
 * reserve -> write -> commit path (kvp_store_prepare/commit), so nothing half-written is ever
 * visible and a concurrent load or store of the same key sees "busy" rather than inserting it
 * twice; a value that fails any check of l2_value.c is aborted, counted, logged (rate-limited)
 * and deleted from L2. A good one is committed sealed, with its checksum (warm_index.h), as a
 * worker's commit is, so that a warm restart adopts it too. The load table (at most
 * KVP_L2_MAX_LOADS keys, hashed) knows which keys are queued or being loaded: a retrieve that
 * needs a queued key takes it over and loads it on its own thread; one that needs a key another
 * thread is loading waits for it, bounded.
 * Background threads take loads before copies: a worker may be waiting for them.
 *
 * Faults. The state is unknown until the first operation, then up, down or auth_failed. Any
 * failure to reach L2 makes it down (one WARN line), the foreground path then skips L2 at once,
 * and the background threads reconnect with exponential backoff (0.1 s to 5 s); the first
 * success makes it up again (one INFO line) and the queued copies flow again. Credentials the
 * server refuses make it auth_failed instead (one ERROR line), with a backoff from 1 s to 60 s:
 * they do not fix themselves, and every attempt is a failed login in the server's log.
 * While there is nothing to send, each background thread pings its connection once a second,
 * so that a server that went away while idle is reported down within about a second plus
 * --l2-timeout. Every operation of the backend, as a whole, ends within --l2-timeout (a server that
 * answers slowly fails it, which makes the tier down like a dead one); a fetch starts no round
 * after its own deadline. The latest error is kept, in words, for the reports
 * (kvp_l2_get_gauges()).
 *
 * Threads and locks. l2->lock guards the ring, the load table, the foreground connection slots
 * and the state. It is never held across network I/O or a store call: the store lock and this
 * one are never nested. The log's own lock is taken under it (state changes are logged there,
 * so that two threads cannot report them out of order). Foreground connections (at most
 * --l2-connections) are used by workers' threads for lookups and fetches, one at a time each;
 * a worker that finds none free within KVP_L2_FG_WAIT_MS skips L2 for that request.
 */
#include "l2/l2.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/thread.h"
#include "core/seg_guard.h"
#include "core/stats.h"
#include "core/warm_index.h"
#include "l2/l2_backend.h"

#define KVP_L2_MAX_LOADS 4096      /* keys queued or being loaded at once */
#define KVP_L2_LOAD_BUCKETS 1024   /* hash buckets of the load table */
#define KVP_L2_MAX_PUTS (1u << 20) /* entries of the write-behind ring, whatever their size */
#define KVP_L2_FG_WAIT_MS 100      /* wait for a free foreground connection */
#define KVP_L2_LOAD_BATCH 16       /* loads read in one pipelined round, at most... */
#define KVP_L2_LOAD_BATCH_BYTES (1u << 20) /* ...and about this many bytes (see batch_of()) */
#define KVP_L2_PROBE_MS 1000               /* an idle background connection is pinged this often */
#define KVP_L2_BACKOFF_MIN_MS 100
#define KVP_L2_BACKOFF_MAX_MS 5000
#define KVP_L2_AUTH_BACKOFF_MIN_MS 1000  /* refused credentials: the first retry after 1 s, */
#define KVP_L2_AUTH_BACKOFF_MAX_MS 60000 /* then doubling up to a minute */
enum load_state { LOAD_FREE, LOAD_QUEUED, LOAD_RUNNING };

struct put_item {
    uint8_t key[KVP_KEY_SIZE];
    struct kvp_l2_layout lay;
    uint32_t epoch; /* kvp_seg_guard_epoch() when queued */
};

struct load_item {
    uint8_t key[KVP_KEY_SIZE];
    struct kvp_l2_layout lay;
    uint8_t state;
    struct load_item *hnext;       /* bucket chain, while queued or running */
    struct load_item *prev, *next; /* the queue while queued; the free list (next) when free */
};

struct fg_slot {
    struct kvp_l2_conn *conn; /* NULL until used, and after a failure */
    bool busy;
};

struct kvp_l2 {
    const struct kvp_l2_backend *be;
    struct kvp_l2_target target;
    char name[KVP_L2_MAX_URL + 64]; /* the masked URL: what logs show */
    struct kvp_store *store;
    uint8_t *base;
    _Atomic uint32_t ttl_s, timeout_ms; /* SIGHUP changes them (kvp_l2_set_limits) */
    uint32_t nthreads;
    uint64_t queue_bytes;

    pthread_mutex_t lock;
    pthread_cond_t work_cv; /* background threads: work, a state change, stop */
    pthread_cond_t done_cv; /* a load ended, a foreground slot was released */
    bool stopping;
    enum kvp_l2_state state;
    atomic_int state_hint;          /* state, readable without the lock (for fast paths) */
    char reason[KVP_L2_REASON_MAX]; /* why the state is not up; "" when it is */

    struct put_item *ring; /* write-behind ring */
    uint32_t ring_cap, ring_head, ring_count;
    uint64_t backlog_bytes;

    struct load_item *loads; /* KVP_L2_MAX_LOADS entries */
    struct load_item *free_loads;
    struct load_item queue; /* sentinel of the queued loads, oldest at queue.next */
    struct load_item *buckets[KVP_L2_LOAD_BUCKETS];

    struct fg_slot *fg; /* nthreads foreground connection slots */
    pthread_t *threads;
    uint32_t nstarted;
};

const char *kvp_l2_state_name(enum kvp_l2_state st)
{
    switch (st) {
    case KVP_L2_STATE_UP:
        return "up";
    case KVP_L2_STATE_AUTH_FAILED:
        return "auth_failed";
    default:
        return "down";
    }
}

/* A failure that leaves the connection unusable (l2_backend.h). */
static bool broken(int rc)
{
    return rc < 0 && rc != -ENOENT && rc != -EREMOTEIO;
}

static uint64_t mono_ms(void)
{
    return kvp_mono_ms();
}

/* --l2-ttl and --l2-timeout as they are now: SIGHUP changes them, for what begins after it. */
static uint32_t ttl_of(const struct kvp_l2 *l2)
{
    return atomic_load_explicit(&l2->ttl_s, memory_order_relaxed);
}

static uint32_t timeout_of(const struct kvp_l2 *l2)
{
    return atomic_load_explicit(&l2->timeout_ms, memory_order_relaxed);
}

void kvp_l2_set_limits(struct kvp_l2 *l2, uint32_t ttl_s, uint32_t timeout_ms)
{
    if (!l2)
        return;
    atomic_store_explicit(&l2->ttl_s, ttl_s, memory_order_relaxed);
    atomic_store_explicit(&l2->timeout_ms, timeout_ms, memory_order_relaxed);
}

/* pthread_cond_timedwait() until the monotonic deadline, on a CLOCK_MONOTONIC condition. */
static int wait_until(pthread_cond_t *cv, pthread_mutex_t *m, uint64_t deadline_ms)
{
    struct timespec ts = {.tv_sec = (time_t)(deadline_ms / 1000),
                          .tv_nsec = (long)(deadline_ms % 1000) * 1000000};
    return pthread_cond_timedwait(cv, m, &ts);
}

/*
 * Chunks per pipelined round of reads. Pipelining pays for small values (one round trip for
 * many); for large ones it costs: Redis builds every reply of the round in its output buffer
 * while the first is still being read, and measured rounds of 4 MiB values ran slower than one
 * GET after the other. So rounds are bounded to about KVP_L2_LOAD_BATCH_BYTES.
 */
static uint32_t batch_of(const struct kvp_l2_layout *lay)
{
    uint64_t n = KVP_L2_LOAD_BATCH_BYTES / (lay->bytes ? lay->bytes : 1);
    return n < 1 ? 1 : n > KVP_L2_LOAD_BATCH ? KVP_L2_LOAD_BATCH : (uint32_t)n;
}

/* ---- state ---- */

/*
 * Records the outcome of an operation (why: what went wrong, for a state other than up); logs a
 * change of state once, and keeps the latest reason for the reports. Caller holds the lock.
 */
static void do_set_state(struct kvp_l2 *l2, enum kvp_l2_state st, const char *why)
{
    if (st != KVP_L2_STATE_UP)
        snprintf(l2->reason, sizeof(l2->reason), "%s", why && why[0] ? why : "unknown error");
    else
        l2->reason[0] = '\0';
    if (l2->state == st)
        return;
    enum kvp_l2_state old = l2->state;
    l2->state = st;
    atomic_store_explicit(&l2->state_hint, st, memory_order_relaxed);
    if (st != KVP_L2_STATE_UP && (old == KVP_L2_STATE_UP || old == KVP_L2_STATE_UNKNOWN))
        KVP_COUNT(l2_outages, 1);
    if (st == KVP_L2_STATE_AUTH_FAILED) {
        log_error("L2 %s: authentication failed (%s): serving from L1 only; trying again with "
                  "backoff, up to every %d s (check the password: --l2, --l2-password-file)",
                  l2->name, why, KVP_L2_AUTH_BACKOFF_MAX_MS / 1000);
    } else if (st == KVP_L2_STATE_DOWN) {
        log_warn("L2 %s unreachable (%s): serving from L1 only; reconnecting in the background",
                 l2->name, why);
    } else if (old != KVP_L2_STATE_UNKNOWN) {
        log_info("L2 %s reachable again: write-behind and loads resume", l2->name);
    } else {
        log_info("L2 %s connected", l2->name);
    }
    /* Background threads probe their connections when the state turns down. */
    pthread_cond_broadcast(&l2->work_cv);
}

/* The state after a failed operation: refused credentials are told apart. */
static enum kvp_l2_state failed_state(int rc)
{
    return rc == -EACCES ? KVP_L2_STATE_AUTH_FAILED : KVP_L2_STATE_DOWN;
}

static bool known_down(struct kvp_l2 *l2)
{
    int st = atomic_load_explicit(&l2->state_hint, memory_order_relaxed);
    return st == KVP_L2_STATE_DOWN || st == KVP_L2_STATE_AUTH_FAILED;
}

/* ---- write-behind ring ---- */

/* Drops the oldest queued copy. Caller holds the lock. */
static void do_drop_oldest(struct kvp_l2 *l2)
{
    l2->backlog_bytes -= l2->ring[l2->ring_head].lay.bytes;
    l2->ring_head = (l2->ring_head + 1) % l2->ring_cap;
    l2->ring_count--;
    KVP_COUNT(l2_write_dropped, 1);
}

/* Queues one copy, dropping the oldest ones until it fits. Caller holds the lock. */
static void do_push_put(struct kvp_l2 *l2, const uint8_t *key, const struct kvp_l2_layout *lay)
{
    if (lay->bytes > l2->queue_bytes) {
        KVP_COUNT(l2_write_dropped, 1);
        return;
    }
    while (l2->ring_count == l2->ring_cap || l2->backlog_bytes + lay->bytes > l2->queue_bytes)
        do_drop_oldest(l2);
    struct put_item *it = &l2->ring[(l2->ring_head + l2->ring_count) % l2->ring_cap];
    memcpy(it->key, key, KVP_KEY_SIZE);
    it->lay = *lay;
    it->epoch = kvp_seg_guard_epoch();
    l2->ring_count++;
    l2->backlog_bytes += lay->bytes;
}

static bool do_pop_put(struct kvp_l2 *l2, struct put_item *out)
{
    if (!l2->ring_count)
        return false;
    *out = l2->ring[l2->ring_head];
    l2->ring_head = (l2->ring_head + 1) % l2->ring_cap;
    l2->ring_count--;
    l2->backlog_bytes -= out->lay.bytes;
    return true;
}

/* ---- load table ---- */

static uint32_t load_bucket(const uint8_t *key)
{
    uint32_t h;
    memcpy(&h, key, sizeof(h)); /* keys are BLAKE2b output: any bytes are a uniform hash */
    return h % KVP_L2_LOAD_BUCKETS;
}

static struct load_item *do_find_load(struct kvp_l2 *l2, const uint8_t *key)
{
    for (struct load_item *e = l2->buckets[load_bucket(key)]; e; e = e->hnext)
        if (memcmp(e->key, key, KVP_KEY_SIZE) == 0)
            return e;
    return NULL;
}

/* A new entry for key in state st (queued: at the queue's tail). NULL when the table is full.
 * Caller holds the lock and knows that key is not in the table. */
static struct load_item *do_add_load(struct kvp_l2 *l2, const uint8_t *key,
                                     const struct kvp_l2_layout *lay, enum load_state st)
{
    struct load_item *e = l2->free_loads;
    if (!e)
        return NULL;
    l2->free_loads = e->next;
    memcpy(e->key, key, KVP_KEY_SIZE);
    e->lay = *lay;
    e->state = (uint8_t)st;
    uint32_t b = load_bucket(key);
    e->hnext = l2->buckets[b];
    l2->buckets[b] = e;
    e->prev = e->next = NULL;
    if (st == LOAD_QUEUED) {
        e->prev = l2->queue.prev;
        e->next = &l2->queue;
        l2->queue.prev->next = e;
        l2->queue.prev = e;
    }
    return e;
}

/* Takes a queued entry off the queue: its loader is now the caller. */
static void do_take_load(struct load_item *e)
{
    e->prev->next = e->next;
    e->next->prev = e->prev;
    e->prev = e->next = NULL;
    e->state = LOAD_RUNNING;
}

static struct load_item *do_pop_load(struct kvp_l2 *l2)
{
    struct load_item *e = l2->queue.next;
    if (e == &l2->queue)
        return NULL;
    do_take_load(e);
    return e;
}

/* A load ended: the key leaves the table, and whoever waits for it looks again. */
static void do_load_done(struct kvp_l2 *l2, struct load_item *e)
{
    struct load_item **pp = &l2->buckets[load_bucket(e->key)];
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    e->state = LOAD_FREE;
    e->hnext = NULL;
    e->next = l2->free_loads;
    l2->free_loads = e;
    pthread_cond_broadcast(&l2->done_cv);
}

/* ---- one copy, one load ---- */

/* Copies one queued chunk to L2, pinned while it is read. */
static int put_one(struct kvp_l2 *l2, struct kvp_l2_conn *conn, const struct put_item *it,
                   char *why, size_t why_size)
{
    struct kvp_obj *obj;
    uint8_t hdr[KVP_L2_HEADER_SIZE];
    char name[KVP_L2_KEY_LEN + 1];

    if (kvp_store_pin(l2->store, it->key, 1, &obj) != 1) {
        KVP_COUNT(l2_write_evicted, 1);
        return 0;
    }
    /* The pin orders this read after the commit that wrote the bytes (the store lock). */
    const uint8_t *data = l2->base + obj->offset;
    if (obj->length != it->lay.bytes) {
        kvp_store_unpin(l2->store, &obj, 1);
        KVP_COUNT(l2_write_evicted, 1);
        return 0;
    }
    kvp_l2_header_encode(hdr, it->key, &it->lay, data);
    /* A chunk committed before the segment shrank under the daemon (seg_guard.h) has lost its
     * bytes: its checksum, just computed, may be of zeros. Checked after the checksum, so that
     * a trip during the send leaves a value whose checksum fails, never a valid one. */
    if (it->epoch != kvp_seg_guard_epoch()) {
        kvp_store_unpin(l2->store, &obj, 1);
        KVP_COUNT(l2_write_dropped, 1);
        return 0;
    }
    kvp_l2_key_name(it->key, name);
    struct iovec parts[2] = {{hdr, sizeof(hdr)}, {(void *)data, it->lay.bytes}};
    int rc = l2->be->put(conn, name, parts, 2, ttl_of(l2), why, why_size);
    kvp_store_unpin(l2->store, &obj, 1);
    if (rc == 0) {
        KVP_COUNT(l2_written_chunks, 1);
        KVP_COUNT(l2_written_bytes, sizeof(hdr) + it->lay.bytes);
        return 0;
    }
    KVP_COUNT(l2_write_failed, 1);
    KVP_COUNT(l2_errors, 1);
    if (!broken(rc))
        log_warn_rl("L2 %s refused a chunk: %s", l2->name, why);
    return rc;
}

/*
 * Loads keys[0..n) (n <= KVP_L2_LOAD_BATCH) into L1 through reserve -> write -> commit, with one
 * pipelined round of reads: each value's data is received straight into its reserved slot and
 * its header into a buffer here, then checked; the slot is committed only if the value passes.
 * Chunks already in L1, or being stored by someone else right now (busy), are left alone; each
 * loaded chunk is committed on its own, so a bad value costs only itself. Returns 0 or a
 * backend error; nothing stays reserved either way.
 */
static int load_batch(struct kvp_l2 *l2, struct kvp_l2_conn *conn, const uint8_t *keys, uint32_t n,
                      const struct kvp_l2_layout *lay, char *why, size_t why_size)
{
    struct kvp_obj *objs[KVP_L2_LOAD_BATCH];
    uint32_t idx[KVP_L2_LOAD_BATCH];
    struct kvp_prepare_result pr;
    char names[KVP_L2_LOAD_BATCH][KVP_L2_KEY_LEN + 1];
    const char *ptrs[KVP_L2_LOAD_BATCH];
    uint8_t hdrs[KVP_L2_LOAD_BATCH][KVP_L2_HEADER_SIZE];
    uint8_t *hp[KVP_L2_LOAD_BATCH], *dp[KVP_L2_LOAD_BATCH];
    uint64_t len[KVP_L2_LOAD_BATCH];

    if (kvp_store_prepare(l2->store, keys, n, lay->bytes, mono_ms(), objs, idx, &pr) ||
        pr.nslots == 0)
        return 0;
    for (uint32_t k = 0; k < pr.nslots; k++) {
        kvp_l2_key_name(keys + (size_t)idx[k] * KVP_KEY_SIZE, names[k]);
        ptrs[k] = names[k];
        hp[k] = hdrs[k];
        /* The reservation is ours alone and invisible until the commit: no lock is needed. */
        dp[k] = l2->base + objs[k]->offset;
    }
    int rc = l2->be->read(conn, ptrs, pr.nslots, hp, KVP_L2_HEADER_SIZE, dp, lay->bytes, len, why,
                          why_size);
    if (rc) {
        KVP_COUNT(l2_errors, 1);
        if (broken(rc)) {
            kvp_store_abort(l2->store, objs, pr.nslots);
            return rc;
        }
        log_warn_rl("L2 %s refused a read: %s", l2->name, why);
        rc = 0; /* the values that came are good to use */
    }
    for (uint32_t k = 0; k < pr.nslots; k++) {
        const uint8_t *key = keys + (size_t)idx[k] * KVP_KEY_SIZE;
        if (!len[k]) {
            kvp_store_abort(l2->store, &objs[k], 1);
            KVP_COUNT(l2_misses, 1);
            continue;
        }
        KVP_COUNT(l2_read_bytes, len[k]);
        enum kvp_l2_verdict verdict = kvp_l2_value_check_parts(hdrs[k], dp[k], len[k], key, lay);
        if (verdict == KVP_L2_VALUE_OK) {
            /* Sealed as a worker's commit is, so that a warm restart adopts it too. */
            if (kvp_store_indexed(l2->store))
                objs[k]->sum = kvp_widx_data_sum(dp[k], objs[k]->length);
            if (kvp_store_commit_sealed(l2->store, &objs[k], 1) > 0)
                KVP_COUNT(l2_hits, 1);
            continue;
        }
        kvp_store_abort(l2->store, &objs[k], 1);
        KVP_COUNT(l2_corrupt, 1);
        log_warn_rl("Discarding the L2 value %s (%" PRIu64 " bytes): %s", names[k], len[k],
                    kvp_l2_verdict_name(verdict));
        /* A good copy written later (by any daemon) can then take its place. */
        if (!broken(rc)) {
            char why2[256];
            int d = l2->be->del(conn, names[k], why2, sizeof(why2));
            if (broken(d)) {
                rc = d;
                snprintf(why, why_size, "%s", why2);
            }
        }
    }
    return rc;
}

/* ---- background threads ---- */

static void *bg_main(void *arg)
{
    struct kvp_l2 *l2 = arg;
    kvp_thread_name("kvp-l2");
    struct kvp_l2_conn *conn = NULL;
    uint32_t backoff = KVP_L2_BACKOFF_MIN_MS;
    uint8_t keys[KVP_L2_LOAD_BATCH * KVP_KEY_SIZE];
    char why[256];
    uint64_t last_io = mono_ms(); /* the end of this thread's latest operation */

    pthread_mutex_lock(&l2->lock);
    while (!l2->stopping) {
        /* An idle connection is checked now and then: a server that died while nothing was
         * sent must not be reported up (it is, before the first chunk is stored). */
        bool idle = l2->ring_count == 0 && l2->queue.next == &l2->queue;
        bool probe = conn && idle && mono_ms() >= last_io + KVP_L2_PROBE_MS;
        /* (Re)connect, or check the connection when somebody found L2 down. */
        if (!conn || probe || (l2->state != KVP_L2_STATE_UP && l2->state != KVP_L2_STATE_UNKNOWN)) {
            pthread_mutex_unlock(&l2->lock);
            int rc = conn ? l2->be->ping(conn, why, sizeof(why))
                          : l2->be->open(&l2->target, timeout_of(l2), &conn, why, sizeof(why));
            if (rc && conn) {
                l2->be->close(conn);
                conn = NULL;
            }
            last_io = mono_ms();
            pthread_mutex_lock(&l2->lock);
            if (rc) {
                KVP_COUNT(l2_errors, 1);
                do_set_state(l2, failed_state(rc), why);
                if (rc == -EACCES && backoff < KVP_L2_AUTH_BACKOFF_MIN_MS)
                    backoff = KVP_L2_AUTH_BACKOFF_MIN_MS;
                /* The whole backoff, even when stores wake us: a worker's store must not
                 * become a connection attempt while L2 is down. */
                uint64_t retry_at = mono_ms() + backoff;
                while (!l2->stopping && mono_ms() < retry_at)
                    wait_until(&l2->work_cv, &l2->lock, retry_at);
                /* Credentials do not fix themselves: those attempts back off further. */
                uint32_t cap = rc == -EACCES ? KVP_L2_AUTH_BACKOFF_MAX_MS : KVP_L2_BACKOFF_MAX_MS;
                backoff = backoff * 2 > cap ? cap : backoff * 2;
                continue;
            }
            do_set_state(l2, KVP_L2_STATE_UP, NULL);
            backoff = KVP_L2_BACKOFF_MIN_MS;
        }
        /* Loads first, several of one layout in one round: a worker may be waiting for them. */
        struct put_item put;
        struct load_item *ld[KVP_L2_LOAD_BATCH];
        uint32_t nld = 0;
        while (l2->queue.next != &l2->queue && nld < batch_of(&l2->queue.next->lay) &&
               (nld == 0 || memcmp(&l2->queue.next->lay, &ld[0]->lay, sizeof(ld[0]->lay)) == 0))
            ld[nld++] = do_pop_load(l2);
        if (!nld && !do_pop_put(l2, &put)) {
            wait_until(&l2->work_cv, &l2->lock, last_io + KVP_L2_PROBE_MS);
            continue;
        }
        pthread_mutex_unlock(&l2->lock);
        int rc;
        if (nld) {
            /* Running entries are never reused until do_load_done(): their keys are stable. */
            for (uint32_t i = 0; i < nld; i++)
                memcpy(keys + (size_t)i * KVP_KEY_SIZE, ld[i]->key, KVP_KEY_SIZE);
            rc = load_batch(l2, conn, keys, nld, &ld[0]->lay, why, sizeof(why));
        } else {
            rc = put_one(l2, conn, &put, why, sizeof(why));
        }
        last_io = mono_ms();
        pthread_mutex_lock(&l2->lock);
        for (uint32_t i = 0; i < nld; i++)
            do_load_done(l2, ld[i]);
        if (broken(rc)) {
            pthread_mutex_unlock(&l2->lock);
            l2->be->close(conn);
            conn = NULL;
            pthread_mutex_lock(&l2->lock);
            do_set_state(l2, failed_state(rc), why);
        }
    }
    pthread_mutex_unlock(&l2->lock);
    l2->be->close(conn);
    return NULL;
}

/* ---- foreground connections ---- */

/* A foreground connection, connected; NULL when none is free in time or L2 cannot be
 * reached (the state is then down). */
static struct fg_slot *fg_acquire(struct kvp_l2 *l2)
{
    struct fg_slot *slot = NULL;
    uint64_t deadline = mono_ms() + KVP_L2_FG_WAIT_MS;
    char why[256];

    pthread_mutex_lock(&l2->lock);
    while (!slot && !l2->stopping) {
        for (uint32_t i = 0; i < l2->nthreads && !slot; i++)
            if (!l2->fg[i].busy)
                slot = &l2->fg[i];
        if (!slot && wait_until(&l2->done_cv, &l2->lock, deadline) == ETIMEDOUT)
            break;
    }
    if (slot)
        slot->busy = true;
    pthread_mutex_unlock(&l2->lock);
    if (!slot || slot->conn)
        return slot;
    int rc = l2->be->open(&l2->target, timeout_of(l2), &slot->conn, why, sizeof(why));
    if (rc == 0)
        return slot;
    KVP_COUNT(l2_errors, 1);
    pthread_mutex_lock(&l2->lock);
    do_set_state(l2, failed_state(rc), why);
    slot->busy = false;
    pthread_cond_broadcast(&l2->done_cv);
    pthread_mutex_unlock(&l2->lock);
    return NULL;
}

/* Gives a slot back; rc is the last operation's result (a broken connection is closed and
 * makes the state down). */
static void fg_release(struct kvp_l2 *l2, struct fg_slot *slot, int rc, const char *why)
{
    if (broken(rc)) {
        l2->be->close(slot->conn);
        slot->conn = NULL;
    }
    pthread_mutex_lock(&l2->lock);
    if (broken(rc))
        do_set_state(l2, failed_state(rc), why);
    slot->busy = false;
    pthread_cond_broadcast(&l2->done_cv);
    pthread_mutex_unlock(&l2->lock);
}

/* ---- the daemon's calls ---- */

void kvp_l2_layout_of(const struct kvp_registration *inst, struct kvp_l2_layout *lay)
{
    *lay = (struct kvp_l2_layout){.ndim = inst->layout.ndim, .bytes = inst->layout.bytes};
    memcpy(lay->shape, inst->layout.shape, sizeof(lay->shape));
    size_t len = strnlen(inst->spec.dtype, sizeof(lay->dtype));
    memcpy(lay->dtype, inst->spec.dtype, len); /* NUL-padded by the initializer */
}

void kvp_l2_stored(struct kvp_l2 *l2, const uint8_t *keys, uint32_t n,
                   const struct kvp_l2_layout *lay)
{
    if (!l2 || !n)
        return;
    pthread_mutex_lock(&l2->lock);
    for (uint32_t i = 0; i < n; i++)
        do_push_put(l2, keys + (size_t)i * KVP_KEY_SIZE, lay);
    pthread_cond_broadcast(&l2->work_cv);
    pthread_mutex_unlock(&l2->lock);
    KVP_COUNT(l2_write_queued, n);
}

uint32_t kvp_l2_lookup(struct kvp_l2 *l2, const uint8_t *keys, uint32_t n,
                       const struct kvp_l2_layout *lay)
{
    char why[256] = "";
    uint32_t m = 0;

    if (!l2 || !n || known_down(l2))
        return 0;
    /* Bounded by KVP_MAX_CHUNKS keys per request: about 300 KiB of names at most. */
    char(*names)[KVP_L2_KEY_LEN + 1] = malloc(sizeof(*names) * n);
    const char **ptrs = malloc(sizeof(*ptrs) * n);
    uint8_t *found = malloc(n);
    struct fg_slot *slot = names && ptrs && found ? fg_acquire(l2) : NULL;
    if (slot) {
        for (uint32_t i = 0; i < n; i++) {
            kvp_l2_key_name(keys + (size_t)i * KVP_KEY_SIZE, names[i]);
            ptrs[i] = names[i];
        }
        int rc = l2->be->exists(slot->conn, ptrs, n, found, why, sizeof(why));
        fg_release(l2, slot, rc, why);
        if (rc) {
            KVP_COUNT(l2_errors, 1);
        } else {
            while (m < n && found[m])
                m++;
        }
    }
    free(names);
    free(ptrs);
    free(found);
    if (!m)
        return 0;
    KVP_COUNT(l2_lookup_hit_chunks, m);
    pthread_mutex_lock(&l2->lock);
    for (uint32_t i = 0; i < m; i++) {
        const uint8_t *key = keys + (size_t)i * KVP_KEY_SIZE;
        /* A full table only means that a retrieve will load those chunks itself. */
        if (!do_find_load(l2, key))
            do_add_load(l2, key, lay, LOAD_QUEUED);
    }
    pthread_cond_broadcast(&l2->work_cv);
    pthread_mutex_unlock(&l2->lock);
    return m;
}

/* How fetch found each key in the load table. */
enum claim { CLAIM_OURS, CLAIM_THEIRS };

/*
 * Makes the calling worker the loader of every key of keys[0..n) that nobody is loading: new
 * entries, and queued ones taken over (a worker should not wait behind a queue). Keys another
 * thread is loading are marked CLAIM_THEIRS. mine[i] is the entry to release (NULL when the
 * table was full: the key is then loaded without one).
 */
static void claim_all(struct kvp_l2 *l2, const uint8_t *keys, uint32_t n,
                      const struct kvp_l2_layout *lay, uint8_t *claim, struct load_item **mine)
{
    pthread_mutex_lock(&l2->lock);
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *key = keys + (size_t)i * KVP_KEY_SIZE;
        struct load_item *e = do_find_load(l2, key);
        claim[i] = CLAIM_OURS;
        mine[i] = NULL;
        if (!e) {
            mine[i] = do_add_load(l2, key, lay, LOAD_RUNNING);
        } else if (e->state == LOAD_QUEUED) {
            do_take_load(e);
            mine[i] = e;
        } else {
            claim[i] = CLAIM_THEIRS;
        }
    }
    pthread_mutex_unlock(&l2->lock);
}

/* Releases our entries, then waits (until deadline_ms at most) for the keys of others. */
static void release_and_wait(struct kvp_l2 *l2, const uint8_t *keys, uint32_t n,
                             const uint8_t *claim, struct load_item **mine, uint64_t deadline_ms)
{
    pthread_mutex_lock(&l2->lock);
    for (uint32_t i = 0; i < n; i++)
        if (mine[i])
            do_load_done(l2, mine[i]);
    for (uint32_t i = 0; i < n && !l2->stopping; i++) {
        if (claim[i] != CLAIM_THEIRS)
            continue;
        while (!l2->stopping && do_find_load(l2, keys + (size_t)i * KVP_KEY_SIZE) &&
               wait_until(&l2->done_cv, &l2->lock, deadline_ms) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&l2->lock);
}

uint32_t kvp_l2_fetch(struct kvp_l2 *l2, const uint8_t *keys, uint32_t n,
                      const struct kvp_l2_layout *lay)
{
    struct fg_slot *slot = NULL;
    char why[256] = "";
    int rc = 0;

    if (!l2 || !n || known_down(l2))
        return 0;
    uint8_t *claim = malloc(n);
    struct load_item **mine = malloc(sizeof(*mine) * n);
    if (!claim || !mine) {
        free(claim);
        free(mine);
        return 0;
    }
    uint64_t deadline = mono_ms() + timeout_of(l2);
    claim_all(l2, keys, n, lay, claim, mine);
    /* Our keys, in pipelined rounds of consecutive ones, until a round leaves a hole: the
     * chunks after a missing one cannot be part of the leading run. */
    for (uint32_t i = 0; i < n;) {
        if (claim[i] == CLAIM_THEIRS) {
            i++;
            continue;
        }
        uint32_t j = i;
        while (j < n && claim[j] == CLAIM_OURS && j - i < batch_of(lay))
            j++;
        const uint8_t *k = keys + (size_t)i * KVP_KEY_SIZE;
        /* Each round ends within --l2-timeout; none starts after the fetch's own deadline. */
        if (i > 0 && mono_ms() >= deadline)
            break;
        if (!slot && !(slot = fg_acquire(l2)))
            break;
        rc = load_batch(l2, slot->conn, k, j - i, lay, why, sizeof(why));
        if (rc || kvp_store_lookup(l2->store, k, j - i) < j - i)
            break;
        i = j;
    }
    if (slot)
        fg_release(l2, slot, rc, why);
    release_and_wait(l2, keys, n, claim, mine, deadline);
    free(claim);
    free(mine);
    return kvp_store_lookup(l2->store, keys, n);
}

/* Set once at start-up and never changed: readable without the lock. */
const char *kvp_l2_name(const struct kvp_l2 *l2)
{
    return l2 ? l2->name : "";
}

void kvp_l2_get_gauges(struct kvp_l2 *l2, struct kvp_l2_gauges *g)
{
    *g = (struct kvp_l2_gauges){0};
    if (!l2)
        return;
    pthread_mutex_lock(&l2->lock);
    g->up = l2->state == KVP_L2_STATE_UP;
    g->state = l2->state;
    if (l2->state == KVP_L2_STATE_UNKNOWN)
        snprintf(g->reason, sizeof(g->reason), "not connected yet");
    else
        memcpy(g->reason, l2->reason, sizeof(g->reason));
    g->backlog_chunks = l2->ring_count;
    g->backlog_bytes = l2->backlog_bytes;
    pthread_mutex_unlock(&l2->lock);
}

/* ---- start and stop ---- */

static void l2_free(struct kvp_l2 *l2)
{
    for (uint32_t i = 0; l2->fg && i < l2->nthreads; i++)
        l2->be->close(l2->fg[i].conn);
    free(l2->fg);
    free(l2->threads);
    free(l2->loads);
    free(l2->ring);
    pthread_mutex_destroy(&l2->lock);
    pthread_cond_destroy(&l2->work_cv);
    pthread_cond_destroy(&l2->done_cv);
    explicit_bzero(l2->target.password, sizeof(l2->target.password));
    free(l2);
}

/* The password file replaces the URL's password. Returns 0 or -errno after logging. */
static int read_password(struct kvp_l2 *l2, const char *path)
{
    char why[512];
    bool loose;
    int rc = kvp_l2_password_file_read(path, l2->target.password, sizeof(l2->target.password),
                                       &loose, why, sizeof(why));
    if (rc) {
        log_error("Cannot start: --l2-password-file: %s", why);
        return rc;
    }
    if (loose)
        log_warn("The L2 password file %s can be read by group or others (chmod 600 it)", path);
    return 0;
}

int kvp_l2_start(const struct kvp_config *cfg, struct kvp_store *store, uint8_t *base,
                 struct kvp_l2 **out)
{
    char why[256];
    pthread_condattr_t ca;

    *out = NULL;
    if (!cfg->l2_url[0])
        return 0;
    struct kvp_l2 *l2 = calloc(1, sizeof(*l2));
    if (!l2) {
        log_error("Cannot start: out of memory for the L2 tier");
        return -ENOMEM;
    }
    *l2 = (struct kvp_l2){
        .be = &kvp_l2_redis_backend,
        .store = store,
        .base = base,
        .ttl_s = cfg->l2_ttl_s,
        .timeout_ms = cfg->l2_timeout_ms,
        .nthreads = cfg->l2_connections,
        .queue_bytes = cfg->l2_queue_bytes,
    };
    pthread_mutex_init(&l2->lock, NULL);
    /* Waits are measured on the monotonic clock, like every deadline of the daemon. */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l2->work_cv, &ca);
    pthread_cond_init(&l2->done_cv, &ca);
    pthread_condattr_destroy(&ca);
    l2->queue.prev = l2->queue.next = &l2->queue;

    int rc = kvp_l2_url_parse(cfg->l2_url, &l2->target, why, sizeof(why));
    if (rc) {
        log_error("Cannot start: invalid --l2: %s", why);
        l2_free(l2);
        return rc;
    }
    kvp_l2_url_masked(&l2->target, l2->name, sizeof(l2->name));
    if (cfg->l2_password_file[0] && (rc = read_password(l2, cfg->l2_password_file)) != 0) {
        l2_free(l2);
        return rc;
    }
    /* Every chunk takes at least one 4 KiB page of the pool: that bounds the ring's entries. */
    uint64_t cap = l2->queue_bytes / 4096 + 16;
    l2->ring_cap = cap > KVP_L2_MAX_PUTS ? KVP_L2_MAX_PUTS : (uint32_t)cap;
    l2->ring = calloc(l2->ring_cap, sizeof(*l2->ring));
    l2->loads = calloc(KVP_L2_MAX_LOADS, sizeof(*l2->loads));
    l2->fg = calloc(l2->nthreads, sizeof(*l2->fg));
    l2->threads = calloc(l2->nthreads, sizeof(*l2->threads));
    if (!l2->ring || !l2->loads || !l2->fg || !l2->threads) {
        log_error("Cannot start: out of memory for the L2 tier's queues");
        l2_free(l2);
        return -ENOMEM;
    }
    for (uint32_t i = KVP_L2_MAX_LOADS; i-- > 0;) {
        l2->loads[i].next = l2->free_loads;
        l2->free_loads = &l2->loads[i];
    }
    for (; l2->nstarted < l2->nthreads; l2->nstarted++) {
        rc = kvp_thread_create(&l2->threads[l2->nstarted], NULL, bg_main, l2);
        if (rc) {
            log_error("Cannot start: cannot create an L2 thread: %s", strerror(rc));
            kvp_l2_stop(l2);
            return -rc;
        }
    }
    log_info("L2 tier %s: %" PRIu32 " connections, write-behind queue %" PRIu64
             " bytes, ttl %" PRIu32 " s, timeout %" PRIu32 " ms",
             l2->name, l2->nthreads, l2->queue_bytes, ttl_of(l2), timeout_of(l2));
    *out = l2;
    return 0;
}

void kvp_l2_stop(struct kvp_l2 *l2)
{
    if (!l2)
        return;
    pthread_mutex_lock(&l2->lock);
    l2->stopping = true;
    pthread_cond_broadcast(&l2->work_cv);
    pthread_cond_broadcast(&l2->done_cv);
    pthread_mutex_unlock(&l2->lock);
    for (uint32_t i = 0; i < l2->nstarted; i++)
        pthread_join(l2->threads[i], NULL);
    if (l2->ring_count)
        log_info("L2 %s: %" PRIu32 " queued copies not sent at shutdown", l2->name, l2->ring_count);
    l2_free(l2);
}
