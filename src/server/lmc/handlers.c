/*
 * handlers.c - one handler per LMCache operation: decode the payloads, call the semantics
 * (instances.h, transfers.h, jobs.h: over the core's operations), encode the reply
 * (docs/LMCACHE.md is the contract).
 *
 * The dispatch table gives each served operation the payload counts LMCache 0.5.5, 0.5.6 and
 * 0.5.7 send (ping, clear and end_session have a shorter older form; 0.5.7 adds a third payload
 * to prepare_store and free_lookup_locks, and two operations sent by name,
 * negotiate_chunk_size and subscribe_kv_events). The version is decided per request, from what
 * the request carries, never per connection: one daemon serves workers of every version at
 * once. Every request is answered:
 *   - a served operation whose payloads do not decode, or whose count is wrong, gets its
 *     operation's negative reply (messages.c) and one rate-limited WARN naming the problem;
 *   - an operation kvpoold does not serve (GPU transfers, CacheBlend, P2P, server modules, an
 *     unknown id or name) gets the negative reply its type allows, a WARN
 *     the first time it is seen (GPU registrations: an ERROR that names the fix), and is
 *     counted. Payloads of those are never decoded: a GPU registration carries pickled ext
 *     values that kvpoold must not touch.
 */
#include <errno.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "core/daemon.h"
#include "core/stats.h"
#include "lmc/front.h"
#include "lmc/inband.h"
#include "lmc/instances.h"
#include "lmc/jobs.h"
#include "lmc/messages.h"
#include "lmc/transfers.h"

typedef bool (*lmc_handler_fn)(struct lmc_front *f, const struct lmc_req *r);

struct handler {
    enum lmc_op op;
    uint8_t min, max; /* payload frames accepted */
    lmc_handler_fn fn;
};

/* A request that did not decode: counted, logged at a limited rate, answered negatively. */
static bool malformed(struct lmc_front *f, const struct lmc_req *r, const char *why)
{
    KVP_COUNT(lmcache_malformed, 1);
    log_warn_rl("LMCache %s request malformed (%s): answered negatively", lmc_op_name(r->op), why);
    return lmc_encode_negative(&f->out, r->op);
}

static bool decode_key(struct lmc_front *f, const struct lmc_req *r, uint32_t i, struct lmc_key *k,
                       char *why, size_t why_size)
{
    return lmc_decode_key(r->p[i], r->n[i], k, f->tokens, why, why_size) == 0;
}

static bool h_get_chunk_size(struct lmc_front *f, const struct lmc_req *r)
{
    (void)r;
    lmc_mp_put_uint(&f->out, f->srv->cfg.chunk_tokens);
    return true;
}

/*
 * LMCache 0.5.7's connector asks for the chunk size by name with the alignment its model needs
 * (vLLM's block size). kvpoold's chunk size is --chunk-size, fixed (its keys are chunked by it),
 * so the answer is always that size: `lmcache server` raises and sends nothing when the size it
 * chose does not fit, and the worker waits out its timeout; the connector checks the answer
 * itself and stops with its own message. Never anything but the size, not even for a request
 * that does not decode: the connector would call int() on None.
 */
static bool h_negotiate_chunk_size(struct lmc_front *f, const struct lmc_req *r)
{
    uint32_t C = f->srv->cfg.chunk_tokens;
    int64_t align;
    if (r->npayloads == 1 && lmc_decode_int(r->p[0], r->n[0], 1, INT32_MAX, &align) == 0) {
        if (C % (uint64_t)align) {
            uint64_t up = ((uint64_t)C + (uint64_t)align - 1) / (uint64_t)align * (uint64_t)align;
            log_warn_rl("An LMCache worker needs a chunk size that is a multiple of %" PRId64
                        ", and kvpoold's is %u: answered %u, which its connector refuses; start "
                        "kvpoold with --chunk-size %" PRIu64 " (or another multiple of %" PRId64
                        ")",
                        align, C, C, up, align);
        }
    } else if (r->npayloads == 1) {
        KVP_COUNT(lmcache_malformed, 1);
        log_warn_rl("LMCache negotiate_chunk_size request malformed (required_chunk_alignment is "
                    "not an int of 1..2^31-1): answered with the chunk size");
    }
    lmc_mp_put_uint(&f->out, C);
    return true;
}

