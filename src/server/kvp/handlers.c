/*
 * handlers.c - one function per request opcode of kvpool's protocol (docs/PROTOCOL.md is the
 * contract): decode, call one operation of the core (core/ops.h), encode.
 *
 * Each handler decodes its body strictly, turns it into the operation's protocol-neutral
 * arguments (a REGISTER body into a kvp_reg_spec, a keyed body into a handle and a key source),
 * calls the operation for this connection's owner, and sends exactly one reply from its result
 * or its errno and message. Key derivation, validation, limits, ownership and the L2 tier are
 * the operations' business, so this file decides nothing a second front end would have to
 * decide again. Inline transfers are the exception that proves the rule: the operation hands
 * out iovecs over the slots and the handler moves the bytes on its socket, without a copy.
 *
 * Returning non-zero closes the connection; that is reserved for framing errors and failed
 * socket I/O. A bad value is an error reply and the connection stays usable.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "common/msg.h"
#include "core/daemon.h"
#include "core/ops.h"
#include "core/stats.h"
#include "kvp/handlers.h"
#include "kvp/session.h"
#include "report/metrics.h"
#include "report/status_json.h"

/* Sends an error reply with a formatted message. Returns the send result. */
__attribute__((format(printf, 4, 5))) static int fail(struct kvp_session *c,
                                                      const struct kvp_header *h, int status,
                                                      const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errmsg, sizeof(c->errmsg), fmt, ap);
    va_end(ap);
    return kvp_session_reply(c, h, status, NULL, 0, 0);
}

/* A body that does not decode: answer, then close (the framing is suspect). */
static int malformed(struct kvp_session *c, const struct kvp_header *h)
{
    fail(c, h, -EPROTO, "malformed %s body", kvp_opcode_name(h->opcode));
    KVP_COUNT(protocol_errors, 1);
    log_warn_rl("Connection %llu (pid %d): malformed %s body; closing",
                (unsigned long long)c->owner.id, (int)c->owner.pid, kvp_opcode_name(h->opcode));
    return -EPROTO;
}

static int ok(struct kvp_session *c, const struct kvp_header *h)
{
    return kvp_session_reply(c, h, 0, NULL, 0, 0);
}

/* An operation's failure (its message is in c->errmsg): an error reply; the connection stays. */
static int error(struct kvp_session *c, const struct kvp_header *h, int status)
{
    return kvp_session_reply(c, h, status, NULL, 0, 0);
}

/* -EOPNOTSUPP for the transport an instance does not use: the message names this protocol's
 * request for the other one. */
static int wrong_transport(struct kvp_session *c, const struct kvp_header *h, const char *op)
{
    size_t len = strlen(c->errmsg);
    snprintf(c->errmsg + len, sizeof(c->errmsg) - len, " (use %s)", op);
    return error(c, h, -EOPNOTSUPP);
}

static int handle_hello(struct kvp_session *c, const struct kvp_header *h)
{
    struct kvp_server *s = c->srv;
    struct kvp_hello_reply m = {
        .major = KVP_PROTO_VERSION,
        .minor = KVP_PROTO_MINOR,
        .pid = (uint32_t)getpid(),
        .chunk_tokens = s->cfg.chunk_tokens,
        .shm_backend = !s->seg.shared ? KVP_WIRE_BACKEND_NONE
                       : s->seg.memfd ? KVP_WIRE_BACKEND_MEMFD
                                      : KVP_WIRE_BACKEND_POSIX,
        .segment_size = s->seg.shared ? s->seg.size : 0,
    };
    if (h->body_len != 0)
        return malformed(c, h);
    memcpy(m.nonce, s->seg.nonce, sizeof(m.nonce));
    snprintf(m.shm_name, sizeof(m.shm_name), "%s", s->seg.shared ? s->seg.name : "");
    snprintf(m.shm_reason, sizeof(m.shm_reason), "%s", s->shm_reason);
    kvp_encode_hello_reply(&c->out, &m);
    return ok(c, h);
}

