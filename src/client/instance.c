/*
 * instance.c - registration of a worker's KV layout, and the shm-versus-inline decision.
 *
 * Design. The transport is decided here, once per instance, and the daemon is told the truth:
 *
 *   requested   daemon offers shm   segment maps and verifies   sent to the daemon
 *   AUTO        yes                 yes                         shm
 *   AUTO        yes                 no                          inline, reason = why not
 *   AUTO        no                  -                           inline, reason = daemon's own
 *   SHM         yes                 yes                         shm
 *   SHM         no, or it fails     -                           nothing: KVP_ENOSHM
 *   INLINE      -                   -                           inline, "requested by worker"
 *
 * The segment is mapped at most once per client (the first registration that wants it) and
 * stays mapped until kvp_client_close(). The daemon's reply is checked for internal consistency
 * (known dtype, shape and chunk_bytes agree, same segment as HELLO) because chunk_bytes sizes
 * every later copy.
 *
 * If this client had already registered the id (with the same layout; a namesake is refused
 * with -EEXIST or -EBUSY and the daemon's message), the daemon answers with that registration,
 * which may be on shm even though this call asked for inline; the library then tries to map
 * the segment and otherwise moves this instance's bytes inline (the daemon accepts inline
 * transfers for shm instances), reporting that in info.reason.
 *
 * Registering again. An instance keeps a copy of what it was registered with (inst->req, the
 * names copied, and the transport asked for), so that after a reconnect (reconnect.c) it can be
 * registered on the new connection exactly as kvp_register() did, transport choice and inline
 * fallback included. The chunk layout must come back the same: the worker sized its buffers by
 * chunk_bytes, so a daemon restarted with another chunk size makes the instance stale for good
 * (-ESTALE; the registration the new daemon made is dropped). Any other refusal is kept in
 * inst->err/errmsg and the instance's next call tries again.
 *
 * Threads: the client's lock is held for the whole registration, including the mapping.
 */
#include "client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/layout.h"

#define KVP_INFO_DTYPE_SIZE sizeof(((kvp_instance_info *)0)->dtype)

/* Checks a caller-supplied name: -EINVAL when missing or empty, -ENAMETOOLONG when too long. */
static int check_name(struct kvp_conn *conn, const char *s, const char *field)
{
    if (!s || !s[0])
        return kvp_conn_error(conn, -EINVAL, "%s must be a non-empty string", field);
    if (strlen(s) > KVP_MAX_NAME)
        return kvp_conn_error(conn, -ENAMETOOLONG, "%s is longer than %u bytes", field,
                              KVP_MAX_NAME);
    return 0;
}

/* Maps the daemon's segment unless this connection already did. Caller holds the lock. */
static int do_map_segment(kvp_client *c, char *reason, size_t reason_size)
{
    int rc;

    if (c->shm.base)
        return 0;
    /* Plans count their pointers per mapping (reconnect.c). */
    c->shm_gen = c->gen;
    c->shm_plans = 0;
    if (c->hello.shm_backend == KVP_WIRE_BACKEND_POSIX)
        return kvp_shm_map_open(&c->shm, c->hello.shm_name, c->hello.segment_size, c->hello.nonce,
                                reason, reason_size);

    /* memfd: the daemon hands the descriptor over the socket; there is no name to open. */
    rc = kvp_conn_begin(&c->conn);
    if (rc == 0)
        rc = kvp_conn_call(&c->conn, KVP_OP_MAP_SEGMENT, NULL, 0, false);
    int fd = kvp_conn_take_fd(&c->conn);
    if (rc == 0 && fd < 0)
        rc = -EBADF;
    if (rc < 0) {
        snprintf(reason, reason_size, "cannot receive the memfd segment: %.200s",
                 c->conn.errmsg[0] ? c->conn.errmsg : kvp_strerror(rc));
        if (fd >= 0)
            close(fd);
        return rc;
    }
    rc = kvp_shm_map_fd(&c->shm, fd, c->hello.segment_size, c->hello.nonce, "the memfd segment",
                        reason, reason_size);
    close(fd);
    return rc;
}