/*
 * LMCache 0.5.7's KV event stream. kvpoold records no KV events (yet), so a subscription gets
 * what `lmcache server --kv-event-log-size 0` sends: one KVEventBatch with enabled false. The
 * worker then falls back to publishing its own store events and never subscribes again. The
 * stream is ended by the listener once the worker has acknowledged that batch (ending it
 * before makes the worker drop the batch and subscribe again a second later, forever).
 */
static bool h_subscribe_kv_events(struct lmc_front *f, const struct lmc_req *r)
{
    uint64_t iid;
    char model[KVP_MAX_NAME + 1];
    int64_t cursor, max_events;
    if (lmc_decode_instance_id(r->p[0], r->n[0], &iid))
        return malformed(f, r, "instance_id is not a non-negative int");
    if (lmc_decode_request_id(r->p[1], r->n[1], model, sizeof(model)))
        return malformed(f, r, "model_name is not a str of at most 127 bytes");
    if (lmc_decode_int(r->p[2], r->n[2], 0, INT64_MAX, &cursor))
        return malformed(f, r, "cursor is not an int >= 0");
    if (lmc_decode_int(r->p[3], r->n[3], 1, 1024, &max_events))
        return malformed(f, r, "max_events is not an int of 1..1024");
    KVP_COUNT(lmcache_kv_event_subscriptions, 1);
    log_info_rl("LMCache instance %" PRIu64 " (model %s) subscribed to KV events: answered that "
                "kvpoold records none (enabled: false), so its worker publishes its own",
                iid, model);
    lmc_encode_kv_events_disabled(&f->out, f->incarnation);
    f->stream_opened = true;
    return true;
}

static bool h_get_experimental(struct lmc_front *f, const struct lmc_req *r)
{
    (void)r;
    /* No experimental transfers and no optional capability (kv_event_stream, ...). */
    lmc_mp_put_array(&f->out, 0);
    return true;
}

static bool h_noop(struct lmc_front *f, const struct lmc_req *r)
{
    (void)r;
    lmc_mp_put_cstr(&f->out, "OK");
    return true;
}

static bool h_ping(struct lmc_front *f, const struct lmc_req *r)
{
    bool has = false;
    uint64_t iid = 0;
    if (r->npayloads == 1 && lmc_decode_opt_instance_id(r->p[0], r->n[0], &has, &iid))
        return malformed(f, r, "instance_id is not an int or nil");
    lmc_mp_put_bool(&f->out, lmc_inst_ping(f, has, iid));
    return true;
}

/* A registration that did not decode: refused with the segment still named (a worker told
 * "no shared memory" would gather and pickle every chunk only to have it refused). */
static bool register_malformed(struct lmc_front *f, const char *why)
{
    const struct kvp_server *s = f->srv;
    bool shm = s->seg.shared && !s->seg.memfd;
    char err[200];
    KVP_COUNT(lmcache_malformed, 1);
    log_warn_rl("LMCache registration malformed (%s): refused", why);
    snprintf(err, sizeof(err), "kvpoold refused the registration: %s", why);
    lmc_encode_register_reply(&f->out, shm ? s->seg.name : "", shm ? s->seg.size : 0, err);
    return true;
}

static bool h_register(struct lmc_front *f, const struct lmc_req *r)
{
    struct lmc_register m;
    struct lmc_reg_answer a;
    char why[160];
    if (lmc_decode_register(r->p[0], r->n[0], &m, why, sizeof(why)))
        return register_malformed(f, why);
    lmc_inst_register(f, &m, &a);
    /* In the form of the worker's version: 0.5.7's reply has null_block_id. */
    lmc_encode_register_reply_to(&f->out, &m, a.shm_name, a.pool_size, a.error[0] ? a.error : NULL);
    return true;
}

static bool h_unregister(struct lmc_front *f, const struct lmc_req *r)
{
    uint64_t iid;
    if (lmc_decode_instance_id(r->p[0], r->n[0], &iid))
        return malformed(f, r, "instance_id is not a non-negative int");
    lmc_inst_unregister(f, iid);
    return false;
}

