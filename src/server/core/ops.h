/*
 * ops.h - the operations of the daemon, under every protocol front end.
 *
 * This is the contract a front end codes to. kvpool's own protocol (kvp/handlers.c) and
 * LMCache's (lmc/) are codecs over it: each decodes a request, calls one operation, encodes the
 * result, and does its own I/O. The core decides everything else:
 *
 *   - Keys. A front end never hands the core a key. It passes where the keys come from
 *     (struct kvp_key_src: token ids with a salt and a range, or opaque per-chunk ids), and the
 *     core derives the keys in the namespace of the registration the handle names (model,
 *     world size, rank, dtype, layout, salt). So no front end can read or write another
 *     model's chunks, whatever it sends.
 *   - Validation and limits. Every count, length and range is checked here (KVP_MAX_TOKENS,
 *     KVP_MAX_SALT, KVP_MAX_CHUNKS, KVP_MAX_CHUNK_ID, KVP_MAX_HOLDS, the instance table, the
 *     per-owner instance limit), whatever the front end's decoder already bounded.
 *   - Ownership. Every operation acts for an owner (owner.h). A handle is only valid for the
 *     owner that registered it (another owner's handle is -ENOENT); holds (reservation and pin
 *     ids) belong to one owner. When the client goes away the front end calls
 *     kvp_owner_release() or kvp_owner_destroy(): reservations are aborted, pins dropped,
 *     instances unregistered.
 *   - The L2 tier. Lookups and retrieves read through it, commits write behind to it, inside
 *     the operations; a front end never calls l2.h.
 *   - Counters (stats.h), per-instance transfer counts and the log lines of refusals.
 *
 * Returns. Every operation returns 0 (or a count, where said) on success and a negative errno on
 * failure, with a message for the client in msg (msg_size bytes, NUL-terminated, at most
 * KVP_MAX_ERRMSG characters are useful): the front end sends the errno and the message in its
 * own error format. A failure leaves nothing held on the client's behalf unless said. The
 * operations never encode and never send; no lock is held when they return.
 *
 * Results. Slots are objects of the pool (struct kvp_obj: offset and length in the segment).
 * The arrays a result points to (objs, idx, iov) are the owner's scratch: valid until the
 * owner's next operation. An object stays valid, and its bytes stay put, while the hold that
 * covers it lives (until commit, abort, unpin, or the owner's release).
 *
 * Transfers. Shared memory: the worker writes into (reads from) the slots itself, between a
 * prepare and its commit. Inline: the front end moves the bytes between its socket and the
 * slots through the iovecs the *_inline_begin operations return, without any lock and without a
 * copy; the pins or the reservation keep the slots the client's meanwhile.
 *
 * Threads. The operations of one owner are called by one thread at a time (its holds and
 * scratch have no lock); different owners run in parallel. Each operation takes the store's
 * and the registry's leaf locks only around metadata work, never across I/O or hashing.
 */
#ifndef KVP_OPS_H
#define KVP_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "core/holds.h"
#include "core/owner.h"
#include "core/registry.h"
#include "core/snapshot.h"
#include "core/store.h"

/* Longest opaque chunk id (struct kvp_key_src.chunk_ids) in bytes. */
#define KVP_MAX_CHUNK_ID 64u

/*
 * Where the keys of a request come from: exactly one of token ids or chunk ids.
 *
 * Token ids (kvpool's protocol): the whole token prefix up to the end of the range, as
 * little-endian uint32 (ntokens <= KVP_MAX_TOKENS), and the token range [start, end) whose
 * full chunks the request concerns (docs/PROTOCOL.md, "Chunk ranges"; at most KVP_MAX_CHUNKS
 * chunks). The keys are the hash chain of chunk_hash.h: chunk i's key covers every token up to
 * its end. A lookup ignores start and end and takes the whole sequence.
 *
 * Chunk ids (for a protocol that names chunks by its own hashes, such as LMCache's): nchunk_ids
 * ids of id_len bytes each (1..KVP_MAX_CHUNK_ID; at most KVP_MAX_CHUNKS ids), one per chunk, in
 * sequence order. Chunk i's key is BLAKE2b-256 keyed with the namespace's seed over id i: the
 * ids are not chained (a protocol's own hashes already cover the prefix), but the namespace
 * still comes from the registration.
 *
 * Either way an optional salt (salt_len <= KVP_MAX_SALT) makes a namespace of its own, and
 * other_rank names another rank of the registration's world size.
 */
struct kvp_key_src {
    const uint8_t *tokens_le; /* token ids, or NULL for chunk ids */
    uint32_t ntokens;
    uint32_t start, end;
    const uint8_t *chunk_ids; /* or NULL for token ids */
    uint32_t nchunk_ids;
    uint32_t id_len;
    const void *salt;
    uint32_t salt_len;
    /* The keys of rank `rank` of the registration's model and layout (a tensor-parallel
     * peer's chunks: a lookup that must find every rank's, a protocol whose requests name
     * their rank) instead of the registration's own; rank < world size. The rank is then part
     * of every key, whatever the layout: LMCache keys each chunk by the worker that names it,
     * and a single-plane layout ("use_mla") is MLA or a fused K/V format of a GQA model, whose
     * ranks hold different heads; LMCache's MLA workers name one rank for their replicas
     * themselves. (kvpool's own protocol shares an MLA layout's chunks across ranks.) */
    bool other_rank;
    uint32_t rank;
};

