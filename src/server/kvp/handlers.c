/*
 * handlers.c - one function per request opcode (docs/PROTOCOL.md is the contract).
 *
 * Each handler decodes its body strictly, validates values against the instance and the
 * limits, performs the operation through the store/registry, and sends exactly one reply.
 * Returning non-zero closes the connection; that is reserved for framing errors and failed
 * socket I/O. A bad value is an error reply and the connection stays usable.
 *
 * Keys: a keyed request carries the whole token prefix. The hash chain is computed here, in the
 * connection's thread, without any lock: only the finished keys reach the store. The namespace
 * (the chain seed) comes from the registration the handle names, and a connection can only name
 * its own registrations, so a namesake can never derive keys in another model's namespace.
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
#include "common/chunk_hash.h"
#include "common/layout.h"
#include "common/msg.h"
#include "core/daemon.h"
#include "core/snapshot.h"
#include "core/stats.h"
#include "http/metrics.h"
#include "http/status_json.h"
#include "kvp/handlers.h"
#include "kvp/session.h"
#include "l2/l2.h"

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
    log_warn_rl("Connection %llu (pid %d): malformed %s body; closing", (unsigned long long)c->id,
                (int)c->peer.pid, kvp_opcode_name(h->opcode));
    return -EPROTO;
}

static int ok(struct kvp_session *c, const struct kvp_header *h)
{
    return kvp_session_reply(c, h, 0, NULL, 0, 0);
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
static int handle_stats(struct kvp_session *c, const struct kvp_header *h)
{
    _Static_assert(KVP_NCOUNTERS + KVP_NGAUGES <= KVP_MAX_STATS, "STATS reply too long");
    struct kvp_stat_entry e[KVP_NCOUNTERS + KVP_NGAUGES];
    struct kvp_snapshot snap;
    uint32_t n = 0;

    if (h->body_len != 0)
        return malformed(c, h);
    memset(e, 0, sizeof(e)); /* names are copied whole onto the wire */
    if (kvp_snapshot_take(c->srv, 0, &snap))
        return fail(c, h, -ENOMEM, "out of memory while collecting statistics");
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

static int handle_register(struct kvp_session *c, const struct kvp_header *h)
{
    struct kvp_server *s = c->srv;
    struct kvp_register_req req;
    struct kvp_registration inst;
    bool existing;

    if (kvp_decode_register_req(c->body, h->body_len, &req))
        return malformed(c, h);
    int rc = kvp_registry_validate(&s->registry, &req, &inst, c->errmsg, sizeof(c->errmsg));
    /* A claim to use shared memory stands only on evidence that the worker can map it. */
    char nomap[KVP_MAX_REASON + 1];
    bool can_map = kvp_transport_peer_can_map(&s->seg, c->fd, c->sent_segment_fd, nomap,
                                              sizeof(nomap));
    if (rc == 0)
        rc = kvp_registry_choose_transport(&s->registry, &inst, can_map ? NULL : nomap, c->errmsg,
                                           sizeof(c->errmsg));
    if (rc) {
        log_warn_rl("Registration of instance '%s' refused: %s", req.instance_id, c->errmsg);
        return kvp_session_reply(c, h, rc, NULL, 0, 0);
    }
    /* The owner's pid is recorded so that a refused namesake learns who holds the id. */
    rc = kvp_registry_add(&s->registry, c->id, (int32_t)c->peer.pid, &inst, &existing, c->errmsg,
                          sizeof(c->errmsg));
    if (rc) {
        log_warn("Registration of instance '%s' from pid %d refused: %s", req.instance_id,
                 (int)c->peer.pid, c->errmsg);
        return kvp_session_reply(c, h, rc, NULL, 0, 0);
    }

    struct kvp_register_reply m = {
        .handle = inst.handle,
        .transport = inst.transport,
        .existing = existing,
        .ndim = (uint8_t)inst.layout.ndim,
        .chunk_tokens = s->cfg.chunk_tokens,
        .chunk_bytes = inst.layout.bytes,
        .dtype_size = inst.dtype_size,
        .segment_size = inst.transport == KVP_WIRE_SHM ? s->seg.size : 0,
    };
    memcpy(m.shape, inst.layout.shape, sizeof(m.shape));
    snprintf(m.dtype, sizeof(m.dtype), "%s", inst.req.dtype);
    snprintf(m.shm_name, sizeof(m.shm_name), "%s",
             inst.transport == KVP_WIRE_SHM ? s->seg.name : "");
    snprintf(m.reason, sizeof(m.reason), "%s", inst.reason);
    kvp_encode_register_reply(&c->out, &m);
    return ok(c, h);
}

