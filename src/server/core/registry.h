/*
 * registry.h - registered worker instances and the per-instance transport decision.
 *
 * An instance is one worker (one tensor-parallel rank) with one KV layout, owned by the one
 * owner (owner.h: a kvpool connection, an LMCache worker) that registered it. An instance id
 * names at most one registration: a namesake with another layout is refused (-EEXIST), and so is
 * an identical one from another owner (-EBUSY), so one model's chunks are never served to another
 * and nobody can adopt a live worker's instance. Handles are (generation << 16 | slot): a handle of
 * an unregistered instance never names a newer one.
 */
#ifndef KVP_REGISTRY_H
#define KVP_REGISTRY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/chunk_hash.h"
#include "common/layout.h"
#include "common/limits.h"

#define KVP_MAX_INSTANCES 1024

/*
 * How an instance's chunks travel. A registration asks for AUTO, SHM or INLINE; the registry
 * settles on SHM or INLINE (kvp_registry_choose_transport()). PICKLE and ENVELOPE are LMCache's
 * transports without shared memory, where the chunks travel inside the front end's messages
 * (docs/LMCACHE.md): a torch pickle up to LMCache 0.5.6, a msgpack tensor envelope from 0.5.7 on.
 * Only a front end that serves them asks for them, and they are kept as asked. The reports name
 * every value through kvp_reg_transport_name(), so a value added here is shown by its own name
 * everywhere.
 */
enum kvp_reg_transport {
    KVP_REG_AUTO = 0,
    KVP_REG_SHM = 1,
    KVP_REG_INLINE = 2,
    KVP_REG_PICKLE = 3,
    KVP_REG_ENVELOPE = 4,
};

/* Whether chunks of this transport travel inside a front end's own messages (PICKLE,
 * ENVELOPE): the front end reserves and copies them itself. */
bool kvp_reg_transport_in_band(uint8_t transport);

/* The name of a transport in the reports and logs: "auto", "shm", "inline", "pickle",
 * "envelope", or "unknown" for a value without one. Never NULL; a static string. */
const char *kvp_reg_transport_name(uint8_t transport);

/*
 * What a worker declares when it registers, whatever protocol carried it: its instance id, the
 * identity of its keys (model, world size, rank, dtype, MLA), its KV layout and the transport it
 * will use. A front end fills it from its own request; the registry validates every field.
 */
struct kvp_reg_spec {
    char instance_id[KVP_MAX_NAME + 1];
    char model_name[KVP_MAX_NAME + 1];
    char dtype[KVP_MAX_NAME + 1];
    uint32_t world_size, worker_rank, block_size, num_layers, hidden_dim;
    uint8_t use_mla;                 /* 0 or 1 */
    uint8_t transport;               /* enum kvp_reg_transport: what the worker will use */
    char reason[KVP_MAX_REASON + 1]; /* why the worker chose inline, or "" */
    /* The instance as the registry's log lines name it, when not by instance_id: the id its
     * worker knows and logs itself (LMCache's number, whose instance_id is "lmcache-<id>").
     * Not part of the identity. */
    char log_id[KVP_MAX_NAME + 1];
};

/* Longest front-end name ("kvpool", "lmcache") a registration records. */
#define KVP_MAX_FRONTEND 15

/* A registered instance: the worker's declaration, its owner and what the daemon derived. */
struct kvp_registration {
    uint32_t handle;
    uint64_t owner;                      /* id of the owner (owner.h) that registered it */
    int32_t owner_pid;                   /* that owner's peer pid, -1 if unknown */
    int64_t connected_since_ms;          /* wall clock (ms since the epoch) the owner connected */
    char frontend[KVP_MAX_FRONTEND + 1]; /* the protocol that registered it: "kvpool", ... */
    struct kvp_reg_spec spec;
    struct kvp_chunk_layout layout;
    uint32_t dtype_size;
    uint8_t transport; /* KVP_REG_SHM, KVP_REG_INLINE, KVP_REG_PICKLE or KVP_REG_ENVELOPE */
    char reason[KVP_MAX_REASON + 1];
    /* The key chain's seed for requests without a salt, computed once at registration
     * (kvp_registration_key_ns() with no salt). */
    uint8_t seed[KVP_KEY_SIZE];
};

