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
 * Warm restart (core/warm_restart.h): with an index hook (kvp_store_set_index()) the store
 * records what it holds for a successor: a reservation marks its pages, a sealing commit seals
 * each chunk's record, a use touches it, and whatever lets a recorded object's pages go
 * (eviction, clear, abort, a drop) clears its record or mark first, under the lock. A successor
 * adopts the committed objects (kvp_store_adopt(): COMMITTED, but unverified until their first
 * pin is checked, kvp_store_verified()); one whose bytes fail the check becomes DROPPED: out of
 * the index at once, its pages freed at its last unpin:
 *
 *   adopt ──> COMMITTED (unverified) ──verified──> COMMITTED
 *                  └──check fails (pinned)──> DROPPED ──last unpin──> freed
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
#include <stdbool.h>
#include <stdint.h>

#include "common/chunk_hash.h"
#include "core/pool.h"

/* KVP_OBJ_DROPPED: a committed object whose bytes failed their check (kvp_store_verified())
 * while pinned: out of the index, its pages freed at its last unpin. */
enum kvp_obj_state { KVP_OBJ_RESERVED, KVP_OBJ_COMMITTED, KVP_OBJ_EXPIRED, KVP_OBJ_DROPPED };

struct kvp_obj {
    uint8_t key[KVP_KEY_SIZE];
    uint64_t offset; /* byte offset in the segment */
    uint64_t length;
    uint64_t reserved_at_ms;
    uint64_t last_use; /* the store's recency clock when last used (LRU order) */
    /* The checksum of its bytes (kvp_widx_data_sum()): written by the reservation's owner
     * before kvp_store_commit_sealed(), or by kvp_store_adopt(); then never changed. */
    uint64_t sum;
    uint32_t pins;
    uint32_t guard; /* prepares in progress that reported it cached (protects it there) */
    uint8_t state;
    uint8_t indexed; /* its record in the index is sealed (cleared before its pages go) */
    uint8_t marked;  /* reserved, its record marks the reservation (unmarked before it goes) */
    /* Adopted, its bytes not checked against sum yet: set before it is published, cleared
     * (release, under the lock) once; read without the lock (kvp_obj_unverified()). */
    atomic_bool unverified;
    struct kvp_obj *hnext; /* index chain */
    /* COMMITTED: the LRU list while evictable (no pins, no guard), else the held list;
     * RESERVED/EXPIRED: the pending list. */
    struct kvp_obj *prev;
    struct kvp_obj *next;
};

/*
 * The index of what the store holds, for a successor to adopt (core/warm_restart.c over
 * warm_index.h); the store knows no more of it than these calls. Each is made with the store
 * lock held, so the store is the index's one writer. Pages are pool pages (the object's first
 * page, counted from the pool's base), the index's record numbers.
 */
struct kvp_store_index {
    /* Seals the record of a committed object (sum: kvp_obj.sum, seq: its recency clock).
     * Returns 0, or a negative errno: the object then stays unrecorded (never adopted). */
    int (*seal)(void *arg, uint64_t page, const uint8_t key[KVP_KEY_SIZE], uint64_t length,
                uint64_t sum, uint64_t seq);
    /* Clears the record of a sealed object: called before its pages can go to another. */
    void (*clear)(void *arg, uint64_t page);
    /* Records a use of a sealed object (its new recency clock). */
    void (*touch)(void *arg, uint64_t page, uint64_t seq);
    /* Marks the pages of a reservation: its worker may write them until its next call, even
     * after this daemon died. Returns 0, or a negative errno (then not marked). May be NULL
     * (with unmark): reservations are not marked. */
    int (*mark)(void *arg, uint64_t page, uint64_t length);
    /* Ends a mark: called before the reservation's pages are freed. */
    void (*unmark)(void *arg, uint64_t page);
    void *arg;
};

/* Pages held back from a previous daemon's reservation (kvp_store_hold_back()). */
struct kvp_held_run {
    uint64_t mark_page; /* the page whose record marks it */
    uint64_t first, n;  /* pages claimed */
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
    const struct kvp_store_index *index; /* NULL: nothing is recorded (kvp_store_set_index) */
    uint64_t nindexed, indexed_bytes;    /* objects whose record is sealed, and their bytes */
    /* Adopted objects not verified yet: changed under the lock, read without it (the
     * operations skip the check while it is 0). */
    _Atomic uint64_t nunverified;
    bool keep_marks; /* reservations freed from now on keep their marks (kvp_store_keep_marks) */
    struct kvp_held_run *held_runs; /* kvp_store_hold_back(), until kvp_store_release_held() */
    uint64_t nheld_runs, held_pages;
};

struct kvp_prepare_result {
    uint32_t cached, busy, no_space, nslots;
};