static int handle_unregister(struct kvp_session *c, const struct kvp_header *h)
{
    struct kvp_ref_req req;
    if (kvp_decode_ref_req(c->body, h->body_len, &req))
        return malformed(c, h);
    kvp_holds_release_all(&c->holds, req.handle, false, KVP_DROP_UNREGISTER);
    struct kvp_registration inst;
    /* Only the registering connection knows the handle legitimately, and only it ends the
     * instance. */
    if (kvp_registry_get_owned(&c->srv->registry, req.handle, c->id, &inst))
        return fail(c, h, -ENOENT, "unknown instance handle 0x%08" PRIx32, req.handle);
    if (kvp_registry_remove(&c->srv->registry, req.handle, "unregistered by worker"))
        return fail(c, h, -ENOENT, "unknown instance handle 0x%08" PRIx32, req.handle);
    return ok(c, h);
}

/* A decoded and validated keyed request. */
struct keyed {
    struct kvp_key_req req;
    struct kvp_registration inst;
    uint32_t first; /* first chunk of the range */
    uint32_t n;     /* chunks in the range */
};

/*
 * Decodes a keyed request, checks the instance and the range, and leaves the keys of the
 * range's chunks in c->keys. Returns 0; 1 after an error reply (connection stays open); <0 to
 * close.
 */
static int keyed_prepare(struct kvp_session *c, const struct kvp_header *h, struct keyed *k,
                         bool whole_sequence)
{
    struct kvp_server *s = c->srv;
    uint32_t C = s->cfg.chunk_tokens;

    if (kvp_decode_key_req(c->body, h->body_len, &k->req))
        return malformed(c, h);
    /* The keys come from the registration the handle names, and only from one this connection
     * made: another connection's handle (guessed, or kept by a namesake) is unknown here. */
    if (kvp_registry_get_owned(&s->registry, k->req.handle, c->id, &k->inst)) {
        int rc = fail(c, h, -ENOENT, "unknown instance handle 0x%08" PRIx32, k->req.handle);
        return rc ? rc : 1;
    }
    uint32_t start = whole_sequence ? 0 : k->req.start;
    uint32_t end = whole_sequence ? k->req.ntokens : k->req.end;
    char why[KVP_MAX_ERRMSG + 1];
    int rc = kvp_chunk_range(start, end, k->req.ntokens, C, whole_sequence ? 0 : KVP_MAX_CHUNKS,
                             &k->first, &k->n, why, sizeof(why));
    if (rc) {
        rc = fail(c, h, rc, "%s", why);
        return rc ? rc : 1;
    }
    if (k->n > KVP_MAX_CHUNKS)
        k->n = KVP_MAX_CHUNKS; /* lookup: counted in windows by the caller */

    /* Without a salt the seed is the registration's; a salt makes a namespace of its own. */
    uint8_t seed[KVP_KEY_SIZE];
    memcpy(seed, k->inst.seed, sizeof(seed));
    if (k->req.salt_len) {
        struct kvp_key_ns ns;
        kvp_registration_key_ns(&k->inst, k->req.salt, k->req.salt_len, &ns);
        if (kvp_key_seed(&ns, seed)) {
            rc = fail(c, h, -ENOMEM, "cannot initialise hashing");
            return rc ? rc : 1;
        }
    }
    /* Chain through the prefix before the range in windows, keeping only the last key. */
    for (uint32_t done = 0; done < k->first;) {
        uint32_t w = k->first - done < KVP_MAX_CHUNKS ? k->first - done : KVP_MAX_CHUNKS;
        kvp_key_chain(seed, k->req.tokens + (size_t)done * C * 4, C, w, c->keys);
        memcpy(seed, c->keys + (size_t)(w - 1) * KVP_KEY_SIZE, KVP_KEY_SIZE);
        done += w;
    }
    kvp_key_chain(seed, k->req.tokens + (size_t)k->first * C * 4, C, k->n, c->keys);
    return 0;
}

