/*
 * store.c - key index, object life cycle and LRU eviction (see store.h for the state machine).
 *
 * Threads: every connection thread and the expiry thread call in; one mutex (s->lock) guards
 * the index, both lists, the counters and the pool allocator. It is held only for metadata work
 * (hash lookups, list splicing, bitmap updates): no chunk byte is ever copied under it, so a
 * large transfer by one worker never blocks another worker's requests. It is a leaf lock:
 * nothing else is acquired while holding it.
 *
 * Index: keys are BLAKE2b digests, so their first 8 bytes are already uniformly distributed and
 * serve directly as the bucket hash. The table has one bucket per pool page / 4 (a power of two,
 * at least 1024) and is never resized: objects are at least one page, so chains stay short.
 *
 * Eviction happens on demand inside prepare: while the allocator cannot place a chunk, the
 * least recently used committed object that is not pinned is freed. Lookup, cached-store hits
 * and retrieves refresh recency.
 */
#include "core/store.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/stats.h"

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
    if (!s->buckets) {
        kvp_pool_destroy(&s->pool);
        return -ENOMEM;
    }
    s->mask = nb - 1;
    list_init(&s->lru);
    list_init(&s->pending);
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
    free_list(&s->pending);
    free(s->buckets);
    kvp_pool_destroy(&s->pool);
    pthread_mutex_destroy(&s->lock);
    s->buckets = NULL;
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

/* Frees an object that is out of the index; caller holds the lock. */
static void do_release(struct kvp_store *s, struct kvp_obj *o)
{
    list_unlink(o);
    kvp_pool_free(&s->pool, o->offset, o->length);
    free(o);
}

/* Evicts the least recently used unpinned committed object. Returns false if there is none. */
static bool do_evict_one(struct kvp_store *s)
{
    for (struct kvp_obj *o = s->lru.prev; o != &s->lru; o = o->prev) {
        if (o->pins || o->seen_in == s->prepare_seq)
            continue;
        do_index_remove(s, o);
        do_release(s, o);
        s->ncommitted--;
        KVP_COUNT(evictions, 1);
        return true;
    }
    return false;
}

/*
 * Allocates len bytes, evicting least-recently-used objects until the allocator finds a free
 * run. Eviction frees one object at a time and retries, because under fragmentation the
 * victim's pages may not be adjacent to any other free run. Caller holds the lock.
 */
static int do_alloc(struct kvp_store *s, uint64_t len, uint64_t *off)
{
    for (;;) {
        int rc = kvp_pool_alloc(&s->pool, len, off);
        if (rc != -ENOSPC)
            return rc;
        if (!do_evict_one(s))
            return -ENOSPC;
    }
}

/* Marks a committed object most recently used. Caller holds the lock. */
static void do_touch(struct kvp_store *s, struct kvp_obj *o)
{
    list_unlink(o);
    list_push_front(&s->lru, o);
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

/*
 * One lock hold for the whole request, so its answer is consistent: a chunk reported cached
 * cannot be evicted by a later chunk of the same request (seen_in), and the busy/no-space
 * counts describe one moment.
 */
int kvp_store_prepare(struct kvp_store *s, const uint8_t *keys, uint32_t n, uint64_t chunk_bytes,
                      uint64_t now_ms, struct kvp_obj **objs, uint32_t *idx,
                      struct kvp_prepare_result *res)
{
    *res = (struct kvp_prepare_result){0};
    pthread_mutex_lock(&s->lock);
    s->prepare_seq++;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *key = keys + (size_t)i * KVP_KEY_SIZE;
        struct kvp_obj *o = do_find(s, key);
        if (o) {
            if (o->state == KVP_OBJ_COMMITTED) {
                res->cached++;
                o->seen_in = s->prepare_seq;
                do_touch(s, o);
            } else {
                res->busy++;
            }
            continue;
        }
        if (res->no_space) {
            res->no_space++;
            continue;
        }
        o = calloc(1, sizeof(*o));
        if (!o) {
            do_abort(s, objs, res->nslots);
            pthread_mutex_unlock(&s->lock);
            *res = (struct kvp_prepare_result){0};
            return -ENOMEM;
        }
        if (do_alloc(s, chunk_bytes, &o->offset) != 0) {
            free(o);
            res->no_space++;
            continue;
        }
        memcpy(o->key, key, KVP_KEY_SIZE);
        o->length = chunk_bytes;
        o->state = KVP_OBJ_RESERVED;
        o->reserved_at_ms = now_ms;
        do_index_insert(s, o);
        list_push_front(&s->pending, o);
        s->nreserved++;
        objs[res->nslots] = o;
        idx[res->nslots] = i;
        res->nslots++;
    }
    pthread_mutex_unlock(&s->lock);
    return 0;
}