/* Fills req->transport and req->reason. Returns 0, or KVP_ENOSHM for a strict SHM request
 * that cannot be met. Caller holds the lock. */
static int do_choose_transport(kvp_client *c, uint32_t want, struct kvp_register_req *req)
{
    const struct kvp_hello_reply *h = &c->hello;
    char why[KVP_MAX_REASON + 1];

    if (want == KVP_TRANSPORT_INLINE) {
        req->transport = KVP_WIRE_INLINE;
        snprintf(req->reason, sizeof(req->reason), "requested by worker");
        return 0;
    }
    if (!h->shm_backend) {
        if (want == KVP_TRANSPORT_SHM)
            return kvp_conn_error(&c->conn, KVP_ENOSHM, "kvpoold offers no shared memory: %s",
                                  h->shm_reason[0] ? h->shm_reason : "disabled");
        req->transport = KVP_WIRE_INLINE;
        snprintf(req->reason, sizeof(req->reason), "%s",
                 h->shm_reason[0] ? h->shm_reason : "kvpoold offers no shared memory");
        return 0;
    }
    if (do_map_segment(c, why, sizeof(why)) < 0) {
        if (want == KVP_TRANSPORT_SHM)
            return kvp_conn_error(&c->conn, KVP_ENOSHM, "%s", why);
        req->transport = KVP_WIRE_INLINE;
        snprintf(req->reason, sizeof(req->reason), "%s", why);
        return 0;
    }
    req->transport = KVP_WIRE_SHM;
    req->reason[0] = '\0';
    return 0;
}

/* Checks that a REGISTER reply describes a usable layout. Returns 0 or KVP_EPROTO (broken). */
static int do_check_reply(kvp_client *c, const struct kvp_register_reply *r)
{
    struct kvp_conn *conn = &c->conn;
    const struct kvp_dtype *dt = kvp_dtype_find(r->dtype);
    struct kvp_chunk_layout l;
    bool mla = r->ndim == 3;
    const uint32_t *dims = mla ? r->shape : r->shape + 1; /* layers, tokens, hidden */

    if (r->transport != KVP_WIRE_SHM && r->transport != KVP_WIRE_INLINE)
        return kvp_conn_fail(conn, KVP_EPROTO, "REGISTER reply has transport %u", r->transport);
    if (!dt || dt->size != r->dtype_size || strlen(r->dtype) >= KVP_INFO_DTYPE_SIZE)
        return kvp_conn_fail(conn, KVP_EPROTO, "REGISTER reply has dtype \"%s\" of size %u",
                             r->dtype, r->dtype_size);
    if ((!mla && r->shape[0] != 2) || dims[1] != r->chunk_tokens ||
        kvp_chunk_layout(dims[0], dims[1], dims[2], dt->size, mla, 0, &l) < 0 ||
        l.bytes != r->chunk_bytes || r->chunk_bytes > SIZE_MAX)
        return kvp_conn_fail(conn, KVP_EPROTO,
                             "REGISTER reply has an inconsistent chunk layout "
                             "(%u dims, %llu bytes)",
                             r->ndim, (unsigned long long)r->chunk_bytes);
    if (r->transport == KVP_WIRE_SHM &&
        (!c->hello.shm_backend || strcmp(r->shm_name, c->hello.shm_name) != 0 ||
         r->segment_size != c->hello.segment_size ||
         r->chunk_bytes > r->segment_size - KVP_SHM_HEADER_SIZE))
        return kvp_conn_fail(conn, KVP_EPROTO,
                             "REGISTER reply names segment \"%s\" of %llu "
                             "bytes, HELLO announced \"%s\" of %llu",
                             r->shm_name, (unsigned long long)r->segment_size, c->hello.shm_name,
                             (unsigned long long)c->hello.segment_size);
    return 0;
}

/* Drops a registration the library cannot use. Best effort: errors are ignored. Caller holds
 * the lock. */
