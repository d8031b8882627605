/*
 * transfer.c - keyed requests: lookup, two-phase store and retrieve, and the one-call
 * kvp_store() / kvp_retrieve() that pick the right path for the instance's transport.
 *
 * Design. Every keyed request is validated before anything is sent (pointers, token and salt
 * limits, range alignment, chunk count, and every caller buffer the range needs), so that a bad
 * argument is a clean -EINVAL and never a half-sent frame. Replies are checked before their
 * slots are used: the chunk count must be the one the range implies, retrieve slots must be the
 * leading chunks in order, and on shm every (offset, length) must lie inside the mapped pool
 * (KVP_EBADSLOT otherwise; the reservation or pin is released first).
 *
 * Data paths, none with an intermediate copy:
 *   shm store      prepare -> memcpy caller -> pool slots -> commit
 *   shm retrieve   prepare (pins) -> memcpy pool -> caller -> commit (unpins)
 * On shm the commit is pipelined (do_commit): sent without waiting for a reply, so that a
 * transfer costs one round trip. The daemon applies it before the client's next request, and
 * answers that request with KVP_EPIPELINED instead if it failed (kvpool.h, KVP_OPT_SYNC_COMMIT).
 *   inline store   prepare -> STORE_INLINE whose payload iovecs are the caller's chunks
 *   inline fetch   RETRIEVE_INLINE whose payload is received straight into the caller's out[]
 *
 * Threads. Functions named do_*() run with the client's lock held and after kvp_conn_begin().
 * The shm copies run without the lock: the slots are reserved or pinned for this client, so no
 * other thread or process touches them meanwhile.
 *
 * Plans own their slot arrays (malloc'd per prepare); commit, abort and store_inline free them
 * and zero the plan, so releasing a plan twice is harmless. A plan knows its connection: every
 * slot carries the connection generation it was prepared in (kvp_slot.reserved_, the library's
 * field; the public structs are unchanged and plan->slots stays a plain malloc'd array). One
 * prepared before a reconnect (or on a connection that has been lost since) is refused with
 * -ESTALE and freed without a round trip, because its reservation or pin id belongs to a
 * connection that no longer exists, and the same number may name another plan's hold on the
 * new one. A plan that holds nothing has no slots and needs no round trip either: the daemon
 * answers id 0 exactly when it gives no slot (do_decode_slots() insists). Plans with pointers
 * into the mapping are counted, so that a retired mapping can go once none is left
 * (reconnect.c); a plan the caller frees itself only keeps it until kvp_client_close().
 */
#include "client.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/layout.h"

/*
 * The generation as kept in kvp_slot.reserved_: 32 bits, so a plan could only be mistaken for
 * a current one after 2^32 reconnects of its client.
 */
static uint32_t gen32(uint64_t gen)
{
    return (uint32_t)gen;
}

/* Frees a plan's slot array of n slots (NULL is fine). Caller holds the lock. */
static void do_plan_slots_free(kvp_client *c, kvp_slot *slots, uint32_t n)
{
    if (slots && n && slots[0].data)
        kvp_client_plan_unmapped(c, slots[0].reserved_);
    free(slots);
}

/*
 * Whether a plan that holds a reservation or pin, with nslots slots, may still be finished on
 * the current connection. Returns 0, or -ESTALE (or -EINVAL for a plan without the slots the
 * library gave it) with the message set. Caller holds the lock.
 */
static int do_plan_check(kvp_client *c, const kvp_slot *slots, uint32_t nslots, const char *what)
{
    /* A daemon that exited since the prepare took the plan's hold with it: say so, rather than
     * fail the commit with EPIPE. */
    c->conn.errmsg[0] = '\0';
    kvp_client_probe(c);
    if (!slots || !nslots)
        return kvp_conn_error(&c->conn, -EINVAL, "%s holds an id but no slots", what);
    if (slots[0].reserved_ != gen32(c->gen))
        return kvp_conn_error(&c->conn, -ESTALE,
                              "%s was prepared before the client reconnected to kvpoold: "
                              "its hold died with the old connection, nothing was published",
                              what);
    if (c->conn.broken || c->conn.fd < 0)
        return kvp_conn_error(&c->conn, -ESTALE,
                              "%s was prepared on a connection to kvpoold that has been lost "
                              "since (%.300s): nothing was published",
                              what, c->conn.broken_msg);
    return 0;
}