/* All or nothing: a set of chunks is published together or not at all, never a torn prefix. */
int kvp_store_commit(struct kvp_store *s, struct kvp_obj **objs, uint32_t n)
{
    pthread_mutex_lock(&s->lock);
    for (uint32_t i = 0; i < n; i++) {
        if (objs[i]->state == KVP_OBJ_EXPIRED) {
            do_abort(s, objs, n);
            pthread_mutex_unlock(&s->lock);
            return -ETIMEDOUT;
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        struct kvp_obj *o = objs[i];
        list_unlink(o);
        o->state = KVP_OBJ_COMMITTED;
        list_push_front(&s->lru, o);
    }
    s->nreserved -= n;
    s->ncommitted += n;
    pthread_mutex_unlock(&s->lock);
    return (int)n;
}

uint32_t kvp_store_abort(struct kvp_store *s, struct kvp_obj **objs, uint32_t n)
{
    pthread_mutex_lock(&s->lock);
    uint32_t r = do_abort(s, objs, n);
    pthread_mutex_unlock(&s->lock);
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
        if (objs) {
            if (o->pins++ == 0)
                s->npinned++;
            objs[k] = o;
        }
        do_touch(s, o);
    }
    return k;
}

uint32_t kvp_store_pin(struct kvp_store *s, const uint8_t *keys, uint32_t n, struct kvp_obj **objs)
{
    pthread_mutex_lock(&s->lock);
    uint32_t k = do_leading_run(s, keys, n, objs);
    pthread_mutex_unlock(&s->lock);
    return k;
}

void kvp_store_unpin(struct kvp_store *s, struct kvp_obj **objs, uint32_t n)
{
    pthread_mutex_lock(&s->lock);
    for (uint32_t i = 0; i < n; i++)
        if (--objs[i]->pins == 0)
            s->npinned--;
    pthread_mutex_unlock(&s->lock);
}

/* A lookup announces a retrieve soon: refreshing recency keeps the prefix from eviction. */
uint32_t kvp_store_lookup(struct kvp_store *s, const uint8_t *keys, uint32_t n)
{
    pthread_mutex_lock(&s->lock);
    uint32_t k = do_leading_run(s, keys, n, NULL);
    pthread_mutex_unlock(&s->lock);
    return k;
}

uint32_t kvp_store_expire(struct kvp_store *s, uint64_t now_ms, uint64_t timeout_ms)
{
    uint32_t n = 0;
    pthread_mutex_lock(&s->lock);
    for (struct kvp_obj *o = s->pending.next; o != &s->pending; o = o->next) {
        if (o->state != KVP_OBJ_RESERVED || now_ms - o->reserved_at_ms < timeout_ms)
            continue;
        /* Out of the index: the key is free for other stores. The memory stays with the owner
         * until it commits, aborts or disconnects. */
        do_index_remove(s, o);
        o->state = KVP_OBJ_EXPIRED;
        s->nreserved--;
        s->nexpired++;
        n++;
    }
    pthread_mutex_unlock(&s->lock);
    return n;
}

void kvp_store_clear(struct kvp_store *s, struct kvp_clear_result *res)
{
    *res = (struct kvp_clear_result){0};
    pthread_mutex_lock(&s->lock);
    for (struct kvp_obj *o = s->lru.next, *next; o != &s->lru; o = next) {
        next = o->next; /* o is freed below */
        if (o->pins) {
            res->pinned++;
            continue;
        }
        res->dropped++;
        res->bytes += o->length;
        do_index_remove(s, o);
        do_release(s, o);
        s->ncommitted--;
    }
    pthread_mutex_unlock(&s->lock);
}

void kvp_store_extend(struct kvp_store *s, uint64_t avail)
{
    pthread_mutex_lock(&s->lock);
    kvp_pool_extend(&s->pool, avail);
    pthread_mutex_unlock(&s->lock);
}

/* A consistent snapshot for STATS; largest_free walks the bitmap, so it is not for hot paths. */
void kvp_store_get_gauges(struct kvp_store *s, struct kvp_store_gauges *g)
{
    pthread_mutex_lock(&s->lock);
    *g = (struct kvp_store_gauges){
        .pool_size = kvp_pool_size(&s->pool),
        .pool_reserved = kvp_pool_avail(&s->pool),
        .pool_used = kvp_pool_used(&s->pool),
        .largest_free = kvp_pool_largest_free(&s->pool),
        .committed = s->ncommitted,
        .reserved = s->nreserved,
        .expired = s->nexpired,
        .pinned = s->npinned,
    };
    pthread_mutex_unlock(&s->lock);
}
