/*
 * ops.c - the operations of the daemon, under every protocol front end (ops.h is the contract).
 *
 * Design. Each operation takes an owner, a handle and a key source, checks them, derives the
 * keys, works on the store, the registry and the owner's holds, reads through or writes behind
 * to the L2 tier, counts, and returns: it never encodes and never sends. What used to be each
 * kvpool handler's middle is here, unchanged, so that a second front end gets the same rules
 * by calling the same function.
 *
 * Keys: computed in the calling thread without any lock, into the owner's scratch (o->keys);
 * only finished keys reach the store. The namespace (the chain's seed) comes from the
 * registration the handle names, and only an owner's own registrations are found, so a
 * namesake can never derive keys in another model's namespace. A sequence longer than
 * KVP_MAX_CHUNKS chunks is hashed in windows of that many keys.
 *
 * Fast paths: a prepare or retrieve is one registry copy, the hashing, one store call (one lock
 * hold) and, for a hold, one small allocation, as before this layer existed. Inline transfers
 * hand the front end iovecs over the pool: the bytes move between socket and pool with no copy
 * and no lock, the reservation or the pins keeping the slots the client's.
 *
 * Warm restart (warm_restart.h): when the store keeps an index, a commit first computes each
 * chunk's checksum (XXH3-64, kvp_widx_data_sum()) over the bytes of its reserved slot, without
 * the lock (the reservation keeps the slot the committer's: nobody else can publish it), and the
 * store seals it into the chunk's record; without an index nothing is hashed. Chunks adopted
 * from a previous daemon's pool are checked on their first read: every operation that pins
 * (prepare-retrieve, the inline retrieve, the pinning lookup LMCache's retrieves use, the pins
 * of chunks brought from L2) reads the bytes of the unverified ones, without the lock, against
 * the checksum recorded at commit. One that differs is dropped (never served; counted and
 * logged) and the caller gets the run of good chunks before it.
 *
 * Threads: any thread, one at a time per owner (owner.h). Locks: the store's and the registry's
 * leaf locks, each inside one call of store.c or registry.c; none is held on return.
 */
#include "core/ops.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "common/chunk_hash.h"
#include "common/layout.h"
#include "common/why.h"
#include "core/daemon.h"
#include "core/seg_guard.h"
#include "core/stats.h"
#include "core/warm_index.h"
#include "l2/l2.h"

/* ---- counting by transport ---- */

/* The counters of one transport (stats.h): every transfer and registration is counted under
 * the transport of the instance it concerns, so that each transport of registry.h has its own
 * rows and none is folded into another (an LMCache pickle commit is not an inline one). */
struct transport_counters {
    _Atomic uint64_t *registrations;
    _Atomic uint64_t *store_chunks, *store_bytes;
    _Atomic uint64_t *retrieve_chunks, *retrieve_bytes;
};

#define TRANSPORT_COUNTERS(t)                                                 \
    {                                                                         \
        &kvp_counters.registrations_##t, &kvp_counters.store_chunks_##t,      \
            &kvp_counters.store_bytes_##t, &kvp_counters.retrieve_chunks_##t, \
            &kvp_counters.retrieve_bytes_##t                                  \
    }

static const struct transport_counters by_transport[] = {
    [KVP_REG_SHM] = TRANSPORT_COUNTERS(shm),
    [KVP_REG_INLINE] = TRANSPORT_COUNTERS(inline),
    [KVP_REG_PICKLE] = TRANSPORT_COUNTERS(pickle),
    [KVP_REG_ENVELOPE] = TRANSPORT_COUNTERS(envelope),
};

/* The counters of transport; NULL for one that has none (KVP_REG_AUTO is never an instance's
 * transport: kvp_registry_choose_transport() has chosen by then). */
static const struct transport_counters *counters_of(uint8_t transport)
{
    if (transport >= sizeof(by_transport) / sizeof(by_transport[0]) ||
        !by_transport[transport].registrations)
        return NULL;
    return &by_transport[transport];
}