/* Every counter, then every gauge, in the order of their maps (stats.h). */
/* Every counter, then every gauge, in the order of their maps (stats.h). */
static int handle_stats(struct kvp_session *c, const struct kvp_header *h)
{
    _Static_assert(KVP_NCOUNTERS + KVP_NGAUGES <= KVP_MAX_STATS, "STATS reply too long");
    struct kvp_stat_entry e[KVP_NCOUNTERS + KVP_NGAUGES];
    struct kvp_snapshot snap;
    uint32_t n = 0;

    if (h->body_len != 0)
        return malformed(c, h);
    memset(e, 0, sizeof(e)); /* names are copied whole onto the wire */
    int rc = kvp_op_stats(&c->owner, &snap, c->errmsg, sizeof(c->errmsg));
    if (rc)
        return error(c, h, rc);
    for (uint32_t i = 0; i < KVP_NCOUNTERS; i++, n++) {
        snprintf(e[n].name, sizeof(e[n].name), "%s", kvp_counter_desc[i].name);
        e[n].value = snap.counters[i];
    }
    for (uint32_t i = 0; i < KVP_NGAUGES; i++, n++) {
        snprintf(e[n].name, sizeof(e[n].name), "%s", kvp_gauge_desc[i].name);
        e[n].value = snap.gauges[i];
    }
    kvp_snapshot_free(&snap);
    kvp_encode_stats_reply(&c->out, e, n);
    return ok(c, h);
}

/* The wire's transport values are the registry's (KVP_WIRE_* and KVP_REG_*). */
_Static_assert((int)KVP_WIRE_AUTO == (int)KVP_REG_AUTO && (int)KVP_WIRE_SHM == (int)KVP_REG_SHM &&
                   (int)KVP_WIRE_INLINE == (int)KVP_REG_INLINE,
               "wire and registry transports differ");

/* The registry's declaration of a worker, from REGISTER's body (the values are checked by
 * the operation). */
static void spec_of(const struct kvp_register_req *req, struct kvp_reg_spec *spec)
{
    memset(spec, 0, sizeof(*spec));
    memcpy(spec->instance_id, req->instance_id, sizeof(spec->instance_id));
    memcpy(spec->model_name, req->model_name, sizeof(spec->model_name));
    memcpy(spec->dtype, req->dtype, sizeof(spec->dtype));
    spec->world_size = req->world_size;
    spec->worker_rank = req->worker_rank;
    spec->block_size = req->block_size;
    spec->num_layers = req->num_layers;
    spec->hidden_dim = req->hidden_dim;
    spec->use_mla = req->use_mla;
    spec->transport = req->transport;
    memcpy(spec->reason, req->reason, sizeof(spec->reason));
}

static int handle_register(struct kvp_session *c, const struct kvp_header *h)
{
    struct kvp_server *s = c->srv;
    struct kvp_register_req req;
    struct kvp_reg_spec spec;
    struct kvp_registration inst;
    bool existing;

    if (kvp_decode_register_req(c->body, h->body_len, &req))
        return malformed(c, h);
    /* Pickle is LMCache's transport, served by its front end only. */
    if (req.transport > KVP_WIRE_INLINE) {
        snprintf(c->errmsg, sizeof(c->errmsg), "transport must be 0 (auto), 1 (shm) or 2 (inline)");
        return error(c, h, -EINVAL);
    }
    spec_of(&req, &spec);
    /* A claim to use shared memory stands only on evidence that the worker can map it. */
    char nomap[KVP_MAX_REASON + 1];
    bool can_map = kvp_transport_peer_can_map(&s->seg, c->fd, c->sent_segment_fd, nomap,
                                              sizeof(nomap));
    int rc = kvp_op_register(&c->owner, &spec, can_map ? NULL : nomap, &inst, &existing, c->errmsg,
                             sizeof(c->errmsg));
    if (rc)
        return error(c, h, rc);

    bool shm = inst.transport == KVP_REG_SHM;
    struct kvp_register_reply m = {
        .handle = inst.handle,
        .transport = inst.transport,
        .existing = existing,
        .ndim = (uint8_t)inst.layout.ndim,
        .chunk_tokens = s->cfg.chunk_tokens,
        .chunk_bytes = inst.layout.bytes,
        .dtype_size = inst.dtype_size,
        .segment_size = shm ? s->seg.size : 0,
    };
    memcpy(m.shape, inst.layout.shape, sizeof(m.shape));
    snprintf(m.dtype, sizeof(m.dtype), "%s", inst.spec.dtype);
    snprintf(m.shm_name, sizeof(m.shm_name), "%s", shm ? s->seg.name : "");
    snprintf(m.reason, sizeof(m.reason), "%s", inst.reason);
    kvp_encode_register_reply(&c->out, &m);
    return ok(c, h);
}

