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
 * object. Only COMMITTED objects are visible; pinned ones (pins > 0) are never evicted.
 *
 * Every function takes the store lock itself (the do_* helpers in store.c expect it held).
 * Callers hold no other lock when calling in. Object pointers handed out by prepare and pin stay
 * valid until the matching commit/abort/unpin.
 */
#ifndef KVP_STORE_H
#define KVP_STORE_H

#include <pthread.h>
#include <stdint.h>

#include "common/chunk_hash.h"
#include "core/pool.h"

enum kvp_obj_state { KVP_OBJ_RESERVED, KVP_OBJ_COMMITTED, KVP_OBJ_EXPIRED };

struct kvp_obj {
    uint8_t key[KVP_KEY_SIZE];
    uint64_t offset; /* byte offset in the segment */
    uint64_t length;
    uint64_t reserved_at_ms;
    uint32_t pins;
    uint64_t seen_in; /* last prepare that reported it cached (protects it there) */
    uint8_t state;
    struct kvp_obj *hnext; /* index chain */
    struct kvp_obj *prev;  /* COMMITTED: LRU list; RESERVED/EXPIRED: pending list */
    struct kvp_obj *next;
};

struct kvp_store {
    pthread_mutex_t lock;
    struct kvp_pool pool;
    struct kvp_obj **buckets;
    uint64_t mask;
    struct kvp_obj lru;     /* sentinel; lru.next is the most recently used */
    struct kvp_obj pending; /* sentinel of RESERVED and EXPIRED objects */
    uint64_t ncommitted, nreserved, nexpired, npinned;
    uint64_t prepare_seq; /* numbers prepares, for kvp_obj.seen_in */
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
 * k < res->nslots. After the first chunk that cannot get space, every later chunk that needs
 * space counts as no_space (later cached or busy ones are still reported as such). Returns 0,
 * or -ENOMEM (nothing reserved).
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

/* What kvp_store_clear() did. */
struct kvp_clear_result {
    uint64_t dropped; /* committed objects freed */
    uint64_t bytes;   /* their bytes */
    uint64_t pinned;  /* committed objects kept because a retrieve pins them */
};

/*
 * Frees every committed object that nobody pins, as if each were evicted (CLEAR). Reserved
 * and expired objects belong to stores in progress and are not touched; pinned objects stay
 * until their last unpin and remain visible. One lock hold: a concurrent store or lookup sees
 * the store before or after, never in between.
 */
void kvp_store_clear(struct kvp_store *s, struct kvp_clear_result *res);

#endif /* KVP_STORE_H */