static void do_drop_registration(kvp_client *c, uint32_t handle)
{
    struct kvp_ref_req ref = {.handle = handle, .id = 0};
    char keep[KVP_ERRMSG_SIZE];

    memcpy(keep, c->conn.errmsg, sizeof(keep));
    if (kvp_conn_begin(&c->conn) == 0) {
        kvp_encode_ref_req(&c->conn.req, &ref);
        kvp_conn_call(&c->conn, KVP_OP_UNREGISTER, NULL, 0, false);
    }
    memcpy(c->conn.errmsg, keep, sizeof(keep));
}

/*
 * A registration made again after a reconnect must have the layout the worker's buffers were
 * sized for. Returns 0, or -ESTALE with the registration dropped if this call created it.
 */
static int do_check_same_layout(kvp_client *c, const kvp_instance *inst,
                                const struct kvp_register_reply *r)
{
    const kvp_instance_info *old = &inst->info;

    if (r->chunk_tokens == old->chunk_tokens && r->ndim == old->ndim &&
        r->chunk_bytes == old->chunk_bytes && r->dtype_size == old->dtype_size &&
        memcmp(r->shape, old->shape, sizeof(old->shape)) == 0 && strcmp(r->dtype, old->dtype) == 0)
        return 0;
    if (!r->existing)
        do_drop_registration(c, r->handle);
    return kvp_conn_error(&c->conn, -ESTALE,
                          "kvpoold now uses %u-token chunks of %llu bytes, the instance was "
                          "registered with %u-token chunks of %llu bytes: unregister it and "
                          "register again",
                          r->chunk_tokens, (unsigned long long)r->chunk_bytes, old->chunk_tokens,
                          (unsigned long long)old->chunk_bytes);
}

/*
 * Turns a checked REGISTER reply into inst->info, inst->shm and inst->handle, given what was
 * requested. Returns 0, or KVP_ENOSHM (with the registration dropped if this call created it);
 * on failure inst is left as it was.
 */
static int do_adopt_reply(kvp_client *c, kvp_instance *inst, uint32_t want,
                          const struct kvp_register_reply *r)
{
    kvp_instance_info new_info, *info = &new_info;
    char why[KVP_MAX_REASON + 1] = "";

    *info = (kvp_instance_info){
        .chunk_tokens = r->chunk_tokens,
        .ndim = r->ndim,
        .chunk_bytes = r->chunk_bytes,
        .dtype_size = r->dtype_size,
        .existing = r->existing,
    };
    memcpy(info->shape, r->shape, sizeof(info->shape));
    /* do_check_reply() bounded the dtype name to the field. */
    snprintf(info->dtype, sizeof(info->dtype), "%.*s", (int)sizeof(info->dtype) - 1, r->dtype);

    if (r->transport == KVP_WIRE_SHM && want != KVP_TRANSPORT_INLINE &&
        do_map_segment(c, why, sizeof(why)) == 0) {
        info->transport = KVP_TRANSPORT_SHM;
        snprintf(info->shm_name, sizeof(info->shm_name), "%s", r->shm_name);
        inst->shm = true;
        inst->handle = r->handle;
        inst->info = *info;
        return 0;
    }
    if (want == KVP_TRANSPORT_SHM) {
        /* An existing registration can come back inline after we said shm (it is not ours to
         * drop), and so can a new one when the daemon finds no evidence that this process can
         * map the segment (docs/SECURITY.md): do not leave that one behind. */
        if (!r->existing)
            do_drop_registration(c, r->handle);
        return kvp_conn_error(&c->conn, KVP_ENOSHM,
                              "instance is registered with the inline transport%s: %.200s",
                              r->existing ? " (existing registration)" : "",
                              r->reason[0] ? r->reason : why);
    }
    info->transport = KVP_TRANSPORT_INLINE;
    if (r->transport == KVP_WIRE_SHM && want == KVP_TRANSPORT_INLINE)
        snprintf(info->reason, sizeof(info->reason), "requested by worker");
    else if (r->transport == KVP_WIRE_SHM)
        snprintf(info->reason, sizeof(info->reason),
                 "existing shm registration, this process "
                 "cannot map the segment: %.180s",
                 why);
    else
        snprintf(info->reason, sizeof(info->reason), "%s", r->reason);
    inst->shm = false;
    inst->handle = r->handle;
    inst->info = *info;
    return 0;
}