/* Checks a sequence argument. Caller holds the lock. */
static int do_check_seq(kvp_client *c, const kvp_tokens *seq)
{
    if (!seq)
        return kvp_conn_error(&c->conn, -EINVAL, "sequence is NULL");
    if (seq->count > KVP_MAX_TOKENS)
        return kvp_conn_error(&c->conn, -EINVAL,
                              "sequence of %u tokens exceeds the limit of "
                              "%u",
                              seq->count, KVP_MAX_TOKENS);
    if (seq->count && !seq->ids)
        return kvp_conn_error(&c->conn, -EINVAL, "sequence has %u tokens but ids is NULL",
                              seq->count);
    if (seq->salt_len > KVP_MAX_SALT)
        return kvp_conn_error(&c->conn, -EINVAL, "salt of %u bytes exceeds the limit of %u",
                              seq->salt_len, KVP_MAX_SALT);
    if (seq->salt_len && !seq->salt)
        return kvp_conn_error(&c->conn, -EINVAL, "salt_len is %u but salt is NULL", seq->salt_len);
    return 0;
}

/* The chunk-range rule (src/common/layout.c, shared with the daemon): the number of full chunks
 * in [start, end), or a negative error with errmsg set. Caller holds the lock. */
static int do_range(kvp_instance *inst, uint32_t start, uint32_t end, uint32_t ntokens)
{
    char why[KVP_ERRMSG_SIZE];
    uint32_t first, n;
    int rc = kvp_chunk_range(start, end, ntokens, inst->info.chunk_tokens, KVP_MAX_CHUNKS, &first,
                             &n, why, sizeof(why));

    if (rc < 0)
        return kvp_conn_error(&inst->client->conn, rc, "%s", why);
    return (int)n;
}

/* The sequence's own limits, then the range rule. Caller holds the lock. */
static int do_check_range(kvp_instance *inst, const kvp_tokens *seq, uint32_t start, uint32_t end)
{
    int rc = do_check_seq(inst->client, seq);

    return rc < 0 ? rc : do_range(inst, start, end, seq->count);
}

/* No round trip: the rule is the library's own, and the daemon applies the same one. */
KVP_EXPORT int kvp_chunk_count(kvp_instance *inst, uint32_t start, uint32_t end, uint32_t ntokens)
{
    int rc;

    if (!inst)
        return -EINVAL;
    pthread_mutex_lock(&inst->client->lock);
    inst->client->conn.errmsg[0] = '\0';
    rc = do_range(inst, start, end, ntokens);
    pthread_mutex_unlock(&inst->client->lock);
    return rc;
}

/* Checks that bufs[0..n) are all set. Caller holds the lock. */
static int do_check_bufs(kvp_client *c, const void *const *bufs, uint32_t n, const char *what)
{
    if (n && !bufs)
        return kvp_conn_error(&c->conn, -EINVAL, "%s is NULL", what);
    for (uint32_t i = 0; i < n; i++)
        if (!bufs[i])
            return kvp_conn_error(&c->conn, -EINVAL, "%s[%u] is NULL", what, i);
    return 0;
}

/*
 * Sends a keyed request and reads the reply header and body. The token ids are encoded from the
 * caller's array straight into the request buffer (little-endian, as the daemon hashes them);
 * salt_len was checked against KVP_MAX_SALT, so the u16 cast cannot truncate.
 */
static int do_key_call(kvp_instance *inst, uint16_t op, const kvp_tokens *seq, uint32_t start,
                       uint32_t end, bool payload)
{
    struct kvp_conn *conn = &inst->client->conn;

    kvp_encode_key_req(&conn->req, inst->handle, start, end, seq->ids, seq->count, seq->salt,
                       (uint16_t)seq->salt_len);
    return kvp_conn_call(conn, op, NULL, 0, payload);
}

