/*
 * registry.h - registered worker instances and the per-instance transport decision.
 *
 * An instance is one worker (one tensor-parallel rank) with one KV layout, owned by the one
 * connection that registered it. An instance id names at most one registration: a namesake with
 * another layout is refused (-EEXIST), and so is an identical one from another connection
 * (-EBUSY), so one model's chunks are never served to another and nobody can adopt a live
 * worker's instance. Handles are (generation << 16 | slot): a handle of an unregistered instance
 * never names a newer one.
 */
#ifndef KVP_REGISTRY_H
#define KVP_REGISTRY_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/chunk_hash.h"
#include "common/layout.h"
#include "common/msg.h"

#define KVP_MAX_INSTANCES 1024

struct kvp_registration {
    uint32_t handle;
    uint64_t owner;    /* connection id that registered it */
    int32_t owner_pid; /* that connection's peer pid (SO_PEERCRED), -1 if unknown */
    struct kvp_register_req req;
    struct kvp_chunk_layout layout;
    uint32_t dtype_size;
    uint8_t transport; /* KVP_WIRE_SHM or KVP_WIRE_INLINE */
    char reason[KVP_MAX_REASON + 1];
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
    uint32_t count;
    struct {
        bool used;
        uint16_t gen;
        struct kvp_registration inst;
    } slots[KVP_MAX_INSTANCES];
};

void kvp_registry_init(struct kvp_registry *r, const struct kvp_offer *offer);
void kvp_registry_destroy(struct kvp_registry *r);

/*
 * Validates a registration: 0, or -EINVAL with a message naming the field in msg.
 * On success fills layout and dtype size into *inst (not yet registered).
 */
int kvp_registry_validate(const struct kvp_registry *r, const struct kvp_register_req *req,
                          struct kvp_registration *inst, char *msg, size_t msg_size);

/*
 * Decides the transport of a validated instance (the single place where SHM versus inline is
 * chosen per worker). Returns 0, or -EOPNOTSUPP when the worker insists on shm and the daemon
 * has none (msg says why).
 */
int kvp_registry_choose_transport(const struct kvp_registry *r, struct kvp_registration *inst,
                                  char *msg, size_t msg_size);

/*
 * Registers *inst for connection owner, whose peer process is owner_pid, and logs the transport
 * line. If the instance id is already registered:
 *   - with another model_name, world_size, worker_rank, block_size, num_layers, hidden_dim,
 *     dtype or use_mla: -EEXIST, msg names the first differing field with both values;
 *   - identically, by another connection: -EBUSY, msg names that connection's pid;
 *   - identically, by the same connection: 0 with *existing = true, the existing registration
 *     copied to *inst, and one warning logged.
 * A refusal changes nothing in the table. Returns 0, -EEXIST, -EBUSY or -ENOSPC (table full);
 * msg is set on every error.
 */
int kvp_registry_add(struct kvp_registry *r, uint64_t owner, int32_t owner_pid,
                     struct kvp_registration *inst, bool *existing, char *msg, size_t msg_size);

/* Copies the instance of handle. Returns 0 or -ENOENT. */
int kvp_registry_get(struct kvp_registry *r, uint32_t handle, struct kvp_registration *out);

/* Copies the instance of handle if connection owner registered it. Returns 0, or -ENOENT for
 * an unknown handle and for another connection's instance (handles are not capabilities to
 * share: requests only ever act on the caller's own registration). */
int kvp_registry_get_owned(struct kvp_registry *r, uint32_t handle, uint64_t owner,
                           struct kvp_registration *out);

/* The key namespace of an instance with a request's salt: every field comes from inst, the
 * registration the request's handle names. ns points into inst and salt. */
void kvp_registration_key_ns(const struct kvp_registration *inst, const void *salt,
                             uint32_t salt_len, struct kvp_key_ns *ns);

/* Unregisters handle. Returns 0 or -ENOENT. */
int kvp_registry_remove(struct kvp_registry *r, uint32_t handle, const char *why);

/* Unregisters every instance registered by connection owner. Returns how many. */
uint32_t kvp_registry_remove_owner(struct kvp_registry *r, uint64_t owner);

uint32_t kvp_registry_count(struct kvp_registry *r);

#endif /* KVP_REGISTRY_H */
