/*
 * registry.c - instance table, registration validation and the per-instance transport choice.
 *
 * The transport rule (docs/PROTOCOL.md, REGISTER): the worker reports the transport it will
 * actually use, after trying to map the segment itself, so the daemon never believes a worker
 * is on SHM while it silently fell back. The daemon only overrides towards inline: when it has
 * no segment, and when there is no evidence that the worker can map it (transport.c), since a
 * worker that commits slots it could not write would read their previous contents back.
 * Exactly one INFO line per new registration names the outcome.
 *
 * Identity rule: an instance id names one registration, owned by one connection. The keys of a
 * request are derived from the registration its handle names (model, world size, rank,
 * layout), so letting a namesake with another layout share it would serve one model's KV to
 * another, and letting another connection adopt it would tie that worker to the first one's
 * lifetime. Both are refused with a message naming the reason; only the owning connection may
 * register the same parameters again (it gets its registration back) or use the handle.
 *
 * Threads: connection threads call in; r->lock guards the table and is a leaf lock. Callers
 * get copies of instances, never pointers into the table, so an instance can be unregistered
 * concurrently without dangling references.
 */
#include "core/registry.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "core/stats.h"

/* The offer (SHM on or off, and why) is fixed at start-up; the table starts empty. */
void kvp_registry_init(struct kvp_registry *r, const struct kvp_offer *offer)
{
    memset(r, 0, sizeof(*r));
    r->offer = *offer;
    atomic_init(&r->shm_lost, false);
    r->max_per_frontend = KVP_MAX_INSTANCES;
    pthread_mutex_init(&r->lock, NULL);
}

void kvp_registry_share(struct kvp_registry *r, uint32_t nfrontends)
{
    uint32_t others = nfrontends > 1 ? nfrontends - 1 : 0;
    r->max_per_frontend = KVP_MAX_INSTANCES - KVP_REGISTRY_RESERVE * others;
}

void kvp_registry_destroy(struct kvp_registry *r)
{
    pthread_mutex_destroy(&r->lock);
}

/*
 * Every scalar of a registration comes from a worker: each is checked, in wire order, and the
 * first bad one is named in the message so the operator can fix the worker's configuration.
 */
int kvp_registry_validate(const struct kvp_registry *r, const struct kvp_reg_spec *req,
                          struct kvp_registration *inst, char *msg, size_t msg_size)
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
    if (req->transport > KVP_REG_ENVELOPE)
        BAD("transport must be 0 (auto), 1 (shm), 2 (inline), 3 (pickle) or 4 (envelope)");
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
    inst->spec = *req;
    inst->dtype_size = dt->size;
    struct kvp_key_ns ns;
    kvp_registration_key_ns(inst, NULL, 0, &ns);
    if (kvp_key_seed(&ns, inst->seed)) {
        snprintf(msg, msg_size, "cannot initialise hashing");
        return -ENOMEM;
    }
    return 0;
}

/*
 * The worker reports what it will use after trying to map the segment itself; the daemon
 * refuses "shm" when it has no segment, overrules it (inline, with the evidence's reason) when
 * the worker cannot map the segment, and otherwise records the worker's choice and reason.
 */
