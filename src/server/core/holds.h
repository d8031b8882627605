/*
 * holds.h - the reservations and pins ("holds") one owner (a client) has.
 *
 * A hold is what a prepare hands out and a commit, abort or disconnect ends: a reservation
 * (prepare-store: reserved objects to publish or abort) or a pin set (prepare-retrieve: committed
 * objects that eviction must skip). The table belongs to one owner (owner.h) and is used by the
 * thread serving it only, so it has no lock; the store calls it makes take the store's lock.
 */
#ifndef KVP_HOLDS_H
#define KVP_HOLDS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/store.h"

/* Why a reservation ends without being published: the counter its chunks are reported in
 * (kvpool_reserved_chunks_dropped_total{cause}; the fourth cause, timeout, is the expiry's). */
enum kvp_drop_cause {
    KVP_DROP_ABORT,      /* ABORT_STORE, or a store the daemon refused to complete */
    KVP_DROP_UNREGISTER, /* the instance was unregistered */
    KVP_DROP_DISCONNECT, /* the connection closed (or failed mid-transfer) */
};

/* Holds one connection may have at once; a prepare beyond that is refused with -EMFILE. */
#define KVP_MAX_HOLDS 1024

/* A reservation (prepare-store) or a pin set (prepare-retrieve) owned by one connection. */
struct kvp_hold {
    uint64_t id;
    uint32_t handle; /* instance it was made for */
    bool is_pin;
    uint32_t n;
    uint64_t chunk_bytes;
    struct kvp_obj **objs;
};

struct kvp_holds {
    struct kvp_store *store; /* where releases go */
    struct kvp_hold *v;      /* KVP_MAX_HOLDS entries, unordered */
    uint32_t n;
    uint64_t next_id; /* ids are unique per connection, never reused */
};

/* An empty table over store. Allocates nothing: the entries come with the first hold. */
void kvp_holds_init(struct kvp_holds *t, struct kvp_store *store);

/* Releases every hold, then frees the table. Safe on a zeroed or half-built table. */
void kvp_holds_destroy(struct kvp_holds *t);

/* True when no other hold fits. */
bool kvp_holds_full(const struct kvp_holds *t);

/*
 * Records a hold of objs[0..n) (copied) for instance handle. Returns it, or NULL when the table
 * is full or out of memory (the first hold allocates the table): the caller then undoes the
 * store side.
 */
struct kvp_hold *kvp_holds_add(struct kvp_holds *t, uint32_t handle, bool is_pin,
                               struct kvp_obj *const *objs, uint32_t n, uint64_t chunk_bytes);

/* The hold with this id, handle and kind, or NULL: a pin id never commits a store. */
struct kvp_hold *kvp_holds_find(struct kvp_holds *t, uint64_t id, uint32_t handle, bool is_pin);

/* Removes a hold whose objects were already committed. h is invalid afterwards. */
void kvp_holds_drop(struct kvp_holds *t, struct kvp_hold *h);

/* Releases (aborts a reservation, counted under why; unpins a pin set) and removes a hold. */
void kvp_holds_release(struct kvp_holds *t, struct kvp_hold *h, enum kvp_drop_cause why);

/* Releases every hold of instance handle, or every hold when all is true. */
void kvp_holds_release_all(struct kvp_holds *t, uint32_t handle, bool all, enum kvp_drop_cause why);

#endif /* KVP_HOLDS_H */
