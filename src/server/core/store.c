/*
 * store.c - key index, object life cycle and LRU eviction (see store.h for the state machine).
 *
 * Threads: every connection thread and the expiry thread call in; one mutex (s->lock) guards
 * the index, the lists, the counters and the pool allocator. It is held only for metadata work
 * (hash lookups, list splicing, bitmap updates): no chunk byte is ever copied under it, so a
 * large transfer by one worker never blocks another worker's requests. It is a leaf lock:
 * nothing else is acquired while holding it. Every hold is timed into the
 * kvpool_store_lock_hold_seconds histogram (stats.h).
 *
 * Index: keys are BLAKE2b digests, so their first 8 bytes are already uniformly distributed and
 * serve directly as the bucket hash. The table has one bucket per pool page / 4 (a power of two,
 * at least 1024) and is never resized: objects are at least one page, so chains stay short.
 *
 * Lists: COMMITTED objects that may be evicted (no pins, no guard) are on the LRU list, most
 * recent first, ordered by last_use (a clock ticked at every use); pinned or guarded ones wait
 * on the held list and come back to the LRU's front when released. So the LRU's tail is always
 * a victim, and evictable_pages (the LRU's pages) tells at once whether a chunk can get space.
 *
 * Eviction, on demand inside prepare, targeted (the pool is first fit over pages, pool.c):
 *
 *   1. if the allocator finds a free run, done: O(log n);
 *   2. if free plus evictable pages are fewer than the chunk needs, no space, at once;
 *   3. else plan a window: a run of pages at least as long as the chunk, made of free pages and
 *      evictable objects, grown from a victim on the LRU's tail towards whichever neighbour
 *      (found through edge[], the object at each page where one begins or ends) was used less
 *      recently. A window's cost is its most recently used victim; the cheapest of up to
 *      KVP_EVICT_CANDIDATES windows (grown from the oldest objects, a plan stopped as soon as
 *      it cannot win, all within a step budget proportional to the chunk) is evicted, and the
 *      allocator places the chunk in the run it leaves. With chunks of one size a window is
 *      exactly the LRU victim: plain LRU. With mixed sizes it evicts what lies around the
 *      oldest objects, never more than the chunk's length beyond it, so the hit ratio stays
 *      near a byte-LRU's and no size class can calcify.
 *
 * A step is one object or one bitmap word, so a chunk costs O(its pages + log n), independent
 * of the pool's size and of where its other objects lie. The steps are counted (s->steps and
 * the pool's), and tests check the counts.
 *
 * The warm-restart index (store.h, kvp_store_set_index()): every record write is a call of the
 * hook under the lock, so the store is the index's one writer, and the order of those calls is
 * the crash-safety argument of warm_restart.c: a reservation is marked when it is made; a
 * sealing commit publishes, then seals; do_release_keep() clears a record (or ends a mark)
 * before the object's pages go back to the pool or into an eviction window. Without a hook none
 * of this happens and nothing costs more.
 *
 * Long work, short holds: evicting a window of thousands of one-page objects takes a
 * millisecond or more. Once a hold has lasted KVP_STORE_SLICE_NS, the evicting prepare ends it
 * between victims or between chunks (unlock; if threads wait, wait until one of them got the
 * lock; relock), so no hold lasts much longer than that. What protects a prepare's state
 * meanwhile: its reservations are RESERVED (never evicted), the objects it reported cached are
 * guarded (off the LRU list, listed in the tail of its objs array), and the window's pages stay
 * used as its victims go (the free ones between them are claimed), so nothing else lands in
 * the part already evicted. A window whose remaining part changed meanwhile (a victim pinned by
 * a retrieve) is given back and planned again, a bounded number of times.
 */
#include "core/store.h"

#include <errno.h>
#include <sched.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "common/populate.h"
#include "core/stats.h"