int kvp_registry_choose_transport(const struct kvp_registry *r, struct kvp_registration *inst,
                                  const char *cannot_map, char *msg, size_t msg_size)
{
    const struct kvp_reg_spec *req = &inst->spec;
    /* A lost segment is refused like one the worker cannot map: inline, with the reason. */
    bool lost = atomic_load_explicit(&r->shm_lost, memory_order_acquire);
    if (lost && !cannot_map)
        cannot_map = r->lost_reason;

    if (kvp_reg_transport_in_band(req->transport)) {
        /* The front end moves the chunks inside its own messages (LMCache's pickle or envelope
         * transport): nothing to decide, the segment is never the worker's. */
        inst->transport = req->transport;
        snprintf(inst->reason, sizeof(inst->reason), "%s",
                 req->reason[0]          ? req->reason
                 : !r->offer.shm_enabled ? r->offer.shm_reason
                 : lost                  ? r->lost_reason
                                         : "the worker does not map the segment");
        return 0;
    }
    if (req->transport == KVP_REG_SHM) {
        if (!r->offer.shm_enabled) {
            snprintf(msg, msg_size, "shm transport unavailable: %s", r->offer.shm_reason);
            return -EOPNOTSUPP;
        }
        if (!cannot_map) {
            inst->transport = KVP_REG_SHM;
            inst->reason[0] = '\0';
            return 0;
        }
    }
    inst->transport = KVP_REG_INLINE;
    if (!r->offer.shm_enabled)
        snprintf(inst->reason, sizeof(inst->reason), "%s", r->offer.shm_reason);
    else if (req->transport == KVP_REG_SHM)
        snprintf(inst->reason, sizeof(inst->reason), "%s", cannot_map);
    else if (req->reason[0])
        snprintf(inst->reason, sizeof(inst->reason), "%s", req->reason);
    else if (req->transport == KVP_REG_INLINE)
        snprintf(inst->reason, sizeof(inst->reason), "requested by worker");
    else if (lost)
        snprintf(inst->reason, sizeof(inst->reason), "%s", r->lost_reason);
    else
        snprintf(inst->reason, sizeof(inst->reason), "worker did not map the segment");
    return 0;
}