/* The key and instance id of a worker's keyed request (payloads 0 and 1). */
static bool worker_args(struct lmc_front *f, const struct lmc_req *r, struct lmc_key *k,
                        uint64_t *iid, char *why, size_t why_size)
{
    if (!decode_key(f, r, 0, k, why, why_size))
        return false;
    if (lmc_decode_instance_id(r->p[1], r->n[1], iid)) {
        snprintf(why, why_size, "instance_id is not a non-negative int");
        return false;
    }
    return true;
}

static bool h_prepare_store(struct lmc_front *f, const struct lmc_req *r)
{
    struct lmc_key k;
    uint64_t iid;
    char why[160];
    struct lmc_slots s;
    if (!worker_args(f, r, &k, &iid, why, sizeof(why)))
        return malformed(f, r, why);
    if (r->npayloads == 3) {
        /* LMCache 0.5.7: per KV cache group, the chunk positions the worker will not store.
         * A single-group worker sends none; anything else belongs to a hybrid model, which
         * kvpool does not serve (and `lmcache server` refuses it for a single group). */
        struct lmc_skipped_chunks sk;
        if (lmc_decode_skipped_chunks(r->p[2], r->n[2], &sk, why, sizeof(why)))
            return malformed(f, r, why);
        if (sk.ngroups > 1 || sk.npositions > 0) {
            log_warn_rl("LMCache prepare_store of instance %" PRIu64 " skips %u chunk positions "
                        "in %u KV cache groups: kvpool serves one group; answered that there "
                        "is nothing to write",
                        iid, sk.npositions, sk.ngroups);
            return lmc_encode_negative(&f->out, r->op);
        }
    }
    lmc_prepare_store(f, iid, &k, &s);
    lmc_encode_prepare_store_reply(&f->out, s.slots, s.chunk_indices, s.n, &s.shape, s.no_buffers);
    return true;
}

static bool h_commit_store(struct lmc_front *f, const struct lmc_req *r)
{
    struct lmc_key k;
    uint64_t iid, len;
    const uint8_t *data;
    char why[160];
    if (!worker_args(f, r, &k, &iid, why, sizeof(why)))
        return malformed(f, r, why);
    if (lmc_decode_bin(r->p[2], r->n[2], UINT64_MAX, &data, &len))
        return malformed(f, r, "data is not bin");
    lmc_mp_put_bool(&f->out, lmc_commit_store(f, iid, &k, data, len));
    return true;
}

/*
 * The hit of an in-band instance, {"success": true, "data": <chunks>, "context": {}}: the chunks
 * in a tensor envelope for a 0.5.7 worker, in a pickle for an older one, written by the encoder
 * straight from the pinned slots into the value frame (the transport's buffer when value_alloc
 * is set, else f->out): one copy of each chunk.
 */
static bool put_in_band_retrieve(struct lmc_front *f, const struct lmc_slots *s)
{
    struct lmc_mp_writer *w = &f->out;
    uint64_t size;
    uint8_t tail[16];

    int rc = s->envelope ? kvp_envelope_encoded_size(s->etpl, s->n, &size)
                         : kvp_tpickle_encoded_size(s->tpl, s->n, &size);
    if (rc || size > UINT32_MAX)
        return false;
    lmc_mp_put_map(w, 3);
    lmc_mp_put_cstr(w, "success");
    lmc_mp_put_bool(w, true);
    lmc_mp_put_cstr(w, "data");
    lmc_mp_put_bin_header(w, (size_t)size);
    size_t head = w->len;
    lmc_mp_put_cstr(w, "context");
    lmc_mp_put_map(w, 0);
    if (w->failed || w->len - head > sizeof(tail))
        return false;
    size_t tail_len = w->len - head;
    memcpy(tail, w->buf + head, tail_len);
    uint8_t *data;
    if (f->value_alloc) {
        uint8_t *v = f->value_alloc(f, head + (size_t)size + tail_len);
        if (!v)
            return false;
        memcpy(v, w->buf, head);
        data = v + head;
        f->value_external = true;
    } else {
        w->len = head;
        data = lmc_mp_put_room(w, (size_t)size + tail_len);
        if (!data)
            return false;
    }
    int64_t wrote = s->envelope ? kvp_envelope_encode(s->etpl, s->n, s->chunks, data, (size_t)size)
                                : kvp_tpickle_encode(s->tpl, s->n, s->chunks, data, (size_t)size);
    if (wrote != (int64_t)size) {
        f->value_external = false;
        return false;
    }
    memcpy(data + size, tail, tail_len);
    return true;
}