struct kvp_store_gauges {
    uint64_t pool_size, pool_reserved, pool_used, largest_free;
    uint64_t committed, reserved, expired, pinned;
    uint64_t indexed, indexed_bytes; /* committed objects recorded in the index, their bytes */
    uint64_t unverified;             /* adopted objects not read (verified) yet */
    uint64_t held_back;              /* pool bytes held back (kvp_store_hold_back()) */
};

/*
 * Manages pool bytes [pool_base, pool_base + pool_size) of the segment, of which the first
 * avail bytes are reserved and may be used now (kvp_store_extend() adds the rest as the
 * background reservation proceeds). 0 or -ENOMEM.
 */
int kvp_store_init(struct kvp_store *s, uint64_t pool_base, uint64_t pool_size, uint64_t avail);
/* The first avail bytes of the pool are reserved: they may be handed out from now on. */
void kvp_store_extend(struct kvp_store *s, uint64_t avail);
/* Frees the store's memory; the index (if any) is left as it is: what it records stays. */
void kvp_store_destroy(struct kvp_store *s);

/*
 * Makes the store record its committed objects in ix (NULL: nothing, the default): sealing
 * commits (kvp_store_commit_sealed()) seal a record, uses touch it, and whatever frees a sealed
 * object's pages (eviction, clear, a dropped object) clears its record first, under the lock.
 * Call it after kvp_store_init(), before any other thread uses the store; ix must outlive it.
 */
void kvp_store_set_index(struct kvp_store *s, const struct kvp_store_index *ix);

/* True when the store has an index: the operations then checksum what they commit. */
static inline bool kvp_store_indexed(const struct kvp_store *s)
{
    return s->index != NULL;
}

/* Adopted objects not verified yet (relaxed: 0 lets a reader skip the checks). */
static inline uint64_t kvp_store_unverified(struct kvp_store *s)
{
    return atomic_load_explicit(&s->nunverified, memory_order_relaxed);
}

/* True while o (pinned by the caller) was adopted and not verified yet. No lock. */
static inline bool kvp_obj_unverified(struct kvp_obj *o)
{
    return atomic_load_explicit(&o->unverified, memory_order_acquire);
}

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

/*
 * kvp_store_commit(), and then, still under the lock, the record of each object committed is
 * sealed in the index with its sum (which the caller computed over its bytes, outside the lock,
 * before the call). Without an index, kvp_store_commit(). Same returns.
 */
int kvp_store_commit_sealed(struct kvp_store *s, struct kvp_obj **objs, uint32_t n);

/*
 * Adopts a committed object that a previous daemon left in the pool (warm restart): key, its
 * offset in the segment and length, and the checksum its bytes had at commit. It becomes the
 * most recently used object (adopt the oldest first), visible to lookups at once, recorded in
 * the index (its record, which the caller found sealed, stays and is touched with the new
 * clock), and unverified until its first pin (kvp_store_verified()). Returns 0; -EINVAL (length
 * 0, or an offset that is not the start of a pool page); -ERANGE (pages beyond the pool's
 * reserved part); -EEXIST (a page of it is used, or the key is already there); -ENOMEM.
 */
int kvp_store_adopt(struct kvp_store *s, uint64_t offset, const uint8_t key[KVP_KEY_SIZE],
                    uint64_t length, uint64_t sum);

/*
 * Holds back the free pages of [offset, offset + length), a reservation a previous daemon had
 * handed out (its mark is the record of mark_page): they are used, and no object's, until
 * kvp_store_release_held(), so that a worker that still writes its stale slots writes nothing
 * anybody reads. Pages used already (adopted objects) or beyond the reserved part are left as
 * they are. Call it at start-up, before other threads use the store. Returns the pages held, or
 * -ENOMEM.
 */
int64_t kvp_store_hold_back(struct kvp_store *s, uint64_t mark_page, uint64_t offset,
                            uint64_t length);

/* Ends every hold of kvp_store_hold_back(): each mark ended (the index's unmark), then its pages
 * freed. Returns the pages freed. */
uint64_t kvp_store_release_held(struct kvp_store *s);

/*
 * From now on, the reservations the store frees keep their marks in the index: a shutdown that
 * leaves the pool for the next daemon (a planned restart) drops its clients' reservations, whose
 * workers may still be writing; the next daemon holds their pages back.
 */
void kvp_store_keep_marks(struct kvp_store *s);

/*
 * The verdict on the bytes of o, an unverified object the caller pins, read against o->sum
 * outside the lock. ok: o is verified from now on (counted warm_restart_verified_chunks by the
 * call that verifies it). Not ok: o leaves the index, so that nobody finds it again, its record
 * is cleared, and its pages are freed at its last unpin (the caller still unpins it); counted
 * warm_restart_corrupt_chunks. Returns true when this call changed o (false: another pinner
 * had already verified or dropped it, or, for ok, it was dropped meanwhile).
 */
bool kvp_store_verified(struct kvp_store *s, struct kvp_obj *o, bool ok);

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