/* Sends a (handle, id) request: COMMIT_STORE, ABORT_STORE, COMMIT_RETRIEVE. Returns the count
 * the daemon answered, or a negative error. */
static int do_ref_call(kvp_instance *inst, uint16_t op, uint64_t id)
{
    struct kvp_conn *conn = &inst->client->conn;
    struct kvp_ref_req ref = {.handle = inst->handle, .id = id};
    struct kvp_count_reply cnt;
    int rc;

    kvp_encode_ref_req(&conn->req, &ref);
    rc = kvp_conn_call(conn, op, NULL, 0, false);
    if (rc < 0)
        return rc;
    if (kvp_decode_count_reply(conn->body, conn->body_len, &cnt) < 0 || cnt.count > INT32_MAX)
        return kvp_conn_fail(conn, KVP_EPROTO, "malformed %s reply", kvp_opcode_name(op));
    return (int)cnt.count;
}

/*
 * Commits a shm plan's hold (COMMIT_STORE or COMMIT_RETRIEVE) of nslots chunks. Pipelined unless
 * the client asked for synchronous commits or the daemon predates them: the request is sent and
 * the plan counts as committed; a failure comes back as KVP_EPIPELINED to the next request
 * (kvpool.h, KVP_OPT_SYNC_COMMIT). Returns the count, or a negative error.
 */
static int do_commit(kvp_instance *inst, uint16_t op, uint64_t id, uint32_t nslots)
{
    kvp_client *c = inst->client;
    struct kvp_ref_req ref = {.handle = inst->handle, .id = id};

    if (!inst->shm || c->sync_commit || c->hello.minor < KVP_MINOR_PIPELINE)
        return do_ref_call(inst, op, id);
    kvp_encode_ref_req(&c->conn.req, &ref);
    int rc = kvp_conn_post(&c->conn, op);
    return rc < 0 ? rc : (int)nslots;
}

/*
 * Decodes a slots reply of a range of nchunks chunks into r (slots: the client's scratch). The
 * chunk count must match the range we asked for: chunk_index is bounded by the reply's nchunks,
 * and the caller's chunks[] / out[] arrays by ours, so the two must agree before any index is
 * used. A length other than chunk_bytes would size a copy wrongly on either transport.
 */
static int do_decode_slots(kvp_instance *inst, uint16_t op, uint32_t nchunks,
                           struct kvp_slots_reply *r)
{
    kvp_client *c = inst->client;

    if (!c->slot_buf) {
        c->slot_buf = malloc(KVP_MAX_CHUNKS * sizeof(*c->slot_buf));
        if (!c->slot_buf)
            return kvp_conn_fail(&c->conn, -ENOMEM, "out of memory for %s slots",
                                 kvp_opcode_name(op));
    }
    r->slots = c->slot_buf;
    if (kvp_decode_slots_reply(c->conn.body, c->conn.body_len, r) < 0)
        return kvp_conn_fail(&c->conn, KVP_EPROTO, "malformed %s reply", kvp_opcode_name(op));
    if (r->nchunks != nchunks)
        return kvp_conn_fail(&c->conn, KVP_EPROTO,
                             "%s reply covers %u chunks, the range has "
                             "%u",
                             kvp_opcode_name(op), r->nchunks, nchunks);
    /* A hold without slots would be a plan that cannot tell its connection (see the top). */
    if (op != KVP_OP_RETRIEVE_INLINE && (r->id == 0) != (r->nslots == 0))
        return kvp_conn_fail(&c->conn, KVP_EPROTO, "%s reply has id %llu for %u slots",
                             kvp_opcode_name(op), (unsigned long long)r->id, r->nslots);
    for (uint32_t i = 0; i < r->nslots; i++)
        if (r->slots[i].length != inst->info.chunk_bytes)
            return kvp_conn_fail(&c->conn, KVP_EBADSLOT,
                                 "%s slot %u is %llu bytes, chunks "
                                 "are %llu",
                                 kvp_opcode_name(op), i, (unsigned long long)r->slots[i].length,
                                 (unsigned long long)inst->info.chunk_bytes);
    return 0;
}

