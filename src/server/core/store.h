/*
 * store.h - the object store: key index, object life cycle, LRU eviction, over the pool.
 *
 * Life cycle of an object (one chunk):
 *
 *   prepare ──> RESERVED ──commit──> COMMITTED ──evict (LRU, unpinned)──> freed
 *                  │  └──expire──> EXPIRED ──commit/abort by owner──> freed
 *                  └──abort──> freed
 *
 * RESERVED objects are in the index (so other stores of the key see "busy") but invisible to
 * lookup and retrieve. EXPIRED objects are out of the index but keep their memory until their
 * owner says commit or abort (or disconnects), so a late writer can never scribble over another
 * object. Only COMMITTED objects are visible; pinned ones (pins > 0) are never evicted, nor are
 * the ones a prepare in progress reported as cached (guard > 0).
 *
 * Cost: every call does O(1) or O(log n) work per chunk, whatever the pool's size and
 * fragmentation (store.c and pool.c say how), except kvp_store_clear(), which visits every
 * object. A prepare that must evict many objects, and a clear, let waiting threads take the lock
 * between victims, so no other worker's request waits behind them for long.
 *
 * Every function takes the store lock itself (the do_* helpers in store.c expect it held).
 * Callers hold no other lock when calling in. Object pointers handed out by prepare and pin stay
 * valid until the matching commit/abort/unpin.
 */
#ifndef KVP_STORE_H
#define KVP_STORE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "common/chunk_hash.h"
#include "core/pool.h"

enum kvp_obj_state { KVP_OBJ_RESERVED, KVP_OBJ_COMMITTED, KVP_OBJ_EXPIRED };

struct kvp_obj {
    uint8_t key[KVP_KEY_SIZE];
    uint64_t offset; /* byte offset in the segment */
    uint64_t length;
    uint64_t reserved_at_ms;
    uint64_t last_use; /* the store's recency clock when last used (LRU order) */
    uint32_t pins;
    uint32_t guard; /* prepares in progress that reported it cached (protects it there) */
    uint8_t state;
    struct kvp_obj *hnext; /* index chain */
    /* COMMITTED: the LRU list while evictable (no pins, no guard), else the held list;
     * RESERVED/EXPIRED: the pending list. */
    struct kvp_obj *prev;
    struct kvp_obj *next;
};

struct kvp_store {
    pthread_mutex_t lock;
    atomic_uint waiters;    /* threads blocked on lock (they may be let in early) */
    atomic_ullong acquired; /* times the lock was taken, to see a waiter got in */
    uint64_t held_since_ns; /* when the current holder took the lock */
    struct kvp_pool pool;
    struct kvp_obj **buckets;
    uint64_t mask;
    struct kvp_obj **edge;  /* per page: the object whose first or last page it is, else NULL */
    struct kvp_obj lru;     /* sentinel of the evictable objects; lru.next is the most recent */
    struct kvp_obj held;    /* sentinel of committed objects that are pinned or guarded */
    struct kvp_obj pending; /* sentinel of RESERVED and EXPIRED objects */
    uint64_t ncommitted, nreserved, nexpired, npinned;
    uint64_t evictable_pages; /* pages of the objects on the LRU list */
    uint64_t clock;           /* recency clock: the last kvp_obj.last_use handed out */
    uint64_t steps;           /* eviction steps (windows planned, victims), ever */
    uint64_t handoffs;        /* times a long hold let waiting threads in (do_yield) */
    uint64_t lets_go;         /* times a hold let the lock go (do_yield), waiters or not */
    uint64_t yield_calls;     /* points where a long hold could end (do_yield) */
    uint64_t slice_ns;        /* a hold this long ends at the next such point (tests: 0) */
    uint64_t steps_at_lock;   /* steps (s->steps + the pool's) when the lock was taken */
    uint64_t max_hold_steps;  /* the most steps taken in one hold: what tests bound */
    uint64_t edge_ready;      /* edge[] entries faulted in ahead (init, extend: no lock) */
};

struct kvp_prepare_result {
    uint32_t cached, busy, no_space, nslots;
};

struct kvp_store_gauges {
    uint64_t pool_size, pool_reserved, pool_used, largest_free;
    uint64_t committed, reserved, expired, pinned;
};