/* How the bytes of a commit travelled: a commit "via shm" of an instance not on shm is refused.
 * The counters follow the instance's transport (shm, inline, pickle, envelope), not this. */
enum kvp_via { KVP_VIA_SHM, KVP_VIA_INLINE };

/* What a prepare, an inline begin or a lookup made. Arrays are the owner's scratch. */
struct kvp_op_slots {
    uint64_t id;       /* the hold (reservation or pin set) for a later commit; 0: none */
    uint32_t nchunks;  /* chunks in the range (a lookup: full chunks of the sequence) */
    uint32_t cached;   /* prepare-store: chunks already stored; lookup: the leading run found */
    uint32_t busy;     /* prepare-store: chunks another client is storing */
    uint32_t no_space; /* prepare-store: chunks that found no room (pinned or reserved pool) */
    uint32_t nslots;   /* objects reserved or pinned, objs[0..nslots) */
    struct kvp_obj **objs;
    const uint32_t *idx;  /* prepare-store: chunk index in the range of slot k; else NULL (k) */
    struct iovec *iov;    /* inline begins: nslots iovecs over the slots' bytes; else NULL */
    uint64_t chunk_bytes; /* bytes of each slot (the instance's chunk) */
    uint8_t transport;    /* retrieve-inline begins: the instance's (what the end counts under) */
};

/* Flags of kvp_op_lookup(). */
#define KVP_LOOKUP_PIN                                                      \
    1u /* also pin the chunks found in L1 (at most KVP_MAX_CHUNKS, from the \
          first) as a pin set, ended by kvp_op_commit_retrieve() */

/*
 * Registers the instance spec describes for owner o, or gives o its own registration back
 * (*existing true). Validates every field, decides the transport, enforces the per-owner limit
 * and the table's size. Fills *out (a copy; the handle is out->handle). Returns 0, -EINVAL (a
 * field, named in msg), -EOPNOTSUPP (shm asked, none here), -EEXIST (the id is registered with
 * another layout), -EBUSY (by another owner), -EDQUOT (o has --max-instances-per-client),
 * -ENOSPC (the table is full) or -ENOMEM. Refusals are logged.
 *
 * cannot_map: NULL when the front end has evidence that the worker can map the segment
 * (kvp_transport_peer_can_map()), else why it cannot: a claim of shm is then overruled to
 * inline with that reason, so that the worker never publishes a slot it could not have written.
 */
int kvp_op_register(struct kvp_owner *o, const struct kvp_reg_spec *spec, const char *cannot_map,
                    struct kvp_registration *out, bool *existing, char *msg, size_t msg_size);

/*
 * o's instance handle stops using the shared-memory segment: its worker turned out unable to
 * map it and moves its chunks through the front end (transport KVP_REG_INLINE, KVP_REG_PICKLE
 * or KVP_REG_ENVELOPE, with reason for the reports). Returns 1 (moved, logged), 0 (not on shm) or
 * -ENOENT.
 */
int kvp_op_leave_shm(struct kvp_owner *o, uint32_t handle, uint8_t transport, const char *reason,
                     char *msg, size_t msg_size);

/* Ends o's instance handle: its reservations are aborted and its pins dropped first. Returns 0
 * or -ENOENT (not o's). */
int kvp_op_unregister(struct kvp_owner *o, uint32_t handle, char *msg, size_t msg_size);

/* Copies o's instance handle. Returns 0 or -ENOENT (unknown, or another owner's). */
int kvp_op_instance(struct kvp_owner *o, uint32_t handle, struct kvp_registration *out, char *msg,
                    size_t msg_size);

/*
 * How many leading chunks of the sequence are cached: res->nchunks full chunks, res->cached of
 * them found (in L1, then in L2, which starts loading them into L1). With KVP_LOOKUP_PIN the
 * chunks found in L1 are also pinned (res->id, res->objs, res->nslots). Returns 0, -ENOENT,
 * -EINVAL / -E2BIG (bad source, named in msg), -EMFILE (too many holds, with PIN), -ENOMEM.
 */
int kvp_op_lookup(struct kvp_owner *o, uint32_t handle, const struct kvp_key_src *src,
                  unsigned flags, struct kvp_op_slots *res, char *msg, size_t msg_size);