/*
 * Builds the caller's slot array from a decoded reply: every slot is tagged with the connection
 * generation, and on shm checked against the mapping and given its pointer (the plan is then
 * counted against the mapping). Returns 0, -ENOMEM or KVP_EBADSLOT (message set).
 */
static int do_make_slots(kvp_instance *inst, const struct kvp_slots_reply *r, kvp_slot **out)
{
    struct kvp_conn *conn = &inst->client->conn;
    kvp_slot *s;

    *out = NULL;
    if (r->nslots == 0)
        return 0;
    s = calloc(r->nslots, sizeof(*s));
    if (!s)
        return kvp_conn_error(conn, -ENOMEM, "out of memory for %u slots", r->nslots);
    for (uint32_t i = 0; i < r->nslots; i++) {
        const struct kvp_wire_slot *w = &r->slots[i];
        s[i] = (kvp_slot){.chunk_index = w->chunk_index,
                          .reserved_ = gen32(inst->client->gen),
                          .offset = w->offset,
                          .length = w->length};
        if (!inst->shm)
            continue;
        s[i].data = kvp_shm_slot(&inst->client->shm, w->offset, w->length, inst->info.chunk_bytes);
        if (!s[i].data) {
            free(s);
            return kvp_conn_error(conn, KVP_EBADSLOT,
                                  "slot %u (offset %llu, %llu bytes) is "
                                  "outside the %llu-byte pool",
                                  i, (unsigned long long)w->offset, (unsigned long long)w->length,
                                  (unsigned long long)inst->client->shm.size);
        }
    }
    if (inst->shm)
        inst->client->shm_plans++;
    *out = s;
    return 0;
}

/*
 * Releases a reservation or pin whose reply could not be used, keeping the error message that
 * explains why. Best effort: if this fails too, closing the connection releases it anyway.
 */
static void do_release(kvp_instance *inst, uint16_t op, uint64_t id)
{
    struct kvp_conn *conn = &inst->client->conn;
    char keep[KVP_ERRMSG_SIZE];

    if (!id)
        return;
    memcpy(keep, conn->errmsg, sizeof(keep));
    /* An earlier pipelined commit's failure may answer the first try instead. */
    for (int i = 0; i < 2; i++)
        if (kvp_conn_begin(conn) != 0 || do_ref_call(inst, op, id) != KVP_EPIPELINED)
            break;
    memcpy(conn->errmsg, keep, sizeof(keep));
}

/* Retrieve slots must be the leading chunks of the range, in order. */
static int do_check_leading(kvp_instance *inst, uint16_t op, const struct kvp_slots_reply *r)
{
    for (uint32_t i = 0; i < r->nslots; i++)
        if (r->slots[i].chunk_index != i)
            return kvp_conn_fail(&inst->client->conn, KVP_EPROTO, "%s slot %u is chunk %u",
                                 kvp_opcode_name(op), i, r->slots[i].chunk_index);
    return 0;
}

/* Caller holds the lock. */
static void do_plan_reset_store(kvp_client *c, kvp_store_plan *plan)
{
    do_plan_slots_free(c, plan->slots, plan->nslots);
    *plan = (kvp_store_plan){0};
}

/* Caller holds the lock. */
static void do_plan_reset_retrieve(kvp_client *c, kvp_retrieve_plan *plan)
{
    do_plan_slots_free(c, plan->slots, plan->nslots);
    *plan = (kvp_retrieve_plan){0};
}

/* LOOKUP: the reply counts the leading committed chunks; nothing is pinned, so the answer can
 * be stale by the time the caller retrieves (kvp_retrieve returns what is really there). */
KVP_EXPORT int kvp_lookup(kvp_instance *inst, const kvp_tokens *seq)
{
    struct kvp_lookup_reply rep;
    kvp_client *c;
    int rc;

    if (!inst)
        return -EINVAL;
    c = inst->client;
    pthread_mutex_lock(&c->lock);
    rc = kvp_instance_begin(inst);
    if (rc < 0)
        goto out_unlock;
    rc = do_check_seq(c, seq);
    if (rc < 0)
        goto out_unlock;
    /* LOOKUP always considers the whole sequence. */
    rc = do_key_call(inst, KVP_OP_LOOKUP, seq, 0, seq->count, false);
    if (rc < 0)
        goto out_unlock;
    if (kvp_decode_lookup_reply(c->conn.body, c->conn.body_len, &rep) < 0 ||
        rep.nchunks != seq->count / inst->info.chunk_tokens) {
        rc = kvp_conn_fail(&c->conn, KVP_EPROTO, "malformed LOOKUP reply");
        goto out_unlock;
    }
    rc = (int)rep.cached;

out_unlock:
    pthread_mutex_unlock(&c->lock);
    return rc;
}