/*
 * REGISTER of inst->req on the current connection, with the transport chosen now (the segment
 * of this connection's daemon is mapped if needed). On success inst's handle, transport and
 * info describe the new registration and inst->gen is the connection's generation. Caller
 * holds the lock, after kvp_conn_begin().
 */
static int do_register(kvp_client *c, kvp_instance *inst)
{
    struct kvp_register_req req = inst->req;
    struct kvp_register_reply rep;
    int rc;

    rc = do_choose_transport(c, inst->want, &req);
    if (rc < 0)
        return rc;
    kvp_encode_register_req(&c->conn.req, &req);
    rc = kvp_conn_call(&c->conn, KVP_OP_REGISTER, NULL, 0, false);
    if (rc == -EOPNOTSUPP && req.transport == KVP_WIRE_SHM)
        rc = KVP_ENOSHM;
    if (rc < 0)
        return rc;
    if (kvp_decode_register_reply(c->conn.body, c->conn.body_len, &rep) < 0)
        return kvp_conn_fail(&c->conn, KVP_EPROTO, "malformed REGISTER reply");
    rc = do_check_reply(c, &rep);
    /* gen is 0 only before the first registration. */
    if (rc == 0 && inst->gen)
        rc = do_check_same_layout(c, inst, &rep);
    if (rc == 0)
        rc = do_adopt_reply(c, inst, inst->want, &rep);
    if (rc < 0)
        return rc;
    inst->gen = c->gen;
    inst->err = 0;
    inst->errmsg[0] = '\0';
    return 0;
}

int kvp_instance_register_again(kvp_instance *inst)
{
    kvp_client *c = inst->client;
    int rc;

    if (inst->stale)
        return inst->err;
    rc = kvp_conn_begin(&c->conn);
    if (rc == 0)
        rc = do_register(c, inst);
    if (rc < 0) {
        inst->err = rc;
        inst->stale = rc == -ESTALE;
        snprintf(inst->errmsg, sizeof(inst->errmsg),
                 "cannot register instance %s again after reconnecting to kvpoold: %.300s",
                 inst->req.instance_id, c->conn.errmsg[0] ? c->conn.errmsg : kvp_strerror(rc));
    }
    return rc;
}

/*
 * An instance that is not registered on the current connection gets one attempt per call. If
 * the reconnect made by this very call has just tried and failed, its answer is reported
 * instead of asking the daemon twice.
 */
int kvp_instance_begin(kvp_instance *inst)
{
    kvp_client *c = inst->client;
    uint64_t gen = c->gen;
    int rc;

    rc = kvp_client_begin(c);
    if (rc < 0 || inst->gen == c->gen)
        return rc;
    if (inst->err && (inst->stale || c->gen != gen))
        return kvp_conn_error(&c->conn, inst->err, "%s", inst->errmsg);
    rc = kvp_instance_register_again(inst);
    if (rc < 0)
        return kvp_conn_error(&c->conn, rc, "%s", inst->errmsg);
    return kvp_conn_begin(&c->conn);
}