/*
 * Reserves slots for the range's chunks that are neither stored nor being stored, evicting
 * unpinned LRU chunks for room. res->objs/idx/nslots are the reservations (res->id, 0 if none);
 * cached, busy and no_space count the others. Nothing is visible until kvp_op_commit_store().
 * Returns 0, -ENOENT, -EINVAL / -E2BIG (bad source or range), -EMFILE (o has KVP_MAX_HOLDS
 * holds), -ENOMEM.
 */
int kvp_op_prepare_store(struct kvp_owner *o, uint32_t handle, const struct kvp_key_src *src,
                         struct kvp_op_slots *res, char *msg, size_t msg_size);

/*
 * Publishes reservation id of instance handle (written by the worker through shared memory,
 * via KVP_VIA_SHM, or by the front end through kvp_op_store_inline_begin()'s iovecs,
 * KVP_VIA_INLINE), and queues the chunks for L2. Returns the number of chunks committed,
 * -ENOENT (no such reservation of o), -ETIMEDOUT (it expired: nothing stored), or -EOPNOTSUPP
 * (KVP_VIA_SHM for an inline instance: its slots were never written; the reservation is
 * dropped). The reservation ends in every case but -ENOENT.
 */
int kvp_op_commit_store(struct kvp_owner *o, uint32_t handle, uint64_t id, enum kvp_via via,
                        char *msg, size_t msg_size);

/* Drops reservation id (counted under why: KVP_DROP_ABORT for a client's abort,
 * KVP_DROP_DISCONNECT when its bytes could not be received). Returns the number of chunks it
 * had, or -ENOENT. */
int kvp_op_abort_store(struct kvp_owner *o, uint32_t handle, uint64_t id, enum kvp_drop_cause why,
                       char *msg, size_t msg_size);

/*
 * The slots of reservation id as iovecs (res->iov, res->nslots) for the front end to receive
 * payload_len bytes into, without a lock. payload_len must be the reservation's size; if not,
 * the reservation is dropped and -EINVAL returned. Then the front end calls
 * kvp_op_commit_store(KVP_VIA_INLINE), or kvp_op_abort_store(KVP_DROP_DISCONNECT) if the bytes
 * did not all arrive. Returns 0, -ENOENT or -EINVAL.
 */
int kvp_op_store_inline_begin(struct kvp_owner *o, uint32_t handle, uint64_t id,
                              uint64_t payload_len, struct kvp_op_slots *res, char *msg,
                              size_t msg_size);

/*
 * Warm restart (warm_restart.h): every operation that pins chunks (the pinning lookup, the
 * prepare-retrieve, the inline retrieve) first checks the chunks adopted from a previous
 * kvpoold's pool that nobody has read yet against the checksum recorded when they were
 * committed: the first that differs is dropped (never served, counted, a rate-limited WARN) and
 * the run of chunks before it is what the caller gets. With the index on, a commit computes each
 * chunk's checksum first (outside every lock).
 */

/*
 * Pins the leading run of the range's chunks that are stored (in L1, then brought from L2) as a
 * pin set (res->id) for a worker that reads them through shared memory; they are counted as
 * retrieved now. Returns 0 (res->nslots may be 0: nothing held), -ENOENT, -EINVAL / -E2BIG,
 * -EOPNOTSUPP (an inline instance), -EMFILE, -ENOMEM.
 */
int kvp_op_prepare_retrieve(struct kvp_owner *o, uint32_t handle, const struct kvp_key_src *src,
                            struct kvp_op_slots *res, char *msg, size_t msg_size);

/* Ends pin set id (of a prepare-retrieve or a pinning lookup). Returns its number of chunks, or
 * -ENOENT. */
int kvp_op_commit_retrieve(struct kvp_owner *o, uint32_t handle, uint64_t id, char *msg,
                           size_t msg_size);

/*
 * Pins the leading run of the range's stored chunks (L1, then L2) for one inline send: res->iov
 * and res->nslots are the bytes to send, res->objs the slots (for the front end's reply). The
 * pins are no hold: the front end sends, then calls kvp_op_retrieve_inline_end() in every case.
 * Returns 0, -ENOENT, -EINVAL / -E2BIG, -ENOMEM (nothing pinned on failure).
 */
int kvp_op_retrieve_inline_begin(struct kvp_owner *o, uint32_t handle,
                                 const struct kvp_key_src *src, struct kvp_op_slots *res, char *msg,
                                 size_t msg_size);

/* Unpins what kvp_op_retrieve_inline_begin() pinned into res; sent says the bytes reached the
 * client (then they are counted as retrieved). */
void kvp_op_retrieve_inline_end(struct kvp_owner *o, uint32_t handle, struct kvp_op_slots *res,
                                bool sent);

/* Frees every stored chunk nobody pins (an operator's action, logged with o's pid). */
void kvp_op_clear(struct kvp_owner *o, struct kvp_clear_result *res);

/* The counters and gauges (kvp_snapshot_take() without the lists). Returns 0 or -ENOMEM. */
int kvp_op_stats(struct kvp_owner *o, struct kvp_snapshot *snap, char *msg, size_t msg_size);

#endif /* KVP_OPS_H */