/* PREPARE_STORE of a checked range of nchunks chunks. Fills plan; returns nslots or an error. */
static int do_prepare_store(kvp_instance *inst, const kvp_tokens *seq, uint32_t start, uint32_t end,
                            uint32_t nchunks, kvp_store_plan *plan)
{
    struct kvp_slots_reply r;
    int rc;

    rc = do_key_call(inst, KVP_OP_PREPARE_STORE, seq, start, end, false);
    if (rc < 0)
        return rc;
    rc = do_decode_slots(inst, KVP_OP_PREPARE_STORE, nchunks, &r);
    if (rc < 0)
        return rc;
    /* Every chunk of the range is in exactly one category: that is what lets a worker tell
     * "cached" from "could not store". */
    if ((uint64_t)r.cached + r.busy + r.no_space + r.nslots != r.nchunks)
        return kvp_conn_fail(&inst->client->conn, KVP_EPROTO,
                             "PREPARE_STORE reply counts "
                             "%u cached + %u busy + %u no_space + %u slots for %u chunks",
                             r.cached, r.busy, r.no_space, r.nslots, r.nchunks);
    rc = do_make_slots(inst, &r, &plan->slots);
    if (rc < 0) {
        do_release(inst, KVP_OP_ABORT_STORE, r.id);
        return rc;
    }
    plan->reservation = r.id;
    plan->nchunks = r.nchunks;
    plan->cached = r.cached;
    plan->busy = r.busy;
    plan->no_space = r.no_space;
    plan->nslots = r.nslots;
    return (int)r.nslots;
}

