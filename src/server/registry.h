/*
 * registry.h - registered worker instances and the per-instance transport decision.
 *
 * An instance is one worker (one tensor-parallel rank) with one KV layout. Handles are
 * (generation << 16 | slot): a handle of an unregistered instance never names a newer one.
 */
#ifndef KVP_REGISTRY_H
#define KVP_REGISTRY_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/layout.h"
#include "common/msg.h"

#define KVP_MAX_INSTANCES 1024

struct kvp_instance {
    uint32_t handle;
    uint64_t owner; /* connection id that registered it */
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
        struct kvp_instance inst;
    } slots[KVP_MAX_INSTANCES];
};

void kvp_registry_init(struct kvp_registry *r, const struct kvp_offer *offer);
void kvp_registry_destroy(struct kvp_registry *r);

/*
 * Validates a registration: 0, or -EINVAL with a message naming the field in msg.
 * On success fills layout and dtype size into *inst (not yet registered).
 */
int kvp_registry_validate(const struct kvp_registry *r, const struct kvp_register_req *req,
                          struct kvp_instance *inst, char *msg, size_t msg_size);

/*
 * Decides the transport of a validated instance (the single place where SHM versus inline is
 * chosen per worker). Returns 0, or -EOPNOTSUPP when the worker insists on shm and the daemon
 * has none (msg says why).
 */
int kvp_registry_choose_transport(const struct kvp_registry *r, struct kvp_instance *inst,
                                  char *msg, size_t msg_size);

/*
 * Registers *inst for connection owner and logs the transport line. If the instance id is
 * already registered, logs a warning and copies the existing registration to *inst instead;
 * *existing tells which. Returns 0 or -ENOSPC (table full).
 */
int kvp_registry_add(struct kvp_registry *r, uint64_t owner, struct kvp_instance *inst,
                     bool *existing);

/* Copies the instance of handle. Returns 0 or -ENOENT. */
int kvp_registry_get(struct kvp_registry *r, uint32_t handle, struct kvp_instance *out);

/* Unregisters handle. Returns 0 or -ENOENT. */
int kvp_registry_remove(struct kvp_registry *r, uint32_t handle, const char *why);

/* Unregisters every instance registered by connection owner. Returns how many. */
uint32_t kvp_registry_remove_owner(struct kvp_registry *r, uint64_t owner);

uint32_t kvp_registry_count(struct kvp_registry *r);

#endif /* KVP_REGISTRY_H */