/*
 * What one instance moved, for the status report. Updated with relaxed atomics and without the
 * registry lock by the one thread serving the owner of the instance (kvp_registry_count_io());
 * reset under the lock when a registration takes the slot.
 */
struct kvp_instance_io {
    _Atomic uint64_t stored_chunks, stored_bytes, retrieved_chunks, retrieved_bytes;
};

/* A registered instance as the status report shows it: a copy, taken under the lock. */
struct kvp_instance_view {
    struct kvp_registration reg;
    uint64_t stored_chunks, stored_bytes, retrieved_chunks, retrieved_bytes;
};

/* How many registered instances one front end has on one transport (the reports' labels). */
struct kvp_instance_group {
    char frontend[KVP_MAX_FRONTEND + 1];
    uint8_t transport; /* enum kvp_reg_transport */
    uint32_t count;
};

/* What the daemon offers, fixed at start-up. */
struct kvp_offer {
    bool shm_enabled;
    bool memfd; /* the segment is a memfd handed out by MAP_SEGMENT */
    const char *shm_name;
    const char *shm_reason; /* why SHM is disabled */
    uint64_t pool_size;
    uint32_t chunk_tokens;
};

struct kvp_registry {
    pthread_mutex_t lock;
    struct kvp_offer offer;
    /* Set once (release) by kvp_registry_lose_shm() after lost_reason is written: shared memory
     * is no longer offered, whatever the offer says (read with acquire, without the lock). */
    atomic_bool shm_lost;
    char lost_reason[KVP_MAX_REASON + 1];
    uint32_t count;
    uint32_t count_shm; /* of count, those on the shm transport */
    /* The most one front end may register, so that every front end keeps room in the table
     * (KVP_MAX_INSTANCES when there is one front end; kvp_registry_share()). */
    uint32_t max_per_frontend;
    struct {
        bool used;
        uint16_t gen;
        struct kvp_registration inst;
        struct kvp_instance_io io;
    } slots[KVP_MAX_INSTANCES];
};

void kvp_registry_init(struct kvp_registry *r, const struct kvp_offer *offer);
void kvp_registry_destroy(struct kvp_registry *r);

/* The table is shared by nfrontends front ends that register instances: each may hold at most
 * KVP_MAX_INSTANCES - KVP_REGISTRY_RESERVE * (nfrontends - 1), the rest being kept for the
 * others. Call before any registration. */
#define KVP_REGISTRY_RESERVE 256u
void kvp_registry_share(struct kvp_registry *r, uint32_t nfrontends);

/*
 * Validates a registration: 0, or -EINVAL with a message naming the field in msg (-ENOMEM when
 * hashing cannot start). On success copies spec into *inst and fills layout, dtype size and the
 * unsalted key seed (not yet registered; the owner fields are the caller's).
 */
int kvp_registry_validate(const struct kvp_registry *r, const struct kvp_reg_spec *spec,
                          struct kvp_registration *inst, char *msg, size_t msg_size);

/*
 * Decides the transport of a validated instance (the single place where SHM versus inline is
 * chosen per worker). cannot_map is NULL when there is evidence that the worker can map the
 * segment (kvp_transport_peer_can_map()), else why not: a claim of shm then gets the inline
 * transport with that reason, as it does once the segment is lost (kvp_registry_lose_shm()).
 * Returns 0, or -EOPNOTSUPP when the worker insists on shm and the daemon has none (msg says why).
 */
int kvp_registry_choose_transport(const struct kvp_registry *r, struct kvp_registration *inst,
                                  const char *cannot_map, char *msg, size_t msg_size);

/*
 * Registers *inst for the owner its owner fields name (owner, owner_pid, connected_since_ms,
 * frontend: filled by the caller) and logs the transport line. If the instance id is already
 * registered:
 *   - with another model_name, world_size, worker_rank, block_size, num_layers, hidden_dim,
 *     dtype or use_mla: -EEXIST, msg names the first differing field with both values;
 *   - identically, by another owner: -EBUSY, msg names that owner's pid;
 *   - identically, by the same owner: 0 with *existing = true, the existing registration
 *     copied to *inst, and one warning logged.
 * A new instance is refused with -EDQUOT when its owner already has max_per_owner (0: no
 * limit) instances or its front end its share (kvp_registry_share()), and -ENOSPC when the
 * table is full. A refusal changes nothing in the table.
 * Returns 0, -EEXIST, -EBUSY, -EDQUOT or -ENOSPC; msg is set on every error.
 */
