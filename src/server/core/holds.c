/*
 * holds.c - an owner's reservations and pins (see holds.h).
 *
 * Design. A fixed array of KVP_MAX_HOLDS entries, allocated once per owner (at its first hold)
 * and searched linearly: a worker keeps a handful of holds at a time (one per transfer in flight),
 * so a scan is cheaper than any index, and the bound makes a client that never commits run out of
 * holds rather than daemon memory. Removal moves the last entry into the hole.
 *
 * Invariant: every object a hold lists is reserved (or pinned) on the hold's behalf until the
 * hold is committed, released or dropped; an owner that ends releases all of them, so a
 * dead worker never leaves anything reserved or pinned.
 *
 * Threads: a table is used by the thread serving its owner only.
 */
#include "core/holds.h"

#include <stdlib.h>
#include <string.h>

#include "core/stats.h"

void kvp_holds_init(struct kvp_holds *t, struct kvp_store *store)
{
    *t = (struct kvp_holds){.store = store};
}

void kvp_holds_destroy(struct kvp_holds *t)
{
    if (t->v)
        kvp_holds_release_all(t, 0, true, KVP_DROP_DISCONNECT);
    free(t->v);
    t->v = NULL;
}

bool kvp_holds_full(const struct kvp_holds *t)
{
    return t->n == KVP_MAX_HOLDS;
}

struct kvp_hold *kvp_holds_add(struct kvp_holds *t, uint32_t handle, bool is_pin,
                               struct kvp_obj *const *objs, uint32_t n, uint64_t chunk_bytes)
{
    if (kvp_holds_full(t))
        return NULL;
    /* A client that only looks up never pays for the table. */
    if (!t->v && !(t->v = malloc(sizeof(*t->v) * KVP_MAX_HOLDS)))
        return NULL;
    struct kvp_obj **copy = malloc(sizeof(*copy) * n);
    if (!copy)
        return NULL;
    memcpy(copy, objs, sizeof(*copy) * n);
    struct kvp_hold *h = &t->v[t->n++];
    *h = (struct kvp_hold){
        .id = ++t->next_id,
        .handle = handle,
        .is_pin = is_pin,
        .n = n,
        .chunk_bytes = chunk_bytes,
        .objs = copy,
    };
    return h;
}

struct kvp_hold *kvp_holds_find(struct kvp_holds *t, uint64_t id, uint32_t handle, bool is_pin)
{
    for (uint32_t i = 0; i < t->n; i++) {
        struct kvp_hold *h = &t->v[i];
        if (h->id == id && h->handle == handle && h->is_pin == is_pin)
            return h;
    }
    return NULL;
}

void kvp_holds_drop(struct kvp_holds *t, struct kvp_hold *h)
{
    free(h->objs);
    *h = t->v[--t->n];
}

/* Chunks that expired first were counted by the expiry (cause "timeout"): only those still
 * reserved are counted here, so each dropped chunk has exactly one cause. */
void kvp_holds_release(struct kvp_holds *t, struct kvp_hold *h, enum kvp_drop_cause why)
{
    if (h->is_pin) {
        kvp_store_unpin(t->store, h->objs, h->n);
    } else {
        uint32_t n = kvp_store_abort(t->store, h->objs, h->n);
        KVP_COUNT(store_chunks_aborted, n);
        if (why == KVP_DROP_UNREGISTER)
            KVP_COUNT(store_chunks_aborted_unregister, n);
        else if (why == KVP_DROP_DISCONNECT)
            KVP_COUNT(store_chunks_aborted_disconnect, n);
        else
            KVP_COUNT(store_chunks_aborted_abort, n);
    }
    kvp_holds_drop(t, h);
}

/* Backwards, so that the entry moved into a released slot has been visited already. */
void kvp_holds_release_all(struct kvp_holds *t, uint32_t handle, bool all, enum kvp_drop_cause why)
{
    for (uint32_t i = t->n; i-- > 0;)
        if (all || t->v[i].handle == handle)
            kvp_holds_release(t, &t->v[i], why);
}