/* ---- the L2 tier (l2.h): a handler calls these only when it is on ---- */

/*
 * The chunks after the L1 run that L2 has (they start loading into L1). The run ended in the
 * window of keys c->keys holds: chunks [win, win + k->n) of the sequence.
 */
static uint32_t lookup_l2(struct kvp_session *c, const struct keyed *k, uint32_t win,
                          uint32_t cached)
{
    struct kvp_l2_layout lay;
    if (!c->srv->l2 || cached < win || cached >= win + k->n)
        return 0;
    kvp_l2_layout_of(&k->inst, &lay);
    return kvp_l2_lookup(c->srv->l2, c->keys + (size_t)(cached - win) * KVP_KEY_SIZE,
                         win + k->n - cached, &lay);
}

/*
 * The chunks after the first n (the run pinned from L1) that L2 has: loaded into L1 (or waited
 * for) by kvp_l2_fetch(), then pinned into c->objs after the others, so that they are served
 * as if they had been in L1. Returns how many were added.
 */
static uint32_t retrieve_l2(struct kvp_session *c, const struct keyed *k, uint32_t n)
{
    struct kvp_server *s = c->srv;
    struct kvp_l2_layout lay;
    if (!s->l2 || n >= k->n)
        return 0;
    kvp_l2_layout_of(&k->inst, &lay);
    const uint8_t *keys = c->keys + (size_t)n * KVP_KEY_SIZE;
    uint32_t got = kvp_l2_fetch(s->l2, keys, k->n - n, &lay);
    return got ? kvp_store_pin(&s->store, keys, got, c->objs + n) : 0;
}

/* Before a commit: the keys of the hold's chunks, copied into c->keys for the copies to L2
 * (once committed, the objects may be evicted at any moment). Returns how many. */
static uint32_t l2_keys_of(struct kvp_session *c, const struct kvp_hold *hold)
{
    if (!c->srv->l2)
        return 0;
    for (uint32_t i = 0; i < hold->n; i++)
        memcpy(c->keys + (size_t)i * KVP_KEY_SIZE, hold->objs[i]->key, KVP_KEY_SIZE);
    return hold->n;
}

/* After a commit: the n chunks whose keys l2_keys_of() saved are queued for L2. */
static void l2_stored(struct kvp_session *c, uint32_t handle, uint32_t n)
{
    struct kvp_registration inst;
    struct kvp_l2_layout lay;
    if (!n || kvp_registry_get_owned(&c->srv->registry, handle, c->id, &inst))
        return;
    kvp_l2_layout_of(&inst, &lay);
    kvp_l2_stored(c->srv->l2, c->keys, n, &lay);
}

static int handle_lookup(struct kvp_session *c, const struct kvp_header *h)
{
    struct kvp_server *s = c->srv;
    struct keyed k;
    int rc = keyed_prepare(c, h, &k, true);
    if (rc)
        return rc < 0 ? rc : 0;

    uint32_t C = s->cfg.chunk_tokens;
    uint32_t total = k.req.ntokens / C;
    uint32_t cached = kvp_store_lookup(&s->store, c->keys, k.n), win = 0;
    /* Sequences longer than one window: continue the chain while every chunk hits. */
    for (uint32_t done = k.n; cached == done && done < total; done += k.n) {
        uint8_t seed[KVP_KEY_SIZE];
        memcpy(seed, c->keys + (size_t)(k.n - 1) * KVP_KEY_SIZE, KVP_KEY_SIZE);
        k.n = total - done < KVP_MAX_CHUNKS ? total - done : KVP_MAX_CHUNKS;
        kvp_key_chain(seed, k.req.tokens + (size_t)done * C * 4, C, k.n, c->keys);
        win = done;
        cached += kvp_store_lookup(&s->store, c->keys, k.n);
    }
    cached += lookup_l2(c, &k, win, cached);
    KVP_COUNT(lookups, 1);
    KVP_COUNT(lookup_chunks, total);
    KVP_COUNT(lookup_hit_chunks, cached);
    struct kvp_lookup_reply m = {.nchunks = total, .cached = cached};
    kvp_encode_lookup_reply(&c->out, &m);
    return ok(c, h);
}