/* Windows planned per chunk at most; then the cheapest is evicted. */
#define KVP_EVICT_CANDIDATES 16
/* Plan attempts per chunk (a window whose pages changed while others had the lock). */
#define KVP_EVICT_ATTEMPTS 4
/* A hold this long ends at the next point where that is safe (do_yield). */
#define KVP_STORE_SLICE_NS 100000ull
/* do_yield reads the clock at every this many calls (a victim or a chunk each). */
#define KVP_STORE_SLICE_CHECK 8
/* How long a holder that let others in waits for one of them to take the lock. */
#define KVP_STORE_HANDOFF_YIELDS 200

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void store_lock(struct kvp_store *s)
{
    if (pthread_mutex_trylock(&s->lock) != 0) {
        atomic_fetch_add_explicit(&s->waiters, 1, memory_order_relaxed);
        pthread_mutex_lock(&s->lock);
        atomic_fetch_sub_explicit(&s->waiters, 1, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(&s->acquired, 1, memory_order_relaxed);
    s->held_since_ns = now_ns();
    s->steps_at_lock = s->steps + s->pool.steps;
}

static void store_unlock(struct kvp_store *s)
{
    uint64_t held = now_ns() - s->held_since_ns;
    uint64_t steps = s->steps + s->pool.steps - s->steps_at_lock;
    if (steps > s->max_hold_steps)
        s->max_hold_steps = steps;
    pthread_mutex_unlock(&s->lock);
    kvp_lock_hold_record(held);
}

/*
 * Ends a hold that has lasted a slice: unlock, and when threads wait for the lock, wait
 * (yielding the CPU) until one of them has taken it, or a bounded while; then lock again. So no
 * hold is much longer than a slice, and a waiter gets the lock within one. The clock is read
 * every KVP_STORE_SLICE_CHECK calls. The caller's state must be consistent: it holds nothing
 * that another thread may not see. Returns true when the lock was let go (any object the caller
 * did not protect may be gone).
 */
static bool do_yield(struct kvp_store *s)
{
    if (++s->yield_calls % KVP_STORE_SLICE_CHECK != 0 || now_ns() - s->held_since_ns < s->slice_ns)
        return false;
    bool waiters = atomic_load_explicit(&s->waiters, memory_order_relaxed) != 0;
    unsigned long long seen = atomic_load_explicit(&s->acquired, memory_order_relaxed);
    store_unlock(s);
    for (int i = 0; waiters && i < KVP_STORE_HANDOFF_YIELDS; i++) {
        if (atomic_load_explicit(&s->acquired, memory_order_relaxed) != seen)
            break;
        sched_yield();
    }
    store_lock(s);
    s->handoffs += waiters;
    s->lets_go++;
    return true;
}

/* Lists are circular and doubly linked around a sentinel, so unlinking needs no head. */
static void list_init(struct kvp_obj *head)
{
    head->prev = head->next = head;
}

static void list_unlink(struct kvp_obj *o)
{
    o->prev->next = o->next;
    o->next->prev = o->prev;
    o->prev = o->next = NULL;
}

static void list_push_front(struct kvp_obj *head, struct kvp_obj *o)
{
    o->next = head->next;
    o->prev = head;
    head->next->prev = o;
    head->next = o;
}

/* Keys are BLAKE2b output: any 8 bytes of them are already a uniform hash. */
static uint64_t bucket_of(const struct kvp_store *s, const uint8_t *key)
{
    uint64_t h;
    memcpy(&h, key, sizeof(h));
    return h & s->mask;
}

static uint64_t npages_of(uint64_t len)
{
    return len / KVP_POOL_PAGE + (len % KVP_POOL_PAGE != 0);
}

/* The index of the object's first page. */
static uint64_t first_page(const struct kvp_store *s, const struct kvp_obj *o)
{
    return (o->offset - s->pool.base) / KVP_POOL_PAGE;
}

static bool evictable(const struct kvp_obj *o)
{
    return o->state == KVP_OBJ_COMMITTED && o->pins == 0 && o->guard == 0;
}

/* Faults in edge[] up to page avail ahead of use. Called by init and by the one thread that
 * extends the pool, without the lock: it changes no value. */
static void populate_edges(struct kvp_store *s, uint64_t avail)
{
    if (avail > s->pool.npages)
        avail = s->pool.npages;
    if (avail <= s->edge_ready)
        return;
    kvp_populate_inside(s->edge + s->edge_ready, (avail - s->edge_ready) * sizeof(*s->edge));
    s->edge_ready = avail;
}

/* All index memory is allocated here, once; only objects are allocated per request. */
int kvp_store_init(struct kvp_store *s, uint64_t pool_base, uint64_t pool_size, uint64_t avail)
{
    *s = (struct kvp_store){0};
    int rc = kvp_pool_init(&s->pool, pool_base, pool_size, avail);
    if (rc)
        return rc;
    uint64_t nb = 1024;
    while (nb < s->pool.npages / 4)
        nb *= 2;
    s->buckets = calloc(nb, sizeof(*s->buckets));
    s->edge = calloc(s->pool.npages ? s->pool.npages : 1, sizeof(*s->edge));
    if (!s->buckets || !s->edge) {
        free(s->buckets);
        free(s->edge);
        s->buckets = NULL;
        kvp_pool_destroy(&s->pool);
        return -ENOMEM;
    }
    s->mask = nb - 1;
    s->slice_ns = KVP_STORE_SLICE_NS;
    /* First touches of these under the lock were page faults of milliseconds each on a VM whose
     * memory is backed lazily: the index is touched all over from the start, the edges as the
     * pool's reserved part grows (kvp_store_extend). */
    kvp_populate_inside(s->buckets, nb * sizeof(*s->buckets));
    populate_edges(s, s->pool.avail);
    list_init(&s->lru);
    list_init(&s->held);
    list_init(&s->pending);
    atomic_init(&s->waiters, 0);
    atomic_init(&s->acquired, 0);
    pthread_mutex_init(&s->lock, NULL);
    return 0;
}

/* Frees every object of a list without touching the pool (used at shutdown only). */
static void free_list(struct kvp_obj *head)
{
    while (head->next != head) {
        struct kvp_obj *o = head->next;
        list_unlink(o);
        free(o);
    }
}

void kvp_store_destroy(struct kvp_store *s)
{
    if (!s->buckets)
        return;
    free_list(&s->lru);
    free_list(&s->held);
    free_list(&s->pending);
    free(s->buckets);
    free(s->edge);
    free(s->held_runs);
    kvp_pool_destroy(&s->pool);
    pthread_mutex_destroy(&s->lock);
    s->buckets = NULL;
    s->edge = NULL;
}

/* Index lookup; caller holds the lock. */
static struct kvp_obj *do_find(struct kvp_store *s, const uint8_t *key)
{
    for (struct kvp_obj *o = s->buckets[bucket_of(s, key)]; o; o = o->hnext)
        if (memcmp(o->key, key, KVP_KEY_SIZE) == 0)
            return o;
    return NULL;
}

/* Pushes o on its bucket chain; the key must not be indexed yet. Caller holds the lock. */
static void do_index_insert(struct kvp_store *s, struct kvp_obj *o)
{
    uint64_t b = bucket_of(s, o->key);
    o->hnext = s->buckets[b];
    s->buckets[b] = o;
}

/* Unlinks o from its bucket chain if it is there. Caller holds the lock. */
static void do_index_remove(struct kvp_store *s, struct kvp_obj *o)
{
    struct kvp_obj **pp = &s->buckets[bucket_of(s, o->key)];
    while (*pp && *pp != o)
        pp = &(*pp)->hnext;
    if (*pp)
        *pp = o->hnext;
    o->hnext = NULL;
}

/* Records o's pages in edge[] (placed) or forgets them. Caller holds the lock. */
static void do_edges(struct kvp_store *s, struct kvp_obj *o, struct kvp_obj *v)
{
    uint64_t f = first_page(s, o);
    s->edge[f] = v;
    s->edge[f + npages_of(o->length) - 1] = v;
}

/* Clears o's record in the index, if it has one: before anything lets its pages go to another
 * object, so that no record a successor could adopt ever names pages of another object. Caller
 * holds the lock. */
static void do_unrecord(struct kvp_store *s, struct kvp_obj *o)
{
    if (o->marked) {
        o->marked = 0;
        if (!s->keep_marks)
            s->index->unmark(s->index->arg, first_page(s, o));
    }
    if (!o->indexed)
        return;
    s->index->clear(s->index->arg, first_page(s, o));
    o->indexed = 0;
    s->nindexed--;
    s->indexed_bytes -= o->length;
}

/* o is verified or gone: one fewer to check. Caller holds the lock. */
static void do_settle_unverified(struct kvp_store *s, struct kvp_obj *o)
{
    if (!atomic_load_explicit(&o->unverified, memory_order_relaxed))
        return;
    /* Release: a pinner that reads false after this (kvp_obj_unverified()) reads the bytes of
     * an object whose check is over. */
    atomic_store_explicit(&o->unverified, false, memory_order_release);
    atomic_fetch_sub_explicit(&s->nunverified, 1, memory_order_relaxed);
}

/* Frees an object that is out of the index and off the LRU accounting, and its pages unless the
 * caller keeps them (an eviction window takes them over). Its record is cleared first, whoever
 * takes the pages next. Caller holds the lock. */
static void do_release_keep(struct kvp_store *s, struct kvp_obj *o, bool keep_pages)
{
    do_unrecord(s, o);
    do_settle_unverified(s, o);
    list_unlink(o);
    do_edges(s, o, NULL);
    if (!keep_pages)
        kvp_pool_free(&s->pool, o->offset, o->length);
    free(o);
}

static void do_release(struct kvp_store *s, struct kvp_obj *o)
{
    do_release_keep(s, o, false);
}

/* Takes o off the LRU list before a pin or a guard makes it unevictable. Caller holds the
 * lock; o is committed. */
static void do_lru_leave(struct kvp_store *s, struct kvp_obj *o)
{
    if (!evictable(o))
        return;
    list_unlink(o);
    list_push_front(&s->held, o);
    s->evictable_pages -= npages_of(o->length);
}

/* o was used: its recency clock, in the index too (seq is advisory there: one store). Caller
 * holds the lock. */
static void do_use(struct kvp_store *s, struct kvp_obj *o)
{
    o->last_use = ++s->clock;
    if (o->indexed)
        s->index->touch(s->index->arg, first_page(s, o), o->last_use);
}

/* Puts o back on the LRU's front once its last pin and guard are gone; a dropped object goes
 * instead, its pages with it (its record was cleared when it was dropped). Caller holds the
 * lock. */
static void do_lru_return(struct kvp_store *s, struct kvp_obj *o)
{
    if (o->state == KVP_OBJ_DROPPED && o->pins == 0 && o->guard == 0) {
        do_release(s, o);
        return;
    }
    if (!evictable(o))
        return;
    list_unlink(o);
    list_push_front(&s->lru, o);
    do_use(s, o);
    s->evictable_pages += npages_of(o->length);
}

/* Marks a committed object most recently used. Caller holds the lock. */
static void do_touch(struct kvp_store *s, struct kvp_obj *o)
{
    do_use(s, o);
    if (evictable(o)) {
        list_unlink(o);
        list_push_front(&s->lru, o);
    }
}

/* Evicts an evictable object, its pages staying used (the window's). Caller holds the lock. */
static void do_evict(struct kvp_store *s, struct kvp_obj *o)
{
    s->evictable_pages -= npages_of(o->length);
    do_index_remove(s, o);
    do_release_keep(s, o, true);
    s->ncommitted--;
    s->steps++;
    KVP_COUNT(evictions, 1);
}

/* A window: pages [lo, hi) of free runs and evictable objects; cost = its newest last_use. */
struct window {
    uint64_t lo, hi, cost;
};

/*
 * Plans a window of at least need pages around the evictable object c: starting from c's pages
 * and the free runs beside them, it takes in the neighbour used less recently (or the only
 * evictable one) with the free run behind it, until the window is long enough. Gives up, false,
 * when both neighbours are unevictable (pinned, guarded, reserved, expired, or the pool's end),
 * when the window's cost reaches best (another window is no worse), or when *budget steps are
 * spent. Caller holds the lock.
 */
static bool do_plan(struct kvp_store *s, struct kvp_obj *c, uint64_t need, uint64_t best,
                    uint64_t *budget, struct window *w, bool *yielded)
{
    struct kvp_pool *p = &s->pool;
    uint64_t lo = first_page(s, c), hi = lo + npages_of(c->length), cost = c->last_use;

    if (cost >= best)
        return false;
    lo = kvp_pool_free_start(p, lo, hi > need ? hi - need : 0);
    hi = kvp_pool_free_end(p, hi, lo + need);
    while (hi - lo < need) {
        if (*budget == 0)
            return false;
        (*budget)--;
        s->steps++;
        /* Only page numbers and a clock value are carried from step to step, never an object:
         * planning may let the lock go. A window that changed meanwhile is found out when it
         * is evicted (do_evict_window) and planned again. */
        if (do_yield(s))
            *yielded = true;
        /* Page lo - 1 (used: free pages there were taken in) is the last page of an object,
         * page hi the first of one, unless it lies beyond the reserved part (no object). */
        struct kvp_obj *l = lo > 0 ? s->edge[lo - 1] : NULL;
        struct kvp_obj *r = hi < p->avail ? s->edge[hi] : NULL;
        bool lok = l && evictable(l), rok = r && evictable(r);
        if (!lok && !rok)
            return false;
        bool left = lok && (!rok || l->last_use <= r->last_use);
        struct kvp_obj *v = left ? l : r;
        if (v->last_use > cost)
            cost = v->last_use;
        if (cost >= best)
            return false;
        if (left) {
            lo = first_page(s, v);
            lo = kvp_pool_free_start(p, lo, hi > need ? hi - need : 0);
        } else {
            hi = first_page(s, v) + npages_of(v->length);
            hi = kvp_pool_free_end(p, hi, lo + need);
        }
    }
    *w = (struct window){lo, hi, cost};
    return true;
}

/*
 * The cheapest window of need pages among those grown from the oldest evictable objects.
 * The LRU list is in last_use order, so once a candidate is no older than the best window's
 * cost, no later one can beat it. Planning a large window over small objects takes thousands
 * of steps, so it lets the lock go every slice too; the walk then goes on from the oldest object
 * used after the last candidate. Returns false if none was found. Caller holds the lock.
 */
static bool do_choose(struct kvp_store *s, uint64_t need, struct window *best)
{
    uint64_t budget = 2 * need + 64;
    struct window w = {0};
    bool yielded = false;
    int n = 0;

    best->cost = UINT64_MAX;
    struct kvp_obj *c = s->lru.prev;
    for (; c != &s->lru && n < KVP_EVICT_CANDIDATES && budget; n++) {
        if (c->last_use >= best->cost)
            break;
        s->steps++;
        uint64_t used = c->last_use;
        yielded = false;
        if (do_plan(s, c, need, best->cost, &budget, &w, &yielded))
            *best = w;
        if (!yielded) {
            c = c->prev;
            continue;
        }
        /* The lock was let go: c may be gone, and its neighbours on the list with it. The next
         * candidate is the oldest object used after c, found again from the list's end. */
        for (c = s->lru.prev; c != &s->lru && c->last_use <= used; c = c->prev)
            s->steps++;
    }
    return best->cost != UINT64_MAX;
}

/*
 * Evicts every object in pages [lo, hi) and claims the free pages between them, so that the
 * whole window ends up used and ours: no other thread can place anything in it while this one
 * lets waiters in between victims. Returns 0, or -EAGAIN when the window changed meanwhile (an
 * object that is not evictable, or that reaches beyond it, was placed in what was still to
 * do); then the part already taken is freed again. Caller holds the lock.
 */
static int do_evict_window(struct kvp_store *s, uint64_t lo, uint64_t hi)
{
    struct kvp_pool *p = &s->pool;
    uint64_t i = lo;
    while (i < hi) {
        if (!kvp_pool_page_used(p, i)) {
            uint64_t e = kvp_pool_free_end(p, i, hi);
            kvp_pool_claim(p, i, e - i);
            i = e;
            continue;
        }
        struct kvp_obj *o = s->edge[i];
        if (!o || first_page(s, o) != i || !evictable(o) || i + npages_of(o->length) > hi) {
            if (i > lo)
                kvp_pool_free(p, p->base + lo * KVP_POOL_PAGE, (i - lo) * KVP_POOL_PAGE);
            return -EAGAIN;
        }
        i += npages_of(o->length);
        do_evict(s, o);
        do_yield(s);
    }
    return 0;
}

/*
 * Allocates len bytes, evicting a window of LRU objects when the allocator finds no free run
 * (see the design note): the chunk takes the window's first pages, the rest is freed. -ENOSPC
 * when the free and evictable pages are too few, or no window could be planned. Caller holds
 * the lock (which it may give up for a while, do_yield).
 */
static int do_alloc(struct kvp_store *s, uint64_t len, uint64_t *off)
{
    struct kvp_pool *p = &s->pool;
    uint64_t need = npages_of(len);
    for (int attempt = 0; attempt < KVP_EVICT_ATTEMPTS; attempt++) {
        int rc = kvp_pool_alloc(p, len, off);
        if (rc != -ENOSPC)
            return rc;
        if (p->avail - p->used + s->evictable_pages < need)
            return -ENOSPC;
        struct window w = {0};
        if (!do_choose(s, need, &w))
            return -ENOSPC;
        if (do_evict_window(s, w.lo, w.hi) == 0) {
            if (w.hi > w.lo + need)
                kvp_pool_free(p, p->base + (w.lo + need) * KVP_POOL_PAGE,
                              (w.hi - w.lo - need) * KVP_POOL_PAGE);
            *off = p->base + w.lo * KVP_POOL_PAGE;
            return 0;
        }
    }
    return -ENOSPC;
}

/*
 * Frees reserved or expired objects. A reserved one is still indexed (others see it as busy);
 * an expired one was already taken out of the index by the expiry pass. Returns how many were
 * still reserved. Caller holds the lock.
 */
static uint32_t do_abort(struct kvp_store *s, struct kvp_obj **objs, uint32_t n)
{
    uint32_t reserved = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct kvp_obj *o = objs[i];
        if (o->state == KVP_OBJ_RESERVED) {
            do_index_remove(s, o);
            s->nreserved--;
            reserved++;
        } else {
            s->nexpired--;
        }
        do_release(s, o);
    }
    return reserved;
}

/* Ends the guard a prepare put on the objects it reported cached (objs[0..n)). */
static void do_unguard(struct kvp_store *s, struct kvp_obj **objs, uint32_t n)
{
    for (uint32_t j = 0; j < n; j++) {
        objs[j]->guard--;
        do_lru_return(s, objs[j]);
    }
}

static void free_spare(struct kvp_obj *o)
{
    while (o) {
        struct kvp_obj *next = o->next;
        free(o);
        o = next;
    }
}

/*
 * A chunk reported cached is guarded until the prepare ends, so that no later chunk of the same
 * request evicts it, even while others hold the lock in between (do_yield). The guarded objects
 * are listed from the end of objs backwards: objs[n - ncached .. n), disjoint from the
 * reservations at objs[0 .. nslots) since each key is one or the other.
 */
int kvp_store_prepare(struct kvp_store *s, const uint8_t *keys, uint32_t n, uint64_t chunk_bytes,
                      uint64_t now_ms, struct kvp_obj **objs, uint32_t *idx,
                      struct kvp_prepare_result *res)
{
    uint32_t ncached = 0;
    struct kvp_obj *spare = NULL; /* new objects, allocated before the lock, linked by next */

    *res = (struct kvp_prepare_result){0};
    /* One per key, allocated (and its memory faulted in) before the lock is taken: a fresh heap
     * page was a page fault under the lock; the ones not used are freed after it. */
    for (uint32_t i = 0; i < n; i++) {
        struct kvp_obj *o = calloc(1, sizeof(*o));
        if (!o) {
            free_spare(spare);
            return -ENOMEM;
        }
        o->next = spare;
        spare = o;
    }
    store_lock(s);
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *key = keys + (size_t)i * KVP_KEY_SIZE;
        struct kvp_obj *o = do_find(s, key);
        if (o) {
            if (o->state == KVP_OBJ_COMMITTED) {
                res->cached++;
                do_touch(s, o);
                do_lru_leave(s, o);
                o->guard++;
                objs[n - 1 - ncached++] = o;
            } else {
                res->busy++;
            }
            continue;
        }
        if (res->no_space) {
            res->no_space++;
            continue;
        }
        o = spare;
        uint64_t lets_go = s->lets_go;
        if (do_alloc(s, chunk_bytes, &o->offset) != 0) {
            res->no_space++;
            continue;
        }
        /* Eviction may have let the lock go, and another store of the key got in meanwhile:
         * this one is then busy, as it would have been a moment later. */
        if (s->lets_go != lets_go && do_find(s, key)) {
            kvp_pool_free(&s->pool, o->offset, chunk_bytes);
            res->busy++;
            continue;
        }
        spare = o->next;
        o->next = NULL;
        memcpy(o->key, key, KVP_KEY_SIZE);
        o->length = chunk_bytes;
        o->state = KVP_OBJ_RESERVED;
        o->reserved_at_ms = now_ms;
        do_edges(s, o, o);
        do_index_insert(s, o);
        list_push_front(&s->pending, o);
        s->nreserved++;
        /* Its worker may write these pages until it commits, whatever becomes of this
         * daemon: a successor holds them back. */
        if (s->index && s->index->mark &&
            s->index->mark(s->index->arg, first_page(s, o), o->length) == 0)
            o->marked = 1;
        objs[res->nslots] = o;
        idx[res->nslots] = i;
        res->nslots++;
        /* Between chunks: this one is reserved and indexed, the next not looked at yet. The
         * key was absent a moment ago; another store of it now sees it busy. */
        do_yield(s);
    }
    do_unguard(s, objs + n - ncached, ncached);
    store_unlock(s);
    free_spare(spare);
    return 0;
}