static void count(_Atomic uint64_t *c, uint64_t n)
{
    atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

/* A transfer of chunks (and their bytes) stored or retrieved on transport. */
static void count_transfer(uint8_t transport, bool store, uint64_t chunks, uint64_t bytes)
{
    const struct transport_counters *t = counters_of(transport);
    if (store)
        KVP_COUNT(store_chunks_committed, chunks);
    else
        KVP_COUNT(retrieve_chunks, chunks);
    if (!t)
        return;
    count(store ? t->store_chunks : t->retrieve_chunks, chunks);
    count(store ? t->store_bytes : t->retrieve_bytes, bytes);
}

/* ---- registration ---- */

int kvp_op_register(struct kvp_owner *o, const struct kvp_reg_spec *spec, const char *cannot_map,
                    struct kvp_registration *out, bool *existing, char *msg, size_t msg_size)
{
    struct kvp_registry *r = &o->srv->registry;
    struct kvp_registration inst;

    *existing = false;
    int rc = kvp_registry_validate(r, spec, &inst, msg, msg_size);
    if (rc == 0)
        rc = kvp_registry_choose_transport(r, &inst, cannot_map, msg, msg_size);
    if (rc) {
        log_warn_rl("Registration of instance '%s' refused: %s", spec->instance_id, msg);
        return rc;
    }
    /* The owner's pid is recorded so that a refused namesake learns who holds the id. */
    inst.owner = o->id;
    inst.owner_pid = o->pid;
    inst.connected_since_ms = o->connected_since_ms;
    memcpy(inst.frontend, o->frontend, sizeof(inst.frontend));
    rc = kvp_registry_add(r, &inst, o->max_instances, existing, msg, msg_size);
    if (rc) {
        log_warn("Registration of instance '%s' from pid %d refused: %s", spec->instance_id,
                 (int)o->pid, msg);
        return rc;
    }
    if (!*existing) {
        const struct transport_counters *t = counters_of(inst.transport);
        KVP_COUNT(registrations, 1);
        if (t)
            count(t->registrations, 1);
    }
    *out = inst;
    return 0;
}

int kvp_op_unregister(struct kvp_owner *o, uint32_t handle, char *msg, size_t msg_size)
{
    struct kvp_registration inst;

    kvp_holds_release_all(&o->holds, handle, false, KVP_DROP_UNREGISTER);
    /* Only the registering owner knows the handle legitimately, and only it ends the
     * instance. */
    if (kvp_registry_get_owned(&o->srv->registry, handle, o->id, &inst) ||
        kvp_registry_remove(&o->srv->registry, handle, "unregistered by worker"))
        return kvp_why(msg, msg_size, -ENOENT, "unknown instance handle 0x%08" PRIx32, handle);
    return 0;
}

int kvp_op_leave_shm(struct kvp_owner *o, uint32_t handle, uint8_t transport, const char *reason,
                     char *msg, size_t msg_size)
{
    if (transport != KVP_REG_INLINE && !kvp_reg_transport_in_band(transport))
        return kvp_why(msg, msg_size, -EINVAL,
                       "an instance leaves shm for inline, pickle or envelope only");
    int rc = kvp_registry_leave_shm(&o->srv->registry, handle, o->id, transport, reason);
    if (rc < 0)
        return kvp_why(msg, msg_size, rc, "unknown instance handle 0x%08" PRIx32, handle);
    return rc;
}

int kvp_op_instance(struct kvp_owner *o, uint32_t handle, struct kvp_registration *out, char *msg,
                    size_t msg_size)
{
    if (kvp_registry_get_owned(&o->srv->registry, handle, o->id, out))
        return kvp_why(msg, msg_size, -ENOENT, "unknown instance handle 0x%08" PRIx32, handle);
    return 0;
}

/* ---- keys ---- */

/* A checked keyed request: its instance, its range, and the keys of the range in o->keys. */
struct keyed {
    struct kvp_registration inst;
    uint32_t first; /* first chunk of the range */
    uint32_t n;     /* chunks whose keys o->keys holds */
    uint32_t total; /* lookup: full chunks of the whole sequence */
};

/* The limits of a key source, whatever the front end's decoder already bounded. */
static int check_src(const struct kvp_key_src *src, char *msg, size_t msg_size)
{
    if (!src->tokens_le == !src->chunk_ids && (src->tokens_le || src->nchunk_ids))
        return kvp_why(msg, msg_size, -EINVAL, "a request names its chunks by tokens or by ids");
    if (src->salt_len > KVP_MAX_SALT)
        return kvp_why(msg, msg_size, -EINVAL, "salt of %" PRIu32 " bytes exceeds %u",
                       src->salt_len, KVP_MAX_SALT);
    if (src->salt_len && !src->salt)
        return kvp_why(msg, msg_size, -EINVAL, "salt length without a salt");
    if (src->chunk_ids) {
        if (src->nchunk_ids > KVP_MAX_CHUNKS)
            return kvp_why(msg, msg_size, -E2BIG, "%" PRIu32 " chunk ids exceed %u",
                           src->nchunk_ids, KVP_MAX_CHUNKS);
        if (src->id_len < 1 || src->id_len > KVP_MAX_CHUNK_ID)
            return kvp_why(msg, msg_size, -EINVAL, "chunk id of %" PRIu32 " bytes (1 to %u)",
                           src->id_len, KVP_MAX_CHUNK_ID);
        return 0;
    }
    if (src->ntokens > KVP_MAX_TOKENS)
        return kvp_why(msg, msg_size, -E2BIG, "%" PRIu32 " token ids exceed %u", src->ntokens,
                       KVP_MAX_TOKENS);
    if (src->ntokens && !src->tokens_le)
        return kvp_why(msg, msg_size, -EINVAL, "token count without token ids");
    return 0;
}

/*
 * Checks a keyed request of owner o (its handle, its source, its range) and leaves the keys of
 * the range's first window in o->keys. whole_sequence: a lookup, which takes every full chunk
 * and is hashed in windows by its caller. Returns 0 or a negative errno with msg.
 */
static int keyed_prepare(struct kvp_owner *o, uint32_t handle, const struct kvp_key_src *src,
                         bool whole_sequence, struct keyed *k, char *msg, size_t msg_size)
{
    struct kvp_server *s = o->srv;
    uint32_t C = s->cfg.chunk_tokens;

    if (kvp_owner_alloc(o))
        return kvp_why(msg, msg_size, -ENOMEM, "out of memory for request buffers");
    /* The keys come from the registration the handle names, and only from one this owner
     * made: another owner's handle (guessed, or kept by a namesake) is unknown here. */
    if (kvp_registry_get_owned(&s->registry, handle, o->id, &k->inst))
        return kvp_why(msg, msg_size, -ENOENT, "unknown instance handle 0x%08" PRIx32, handle);
    int rc = check_src(src, msg, msg_size);
    if (rc)
        return rc;

    if (src->chunk_ids) {
        k->first = 0;
        k->n = k->total = src->nchunk_ids;
    } else {
        uint32_t start = whole_sequence ? 0 : src->start;
        uint32_t end = whole_sequence ? src->ntokens : src->end;
        rc = kvp_chunk_range(start, end, src->ntokens, C, whole_sequence ? 0 : KVP_MAX_CHUNKS,
                             &k->first, &k->n, msg, msg_size);
        if (rc)
            return rc;
        k->total = src->ntokens / C;
        if (k->n > KVP_MAX_CHUNKS)
            k->n = KVP_MAX_CHUNKS; /* lookup: counted in windows by the caller */
    }

    /* Without a salt the seed is the registration's; a salt makes a namespace of its own, and
     * so does another rank (never across models or layouts: the rest comes from inst). */
    if (src->other_rank && src->rank >= k->inst.spec.world_size)
        return kvp_why(msg, msg_size, -EINVAL, "rank %" PRIu32 " is not below world size %" PRIu32,
                       src->rank, k->inst.spec.world_size);
    bool other = src->other_rank && (k->inst.spec.use_mla || src->rank != k->inst.spec.worker_rank);
    uint8_t seed[KVP_KEY_SIZE];
    memcpy(seed, k->inst.seed, sizeof(seed));
    if (src->salt_len || other) {
        struct kvp_key_ns ns;
        kvp_registration_key_ns(&k->inst, src->salt, src->salt_len, &ns);
        if (other)
            ns.rank = src->rank;
        if (kvp_key_seed(&ns, seed))
            return kvp_why(msg, msg_size, -ENOMEM, "cannot initialise hashing");
    }
    if (src->chunk_ids) {
        kvp_key_ids(seed, src->chunk_ids, src->id_len, k->n, o->keys);
        return 0;
    }
    /* Chain through the prefix before the range in windows, keeping only the last key. */
    for (uint32_t done = 0; done < k->first;) {
        uint32_t w = k->first - done < KVP_MAX_CHUNKS ? k->first - done : KVP_MAX_CHUNKS;
        kvp_key_chain(seed, src->tokens_le + (size_t)done * C * 4, C, w, o->keys);
        memcpy(seed, o->keys + (size_t)(w - 1) * KVP_KEY_SIZE, KVP_KEY_SIZE);
        done += w;
    }
    kvp_key_chain(seed, src->tokens_le + (size_t)k->first * C * 4, C, k->n, o->keys);
    return 0;
}

/* ---- warm restart: checksums at commit, checks at the first read ---- */

/*
 * Checks the unverified (adopted) objects among objs[0..n), which the caller has pinned, against
 * their checksums, without the lock. At the first that differs, it is dropped and it and every
 * later one unpinned: returns the length of the good run, which the caller keeps pinned.
 */
static uint32_t verify_pinned(struct kvp_server *s, struct kvp_obj **objs, uint32_t n)
{
    if (kvp_store_unverified(&s->store) == 0)
        return n;
    for (uint32_t i = 0; i < n; i++) {
        struct kvp_obj *obj = objs[i];
        if (!kvp_obj_unverified(obj))
            continue;
        /* The pin keeps its bytes where they are; offset, length and sum never change. */
        bool ok = kvp_widx_data_sum(s->seg.base + obj->offset, obj->length) == obj->sum;
        bool changed = kvp_store_verified(&s->store, obj, ok);
        if (ok)
            continue;
        if (changed)
            log_warn_rl("Dropped a chunk adopted from the previous kvpoold's pool (offset %" PRIu64
                        ", %" PRIu64 " bytes): its bytes differ from those committed",
                        obj->offset, obj->length);
        kvp_store_unpin(&s->store, objs + i, n - i);
        return i;
    }
    return n;
}

/* kvp_store_pin() of the leading run of keys, then verify_pinned(): the run of good chunks. */
static uint32_t pin_verified(struct kvp_server *s, const uint8_t *keys, uint32_t n,
                             struct kvp_obj **objs)
{
    return verify_pinned(s, objs, kvp_store_pin(&s->store, keys, n, objs));
}

/* Before a commit with an index: each reserved object's checksum, for its record. */
static void sum_reserved(struct kvp_server *s, struct kvp_obj **objs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        objs[i]->sum = kvp_widx_data_sum(s->seg.base + objs[i]->offset, objs[i]->length);
}

/* ---- the L2 tier (l2.h): called only when it is on ---- */

/*
 * The chunks after the L1 run that L2 has (they start loading into L1). The run ended in the
 * window of keys o->keys holds: chunks [win, win + k->n) of the sequence.
 */
static uint32_t lookup_l2(struct kvp_owner *o, const struct keyed *k, uint32_t win, uint32_t cached)
{
    struct kvp_l2_layout lay;
    if (!o->srv->l2 || cached < win || cached >= win + k->n)
        return 0;
    kvp_l2_layout_of(&k->inst, &lay);
    return kvp_l2_lookup(o->srv->l2, o->keys + (size_t)(cached - win) * KVP_KEY_SIZE,
                         win + k->n - cached, &lay);
}

/*
 * The chunks after the first n (the run pinned from L1) that L2 has: loaded into L1 (or waited
 * for) by kvp_l2_fetch(), then pinned into o->objs after the others, so that they are served
 * as if they had been in L1. Returns how many were added.
 */
static uint32_t retrieve_l2(struct kvp_owner *o, const struct keyed *k, uint32_t n)
{
    struct kvp_server *s = o->srv;
    struct kvp_l2_layout lay;
    if (!s->l2 || n >= k->n)
        return 0;
    kvp_l2_layout_of(&k->inst, &lay);
    const uint8_t *keys = o->keys + (size_t)n * KVP_KEY_SIZE;
    uint32_t got = kvp_l2_fetch(s->l2, keys, k->n - n, &lay);
    return got ? pin_verified(s, keys, got, o->objs + n) : 0;
}

/* Before a commit: the keys of the hold's chunks, copied into o->keys for the copies to L2
 * (once committed, the objects may be evicted at any moment). Returns how many. */
static uint32_t l2_keys_of(struct kvp_owner *o, const struct kvp_hold *hold)
{
    if (!o->srv->l2 || kvp_owner_alloc(o))
        return 0;
    for (uint32_t i = 0; i < hold->n; i++)
        memcpy(o->keys + (size_t)i * KVP_KEY_SIZE, hold->objs[i]->key, KVP_KEY_SIZE);
    return hold->n;
}

/* After a commit: the n chunks whose keys l2_keys_of() saved are queued for L2. */
static void l2_stored(struct kvp_owner *o, uint32_t handle, uint32_t n)
{
    struct kvp_registration inst;
    struct kvp_l2_layout lay;
    if (!n || kvp_registry_get_owned(&o->srv->registry, handle, o->id, &inst))
        return;
    kvp_l2_layout_of(&inst, &lay);
    kvp_l2_stored(o->srv->l2, o->keys, n, &lay);
}

/* ---- lookup ---- */

/* The L1 run of the first window, pinned as a hold for a later retrieve. */
static int lookup_pin(struct kvp_owner *o, const struct keyed *k, struct kvp_op_slots *res,
                      uint32_t *cached, char *msg, size_t msg_size)
{
    struct kvp_store *st = &o->srv->store;
    if (kvp_holds_full(&o->holds))
        return kvp_why(msg, msg_size, -EMFILE, "too many open reservations and pins (max %d)",
                       KVP_MAX_HOLDS);
    *cached = pin_verified(o->srv, o->keys, k->n, o->objs);
    if (*cached) {
        struct kvp_hold *hold = kvp_holds_add(&o->holds, k->inst.handle, true, o->objs, *cached,
                                              k->inst.layout.bytes);
        if (!hold) {
            kvp_store_unpin(st, o->objs, *cached);
            return kvp_why(msg, msg_size, -ENOMEM, "out of memory while pinning");
        }
        res->id = hold->id;
        res->nslots = *cached;
        res->objs = o->objs;
    }
    return 0;
}

int kvp_op_lookup(struct kvp_owner *o, uint32_t handle, const struct kvp_key_src *src,
                  unsigned flags, struct kvp_op_slots *res, char *msg, size_t msg_size)
{
    struct kvp_server *s = o->srv;
    struct keyed k;

    *res = (struct kvp_op_slots){.id = 0};
    int rc = keyed_prepare(o, handle, src, true, &k, msg, msg_size);
    if (rc)
        return rc;
    res->chunk_bytes = k.inst.layout.bytes;

    uint32_t C = s->cfg.chunk_tokens, cached = 0, win = 0;
    if (flags & KVP_LOOKUP_PIN) {
        rc = lookup_pin(o, &k, res, &cached, msg, msg_size);
        if (rc)
            return rc;
    } else {
        cached = kvp_store_lookup(&s->store, o->keys, k.n);
    }
    /* Sequences longer than one window: continue the chain while every chunk hits. */
    for (uint32_t done = k.n; cached == done && done < k.total; done += k.n) {
        uint8_t seed[KVP_KEY_SIZE];
        memcpy(seed, o->keys + (size_t)(k.n - 1) * KVP_KEY_SIZE, KVP_KEY_SIZE);
        k.n = k.total - done < KVP_MAX_CHUNKS ? k.total - done : KVP_MAX_CHUNKS;
        kvp_key_chain(seed, src->tokens_le + (size_t)done * C * 4, C, k.n, o->keys);
        win = done;
        cached += kvp_store_lookup(&s->store, o->keys, k.n);
    }
    cached += lookup_l2(o, &k, win, cached);
    KVP_COUNT(lookups, 1);
    KVP_COUNT(lookup_chunks, k.total);
    KVP_COUNT(lookup_hit_chunks, cached);
    res->nchunks = k.total;
    res->cached = cached;
    return 0;
}

/* ---- store ---- */

int kvp_op_prepare_store(struct kvp_owner *o, uint32_t handle, const struct kvp_key_src *src,
                         struct kvp_op_slots *res, char *msg, size_t msg_size)
{
    struct kvp_server *s = o->srv;
    struct kvp_prepare_result pr;
    struct keyed k;

    *res = (struct kvp_op_slots){.id = 0};
    int rc = keyed_prepare(o, handle, src, false, &k, msg, msg_size);
    if (rc)
        return rc;
    if (kvp_holds_full(&o->holds))
        return kvp_why(msg, msg_size, -EMFILE, "too many open reservations and pins (max %d)",
                       KVP_MAX_HOLDS);
    rc = kvp_store_prepare(&s->store, o->keys, k.n, k.inst.layout.bytes, kvp_mono_ms(), o->objs,
                           o->idx, &pr);
    if (rc)
        return kvp_why(msg, msg_size, rc, "out of memory while reserving");
    if (pr.nslots) {
        struct kvp_hold *hold = kvp_holds_add(&o->holds, k.inst.handle, false, o->objs, pr.nslots,
                                              k.inst.layout.bytes);
        if (!hold) {
            kvp_store_abort(&s->store, o->objs, pr.nslots);
            return kvp_why(msg, msg_size, -ENOMEM, "out of memory while reserving");
        }
        res->id = hold->id;
    }
    KVP_COUNT(store_chunks_reserved, pr.nslots);
    KVP_COUNT(store_chunks_cached, pr.cached);
    KVP_COUNT(store_chunks_busy, pr.busy);
    KVP_COUNT(store_chunks_no_space, pr.no_space);
    if (pr.no_space)
        log_debug("Instance %s: %" PRIu32 " of %" PRIu32 " chunks not stored: pool full of "
                  "pinned or reserved data",
                  k.inst.spec.instance_id, pr.no_space, k.n);
    res->nchunks = k.n;
    res->cached = pr.cached;
    res->busy = pr.busy;
    res->no_space = pr.no_space;
    res->nslots = pr.nslots;
    res->objs = o->objs;
    res->idx = o->idx;
    res->chunk_bytes = k.inst.layout.bytes;
    return 0;
}

/* Publishes a reservation of an instance on transport and ends the hold. Returns the count or
 * -ETIMEDOUT. */
static int commit_hold(struct kvp_owner *o, struct kvp_hold *hold, uint8_t transport, char *msg,
                       size_t msg_size)
{
    uint64_t id = hold->id, chunk_bytes = hold->chunk_bytes;
    uint32_t handle = hold->handle;
    uint32_t nkeys = l2_keys_of(o, hold);
    struct kvp_store *st = &o->srv->store;
    /* Only with an index: without one, a commit stays metadata work. */
    if (kvp_store_indexed(st))
        sum_reserved(o->srv, hold->objs, hold->n);
    int rc = kvp_store_commit_sealed(st, hold->objs, hold->n);
    kvp_holds_drop(&o->holds, hold);
    if (rc < 0)
        return kvp_why(msg, msg_size, rc,
                       "reservation %" PRIu64 " expired before commit; nothing "
                       "stored",
                       id);
    uint64_t bytes = (uint64_t)rc * chunk_bytes;
    count_transfer(transport, true, (uint64_t)rc, bytes);
    kvp_registry_count_io(&o->srv->registry, handle, true, (uint64_t)rc, bytes);
    l2_stored(o, handle, nkeys);
    return rc;
}

static struct kvp_hold *find_reservation(struct kvp_owner *o, uint32_t handle, uint64_t id,
                                         char *msg, size_t msg_size)
{
    struct kvp_hold *hold = kvp_holds_find(&o->holds, id, handle, false);
    if (!hold)
        kvp_why(msg, msg_size, -ENOENT,
                "no reservation %" PRIu64 " for this instance of this client", id);
    return hold;
}

int kvp_op_commit_store(struct kvp_owner *o, uint32_t handle, uint64_t id, enum kvp_via via,
                        char *msg, size_t msg_size)
{
    struct kvp_hold *hold = find_reservation(o, handle, id, msg, msg_size);
    if (!hold)
        return -ENOENT;
    /* The instance's transport, for the checks and the counters; an instance gone meanwhile
     * (its holds go with it, so only in a race) is counted by how the bytes came. */
    struct kvp_registration inst;
    bool known = kvp_registry_get_owned(&o->srv->registry, handle, o->id, &inst) == 0;
    uint8_t transport = known ? inst.transport
                              : (via == KVP_VIA_INLINE ? KVP_REG_INLINE : KVP_REG_SHM);
    /* An inline worker has no pointers into the pool, so nothing wrote its slots: publishing
     * them would serve stale bytes (of evicted chunks, maybe of another salt) under its keys.
     * The reservation is dropped, as the client library forgets the plan after any commit. */
    if (via == KVP_VIA_SHM && known && inst.transport != KVP_REG_SHM) {
        kvp_holds_release(&o->holds, hold, KVP_DROP_ABORT);
        return kvp_why(msg, msg_size, -EOPNOTSUPP,
                       "instance %s uses the inline transport: its data must be sent inline; "
                       "reservation %" PRIu64 " dropped",
                       inst.spec.instance_id, id);
    }
    /* Once the segment is lost (seg_guard.h), bytes written through a mapping of it never
     * reached the pool the daemon now uses: nothing of such a commit may be published. */
    if (via == KVP_VIA_SHM && kvp_seg_guard_tripped()) {
        kvp_holds_release(&o->holds, hold, KVP_DROP_ABORT);
        return kvp_why(msg, msg_size, -EOPNOTSUPP,
                       "the shared segment is lost: data written through it cannot be stored; "
                       "reservation %" PRIu64 " dropped",
                       id);
    }
    return commit_hold(o, hold, transport, msg, msg_size);
}

int kvp_op_abort_store(struct kvp_owner *o, uint32_t handle, uint64_t id, enum kvp_drop_cause why,
                       char *msg, size_t msg_size)
{
    struct kvp_hold *hold = find_reservation(o, handle, id, msg, msg_size);
    if (!hold)
        return -ENOENT;
    uint32_t n = hold->n;
    kvp_holds_release(&o->holds, hold, why);
    return (int)n;
}

int kvp_op_store_inline_begin(struct kvp_owner *o, uint32_t handle, uint64_t id,
                              uint64_t payload_len, struct kvp_op_slots *res, char *msg,
                              size_t msg_size)
{
    *res = (struct kvp_op_slots){.id = 0};
    if (kvp_owner_alloc(o))
        return kvp_why(msg, msg_size, -ENOMEM, "out of memory for request buffers");
    struct kvp_hold *hold = find_reservation(o, handle, id, msg, msg_size);
    if (!hold)
        return -ENOENT;
    uint64_t want = (uint64_t)hold->n * hold->chunk_bytes;
    if (payload_len != want) {
        kvp_holds_release(&o->holds, hold, KVP_DROP_ABORT);
        return kvp_why(msg, msg_size, -EINVAL,
                       "payload of %" PRIu64 " bytes; reservation %" PRIu64 " needs %" PRIu64,
                       payload_len, id, want);
    }
    /* Straight into the reserved slots: the hold keeps them the client's, no lock needed. */
    uint8_t *base = o->srv->seg.base;
    for (uint32_t i = 0; i < hold->n; i++)
        o->iov[i] = (struct iovec){base + hold->objs[i]->offset, hold->chunk_bytes};
    res->id = id;
    res->nchunks = hold->n;
    res->nslots = hold->n;
    res->objs = hold->objs;
    res->iov = o->iov;
    res->chunk_bytes = hold->chunk_bytes;
    return 0;
}

/* ---- retrieve ---- */

int kvp_op_prepare_retrieve(struct kvp_owner *o, uint32_t handle, const struct kvp_key_src *src,
                            struct kvp_op_slots *res, char *msg, size_t msg_size)
{
    struct kvp_server *s = o->srv;
    struct keyed k;

    *res = (struct kvp_op_slots){.id = 0};
    int rc = keyed_prepare(o, handle, src, false, &k, msg, msg_size);
    if (rc)
        return rc;
    if (k.inst.transport != KVP_REG_SHM)
        return kvp_why(msg, msg_size, -EOPNOTSUPP,
                       "instance %s uses the inline transport; its chunks are retrieved inline",
                       k.inst.spec.instance_id);
    if (kvp_holds_full(&o->holds))
        return kvp_why(msg, msg_size, -EMFILE, "too many open reservations and pins (max %d)",
                       KVP_MAX_HOLDS);
    uint32_t n = pin_verified(s, o->keys, k.n, o->objs);
    n += retrieve_l2(o, &k, n);
    if (n) {
        struct kvp_hold *hold = kvp_holds_add(&o->holds, k.inst.handle, true, o->objs, n,
                                              k.inst.layout.bytes);
        if (!hold) {
            kvp_store_unpin(&s->store, o->objs, n);
            return kvp_why(msg, msg_size, -ENOMEM, "out of memory while pinning");
        }
        res->id = hold->id;
    }
    /* Counted when pinned: the worker copies the bytes out of the mapping by itself. */
    uint64_t bytes = (uint64_t)n * k.inst.layout.bytes;
    count_transfer(k.inst.transport, false, n, bytes);
    kvp_registry_count_io(&s->registry, k.inst.handle, false, n, bytes);
    res->nchunks = k.n;
    res->nslots = n;
    res->objs = o->objs;
    res->chunk_bytes = k.inst.layout.bytes;
    return 0;
}

int kvp_op_commit_retrieve(struct kvp_owner *o, uint32_t handle, uint64_t id, char *msg,
                           size_t msg_size)
{
    struct kvp_hold *hold = kvp_holds_find(&o->holds, id, handle, true);
    if (!hold)
        return kvp_why(msg, msg_size, -ENOENT,
                       "no pin %" PRIu64 " for this instance of this client", id);
    uint32_t n = hold->n;
    kvp_holds_release(&o->holds, hold, KVP_DROP_ABORT); /* a pin set: nothing is dropped */
    return (int)n;
}

int kvp_op_retrieve_inline_begin(struct kvp_owner *o, uint32_t handle,
                                 const struct kvp_key_src *src, struct kvp_op_slots *res, char *msg,
                                 size_t msg_size)
{
    struct kvp_server *s = o->srv;
    struct keyed k;

    *res = (struct kvp_op_slots){.id = 0};
    int rc = keyed_prepare(o, handle, src, false, &k, msg, msg_size);
    if (rc)
        return rc;
    uint32_t n = pin_verified(s, o->keys, k.n, o->objs);
    n += retrieve_l2(o, &k, n);
    /* The pins keep the objects from eviction while the bytes go out unlocked. */
    for (uint32_t i = 0; i < n; i++)
        o->iov[i] = (struct iovec){s->seg.base + o->objs[i]->offset, o->objs[i]->length};
    res->nchunks = k.n;
    res->nslots = n;
    res->objs = o->objs;
    res->iov = o->iov;
    res->chunk_bytes = k.inst.layout.bytes;
    res->transport = k.inst.transport;
    return 0;
}

void kvp_op_retrieve_inline_end(struct kvp_owner *o, uint32_t handle, struct kvp_op_slots *res,
                                bool sent)
{
    uint32_t n = res->nslots;
    kvp_store_unpin(&o->srv->store, res->objs, n);
    res->nslots = 0;
    if (!sent)
        return;
    uint64_t bytes = (uint64_t)n * res->chunk_bytes;
    count_transfer(res->transport, false, n, bytes);
    KVP_COUNT(inline_bytes_out, bytes);
    kvp_registry_count_io(&o->srv->registry, handle, false, n, bytes);
}

/* ---- the whole daemon ---- */

void kvp_op_clear(struct kvp_owner *o, struct kvp_clear_result *res)
{
    kvp_store_clear(&o->srv->store, res);
    log_info("Cleared %" PRIu64 " committed objects (%" PRIu64 " bytes) at the request of pid %d; "
             "%" PRIu64 " pinned objects kept",
             res->dropped, res->bytes, (int)o->pid, res->pinned);
}

int kvp_op_stats(struct kvp_owner *o, struct kvp_snapshot *snap, char *msg, size_t msg_size)
{
    if (kvp_snapshot_take(o->srv, 0, snap))
        return kvp_why(msg, msg_size, -ENOMEM, "out of memory while collecting statistics");
    return 0;
}