/*
 * Manages pool bytes [pool_base, pool_base + pool_size) of the segment, of which the first
 * avail bytes are reserved and may be used now (kvp_store_extend() adds the rest as the
 * background reservation proceeds). 0 or -ENOMEM.
 */
int kvp_store_init(struct kvp_store *s, uint64_t pool_base, uint64_t pool_size, uint64_t avail);
/* The first avail bytes of the pool are reserved: they may be handed out from now on. */
void kvp_store_extend(struct kvp_store *s, uint64_t avail);
void kvp_store_destroy(struct kvp_store *s);

/*
 * Reserves slots for the keys (n x KVP_KEY_SIZE bytes) that are neither committed nor being
 * stored, evicting LRU objects when needed (never one that this same call reported as cached:
 * the worker skips those). Reserved objects go to objs[k] with their position in idx[k],
 * k < res->nslots; objs and idx have room for n entries, and the entries of objs from nslots on
 * are scratch. After the first chunk that cannot get space, every later chunk that needs space
 * counts as no_space (later cached or busy ones are still reported as such); a chunk gets no
 * space at once when the free and evictable pages together are too few, and after a bounded
 * search when pinned or reserved objects split the evictable ones. Returns 0, or -ENOMEM
 * (nothing reserved).
 *
 * The answer is consistent for each chunk; a prepare that has to evict much may let other
 * threads in between victims, so another store can commit a key of a later chunk meanwhile
 * (reported cached) or reserve it (busy), as if it had come first.
 */
int kvp_store_prepare(struct kvp_store *s, const uint8_t *keys, uint32_t n, uint64_t chunk_bytes,
                      uint64_t now_ms, struct kvp_obj **objs, uint32_t *idx,
                      struct kvp_prepare_result *res);

/*
 * Publishes reserved objects. All or nothing: if any of them expired, all are dropped and
 * -ETIMEDOUT is returned. Otherwise returns n.
 */
int kvp_store_commit(struct kvp_store *s, struct kvp_obj **objs, uint32_t n);

/* Drops reserved (or expired) objects; nothing becomes visible. Returns how many of them were
 * still reserved: an expired one was already counted when --reserve-timeout cancelled it. */
uint32_t kvp_store_abort(struct kvp_store *s, struct kvp_obj **objs, uint32_t n);

/* Pins the leading run of committed keys into objs. Returns its length. */
uint32_t kvp_store_pin(struct kvp_store *s, const uint8_t *keys, uint32_t n, struct kvp_obj **objs);
void kvp_store_unpin(struct kvp_store *s, struct kvp_obj **objs, uint32_t n);

/* Length of the leading run of committed keys. */
uint32_t kvp_store_lookup(struct kvp_store *s, const uint8_t *keys, uint32_t n);

/* Cancels reservations older than timeout_ms. Returns how many expired now. */
uint32_t kvp_store_expire(struct kvp_store *s, uint64_t now_ms, uint64_t timeout_ms);

void kvp_store_get_gauges(struct kvp_store *s, struct kvp_store_gauges *g);

/*
 * Allocator and eviction steps taken so far (tree nodes and bitmap words of the pool, windows
 * planned and victims evicted): what tests count instead of timing an operation.
 */
uint64_t kvp_store_alloc_steps(struct kvp_store *s);

/* What kvp_store_clear() did. */
struct kvp_clear_result {
    uint64_t dropped; /* committed objects freed */
    uint64_t bytes;   /* their bytes */
    uint64_t pinned;  /* committed objects kept because a retrieve pins them */
};

/*
 * Frees every committed object that nobody pins, as if each were evicted (CLEAR). Reserved
 * and expired objects belong to stores in progress and are not touched; pinned objects stay
 * until their last unpin and remain visible. Like an evicting prepare it lets waiting threads
 * take the lock every slice, so a concurrent lookup may find part of the store cleared; an
 * object used (looked up, retrieved, committed) after the clear began is kept.
 */
void kvp_store_clear(struct kvp_store *s, struct kvp_clear_result *res);

/* kvp_store_clear() of the objects reserved before before_ms (the clock of kvp_store_prepare()'s
 * now_ms) only: those reserved since are kept, and moved to the LRU's front. */
void kvp_store_clear_older(struct kvp_store *s, uint64_t before_ms, struct kvp_clear_result *res);

#endif /* KVP_STORE_H */
