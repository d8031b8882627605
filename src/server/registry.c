/*
 * registry.c - instance table, registration validation and the per-instance transport choice.
 *
 * The transport rule (docs/PROTOCOL.md, REGISTER): the worker reports the transport it will
 * actually use, after trying to map the segment itself, so the daemon never believes a worker
 * is on SHM while it silently fell back. The daemon only overrides towards inline when it has
 * no segment. Exactly one INFO line per new registration names the outcome.
 *
 * Threads: connection threads call in; r->lock guards the table and is a leaf lock. Callers
 * get copies of instances, never pointers into the table, so an instance can be unregistered
 * concurrently without dangling references.
 */
#include "registry.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "stats.h"

/* The offer (SHM on or off, and why) is fixed at start-up; the table starts empty. */
void kvp_registry_init(struct kvp_registry *r, const struct kvp_offer *offer)
{
    memset(r, 0, sizeof(*r));
    r->offer = *offer;
    pthread_mutex_init(&r->lock, NULL);
}

void kvp_registry_destroy(struct kvp_registry *r)
{
    pthread_mutex_destroy(&r->lock);
}

/*
 * Every scalar of a registration comes from a worker: each is checked, in wire order, and the
 * first bad one is named in the message so the operator can fix the worker's configuration.
 */
int kvp_registry_validate(const struct kvp_registry *r, const struct kvp_register_req *req,
                          struct kvp_instance *inst, char *msg, size_t msg_size)
{
#define BAD(...)                              \
    do {                                      \
        snprintf(msg, msg_size, __VA_ARGS__); \
        return -EINVAL;                       \
    } while (0)

    memset(inst, 0, sizeof(*inst));
    if (!req->instance_id[0])
        BAD("instance_id must not be empty");
    if (!req->model_name[0])
        BAD("model_name must not be empty");
    if (req->world_size < 1)
        BAD("world_size must be >= 1");
    if (req->worker_rank >= req->world_size)
        BAD("worker_rank %" PRIu32 " must be < world_size %" PRIu32, req->worker_rank,
            req->world_size);
    if (req->block_size < 1)
        BAD("block_size must be >= 1");
    if (req->num_layers < 1)
        BAD("num_layers must be >= 1");
    if (req->hidden_dim < 1)
        BAD("hidden_dim must be >= 1");
    if (req->use_mla > 1)
        BAD("use_mla must be 0 or 1");
    if (req->transport > KVP_WIRE_INLINE)
        BAD("transport must be 0 (auto), 1 (shm) or 2 (inline)");
    const struct kvp_dtype *dt = kvp_dtype_find(req->dtype);
    if (!dt)
        BAD("dtype '%s' is not supported (known: %s)", req->dtype, kvp_dtype_names());

    int rc = kvp_chunk_layout(req->num_layers, r->offer.chunk_tokens, req->hidden_dim, dt->size,
                              req->use_mla, r->offer.pool_size, &inst->layout);
    if (rc)
        BAD("num_layers x chunk_size x hidden_dim x dtype size: a chunk would not fit the "
            "pool of %" PRIu64 " bytes",
            r->offer.pool_size);
#undef BAD
    inst->req = *req;
    inst->dtype_size = dt->size;
    return 0;
}

/*
 * The worker reports what it will use after trying to map the segment itself; the daemon only
 * refuses "shm" when it has no segment, and otherwise records the worker's choice and reason.
 */
int kvp_registry_choose_transport(const struct kvp_registry *r, struct kvp_instance *inst,
                                  char *msg, size_t msg_size)
{
    const struct kvp_register_req *req = &inst->req;

    if (req->transport == KVP_WIRE_SHM) {
        if (!r->offer.shm_enabled) {
            snprintf(msg, msg_size, "shm transport unavailable: %s", r->offer.shm_reason);
            return -EOPNOTSUPP;
        }
        inst->transport = KVP_WIRE_SHM;
        inst->reason[0] = '\0';
        return 0;
    }
    inst->transport = KVP_WIRE_INLINE;
    if (!r->offer.shm_enabled)
        snprintf(inst->reason, sizeof(inst->reason), "%s", r->offer.shm_reason);
    else if (req->reason[0])
        snprintf(inst->reason, sizeof(inst->reason), "%s", req->reason);
    else if (req->transport == KVP_WIRE_INLINE)
        snprintf(inst->reason, sizeof(inst->reason), "requested by worker");
    else
        snprintf(inst->reason, sizeof(inst->reason), "worker did not map the segment");
    return 0;
}

/* Slot index of instance id, or -1; caller holds the lock. */
static int do_find_id(struct kvp_registry *r, const char *id)
{
    for (int i = 0; i < KVP_MAX_INSTANCES; i++)
        if (r->slots[i].used && strcmp(r->slots[i].inst.req.instance_id, id) == 0)
            return i;
    return -1;
}