static int handle_unregister(struct kvp_session *c, const struct kvp_header *h)
{
    struct kvp_ref_req req;
    if (kvp_decode_ref_req(c->body, h->body_len, &req))
        return malformed(c, h);
    int rc = kvp_op_unregister(&c->owner, req.handle, c->errmsg, sizeof(c->errmsg));
    return rc ? error(c, h, rc) : ok(c, h);
}

/* Decodes a keyed request into its handle and key source (pointing into the body). */
static int decode_keyed(struct kvp_session *c, const struct kvp_header *h, uint32_t *handle,
                        struct kvp_key_src *src)
{
    struct kvp_key_req req;
    if (kvp_decode_key_req(c->body, h->body_len, &req))
        return -EPROTO;
    *handle = req.handle;
    *src = (struct kvp_key_src){
        .tokens_le = req.tokens,
        .ntokens = req.ntokens,
        .start = req.start,
        .end = req.end,
        .salt = req.salt,
        .salt_len = req.salt_len,
    };
    return 0;
}

static int handle_lookup(struct kvp_session *c, const struct kvp_header *h)
{
    struct kvp_key_src src;
    struct kvp_op_slots res;
    uint32_t handle;

    if (decode_keyed(c, h, &handle, &src))
        return malformed(c, h);
    int rc = kvp_op_lookup(&c->owner, handle, &src, 0, &res, c->errmsg, sizeof(c->errmsg));
    if (rc)
        return error(c, h, rc);
    struct kvp_lookup_reply m = {.nchunks = res.nchunks, .cached = res.cached};
    kvp_encode_lookup_reply(&c->out, &m);
    return ok(c, h);
}

/* Encodes a slots reply (msg.c) of an operation's result. */
static void encode_slots(struct kvp_session *c, const struct kvp_op_slots *res)
{
    struct kvp_slots_reply m = {
        .id = res->id,
        .nchunks = res->nchunks,
        .cached = res->cached,
        .busy = res->busy,
        .no_space = res->no_space,
        .nslots = res->nslots,
        .slots = c->slots,
    };
    for (uint32_t i = 0; i < res->nslots; i++)
        c->slots[i] = (struct kvp_wire_slot){
            .chunk_index = res->idx ? res->idx[i] : i,
            .offset = res->objs[i]->offset,
            .length = res->objs[i]->length,
        };
    kvp_encode_slots_reply(&c->out, &m);
}

static int handle_prepare_store(struct kvp_session *c, const struct kvp_header *h)
{
    struct kvp_key_src src;
    struct kvp_op_slots res;
    uint32_t handle;

    if (decode_keyed(c, h, &handle, &src))
        return malformed(c, h);
    int rc = kvp_op_prepare_store(&c->owner, handle, &src, &res, c->errmsg, sizeof(c->errmsg));
    if (rc)
        return error(c, h, rc);
    encode_slots(c, &res);
    return ok(c, h);
}