static bool h_prepare_retrieve(struct lmc_front *f, const struct lmc_req *r)
{
    struct lmc_key k;
    uint64_t iid;
    char why[160];
    struct lmc_slots s;
    if (!worker_args(f, r, &k, &iid, why, sizeof(why)))
        return malformed(f, r, why);
    bool hit = lmc_prepare_retrieve(f, iid, &k, &s);
    if (hit && s.in_band) {
        hit = put_in_band_retrieve(f, &s);
        lmc_retrieve_in_band_end(f, hit); /* the reply holds the bytes now: unpinned */
        if (hit)
            return true;
        log_warn_rl("LMCache prepare_retrieve of instance %" PRIu64 ": no memory for a reply of "
                    "%u chunks; answered as a miss",
                    iid, s.n);
        lmc_mp_writer_reset(&f->out);
    }
    lmc_encode_prepare_retrieve_reply(&f->out, hit, s.slots, s.n, &s.shape);
    return true;
}

static bool h_commit_retrieve(struct lmc_front *f, const struct lmc_req *r)
{
    struct lmc_key k;
    uint64_t iid;
    char why[160];
    if (!worker_args(f, r, &k, &iid, why, sizeof(why)))
        return malformed(f, r, why);
    lmc_mp_put_bool(&f->out, lmc_commit_retrieve(f, iid, &k));
    return true;
}

/* The scheduler's lookup and free_lookup_locks: (key, tp_size), answered by @fn itself. */
static bool scheduler_call(struct lmc_front *f, const struct lmc_req *r,
                           void (*fn)(struct lmc_front *, const struct lmc_key *))
{
    struct lmc_key k;
    char why[160];
    int64_t tp;
    if (!decode_key(f, r, 0, &k, why, sizeof(why)))
        return malformed(f, r, why);
    if (lmc_decode_int(r->p[1], r->n[1], 0, 65535, &tp))
        return malformed(f, r, "tp_size is not an int of 0..65535");
    fn(f, &k);
    return false;
}

static bool h_lookup(struct lmc_front *f, const struct lmc_req *r)
{
    return scheduler_call(f, r, lmc_lookup);
}

/*
 * free_lookup_locks. LMCache 0.5.7 adds extra_ranges, the (start, end) token ranges its
 * scheduler's earlier lookups of the request locked before it abandoned them (a re-lookup after
 * vLLM's prefix cache shrank). kvpoold already released those: a lookup of a request ends the
 * locks of the request's previous lookup when it replaces it. So the ranges are checked and
 * release nothing more, and the locks of the request's current lookup stay for its retrieves
 * unless the key's own range is not empty, as upstream.
 */
static bool h_free_lookup_locks(struct lmc_front *f, const struct lmc_req *r)
{
    if (r->npayloads == 3) {
        struct lmc_range ranges[LMC_MAX_EXTRA_RANGES];
        uint32_t n;
        char why[160];
        if (lmc_decode_extra_ranges(r->p[2], r->n[2], ranges, LMC_MAX_EXTRA_RANGES, &n, why,
                                    sizeof(why)))
            return malformed(f, r, why);
        log_debug("LMCache free_lookup_locks with %u extra range%s (released with the lookups "
                  "that replaced them)",
                  n, n == 1 ? "" : "s");
    }
    return scheduler_call(f, r, lmc_free_lookup_locks);
}

static bool h_query(struct lmc_front *f, const struct lmc_req *r)
{
    char rid[LMC_MAX_REQUEST_ID + 1];
    double timeout;
    if (lmc_decode_request_id(r->p[0], r->n[0], rid, sizeof(rid)))
        return malformed(f, r, "request_id is not a str of at most 255 bytes");
    if (r->op == LMC_OP_WAIT_PREFETCH_STATUS && lmc_decode_float(r->p[1], r->n[1], &timeout))
        return malformed(f, r, "timeout is not a number");
    /* Jobs are done when the lookup returns: a wait never has to wait. */
    lmc_mp_put_int(&f->out, lmc_query(f, rid));
    return true;
}