KVP_EXPORT int kvp_register(kvp_client *c, const kvp_register_opts *o, kvp_instance **ret)
{
    struct kvp_register_req *req;
    kvp_instance *inst;
    int rc;

    if (!ret)
        return -EINVAL;
    *ret = NULL;
    if (!c || !o)
        return -EINVAL;
    inst = calloc(1, sizeof(*inst));
    if (!inst)
        return -ENOMEM;
    inst->client = c;
    req = &inst->req;

    pthread_mutex_lock(&c->lock);
    rc = kvp_client_begin(c);
    if (rc < 0)
        goto out_unlock;
    if ((rc = check_name(&c->conn, o->instance_id, "instance_id")) < 0 ||
        (rc = check_name(&c->conn, o->model_name, "model_name")) < 0 ||
        (rc = check_name(&c->conn, o->dtype, "dtype")) < 0)
        goto out_unlock;
    for (size_t i = 0; i < sizeof(o->reserved_) / sizeof(o->reserved_[0]); i++) {
        if (o->reserved_[i]) {
            rc = kvp_conn_error(&c->conn, -EINVAL,
                                "kvp_register_opts.reserved_[%zu] is not zero: "
                                "zero-initialise kvp_register_opts",
                                i);
            goto out_unlock;
        }
    }
    if (o->transport > KVP_TRANSPORT_INLINE) {
        rc = kvp_conn_error(&c->conn, -EINVAL,
                            "transport must be 0 (auto), 1 (shm) or "
                            "2 (inline), not %u",
                            o->transport);
        goto out_unlock;
    }

    /* Lengths were checked above, so these copies cannot truncate. The instance keeps them:
     * the caller's strings need not outlive this call, a reconnect registers again. */
    snprintf(req->instance_id, sizeof(req->instance_id), "%s", o->instance_id);
    snprintf(req->model_name, sizeof(req->model_name), "%s", o->model_name);
    snprintf(req->dtype, sizeof(req->dtype), "%s", o->dtype);
    req->world_size = o->world_size;
    req->worker_rank = o->worker_rank;
    req->block_size = o->block_size;
    req->num_layers = o->num_layers;
    req->hidden_dim = o->hidden_dim;
    req->use_mla = o->use_mla ? 1 : 0;
    inst->want = o->transport;
    rc = do_register(c, inst);
    if (rc < 0)
        goto out_unlock;

    inst->next = c->instances;
    if (c->instances)
        c->instances->prev = inst;
    c->instances = inst;
    pthread_mutex_unlock(&c->lock);
    *ret = inst;
    return 0;

out_unlock:
    pthread_mutex_unlock(&c->lock);
    free(inst);
    return rc;
}

/* Unlinks an instance from its client's list. Caller holds the lock. */
static void do_unlink(kvp_instance *inst)
{
    kvp_client *c = inst->client;

    if (inst->prev)
        inst->prev->next = inst->next;
    else
        c->instances = inst->next;
    if (inst->next)
        inst->next->prev = inst->prev;
    inst->prev = inst->next = NULL;
}

KVP_EXPORT int kvp_unregister(kvp_instance *inst)
{
    struct kvp_ref_req ref;
    kvp_client *c;
    int rc;

    if (!inst)
        return 0;
    c = inst->client;

    pthread_mutex_lock(&c->lock);
    kvp_client_probe(c);
    /* Nothing to tell a daemon that does not know this registration: it was made on a lost
     * connection (dropped with it; a reconnect will not make it again) or never made again. */
    if (inst->gen != c->gen || (c->conn.broken && kvp_conn_reconnectable(&c->conn))) {
        c->conn.errmsg[0] = '\0';
        rc = 0;
    } else {
        ref = (struct kvp_ref_req){.handle = inst->handle, .id = 0};
        rc = kvp_conn_begin(&c->conn);
        if (rc == 0) {
            kvp_encode_ref_req(&c->conn.req, &ref);
            rc = kvp_conn_call(&c->conn, KVP_OP_UNREGISTER, NULL, 0, false);
        }
        if (rc == 0 && c->conn.body_len != 0)
            rc = kvp_conn_fail(&c->conn, KVP_EPROTO, "UNREGISTER reply has a %zu-byte body",
                               c->conn.body_len);
    }
    /* The instance is gone for the caller whatever the daemon said: on a broken connection the
     * daemon drops it when it sees the close. */
    do_unlink(inst);
    pthread_mutex_unlock(&c->lock);
    free(inst);
    return rc;
}

KVP_EXPORT const kvp_instance_info *kvp_instance_get_info(const kvp_instance *inst)
{
    return inst ? &inst->info : NULL;
}

void kvp_instances_free_all(kvp_client *c)
{
    kvp_instance *inst = c->instances;

    while (inst) {
        kvp_instance *next = inst->next;
        free(inst);
        inst = next;
    }
    c->instances = NULL;
}