/* The plan is zeroed first so that a failed prepare leaves nothing for the caller to free. */
KVP_EXPORT int kvp_prepare_store(kvp_instance *inst, const kvp_tokens *seq, uint32_t start,
                                 uint32_t end, kvp_store_plan *plan)
{
    kvp_client *c;
    int rc;

    if (!plan)
        return -EINVAL;
    *plan = (kvp_store_plan){0};
    if (!inst)
        return -EINVAL;
    c = inst->client;
    pthread_mutex_lock(&c->lock);
    rc = kvp_instance_begin(inst);
    if (rc == 0)
        rc = do_check_range(inst, seq, start, end);
    if (rc >= 0)
        rc = do_prepare_store(inst, seq, start, end, (uint32_t)rc, plan);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

/*
 * COMMIT_STORE or ABORT_STORE of a plan, which is released whatever the outcome: after an error
 * the daemon has either dropped the reservation (expired, unknown) or will drop it when the
 * broken connection closes, so keeping the slots would only invite writes into freed space. A
 * stale plan is never sent (do_plan_check) and does not reconnect: it needs no daemon.
 */
static int finish_store(kvp_instance *inst, kvp_store_plan *plan, uint16_t op)
{
    kvp_client *c;
    int rc = 0;

    if (!inst || !plan)
        return -EINVAL;
    c = inst->client;
    pthread_mutex_lock(&c->lock);
    if (plan->reservation) {
        rc = do_plan_check(c, plan->slots, plan->nslots, "the store plan");
        if (rc == 0)
            rc = kvp_conn_begin(&c->conn);
        if (rc == 0)
            rc = op == KVP_OP_COMMIT_STORE ? do_commit(inst, op, plan->reservation, plan->nslots)
                                           : do_ref_call(inst, op, plan->reservation);
    }
    do_plan_reset_store(c, plan);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

KVP_EXPORT int kvp_commit_store(kvp_instance *inst, kvp_store_plan *plan)
{
    return finish_store(inst, plan, KVP_OP_COMMIT_STORE);
}

KVP_EXPORT int kvp_abort_store(kvp_instance *inst, kvp_store_plan *plan)
{
    int rc = finish_store(inst, plan, KVP_OP_ABORT_STORE);
    return rc < 0 ? rc : 0;
}

/*
 * STORE_INLINE of a plan whose chunk pointers were checked. Returns chunks committed. The payload
 * iovecs point at the caller's chunks in slot order, which is the order the daemon receives
 * them into its reserved slots.
 */
static int do_store_inline(kvp_instance *inst, const kvp_store_plan *plan,
                           const void *const *chunks)
{
    struct kvp_conn *conn = &inst->client->conn;
    struct kvp_ref_req ref = {.handle = inst->handle, .id = plan->reservation};
    struct kvp_count_reply cnt;
    struct iovec *iov;
    int rc;

    iov = malloc(plan->nslots * sizeof(*iov));
    if (!iov)
        return kvp_conn_error(conn, -ENOMEM, "out of memory");
    for (uint32_t i = 0; i < plan->nslots; i++)
        iov[i] = (struct iovec){.iov_base = (void *)chunks[plan->slots[i].chunk_index],
                                .iov_len = (size_t)inst->info.chunk_bytes};
    kvp_encode_ref_req(&conn->req, &ref);
    rc = kvp_conn_call(conn, KVP_OP_STORE_INLINE, iov, plan->nslots, false);
    free(iov);
    /* The daemon closes the connection after these errors (the stream position is lost). */
    if (rc == -EINVAL || rc == -ENOENT)
        return kvp_conn_break(conn, rc);
    if (rc < 0)
        return rc;
    if (kvp_decode_count_reply(conn->body, conn->body_len, &cnt) < 0 || cnt.count > plan->nslots)
        return kvp_conn_fail(conn, KVP_EPROTO, "malformed STORE_INLINE reply");
    return (int)cnt.count;
}

/* Checks that chunks[] has a buffer for every reserved slot. Caller holds the lock. */
static int do_check_plan_chunks(kvp_instance *inst, const kvp_store_plan *plan,
                                const void *const *chunks)
{
    struct kvp_conn *conn = &inst->client->conn;

    if (plan->nslots && !plan->slots)
        return kvp_conn_error(conn, -EINVAL, "plan has %u slots but no slot array", plan->nslots);
    if (plan->nslots && !chunks)
        return kvp_conn_error(conn, -EINVAL, "chunks is NULL");
    for (uint32_t i = 0; i < plan->nslots; i++)
        if (!chunks[plan->slots[i].chunk_index])
            return kvp_conn_error(conn, -EINVAL, "chunks[%u] is NULL", plan->slots[i].chunk_index);
    return 0;
}

/* A plan with nothing reserved needs no round trip: there is nothing to send or commit. */
KVP_EXPORT int kvp_store_inline(kvp_instance *inst, kvp_store_plan *plan, const void *const *chunks)
{
    kvp_client *c;
    int rc;

    if (!inst || !plan)
        return -EINVAL;
    c = inst->client;
    pthread_mutex_lock(&c->lock);
    if (plan->nslots == 0 || !plan->reservation) {
        do_plan_reset_store(c, plan);
        pthread_mutex_unlock(&c->lock);
        return 0;
    }
    rc = do_plan_check(c, plan->slots, plan->nslots, "the store plan");
    if (rc == 0)
        rc = kvp_conn_begin(&c->conn);
    if (rc == 0) {
        rc = do_check_plan_chunks(inst, plan, chunks);
        /* A bad argument leaves the plan alone: the caller can still abort it. */
        if (rc < 0) {
            pthread_mutex_unlock(&c->lock);
            return rc;
        }
        rc = do_store_inline(inst, plan, chunks);
    }
    do_plan_reset_store(c, plan);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

/*
 * PREPARE_RETRIEVE of a checked range. Fills plan; returns nslots or an error. Refused locally
 * for an instance whose bytes move inline: its slots would have no mapping to point into.
 */
static int do_prepare_retrieve(kvp_instance *inst, const kvp_tokens *seq, uint32_t start,
                               uint32_t end, uint32_t nchunks, kvp_retrieve_plan *plan)
{
    struct kvp_slots_reply r;
    int rc;

    if (!inst->shm)
        return kvp_conn_error(&inst->client->conn, KVP_ENOSHM,
                              "instance uses the inline "
                              "transport: use kvp_retrieve()");
    rc = do_key_call(inst, KVP_OP_PREPARE_RETRIEVE, seq, start, end, false);
    if (rc == -EOPNOTSUPP)
        rc = KVP_ENOSHM;
    if (rc < 0)
        return rc;
    rc = do_decode_slots(inst, KVP_OP_PREPARE_RETRIEVE, nchunks, &r);
    if (rc == 0)
        rc = do_check_leading(inst, KVP_OP_PREPARE_RETRIEVE, &r);
    if (rc < 0)
        return rc;
    rc = do_make_slots(inst, &r, &plan->slots);
    if (rc < 0) {
        do_release(inst, KVP_OP_COMMIT_RETRIEVE, r.id);
        return rc;
    }
    plan->pin = r.id;
    plan->nchunks = r.nchunks;
    plan->nslots = r.nslots;
    return (int)r.nslots;
}

KVP_EXPORT int kvp_prepare_retrieve(kvp_instance *inst, const kvp_tokens *seq, uint32_t start,
                                    uint32_t end, kvp_retrieve_plan *plan)
{
    kvp_client *c;
    int rc;

    if (!plan)
        return -EINVAL;
    *plan = (kvp_retrieve_plan){0};
    if (!inst)
        return -EINVAL;
    c = inst->client;
    pthread_mutex_lock(&c->lock);
    rc = kvp_instance_begin(inst);
    if (rc == 0)
        rc = do_check_range(inst, seq, start, end);
    if (rc >= 0)
        rc = do_prepare_retrieve(inst, seq, start, end, (uint32_t)rc, plan);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

/* Unpins; like the store plans, the retrieve plan is released whatever the daemon answers. */
KVP_EXPORT int kvp_commit_retrieve(kvp_instance *inst, kvp_retrieve_plan *plan)
{
    kvp_client *c;
    int rc = 0;

    if (!inst || !plan)
        return -EINVAL;
    c = inst->client;
    pthread_mutex_lock(&c->lock);
    if (plan->pin) {
        rc = do_plan_check(c, plan->slots, plan->nslots, "the retrieve plan");
        if (rc == 0)
            rc = kvp_conn_begin(&c->conn);
        if (rc == 0)
            rc = do_commit(inst, KVP_OP_COMMIT_RETRIEVE, plan->pin, plan->nslots);
    }
    do_plan_reset_retrieve(c, plan);
    pthread_mutex_unlock(&c->lock);
    return rc < 0 ? rc : 0;
}

/*
 * One-call store. Every chunk buffer of the range is checked before the prepare, because which
 * chunks get slots is only known from the reply, and by then a reservation exists.
 */
KVP_EXPORT int kvp_store(kvp_instance *inst, const kvp_tokens *seq, uint32_t start, uint32_t end,
                         const void *const *chunks, kvp_store_result *result)
{
    kvp_store_plan plan = {0};
    kvp_client *c;
    int rc;

    if (result)
        *result = (kvp_store_result){0};
    if (!inst)
        return -EINVAL;
    c = inst->client;
    pthread_mutex_lock(&c->lock);
    rc = kvp_instance_begin(inst);
    if (rc == 0)
        rc = do_check_range(inst, seq, start, end);
    if (rc >= 0) {
        uint32_t nchunks = (uint32_t)rc;
        rc = do_check_bufs(c, (const void *const *)chunks, nchunks, "chunks");
        if (rc == 0)
            rc = do_prepare_store(inst, seq, start, end, nchunks, &plan);
    }
    if (rc > 0 && !inst->shm) {
        rc = do_store_inline(inst, &plan, chunks);
    } else if (rc > 0) {
        /* The slots are ours until commit: copy without holding the client lock. Another
         * thread may see the connection die meanwhile; the plan check then refuses the
         * commit (the copy itself is safe, see reconnect.c). */
        pthread_mutex_unlock(&c->lock);
        for (uint32_t i = 0; i < plan.nslots; i++)
            memcpy(plan.slots[i].data, chunks[plan.slots[i].chunk_index],
                   (size_t)plan.slots[i].length);
        pthread_mutex_lock(&c->lock);
        rc = do_plan_check(c, plan.slots, plan.nslots, "the store");
        if (rc == 0)
            rc = kvp_conn_begin(&c->conn);
        if (rc == 0)
            rc = do_commit(inst, KVP_OP_COMMIT_STORE, plan.reservation, plan.nslots);
    }

    if (rc >= 0 && result)
        *result = (kvp_store_result){.nchunks = plan.nchunks,
                                     .stored = (uint32_t)rc,
                                     .cached = plan.cached,
                                     .busy = plan.busy,
                                     .no_space = plan.no_space};
    do_plan_reset_store(c, &plan);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

/*
 * RETRIEVE_INLINE of a checked range of nchunks chunks into out[]. Returns chunks received. The
 * payload is received with one readv-style loop whose iovecs are out[0..nslots): the bytes go
 * from the socket straight into the caller's buffers.
 */
static int do_retrieve_inline(kvp_instance *inst, const kvp_tokens *seq, uint32_t start,
                              uint32_t end, uint32_t nchunks, void *const *out)
{
    struct kvp_conn *conn = &inst->client->conn;
    struct kvp_slots_reply r;
    struct iovec *iov;
    int rc;

    rc = do_key_call(inst, KVP_OP_RETRIEVE_INLINE, seq, start, end, true);
    if (rc < 0)
        return rc;
    rc = do_decode_slots(inst, KVP_OP_RETRIEVE_INLINE, nchunks, &r);
    if (rc == 0)
        rc = do_check_leading(inst, KVP_OP_RETRIEVE_INLINE, &r);
    if (rc < 0)
        return rc;
    if (r.nslots == 0)
        return kvp_conn_read_payload(conn, NULL, 0);

    iov = malloc(r.nslots * sizeof(*iov));
    if (!iov)
        return kvp_conn_fail(conn, -ENOMEM, "out of memory");
    for (uint32_t i = 0; i < r.nslots; i++)
        iov[i] = (struct iovec){.iov_base = out[i], .iov_len = (size_t)inst->info.chunk_bytes};
    rc = kvp_conn_read_payload(conn, iov, r.nslots);
    free(iov);
    return rc < 0 ? rc : (int)r.nslots;
}

/*
 * One-call retrieve. On shm the pin taken by the prepare is what makes the unlocked memcpy safe:
 * a pinned object is never evicted, so its slot cannot be reused while we copy.
 */
KVP_EXPORT int kvp_retrieve(kvp_instance *inst, const kvp_tokens *seq, uint32_t start, uint32_t end,
                            void *const *out)
{
    kvp_retrieve_plan plan = {0};
    kvp_client *c;
    uint32_t nchunks = 0;
    int rc;

    if (!inst)
        return -EINVAL;
    c = inst->client;
    pthread_mutex_lock(&c->lock);
    rc = kvp_instance_begin(inst);
    if (rc == 0)
        rc = do_check_range(inst, seq, start, end);
    if (rc >= 0) {
        nchunks = (uint32_t)rc;
        rc = do_check_bufs(c, (const void *const *)out, nchunks, "out");
    }
    if (rc < 0 || !inst->shm) {
        if (rc == 0)
            rc = do_retrieve_inline(inst, seq, start, end, nchunks, out);
        pthread_mutex_unlock(&c->lock);
        return rc;
    }

    rc = do_prepare_retrieve(inst, seq, start, end, nchunks, &plan);
    pthread_mutex_unlock(&c->lock);
    if (rc < 0)
        return rc;
    /* Pinned chunks cannot be evicted or rewritten until the commit below. */
    for (uint32_t i = 0; i < plan.nslots; i++)
        memcpy(out[i], plan.slots[i].data, (size_t)plan.slots[i].length);
    int n = (int)plan.nslots;
    rc = kvp_commit_retrieve(inst, &plan);
    return rc < 0 ? rc : n;
}