static bool h_end_session(struct lmc_front *f, const struct lmc_req *r)
{
    char rid[LMC_MAX_REQUEST_ID + 1];
    if (lmc_decode_request_id(r->p[0], r->n[0], rid, sizeof(rid)))
        return malformed(f, r, "request_id is not a str of at most 255 bytes");
    if (r->npayloads == 2 && lmc_decode_any(r->p[1], r->n[1]))
        return malformed(f, r, "end_info is not msgpack");
    lmc_end_session(f, rid);
    return false;
}

static bool h_clear(struct lmc_front *f, const struct lmc_req *r)
{
    bool force;
    if (r->npayloads == 1 && lmc_decode_bool(r->p[0], r->n[0], &force))
        return malformed(f, r, "force is not a bool");
    if (!f->srv->cfg.lmcache_clear) {
        /* Answered as a clear is (no value), so a worker does not hang; nothing is dropped. */
        KVP_COUNT(lmcache_clears_refused, 1);
        log_warn_rl("LMCache front end: refused a clear request (--lmcache-clear off)");
        return false;
    }
    lmc_clear(f);
    return false;
}

static bool h_report_block_allocation(struct lmc_front *f, const struct lmc_req *r)
{
    uint64_t iid;
    char model[KVP_MAX_NAME + 1];
    struct lmc_mp_reader rd;
    uint32_t n;
    if (lmc_decode_instance_id(r->p[0], r->n[0], &iid))
        return malformed(f, r, "instance_id is not a non-negative int");
    if (lmc_decode_request_id(r->p[1], r->n[1], model, sizeof(model)))
        return malformed(f, r, "model_name is not a str");
    /* The records are accepted and ignored (upstream only publishes them as events). */
    lmc_mp_reader_init(&rd, r->p[2], r->n[2]);
    if (lmc_mp_read_array(&rd, LMC_MAX_RECORDS, &n) || lmc_decode_any(r->p[2], r->n[2]))
        return malformed(f, r, "records is not an array of at most 4096");
    return false;
}

static const struct handler table[] = {
    {LMC_OP_GET_CHUNK_SIZE, 0, 0, h_get_chunk_size},
    {LMC_OP_GET_EXPERIMENTAL, 0, 0, h_get_experimental},
    {LMC_OP_NOOP, 0, 0, h_noop},
    {LMC_OP_PING, 0, 1, h_ping},
    {LMC_OP_REGISTER_ENGINE_DRIVEN, 1, 1, h_register},
    {LMC_OP_UNREGISTER_ENGINE_DRIVEN, 1, 1, h_unregister},
    {LMC_OP_PREPARE_STORE, 2, 3, h_prepare_store},
    {LMC_OP_COMMIT_STORE, 3, 3, h_commit_store},
    {LMC_OP_PREPARE_RETRIEVE, 2, 2, h_prepare_retrieve},
    {LMC_OP_COMMIT_RETRIEVE, 2, 2, h_commit_retrieve},
    {LMC_OP_LOOKUP, 2, 2, h_lookup},
    {LMC_OP_QUERY_PREFETCH_STATUS, 1, 1, h_query},
    {LMC_OP_WAIT_PREFETCH_STATUS, 2, 2, h_query},
    {LMC_OP_FREE_LOOKUP_LOCKS, 2, 3, h_free_lookup_locks},
    {LMC_OP_END_SESSION, 1, 2, h_end_session},
    {LMC_OP_CLEAR, 0, 1, h_clear},
    {LMC_OP_REPORT_BLOCK_ALLOCATION, 3, 3, h_report_block_allocation},
    {LMC_OP_NEGOTIATE_CHUNK_SIZE, 1, 1, h_negotiate_chunk_size},
    {LMC_OP_SUBSCRIBE_KV_EVENTS, 4, 4, h_subscribe_kv_events},
};