/* Encodes a slots reply (msg.c) for objs[0..n) with chunk indices idx (NULL: 0..n). */
static void encode_slots(struct kvp_session *c, uint64_t id, uint32_t nchunks,
                         const struct kvp_prepare_result *pr, struct kvp_obj **objs,
                         const uint32_t *idx, uint32_t n)
{
    struct kvp_slots_reply m = {
        .id = id,
        .nchunks = nchunks,
        .cached = pr ? pr->cached : 0,
        .busy = pr ? pr->busy : 0,
        .no_space = pr ? pr->no_space : 0,
        .nslots = n,
        .slots = c->slots,
    };
    for (uint32_t i = 0; i < n; i++)
        c->slots[i] = (struct kvp_wire_slot){
            .chunk_index = idx ? idx[i] : i,
            .offset = objs[i]->offset,
            .length = objs[i]->length,
        };
    kvp_encode_slots_reply(&c->out, &m);
}

static int handle_prepare_store(struct kvp_session *c, const struct kvp_header *h)
{
    struct kvp_server *s = c->srv;
    struct kvp_prepare_result pr;
    struct keyed k;
    uint64_t id = 0;

    int rc = keyed_prepare(c, h, &k, false);
    if (rc)
        return rc < 0 ? rc : 0;
    if (kvp_holds_full(&c->holds))
        return fail(c, h, -EMFILE,
                    "too many open reservations and pins on this connection "
                    "(max %d)",
                    KVP_MAX_HOLDS);
    rc = kvp_store_prepare(&s->store, c->keys, k.n, k.inst.layout.bytes, kvp_mono_ms(), c->objs,
                           c->idx, &pr);
    if (rc)
        return fail(c, h, rc, "out of memory while reserving");
    if (pr.nslots) {
        struct kvp_hold *hold = kvp_holds_add(&c->holds, k.inst.handle, false, c->objs, pr.nslots,
                                              k.inst.layout.bytes);
        if (!hold) {
            kvp_store_abort(&s->store, c->objs, pr.nslots);
            return fail(c, h, -ENOMEM, "out of memory while reserving");
        }
        id = hold->id;
    }
    KVP_COUNT(store_chunks_reserved, pr.nslots);
    KVP_COUNT(store_chunks_cached, pr.cached);
    KVP_COUNT(store_chunks_busy, pr.busy);
    KVP_COUNT(store_chunks_no_space, pr.no_space);
    if (pr.no_space)
        log_debug("Instance %s: %" PRIu32 " of %" PRIu32 " chunks not stored: pool full of "
                  "pinned or reserved data",
                  k.inst.req.instance_id, pr.no_space, k.n);
    encode_slots(c, id, k.n, &pr, c->objs, c->idx, pr.nslots);
    return ok(c, h);
}

/*
 * Publishes a reservation, ends the hold, and answers with the count (or -ETIMEDOUT). inline_
 * says which transport carried the bytes: STORE_INLINE, or the worker's writes into the mapping.
 */