/*
 * All or nothing: a set of chunks is published together or not at all, never a torn prefix.
 * With seal, each record is sealed after the set is published, in the same hold: the bytes were
 * complete before the commit began (their owner wrote them, then asked to commit). Caller holds
 * the lock.
 */
static int do_commit(struct kvp_store *s, struct kvp_obj **objs, uint32_t n, bool seal)
{
    for (uint32_t i = 0; i < n; i++) {
        if (objs[i]->state == KVP_OBJ_EXPIRED) {
            do_abort(s, objs, n);
            return -ETIMEDOUT;
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        struct kvp_obj *o = objs[i];
        list_unlink(o);
        o->state = KVP_OBJ_COMMITTED;
        o->last_use = ++s->clock;
        list_push_front(&s->lru, o);
        s->evictable_pages += npages_of(o->length);
    }
    s->nreserved -= n;
    s->ncommitted += n;
    for (uint32_t i = 0; s->index && i < n; i++) {
        struct kvp_obj *o = objs[i];
        /* A seal's plan overwrites the mark; without one it ends here. */
        if (seal && s->index->seal(s->index->arg, first_page(s, o), o->key, o->length, o->sum,
                                   o->last_use) == 0) {
            o->indexed = 1;
            s->nindexed++;
            s->indexed_bytes += o->length;
        } else if (o->marked) {
            s->index->unmark(s->index->arg, first_page(s, o));
        }
        o->marked = 0;
    }
    return (int)n;
}

int kvp_store_commit(struct kvp_store *s, struct kvp_obj **objs, uint32_t n)
{
    store_lock(s);
    int rc = do_commit(s, objs, n, false);
    store_unlock(s);
    return rc;
}

int kvp_store_commit_sealed(struct kvp_store *s, struct kvp_obj **objs, uint32_t n)
{
    store_lock(s);
    int rc = do_commit(s, objs, n, true);
    store_unlock(s);
    return rc;
}

void kvp_store_set_index(struct kvp_store *s, const struct kvp_store_index *ix)
{
    s->index = ix;
}

int kvp_store_adopt(struct kvp_store *s, uint64_t offset, const uint8_t key[KVP_KEY_SIZE],
                    uint64_t length, uint64_t sum)
{
    struct kvp_pool *p = &s->pool;

    if (length == 0 || offset < p->base || (offset - p->base) % KVP_POOL_PAGE != 0)
        return -EINVAL;
    /* Allocated before the lock, as a prepare's objects are. */
    struct kvp_obj *o = calloc(1, sizeof(*o));
    if (!o)
        return -ENOMEM;
    uint64_t first = (offset - p->base) / KVP_POOL_PAGE, n = npages_of(length);
    int rc = 0;
    store_lock(s);
    /* Without overflow: first < avail, then n <= avail - first. */
    if (first >= p->avail || n > p->avail - first)
        rc = -ERANGE;
    else if (kvp_pool_free_end(p, first, first + n) != first + n || do_find(s, key))
        rc = -EEXIST;
    if (rc) {
        store_unlock(s);
        free(o);
        return rc;
    }
    kvp_pool_claim(p, first, n);
    memcpy(o->key, key, KVP_KEY_SIZE);
    o->offset = offset;
    o->length = length;
    o->sum = sum;
    o->state = KVP_OBJ_COMMITTED;
    o->indexed = s->index != NULL;
    atomic_init(&o->unverified, true);
    do_edges(s, o, o);
    do_index_insert(s, o);
    list_push_front(&s->lru, o);
    do_use(s, o);
    s->evictable_pages += n;
    s->ncommitted++;
    if (o->indexed) {
        s->nindexed++;
        s->indexed_bytes += length;
    }
    atomic_fetch_add_explicit(&s->nunverified, 1, memory_order_relaxed);
    store_unlock(s);
    return 0;
}

int64_t kvp_store_hold_back(struct kvp_store *s, uint64_t mark_page, uint64_t offset,
                            uint64_t length)
{
    struct kvp_pool *p = &s->pool;
    int64_t held = 0;

    if (length == 0 || offset < p->base || (offset - p->base) % KVP_POOL_PAGE != 0)
        return 0;
    uint64_t first = (offset - p->base) / KVP_POOL_PAGE, n = npages_of(length);
    if (first >= p->avail)
        return 0;
    uint64_t end = n > p->avail - first ? p->avail : first + n;
    store_lock(s);
    /* Each free run inside the range; the used pages between them are adopted objects'. */
    for (uint64_t i = first; i < end;) {
        if (kvp_pool_page_used(p, i)) {
            i++;
            continue;
        }
        uint64_t e = kvp_pool_free_end(p, i, end);
        /* Growing the list under the lock: start-up only, nobody waits. */
        struct kvp_held_run *v = realloc(s->held_runs, (s->nheld_runs + 1) * sizeof(*v));
        if (!v) {
            held = -ENOMEM;
            break;
        }
        s->held_runs = v;
        kvp_pool_claim(p, i, e - i);
        v[s->nheld_runs++] = (struct kvp_held_run){mark_page, i, e - i};
        s->held_pages += e - i;
        held += (int64_t)(e - i);
        i = e;
    }
    store_unlock(s);
    return held;
}

uint64_t kvp_store_release_held(struct kvp_store *s)
{
    uint64_t freed = 0;
    store_lock(s);
    for (uint64_t k = 0; k < s->nheld_runs; k++) {
        const struct kvp_held_run *r = &s->held_runs[k];
        /* The mark first, as for any reservation, when its page is one of those held (else an
         * object lies there, whose record is not the mark's to change). */
        if (s->index && !s->keep_marks && r->first == r->mark_page)
            s->index->unmark(s->index->arg, r->mark_page);
        kvp_pool_free(&s->pool, s->pool.base + r->first * KVP_POOL_PAGE, r->n * KVP_POOL_PAGE);
        freed += r->n;
    }
    free(s->held_runs);
    s->held_runs = NULL;
    s->nheld_runs = s->held_pages = 0;
    store_unlock(s);
    return freed;
}

void kvp_store_keep_marks(struct kvp_store *s)
{
    store_lock(s);
    s->keep_marks = true;
    store_unlock(s);
}

bool kvp_store_verified(struct kvp_store *s, struct kvp_obj *o, bool ok)
{
    bool changed = false;
    store_lock(s);
    if (ok && o->state == KVP_OBJ_COMMITTED &&
        atomic_load_explicit(&o->unverified, memory_order_relaxed)) {
        do_settle_unverified(s, o);
        KVP_COUNT(warm_restart_verified_chunks, 1);
        changed = true;
    } else if (!ok && o->state == KVP_OBJ_COMMITTED) {
        /* Pinned by the caller, so on the held list, off the LRU: out of the index at once,
         * its record cleared now, its pages freed by the last unpin (do_lru_return). */
        do_index_remove(s, o);
        do_unrecord(s, o);
        do_settle_unverified(s, o);
        o->state = KVP_OBJ_DROPPED;
        s->ncommitted--;
        KVP_COUNT(warm_restart_corrupt_chunks, 1);
        changed = true;
    }
    store_unlock(s);
    return changed;
}

uint32_t kvp_store_abort(struct kvp_store *s, struct kvp_obj **objs, uint32_t n)
{
    store_lock(s);
    uint32_t r = do_abort(s, objs, n);
    store_unlock(s);
    return r;
}

/*
 * The leading run of committed keys, each refreshed in the LRU; with objs, each is also pinned
 * and stored there. Pins stack: an object shared by several retrieves stays pinned until the
 * last release. Caller holds the lock.
 */
static uint32_t do_leading_run(struct kvp_store *s, const uint8_t *keys, uint32_t n,
                               struct kvp_obj **objs)
{
    uint32_t k = 0;
    for (; k < n; k++) {
        struct kvp_obj *o = do_find(s, keys + (size_t)k * KVP_KEY_SIZE);
        if (!o || o->state != KVP_OBJ_COMMITTED)
            break;
        do_touch(s, o);
        if (objs) {
            do_lru_leave(s, o);
            if (o->pins++ == 0)
                s->npinned++;
            objs[k] = o;
        }
    }
    return k;
}

uint32_t kvp_store_pin(struct kvp_store *s, const uint8_t *keys, uint32_t n, struct kvp_obj **objs)
{
    store_lock(s);
    uint32_t k = do_leading_run(s, keys, n, objs);
    store_unlock(s);
    return k;
}

void kvp_store_unpin(struct kvp_store *s, struct kvp_obj **objs, uint32_t n)
{
    store_lock(s);
    for (uint32_t i = 0; i < n; i++) {
        if (--objs[i]->pins == 0)
            s->npinned--;
        do_lru_return(s, objs[i]);
    }
    store_unlock(s);
}

/* A lookup announces a retrieve soon: refreshing recency keeps the prefix from eviction. */
uint32_t kvp_store_lookup(struct kvp_store *s, const uint8_t *keys, uint32_t n)
{
    store_lock(s);
    uint32_t k = do_leading_run(s, keys, n, NULL);
    store_unlock(s);
    return k;
}

uint32_t kvp_store_expire(struct kvp_store *s, uint64_t now_ms, uint64_t timeout_ms)
{
    uint32_t n = 0;
    store_lock(s);
    for (struct kvp_obj *o = s->pending.next; o != &s->pending; o = o->next) {
        /* now_ms was read before the lock: a prepare since then reserved with a later clock,
         * and is new. */
        if (o->state != KVP_OBJ_RESERVED || kvp_ms_since(now_ms, o->reserved_at_ms) < timeout_ms)
            continue;
        /* Out of the index: the key is free for other stores. The memory stays with the owner
         * until it commits, aborts or disconnects. */
        do_index_remove(s, o);
        o->state = KVP_OBJ_EXPIRED;
        s->nreserved--;
        s->nexpired++;
        n++;
    }
    store_unlock(s);
    return n;
}

/*
 * Everything on the LRU list is evictable; the held list is what pins and guards keep. Oldest
 * first, with the lock let go every slice (do_yield), and only what was last used before the
 * clear began: an object a lookup or commit refreshes meanwhile moves to the front with a later
 * clock and ends the walk, so a clear under steady stores still ends.
 */
/* kvp_store_clear() of the objects reserved before before_ms (UINT64_MAX: all). The walk takes
 * the LRU's tail each time, so that letting the lock go never leaves it a stale cursor: a kept
 * object is touched to the front, past the walk's end. */
static void do_clear(struct kvp_store *s, uint64_t before_ms, struct kvp_clear_result *res)
{
    *res = (struct kvp_clear_result){0};
    store_lock(s);
    for (struct kvp_obj *o = s->held.next; o != &s->held; o = o->next)
        res->pinned += o->state == KVP_OBJ_COMMITTED;
    uint64_t began = s->clock;
    while (s->lru.prev != &s->lru && s->lru.prev->last_use <= began) {
        struct kvp_obj *o = s->lru.prev;
        if (o->reserved_at_ms >= before_ms) {
            do_touch(s, o);
            continue;
        }
        res->dropped++;
        res->bytes += o->length;
        s->evictable_pages -= npages_of(o->length);
        do_index_remove(s, o);
        do_release(s, o);
        s->ncommitted--;
        do_yield(s);
    }
    store_unlock(s);
}

void kvp_store_clear(struct kvp_store *s, struct kvp_clear_result *res)
{
    do_clear(s, UINT64_MAX, res);
}

void kvp_store_clear_older(struct kvp_store *s, uint64_t before_ms, struct kvp_clear_result *res)
{
    do_clear(s, before_ms, res);
}

void kvp_store_extend(struct kvp_store *s, uint64_t avail)
{
    populate_edges(s, avail / KVP_POOL_PAGE);
    store_lock(s);
    kvp_pool_extend(&s->pool, avail);
    store_unlock(s);
}

/* A consistent snapshot for STATS; every figure is kept up to date, so this is O(1). */
void kvp_store_get_gauges(struct kvp_store *s, struct kvp_store_gauges *g)
{
    store_lock(s);
    *g = (struct kvp_store_gauges){
        .pool_size = kvp_pool_size(&s->pool),
        .pool_reserved = kvp_pool_avail(&s->pool),
        .pool_used = kvp_pool_used(&s->pool),
        .largest_free = kvp_pool_largest_free(&s->pool),
        .committed = s->ncommitted,
        .reserved = s->nreserved,
        .expired = s->nexpired,
        .pinned = s->npinned,
        .indexed = s->nindexed,
        .indexed_bytes = s->indexed_bytes,
        .unverified = kvp_store_unverified(s),
        .held_back = s->held_pages * KVP_POOL_PAGE,
    };
    store_unlock(s);
}

uint64_t kvp_store_alloc_steps(struct kvp_store *s)
{
    store_lock(s);
    uint64_t n = s->steps + s->pool.steps;
    store_unlock(s);
    return n;
}