/* COMMIT_STORE and ABORT_STORE. */
static int handle_finish_store(struct kvp_session *c, const struct kvp_header *h, bool commit)
{
    struct kvp_ref_req req;
    if (kvp_decode_ref_req(c->body, h->body_len, &req))
        return malformed(c, h);
    int rc = commit ? kvp_op_commit_store(&c->owner, req.handle, req.id, KVP_VIA_SHM, c->errmsg,
                                          sizeof(c->errmsg))
                    : kvp_op_abort_store(&c->owner, req.handle, req.id, KVP_DROP_ABORT, c->errmsg,
                                         sizeof(c->errmsg));
    if (rc == -EOPNOTSUPP)
        return wrong_transport(c, h, "STORE_INLINE");
    if (rc < 0)
        return error(c, h, rc);
    kvp_encode_count_reply(&c->out, (uint32_t)rc);
    return ok(c, h);
}

static int handle_store_inline(struct kvp_session *c, const struct kvp_header *h)
{
    struct kvp_op_slots res;
    struct kvp_ref_req req;

    if (kvp_decode_ref_req(c->body, h->body_len, &req))
        return malformed(c, h);
    int rc = kvp_op_store_inline_begin(&c->owner, req.handle, req.id, h->payload_len, &res,
                                       c->errmsg, sizeof(c->errmsg));
    if (rc) {
        error(c, h, rc);
        return rc; /* the payload that follows cannot be skipped safely */
    }
    /* Straight into the reserved slots, without any lock. */
    for (uint32_t i = 0; i < res.nslots; i++) {
        rc = kvp_session_recv(c, res.iov[i].iov_base, res.iov[i].iov_len);
        if (rc) {
            kvp_op_abort_store(&c->owner, req.handle, req.id, KVP_DROP_DISCONNECT, c->errmsg,
                               sizeof(c->errmsg));
            return rc;
        }
    }
    KVP_COUNT(inline_bytes_in, h->payload_len);
    rc = kvp_op_commit_store(&c->owner, req.handle, req.id, KVP_VIA_INLINE, c->errmsg,
                             sizeof(c->errmsg));
    if (rc < 0)
        return error(c, h, rc);
    kvp_encode_count_reply(&c->out, (uint32_t)rc);
    return ok(c, h);
}

static int handle_prepare_retrieve(struct kvp_session *c, const struct kvp_header *h)
{
    struct kvp_key_src src;
    struct kvp_op_slots res;
    uint32_t handle;

    if (decode_keyed(c, h, &handle, &src))
        return malformed(c, h);
    int rc = kvp_op_prepare_retrieve(&c->owner, handle, &src, &res, c->errmsg, sizeof(c->errmsg));
    if (rc == -EOPNOTSUPP)
        return wrong_transport(c, h, "RETRIEVE_INLINE");
    if (rc)
        return error(c, h, rc);
    encode_slots(c, &res);
    return ok(c, h);
}

static int handle_commit_retrieve(struct kvp_session *c, const struct kvp_header *h)
{
    struct kvp_ref_req req;
    if (kvp_decode_ref_req(c->body, h->body_len, &req))
        return malformed(c, h);
    int rc = kvp_op_commit_retrieve(&c->owner, req.handle, req.id, c->errmsg, sizeof(c->errmsg));
    if (rc < 0)
        return error(c, h, rc);
    kvp_encode_count_reply(&c->out, (uint32_t)rc);
    return ok(c, h);
}

static int handle_retrieve_inline(struct kvp_session *c, const struct kvp_header *h)
{
    struct kvp_key_src src;
    struct kvp_op_slots res;
    uint32_t handle;

    if (decode_keyed(c, h, &handle, &src))
        return malformed(c, h);
    int rc = kvp_op_retrieve_inline_begin(&c->owner, handle, &src, &res, c->errmsg,
                                          sizeof(c->errmsg));
    if (rc)
        return error(c, h, rc);
    encode_slots(c, &res);
    /* The pins keep the objects from eviction while the bytes go out unlocked. */
    rc = kvp_session_reply(c, h, 0, res.iov, (int)res.nslots,
                           (uint64_t)res.nslots * res.chunk_bytes);
    kvp_op_retrieve_inline_end(&c->owner, handle, &res, rc == 0);
    return rc;
}