static int commit_hold(struct kvp_session *c, const struct kvp_header *h, struct kvp_hold *hold,
                       bool inline_)
{
    uint64_t id = hold->id, chunk_bytes = hold->chunk_bytes;
    uint32_t handle = hold->handle;
    uint32_t nkeys = l2_keys_of(c, hold);
    int rc = kvp_store_commit(&c->srv->store, hold->objs, hold->n);
    kvp_holds_drop(&c->holds, hold);
    if (rc < 0)
        return fail(c, h, rc, "reservation %" PRIu64 " expired before commit; nothing stored", id);
    uint64_t bytes = (uint64_t)rc * chunk_bytes;
    KVP_COUNT(store_chunks_committed, rc);
    if (inline_) {
        KVP_COUNT(store_chunks_inline, rc);
        KVP_COUNT(store_bytes_inline, bytes);
    } else {
        KVP_COUNT(store_chunks_shm, rc);
        KVP_COUNT(store_bytes_shm, bytes);
    }
    kvp_registry_count_io(&c->srv->registry, handle, true, (uint64_t)rc, bytes);
    l2_stored(c, handle, nkeys);
    kvp_encode_count_reply(&c->out, (uint32_t)rc);
    return ok(c, h);
}

/* COMMIT_STORE and ABORT_STORE. */
static int handle_finish_store(struct kvp_session *c, const struct kvp_header *h, bool commit)
{
    struct kvp_ref_req req;
    if (kvp_decode_ref_req(c->body, h->body_len, &req))
        return malformed(c, h);
    struct kvp_hold *hold = kvp_holds_find(&c->holds, req.id, req.handle, false);
    if (!hold)
        return fail(c, h, -ENOENT,
                    "no reservation %" PRIu64 " for this instance on this "
                    "connection",
                    req.id);
    if (!commit) {
        uint32_t n = hold->n;
        kvp_holds_release(&c->holds, hold, KVP_DROP_ABORT);
        kvp_encode_count_reply(&c->out, n);
        return ok(c, h);
    }
    /* An inline worker has no pointers into the pool, so nothing wrote its slots: publishing
     * them would serve stale bytes (of evicted chunks, maybe of another salt) under its keys.
     * The reservation is dropped, as the client library forgets the plan after any commit. */
    struct kvp_registration inst;
    if (kvp_registry_get_owned(&c->srv->registry, req.handle, c->id, &inst) == 0 &&
        inst.transport != KVP_WIRE_SHM) {
        kvp_holds_release(&c->holds, hold, KVP_DROP_ABORT);
        return fail(c, h, -EOPNOTSUPP,
                    "instance %s uses the inline transport: its data must "
                    "come with STORE_INLINE; reservation %" PRIu64 " dropped",
                    inst.req.instance_id, req.id);
    }
    return commit_hold(c, h, hold, false);
}

static int handle_store_inline(struct kvp_session *c, const struct kvp_header *h)
{
    struct kvp_server *s = c->srv;
    struct kvp_ref_req req;

    if (kvp_decode_ref_req(c->body, h->body_len, &req))
        return malformed(c, h);
    struct kvp_hold *hold = kvp_holds_find(&c->holds, req.id, req.handle, false);
    if (!hold) {
        fail(c, h, -ENOENT, "no reservation %" PRIu64 " for this instance on this connection",
             req.id);
        return -ENOENT; /* the payload that follows cannot be skipped safely */
    }
    uint64_t want = (uint64_t)hold->n * hold->chunk_bytes;
    if (h->payload_len != want) {
        fail(c, h, -EINVAL, "payload of %" PRIu64 " bytes; reservation %" PRIu64 " needs %" PRIu64,
             h->payload_len, req.id, want);
        kvp_holds_release(&c->holds, hold, KVP_DROP_ABORT);
        return -EINVAL;
    }
    /* Straight into the reserved slots: the hold keeps them ours, and no lock is needed. */
    for (uint32_t i = 0; i < hold->n; i++) {
        int rc = kvp_session_recv(c, s->seg.base + hold->objs[i]->offset, hold->chunk_bytes);
        if (rc) {
            kvp_holds_release(&c->holds, hold, KVP_DROP_DISCONNECT);
            return rc;
        }
    }
    KVP_COUNT(inline_bytes_in, want);
    return commit_hold(c, h, hold, true);
}