int kvp_registry_add(struct kvp_registry *r, struct kvp_registration *inst, uint32_t max_per_owner,
                     bool *existing, char *msg, size_t msg_size);

/* Copies the instance of handle. Returns 0 or -ENOENT. */
int kvp_registry_get(struct kvp_registry *r, uint32_t handle, struct kvp_registration *out);

/* Copies the instance of handle if owner registered it. Returns 0, or -ENOENT for
 * an unknown handle and for another owner's instance (handles are not capabilities to
 * share: requests only ever act on the caller's own registration). */
int kvp_registry_get_owned(struct kvp_registry *r, uint32_t handle, uint64_t owner,
                           struct kvp_registration *out);

/* The key namespace of an instance with a request's salt: every field comes from inst, the
 * registration the request's handle names. ns points into inst and salt. */
void kvp_registration_key_ns(const struct kvp_registration *inst, const void *salt,
                             uint32_t salt_len, struct kvp_key_ns *ns);

/*
 * The daemon lost its segment (seg_guard.h): from now on the registry offers no shared memory,
 * for reason (recorded once, by the first call): a registration that claims or may take the shm
 * transport gets inline with that reason (kvp_registry_choose_transport()); in-band transports
 * are kept as asked. The registrations on shm are left as they are: each front end moves or ends
 * its own in its own terms, told through their owners (KVP_OWNER_SHM_LOST, owner.h), and a
 * registration is never rewritten to a transport its front end does not have. Writes the ids of
 * the owners with an instance on shm to owners (each id once, at most cap, their count to
 * *nowners). Returns how many instances are on shm.
 */
uint32_t kvp_registry_lose_shm(struct kvp_registry *r, const char *reason, uint64_t *owners,
                               uint32_t cap, uint32_t *nowners);

/*
 * Instance handle of owner stops using the segment (its worker could not map it after all): an
 * instance on the shm transport moves to transport (KVP_REG_INLINE, or an in-band one) with
 * reason, logged, so that a commit through the segment is refused from now on. Returns 1 when
 * it moved, 0 when it was not on shm, -ENOENT (unknown, or another owner's).
 */
int kvp_registry_leave_shm(struct kvp_registry *r, uint32_t handle, uint64_t owner,
                           uint8_t transport, const char *reason);

/* Unregisters handle. Returns 0 or -ENOENT. */
int kvp_registry_remove(struct kvp_registry *r, uint32_t handle, const char *why);

/* Unregisters every instance registered by owner (its client went away). Returns how many. */
uint32_t kvp_registry_remove_owner(struct kvp_registry *r, uint64_t owner);

uint32_t kvp_registry_count(struct kvp_registry *r);

/* The number of registered instances and, of those, how many use the shm transport. */
void kvp_registry_count_transports(struct kvp_registry *r, uint32_t *total, uint32_t *shm);

/*
 * Counts the registered instances by front end and transport: up to cap groups into out,
 * ordered by front-end name, then transport; returns how many groups. *total is every
 * registered instance, also those of a group beyond cap (front-end names and transports are
 * the daemon's own, never a client's, so a cap of a few dozen is never reached). One pass over
 * the table under the lock; nothing is allocated.
 */
uint32_t kvp_registry_count_groups(struct kvp_registry *r, struct kvp_instance_group *out,
                                   uint32_t cap, uint32_t *total);

/*
 * Adds a transfer to the counts of instance handle: chunks and bytes stored (store true) or
 * retrieved. Lock-free. Only the owner of handle may call it, while the instance is
 * registered: that owner is the only one that can unregister it, so the slot cannot be
 * reused meanwhile.
 */
void kvp_registry_count_io(struct kvp_registry *r, uint32_t handle, bool store, uint64_t chunks,
                           uint64_t bytes);

/* Copies up to cap registered instances, in slot order, into out. Returns how many. The lock is
 * held for the copy only. */
uint32_t kvp_registry_list(struct kvp_registry *r, struct kvp_instance_view *out, uint32_t cap);

#endif /* KVP_REGISTRY_H */