/* MAP_SEGMENT: the memfd segment's descriptor travels as SCM_RIGHTS with the reply header. */
static int handle_map_segment(struct kvp_session *c, const struct kvp_header *h)
{
    struct kvp_server *s = c->srv;
    if (h->body_len != 0)
        return malformed(c, h);
    if (!s->seg.memfd)
        return fail(c, h, -EOPNOTSUPP, "this kvpoold does not use the memfd backend");
    return kvp_session_reply_fd(c, h, s->seg.fd);
}

/*
 * STATUS and METRICS: the documents status.c and metrics.c render (the same text as GET
 * /api/status and GET /metrics), so that `kvpool` works with the HTTP endpoint off.
 */
static int handle_text(struct kvp_session *c, const struct kvp_header *h, bool status)
{
    const char *what = status ? "status" : "metrics";
    size_t len = 0;

    if (h->body_len != 0)
        return malformed(c, h);
    char *text = status ? kvp_status_json(c->srv) : kvp_metrics_text(c->srv, &len);
    if (!text)
        return fail(c, h, -ENOMEM, "out of memory while rendering the %s", what);
    if (status)
        len = strlen(text);
    if (len > KVP_MAX_TEXT) {
        free(text);
        return fail(c, h, -EMSGSIZE, "the %s text of %zu bytes exceeds %u", what, len,
                    KVP_MAX_TEXT);
    }
    kvp_encode_text_reply(&c->out, text, (uint32_t)len);
    free(text);
    if (c->out.err) {
        kvp_wbuf_reset(&c->out);
        return fail(c, h, -ENOMEM, "out of memory while sending the %s", what);
    }
    return ok(c, h);
}

/* CLEAR: drops the committed chunks nobody pins (an operator's action, so it is logged). */
static int handle_clear(struct kvp_session *c, const struct kvp_header *h)
{
    struct kvp_clear_result r;

    if (h->body_len != 0)
        return malformed(c, h);
    kvp_op_clear(&c->owner, &r);
    /* The pool cannot hold 2^32 chunks of at least one page each in any real machine. */
    kvp_encode_count_reply(&c->out, r.dropped > UINT32_MAX ? UINT32_MAX : (uint32_t)r.dropped);
    return ok(c, h);
}

int kvp_handle_request(struct kvp_session *c, const struct kvp_header *h)
{
    switch (h->opcode) {
    case KVP_OP_HELLO:
        return handle_hello(c, h);
    case KVP_OP_PING:
        return h->body_len ? malformed(c, h) : ok(c, h);
    case KVP_OP_STATS:
        return handle_stats(c, h);
    case KVP_OP_REGISTER:
        return handle_register(c, h);
    case KVP_OP_UNREGISTER:
        return handle_unregister(c, h);
    case KVP_OP_LOOKUP:
        return handle_lookup(c, h);
    case KVP_OP_PREPARE_STORE:
        return handle_prepare_store(c, h);
    case KVP_OP_COMMIT_STORE:
        return handle_finish_store(c, h, true);
    case KVP_OP_ABORT_STORE:
        return handle_finish_store(c, h, false);
    case KVP_OP_STORE_INLINE:
        return handle_store_inline(c, h);
    case KVP_OP_PREPARE_RETRIEVE:
        return handle_prepare_retrieve(c, h);
    case KVP_OP_COMMIT_RETRIEVE:
        return handle_commit_retrieve(c, h);
    case KVP_OP_RETRIEVE_INLINE:
        return handle_retrieve_inline(c, h);
    case KVP_OP_MAP_SEGMENT:
        return handle_map_segment(c, h);
    case KVP_OP_STATUS:
        return handle_text(c, h, true);
    case KVP_OP_METRICS:
        return handle_text(c, h, false);
    case KVP_OP_CLEAR:
        return handle_clear(c, h);
    default:
        return malformed(c, h);
    }
}