/* Slot of a handle, or -1; the generation check rejects handles of removed instances. */
static int do_find_handle(struct kvp_registry *r, uint32_t handle)
{
    uint32_t i = handle & 0xffff;
    if (i >= KVP_MAX_INSTANCES || !r->slots[i].used || r->slots[i].inst.handle != handle)
        return -1;
    return (int)i;
}

/* The one INFO line per registration that names the transport actually in use. */
static void log_transport(const struct kvp_instance *inst, const struct kvp_offer *offer)
{
    if (inst->transport == KVP_WIRE_SHM && offer->memfd)
        log_info("Instance %s non-GPU context using SHM transport (backend=memfd, "
                 "pool_size=%" PRIu64 ")",
                 inst->req.instance_id, offer->pool_size);
    else if (inst->transport == KVP_WIRE_SHM)
        log_info("Instance %s non-GPU context using SHM transport (shm_name=%s, "
                 "pool_size=%" PRIu64 ")",
                 inst->req.instance_id, offer->shm_name, offer->pool_size);
    else
        log_info("Instance %s non-GPU context using inline transport (%s)", inst->req.instance_id,
                 inst->reason);
}

/*
 * Logging happens after the lock is dropped: a log write is a syscall and must not stretch a
 * critical section that every registration and request goes through.
 */
int kvp_registry_add(struct kvp_registry *r, uint64_t owner, struct kvp_instance *inst,
                     bool *existing)
{
    pthread_mutex_lock(&r->lock);
    int i = do_find_id(r, inst->req.instance_id);
    if (i >= 0) {
        *inst = r->slots[i].inst;
        pthread_mutex_unlock(&r->lock);
        *existing = true;
        log_warn("Instance %s is already registered; returning the existing registration",
                 inst->req.instance_id);
        return 0;
    }
    for (i = 0; i < KVP_MAX_INSTANCES && r->slots[i].used; i++)
        ;
    if (i == KVP_MAX_INSTANCES) {
        pthread_mutex_unlock(&r->lock);
        return -ENOSPC;
    }
    r->slots[i].used = true;
    if (++r->slots[i].gen == 0)
        r->slots[i].gen = 1;
    inst->handle = ((uint32_t)r->slots[i].gen << 16) | (uint32_t)i;
    inst->owner = owner;
    r->slots[i].inst = *inst;
    r->count++;
    pthread_mutex_unlock(&r->lock);

    *existing = false;
    KVP_COUNT(registrations, 1);
    if (inst->transport == KVP_WIRE_SHM)
        KVP_COUNT(registrations_shm, 1);
    else
        KVP_COUNT(registrations_inline, 1);
    log_transport(inst, &r->offer);
    return 0;
}

/* Returns a copy, so that a concurrent unregister can never leave the caller a dangling
 * pointer. */
int kvp_registry_get(struct kvp_registry *r, uint32_t handle, struct kvp_instance *out)
{
    pthread_mutex_lock(&r->lock);
    int i = do_find_handle(r, handle);
    if (i >= 0)
        *out = r->slots[i].inst;
    pthread_mutex_unlock(&r->lock);
    return i >= 0 ? 0 : -ENOENT;
}

int kvp_registry_remove(struct kvp_registry *r, uint32_t handle, const char *why)
{
    char id[KVP_MAX_NAME + 1];
    pthread_mutex_lock(&r->lock);
    int i = do_find_handle(r, handle);
    if (i >= 0) {
        memcpy(id, r->slots[i].inst.req.instance_id, sizeof(id));
        r->slots[i].used = false;
        r->count--;
    }
    pthread_mutex_unlock(&r->lock);
    if (i < 0)
        return -ENOENT;
    log_info("Instance %s unregistered (%s)", id, why);
    return 0;
}

/* Collects the handles first, then removes them one by one, so that each removal logs outside
 * the lock. */
uint32_t kvp_registry_remove_owner(struct kvp_registry *r, uint64_t owner)
{
    uint32_t handles[KVP_MAX_INSTANCES], n = 0;
    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < KVP_MAX_INSTANCES; i++)
        if (r->slots[i].used && r->slots[i].inst.owner == owner)
            handles[n++] = r->slots[i].inst.handle;
    pthread_mutex_unlock(&r->lock);
    uint32_t removed = 0;
    for (uint32_t k = 0; k < n; k++)
        removed += kvp_registry_remove(r, handles[k], "connection closed") == 0;
    return removed;
}

uint32_t kvp_registry_count(struct kvp_registry *r)
{
    pthread_mutex_lock(&r->lock);
    uint32_t n = r->count;
    pthread_mutex_unlock(&r->lock);
    return n;
}