/* An operation kvpoold does not serve: its negative reply, and a WARN the first time. */
static bool unsupported(struct lmc_front *f, const struct lmc_req *r)
{
    KVP_COUNT(lmcache_unsupported, 1);
    const char *name = r->op != LMC_OP_UNKNOWN ? lmc_op_name(r->op) : r->name[0] ? r->name : "?";
    bool first;
    if (r->op != LMC_OP_UNKNOWN && r->op < 64) {
        first = !(f->warned_ops & (1ull << r->op));
        f->warned_ops |= 1ull << r->op;
    } else if (r->op != LMC_OP_UNKNOWN) {
        first = !(f->warned_ops & (1ull << 0));
        f->warned_ops |= 1ull;
    } else {
        first = !f->warned_unknown;
        f->warned_unknown = true;
    }
    if (r->op == LMC_OP_REGISTER_KV_CACHE || r->op == LMC_OP_REGISTER_Q_CACHE) {
        if (first)
            log_error("An LMCache worker asked for the GPU transfer (%s): kvpoold serves the "
                      "engine-driven one only; set LMCACHE_MP_TRANSFER_MODE=engine_driven "
                      "(or lmcache.mp.mp_transfer_mode) in the worker",
                      name);
    } else if (r->op == LMC_OP_COMMIT_STORE && r->npayloads == 0) {
        if (first)
            log_warn("An LMCache client sent operation 17 without payloads: it predates LMCache "
                     "0.5.5 (an older numbering); upgrade it");
    } else if (first) {
        log_warn("LMCache operation %s is not served by kvpoold: answered with its negative "
                 "reply (logged once)",
                 name);
    } else {
        log_debug("LMCache operation %s not served", name);
    }
    return lmc_encode_negative(&f->out, r->op);
}

bool lmc_dispatch(struct lmc_front *f, const struct lmc_req *r)
{
    KVP_COUNT(lmcache_requests, 1);
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        const struct handler *h = &table[i];
        if (h->op != r->op)
            continue;
        if (r->npayloads < h->min || r->npayloads > h->max) {
            char why[96];
            if (r->op == LMC_OP_COMMIT_STORE && r->npayloads == 0)
                return unsupported(f, r);
            if (h->min == h->max)
                snprintf(why, sizeof(why), "%u payloads, expected %u", r->npayloads, h->min);
            else
                snprintf(why, sizeof(why), "%u payloads, expected %u to %u", r->npayloads, h->min,
                         h->max);
            if (r->op == LMC_OP_REGISTER_ENGINE_DRIVEN)
                return register_malformed(f, why);
            if (h->max == 0 || r->op == LMC_OP_NEGOTIATE_CHUNK_SIZE) {
                /* get_chunk_size, negotiate_chunk_size, get_experimental, noop: a value of
                 * their type is only useful if it is the real one. */
                KVP_COUNT(lmcache_malformed, 1);
                log_warn_rl("LMCache %s request malformed (%s): answered as usual",
                            lmc_op_name(r->op), why);
                return h->fn(f, r);
            }
            return malformed(f, r, why);
        }
        return h->fn(f, r);
    }
    return unsupported(f, r);
}

uint64_t lmc_tick(struct lmc_front *f)
{
    return lmc_state_tick(f);
}

uint64_t lmc_peer_of(const struct lmc_front *f, const void *id, size_t len)
{
    uint8_t h[crypto_shorthash_BYTES];
    uint64_t v;
    crypto_shorthash(h, id, len, f->peer_key);
    memcpy(&v, h, sizeof(v));
    return v;
}

int lmc_front_init(struct lmc_front *f, struct kvp_server *s)
{
    struct timespec now;
    memset(f, 0, sizeof(*f));
    f->srv = s;
    clock_gettime(CLOCK_REALTIME, &now);
    f->incarnation = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
    if (sodium_init() < 0)
        return -ENOMEM;
    randombytes_buf(f->peer_key, sizeof(f->peer_key));
    lmc_mp_writer_init(&f->out);
    f->tokens = malloc((size_t)KVP_MAX_TOKENS * 4);
    if (!f->tokens)
        return -ENOMEM;
    int rc = lmc_state_init(f);
    if (rc) {
        free(f->tokens);
        f->tokens = NULL;
    }
    return rc;
}

void lmc_front_destroy(struct lmc_front *f)
{
    lmc_state_destroy(f);
    free(f->tokens);
    f->tokens = NULL;
    lmc_mp_writer_free(&f->out);
}