static int handle_prepare_retrieve(struct kvp_session *c, const struct kvp_header *h)
{
    struct kvp_server *s = c->srv;
    struct keyed k;
    uint64_t id = 0;

    int rc = keyed_prepare(c, h, &k, false);
    if (rc)
        return rc < 0 ? rc : 0;
    if (k.inst.transport != KVP_WIRE_SHM)
        return fail(c, h, -EOPNOTSUPP,
                    "instance %s uses the inline transport; use "
                    "RETRIEVE_INLINE",
                    k.inst.req.instance_id);
    if (kvp_holds_full(&c->holds))
        return fail(c, h, -EMFILE,
                    "too many open reservations and pins on this connection "
                    "(max %d)",
                    KVP_MAX_HOLDS);
    uint32_t n = kvp_store_pin(&s->store, c->keys, k.n, c->objs);
    n += retrieve_l2(c, &k, n);
    if (n) {
        struct kvp_hold *hold = kvp_holds_add(&c->holds, k.inst.handle, true, c->objs, n,
                                              k.inst.layout.bytes);
        if (!hold) {
            kvp_store_unpin(&s->store, c->objs, n);
            return fail(c, h, -ENOMEM, "out of memory while pinning");
        }
        id = hold->id;
    }
    /* Counted when pinned: the worker copies the bytes out of the mapping by itself. */
    uint64_t bytes = (uint64_t)n * k.inst.layout.bytes;
    KVP_COUNT(retrieve_chunks, n);
    KVP_COUNT(retrieve_chunks_shm, n);
    KVP_COUNT(retrieve_bytes_shm, bytes);
    kvp_registry_count_io(&s->registry, k.inst.handle, false, n, bytes);
    encode_slots(c, id, k.n, NULL, c->objs, NULL, n);
    return ok(c, h);
}

static int handle_commit_retrieve(struct kvp_session *c, const struct kvp_header *h)
{
    struct kvp_ref_req req;
    if (kvp_decode_ref_req(c->body, h->body_len, &req))
        return malformed(c, h);
    struct kvp_hold *hold = kvp_holds_find(&c->holds, req.id, req.handle, true);
    if (!hold)
        return fail(c, h, -ENOENT, "no pin %" PRIu64 " for this instance on this connection",
                    req.id);
    uint32_t n = hold->n;
    kvp_holds_release(&c->holds, hold, KVP_DROP_ABORT); /* a pin set: nothing is dropped */
    kvp_encode_count_reply(&c->out, n);
    return ok(c, h);
}

static int handle_retrieve_inline(struct kvp_session *c, const struct kvp_header *h)
{
    struct kvp_server *s = c->srv;
    struct keyed k;

    int rc = keyed_prepare(c, h, &k, false);
    if (rc)
        return rc < 0 ? rc : 0;
    uint32_t n = kvp_store_pin(&s->store, c->keys, k.n, c->objs);
    n += retrieve_l2(c, &k, n);
    struct iovec *iov = n ? malloc(sizeof(*iov) * n) : NULL;
    if (n && !iov) {
        kvp_store_unpin(&s->store, c->objs, n);
        return fail(c, h, -ENOMEM, "out of memory while sending");
    }
    for (uint32_t i = 0; i < n; i++)
        iov[i] = (struct iovec){s->seg.base + c->objs[i]->offset, c->objs[i]->length};
    encode_slots(c, 0, k.n, NULL, c->objs, NULL, n);
    /* The pins keep the objects from eviction while the bytes go out unlocked. */
    uint64_t bytes = (uint64_t)n * k.inst.layout.bytes;
    rc = kvp_session_reply(c, h, 0, iov, (int)n, bytes);
    kvp_store_unpin(&s->store, c->objs, n);
    free(iov);
    if (rc == 0) {
        KVP_COUNT(retrieve_chunks, n);
        KVP_COUNT(retrieve_chunks_inline, n);
        KVP_COUNT(retrieve_bytes_inline, bytes);
        KVP_COUNT(inline_bytes_out, bytes);
        kvp_registry_count_io(&s->registry, k.inst.handle, false, n, bytes);
    }
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
    kvp_store_clear(&c->srv->store, &r);
    log_info("Cleared %" PRIu64 " committed objects (%" PRIu64 " bytes) at the request of pid %d; "
             "%" PRIu64 " pinned objects kept",
             r.dropped, r.bytes, (int)c->peer.pid, r.pinned);
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