/* Slot index of instance id, or -1; caller holds the lock. */
static int do_find_id(struct kvp_registry *r, const char *id)
{
    for (int i = 0; i < KVP_MAX_INSTANCES; i++)
        if (r->slots[i].used && strcmp(r->slots[i].inst.spec.instance_id, id) == 0)
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

/* How the log lines name an instance: as its worker does (spec.log_id), else by its id. */
static const char *log_name(const struct kvp_reg_spec *spec)
{
    return spec->log_id[0] ? spec->log_id : spec->instance_id;
}

/* The one INFO line per registration that names the transport actually in use. */
static void log_transport(const struct kvp_registration *inst, const struct kvp_offer *offer)
{
    if (inst->transport == KVP_REG_SHM && offer->memfd)
        log_info("Instance %s non-GPU context using SHM transport (backend=memfd, "
                 "pool_size=%" PRIu64 ")",
                 log_name(&inst->spec), offer->pool_size);
    else if (inst->transport == KVP_REG_SHM)
        log_info("Instance %s non-GPU context using SHM transport (shm_name=%s, "
                 "pool_size=%" PRIu64 ")",
                 log_name(&inst->spec), offer->shm_name, offer->pool_size);
    else
        log_info("Instance %s non-GPU context using %s transport (%s)", log_name(&inst->spec),
                 kvp_reg_transport_name(inst->transport), inst->reason);
}

/*
 * Names the first field in which registration want differs from have, in wire order, with
 * both values. Returns true if one differs. The transport and its reason are not identity: a
 * worker may ask for another transport and still gets its own registration back.
 */
static bool differs(const struct kvp_reg_spec *have, const struct kvp_reg_spec *want, char *msg,
                    size_t msg_size)
{
#define STR_FIELD(f)                                                                       \
    if (strcmp(have->f, want->f) != 0) {                                                   \
        snprintf(msg, msg_size, "instance id %s is registered with " #f " '%s', not '%s'", \
                 have->instance_id, have->f, want->f);                                     \
        return true;                                                                       \
    }
#define U32_FIELD(f)                                                                   \
    if (have->f != want->f) {                                                          \
        snprintf(msg, msg_size,                                                        \
                 "instance id %s is registered with " #f " %" PRIu32 ", not %" PRIu32, \
                 have->instance_id, (uint32_t)have->f, (uint32_t)want->f);             \
        return true;                                                                   \
    }
    STR_FIELD(model_name)
    STR_FIELD(dtype)
    U32_FIELD(world_size)
    U32_FIELD(worker_rank)
    U32_FIELD(block_size)
    U32_FIELD(num_layers)
    U32_FIELD(hidden_dim)
    U32_FIELD(use_mla)
#undef STR_FIELD
#undef U32_FIELD
    return false;
}

/*
 * Logging happens after the lock is dropped: a log write is a syscall and must not stretch a
 * critical section that every registration and request goes through.
 */
int kvp_registry_add(struct kvp_registry *r, struct kvp_registration *inst, uint32_t max_per_owner,
                     bool *existing, char *msg, size_t msg_size)
{
    *existing = false;
    pthread_mutex_lock(&r->lock);
    int i = do_find_id(r, inst->spec.instance_id);
    if (i >= 0) {
        const struct kvp_registration *have = &r->slots[i].inst;
        int rc = 0;
        if (differs(&have->spec, &inst->spec, msg, msg_size)) {
            rc = -EEXIST;
        } else if (have->owner != inst->owner) {
            snprintf(msg, msg_size, "instance id %s in use by another connection, pid %" PRId32,
                     have->spec.instance_id, have->owner_pid);
            rc = -EBUSY;
        } else {
            *inst = *have;
            *existing = true;
        }
        pthread_mutex_unlock(&r->lock);
        if (rc == 0)
            log_warn("Instance %s is already registered by this connection; returning the "
                     "existing registration",
                     log_name(&inst->spec));
        return rc;
    }
    /* One client must not take the table from the others (--max-instances-per-client), nor
     * one front end from the other front ends (kvp_registry_share()). */
    uint32_t mine = 0, front = 0;
    for (i = 0; i < KVP_MAX_INSTANCES; i++) {
        if (!r->slots[i].used)
            continue;
        mine += r->slots[i].inst.owner == inst->owner;
        front += strcmp(r->slots[i].inst.frontend, inst->frontend) == 0;
    }
    if (max_per_owner && mine >= max_per_owner) {
        pthread_mutex_unlock(&r->lock);
        snprintf(msg, msg_size,
                 "this client has %" PRIu32 " instances registered, the most "
                 "--max-instances-per-client (%" PRIu32 ") allows",
                 mine, max_per_owner);
        return -EDQUOT;
    }
    for (i = 0; i < KVP_MAX_INSTANCES && r->slots[i].used; i++)
        ;
    if (i == KVP_MAX_INSTANCES) {
        pthread_mutex_unlock(&r->lock);
        snprintf(msg, msg_size, "too many instances registered (max %d)", KVP_MAX_INSTANCES);
        return -ENOSPC;
    }
    if (front >= r->max_per_frontend) {
        pthread_mutex_unlock(&r->lock);
        snprintf(msg, msg_size,
                 "the %s front end has %" PRIu32 " instances registered, its share of the table "
                 "of %d (the rest is kept for the other front ends)",
                 inst->frontend, front, KVP_MAX_INSTANCES);
        return -EDQUOT;
    }
    r->slots[i].used = true;
    if (++r->slots[i].gen == 0)
        r->slots[i].gen = 1;
    inst->handle = ((uint32_t)r->slots[i].gen << 16) | (uint32_t)i;
    r->slots[i].inst = *inst;
    r->count++;
    r->count_shm += inst->transport == KVP_REG_SHM;
    struct kvp_instance_io *io = &r->slots[i].io;
    atomic_store_explicit(&io->stored_chunks, 0, memory_order_relaxed);
    atomic_store_explicit(&io->stored_bytes, 0, memory_order_relaxed);
    atomic_store_explicit(&io->retrieved_chunks, 0, memory_order_relaxed);
    atomic_store_explicit(&io->retrieved_bytes, 0, memory_order_relaxed);
    pthread_mutex_unlock(&r->lock);

    /* Counted by the operations layer (ops.c), under the instance's transport. */
    log_transport(inst, &r->offer);
    return 0;
}

/* Returns a copy, so that a concurrent unregister can never leave the caller a dangling
 * pointer. */
int kvp_registry_get(struct kvp_registry *r, uint32_t handle, struct kvp_registration *out)
{
    pthread_mutex_lock(&r->lock);
    int i = do_find_handle(r, handle);
    if (i >= 0)
        *out = r->slots[i].inst;
    pthread_mutex_unlock(&r->lock);
    return i >= 0 ? 0 : -ENOENT;
}

int kvp_registry_get_owned(struct kvp_registry *r, uint32_t handle, uint64_t owner,
                           struct kvp_registration *out)
{
    pthread_mutex_lock(&r->lock);
    int i = do_find_handle(r, handle);
    if (i >= 0 && r->slots[i].inst.owner != owner)
        i = -1;
    if (i >= 0)
        *out = r->slots[i].inst;
    pthread_mutex_unlock(&r->lock);
    return i >= 0 ? 0 : -ENOENT;
}

/* MLA layouts hold no per-rank heads, so all ranks of a model share one namespace. */
void kvp_registration_key_ns(const struct kvp_registration *inst, const void *salt,
                             uint32_t salt_len, struct kvp_key_ns *ns)
{
    *ns = (struct kvp_key_ns){
        .model_name = inst->spec.model_name,
        .world_size = inst->spec.world_size,
        .rank = inst->spec.use_mla ? KVP_RANK_SHARED : inst->spec.worker_rank,
        .dtype = inst->spec.dtype,
        .ndim = inst->layout.ndim,
        .shape = inst->layout.shape,
        .salt = salt,
        .salt_len = salt_len,
    };
}

int kvp_registry_remove(struct kvp_registry *r, uint32_t handle, const char *why)
{
    char id[KVP_MAX_NAME + 1];
    pthread_mutex_lock(&r->lock);
    int i = do_find_handle(r, handle);
    if (i >= 0) {
        memcpy(id, log_name(&r->slots[i].inst.spec), sizeof(id));
        r->slots[i].used = false;
        r->count--;
        r->count_shm -= r->slots[i].inst.transport == KVP_REG_SHM;
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

/* The reason is written before the flag (release), so a reader that sees the flag (acquire)
 * reads it whole; it is never written again. */
uint32_t kvp_registry_lose_shm(struct kvp_registry *r, const char *reason, uint64_t *owners,
                               uint32_t cap, uint32_t *nowners)
{
    uint32_t on_shm = 0;
    *nowners = 0;
    pthread_mutex_lock(&r->lock);
    if (!atomic_load_explicit(&r->shm_lost, memory_order_relaxed)) {
        snprintf(r->lost_reason, sizeof(r->lost_reason), "%s", reason);
        atomic_store_explicit(&r->shm_lost, true, memory_order_release);
    }
    for (int i = 0; i < KVP_MAX_INSTANCES; i++) {
        const struct kvp_registration *inst = &r->slots[i].inst;
        if (!r->slots[i].used || inst->transport != KVP_REG_SHM)
            continue;
        on_shm++;
        uint32_t k = 0;
        while (k < *nowners && owners[k] != inst->owner)
            k++;
        if (k == *nowners && *nowners < cap)
            owners[(*nowners)++] = inst->owner;
    }
    pthread_mutex_unlock(&r->lock);
    return on_shm;
}

int kvp_registry_leave_shm(struct kvp_registry *r, uint32_t handle, uint64_t owner,
                           uint8_t transport, const char *reason)
{
    char id[KVP_MAX_NAME + 1];
    pthread_mutex_lock(&r->lock);
    int i = do_find_handle(r, handle);
    if (i < 0 || r->slots[i].inst.owner != owner) {
        pthread_mutex_unlock(&r->lock);
        return -ENOENT;
    }
    struct kvp_registration *inst = &r->slots[i].inst;
    if (inst->transport != KVP_REG_SHM) {
        pthread_mutex_unlock(&r->lock);
        return 0;
    }
    inst->transport = transport;
    snprintf(inst->reason, sizeof(inst->reason), "%s", reason);
    r->count_shm--;
    memcpy(id, log_name(&inst->spec), sizeof(id));
    pthread_mutex_unlock(&r->lock);
    log_info("Instance %s non-GPU context now using %s transport (%s)", id,
             kvp_reg_transport_name(transport), reason);
    return 1;
}

bool kvp_reg_transport_in_band(uint8_t transport)
{
    return transport == KVP_REG_PICKLE || transport == KVP_REG_ENVELOPE;
}

const char *kvp_reg_transport_name(uint8_t transport)
{
    switch (transport) {
    case KVP_REG_AUTO:
        return "auto";
    case KVP_REG_SHM:
        return "shm";
    case KVP_REG_INLINE:
        return "inline";
    case KVP_REG_PICKLE:
        return "pickle";
    case KVP_REG_ENVELOPE:
        return "envelope";
    default:
        return "unknown";
    }
}

/* Order of the groups: by front end, then transport. */
static int group_cmp(const void *pa, const void *pb)
{
    const struct kvp_instance_group *a = pa, *b = pb;
    int c = strcmp(a->frontend, b->frontend);
    return c ? c : (int)a->transport - (int)b->transport;
}

uint32_t kvp_registry_count_groups(struct kvp_registry *r, struct kvp_instance_group *out,
                                   uint32_t cap, uint32_t *total)
{
    uint32_t n = 0;
    pthread_mutex_lock(&r->lock);
    *total = r->count;
    for (int i = 0; i < KVP_MAX_INSTANCES; i++) {
        if (!r->slots[i].used)
            continue;
        const struct kvp_registration *inst = &r->slots[i].inst;
        uint32_t g = 0;
        while (g < n && (out[g].transport != inst->transport ||
                         strncmp(out[g].frontend, inst->frontend, sizeof(out[g].frontend)) != 0))
            g++;
        if (g == n) {
            if (n == cap)
                continue;
            out[n] = (struct kvp_instance_group){.transport = inst->transport, .count = 0};
            memcpy(out[n].frontend, inst->frontend, sizeof(out[n].frontend));
            out[n].frontend[KVP_MAX_FRONTEND] = '\0';
            n++;
        }
        out[g].count++;
    }
    pthread_mutex_unlock(&r->lock);
    qsort(out, n, sizeof(*out), group_cmp); /* outside the lock */
    return n;
}

uint32_t kvp_registry_count(struct kvp_registry *r)
{
    pthread_mutex_lock(&r->lock);
    uint32_t n = r->count;
    pthread_mutex_unlock(&r->lock);
    return n;
}

void kvp_registry_count_transports(struct kvp_registry *r, uint32_t *total, uint32_t *shm)
{
    pthread_mutex_lock(&r->lock);
    *total = r->count;
    *shm = r->count_shm;
    pthread_mutex_unlock(&r->lock);
}

/* Relaxed: the counts order nothing; the status report reads them under the lock only to see
 * the slot's registration consistently with them. */
void kvp_registry_count_io(struct kvp_registry *r, uint32_t handle, bool store, uint64_t chunks,
                           uint64_t bytes)
{
    uint32_t i = handle & 0xffff;
    if (i >= KVP_MAX_INSTANCES || chunks == 0)
        return;
    struct kvp_instance_io *io = &r->slots[i].io;
    atomic_fetch_add_explicit(store ? &io->stored_chunks : &io->retrieved_chunks, chunks,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(store ? &io->stored_bytes : &io->retrieved_bytes, bytes,
                              memory_order_relaxed);
}

uint32_t kvp_registry_list(struct kvp_registry *r, struct kvp_instance_view *out, uint32_t cap)
{
    uint32_t n = 0;
    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < KVP_MAX_INSTANCES && n < cap; i++) {
        if (!r->slots[i].used)
            continue;
        struct kvp_instance_io *io = &r->slots[i].io;
        out[n] = (struct kvp_instance_view){
            .reg = r->slots[i].inst,
            .stored_chunks = atomic_load_explicit(&io->stored_chunks, memory_order_relaxed),
            .stored_bytes = atomic_load_explicit(&io->stored_bytes, memory_order_relaxed),
            .retrieved_chunks = atomic_load_explicit(&io->retrieved_chunks, memory_order_relaxed),
            .retrieved_bytes = atomic_load_explicit(&io->retrieved_bytes, memory_order_relaxed),
        };
        n++;
    }
    pthread_mutex_unlock(&r->lock);
    return n;
}
