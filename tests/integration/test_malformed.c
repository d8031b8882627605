/*
 * test_malformed.c - hostile and broken traffic in bulk, beyond the single cases of
 * test_protocol.c: random bytes on hundreds of connections, every truncation of a valid frame,
 * extreme lengths, commits and aborts out of order or of somebody else's ids, a commit without
 * upload from an inline worker, the per-connection hold limit and a flood of connections beyond
 * --max-clients.
 *
 * The rule checked everywhere: each offending request gets an error reply or a closed connection
 * (never a success, never silence on an open connection), the daemon keeps serving (a fresh
 * client pings after every batch) and nothing leaks (no reservation, pin or instance left).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/msg.h"
#include "common/wire.h"
#include "harness.h"

#define C 16
#define CHUNK_BYTES 8192 /* kvpt_layout() */

static struct kvpt_daemon daemon_;

static int setup(void **state)
{
    const char *args[] = {"--l1-size", "16MiB",       "--chunk-size", "16", "--io-timeout",
                          "500",       "--log-level", "info",         NULL};
    return kvpt_group_start(state, &daemon_, args);
}

/* ---------------------------------------------------------------------------------------- */
/* Random bytes.                                                                             */

static uint64_t rng_state;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

enum garbage_kind {
    PURE_NOISE,     /* random bytes from the first one */
    HEADER_PREFIX,  /* magic, version and a real opcode, then noise */
    FRAME_AND_JUNK, /* a well-framed request with a random body, then noise */
};

/*
 * Fills buf with one connection's worth of garbage of the given kind; returns its length. *junk
 * is the number of noise bytes after the well-framed request of FRAME_AND_JUNK.
 */
static size_t make_garbage(uint8_t *buf, size_t cap, enum garbage_kind kind, size_t *junk)
{
    size_t len = 1 + rnd() % (cap - 1);
    *junk = 0;
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)rnd();
    if (kind == PURE_NOISE)
        return len;

    struct kvp_header h = {.magic = KVP_MAGIC,
                           .version = KVP_PROTO_VERSION,
                           .opcode = (uint16_t)(1 + rnd() % (KVP_OP_MAX_ - 1)),
                           .request_id = rnd(),
                           .body_len = (uint32_t)rnd(),
                           .payload_len = rnd()};
    uint8_t hdr[KVP_HEADER_SIZE];
    if (kind == FRAME_AND_JUNK) {
        h.body_len = (uint32_t)(rnd() % 200);
        h.payload_len = 0;
        /* The frame, then at least one more byte of noise: the connection cannot end idle. */
        *junk = 1 + rnd() % 64;
        len = KVP_HEADER_SIZE + h.body_len + *junk;
    }
    if (len < 8)
        len = 8;
    kvp_header_encode(&h, hdr);
    memcpy(buf, hdr, kind == FRAME_AND_JUNK ? KVP_HEADER_SIZE : 8);
    return len;
}

struct outcome {
    int replies;
    int errors;
    int last_status;
    bool reply_after_framing_error;
    uint16_t first_opcode;
    int first_status;
    bool closed;
    bool bad_reply;
};

/* Reads replies until the daemon closes (or 10 s pass). */
static struct outcome drain(int fd)
{
    struct outcome o = {0};
    uint64_t deadline = kvpt_now_ms() + 10000;
    while (kvpt_now_ms() < deadline) {
        struct kvpt_reply r;
        int rc = kvpt_raw_recv(fd, &r);
        if (rc == -ECONNRESET) {
            o.closed = true;
            break;
        }
        if (rc == -ETIMEDOUT)
            continue;
        if (rc) {
            o.bad_reply = true;
            break;
        }
        if (o.replies == 0) {
            o.first_opcode = r.opcode;
            o.first_status = r.status;
        }
        if (o.replies && (o.last_status == -EPROTO || o.last_status == -EPROTONOSUPPORT))
            o.reply_after_framing_error = true;
        o.replies++;
        o.errors += r.status < 0;
        o.last_status = r.status;
        free(r.body);
        /* No garbage request can earn a payload; reading it would be wrong anyway. */
        if (r.payload_len) {
            o.bad_reply = true;
            break;
        }
    }
    return o;
}

#define GARBAGE_CONNS 200
#define BATCH 25

static void test_random_garbage(void **state)
{
    (void)state;
    static uint8_t buf[4096];
    unsigned seed = 20261202;
    const char *env = getenv("KVPOOL_MALFORMED_SEED");
    if (env && *env)
        seed = (unsigned)strtoul(env, NULL, 10);
    rng_state = 0x9e3779b97f4a7c15ull * (2ull * seed + 1);
    print_message("random garbage: %d connections, KVPOOL_MALFORMED_SEED=%u\n", GARBAGE_CONNS,
                  seed);

    kvp_client *c = kvpt_connect(&daemon_);
    uint64_t perr0 = kvpt_stat(c, "protocol_errors");
    int noise_replies = 0;
    for (int b = 0; b < GARBAGE_CONNS / BATCH; b++) {
        int fds[BATCH];
        enum garbage_kind kinds[BATCH];
        size_t lens[BATCH], junk[BATCH];
        for (int i = 0; i < BATCH; i++) {
            kinds[i] = (enum garbage_kind)(rnd() % 3);
            lens[i] = make_garbage(buf, sizeof(buf), kinds[i], &junk[i]);
            fds[i] = kvpt_raw_connect_or_fail(&daemon_);
            kvpt_raw_send_bytes(fds[i], buf, lens[i]);
        }
        for (int i = 0; i < BATCH; i++) {
            struct outcome o = drain(fds[i]);
            close(fds[i]);
            if (!o.closed || o.bad_reply || o.reply_after_framing_error ||
                o.replies > (kinds[i] == FRAME_AND_JUNK ? 2 : 1))
                fail_msg("connection %d (kind %d, %zu bytes): closed %d, bad reply %d, "
                         "%d replies, reply after a framing error %d",
                         b * BATCH + i, kinds[i], lens[i], o.closed, o.bad_reply, o.replies,
                         o.reply_after_framing_error);
            /* Noise of a header's length or more after a request: the daemon's last word is
             * an error (shorter noise is a stalled header, dropped without a word). */
            if (kinds[i] == FRAME_AND_JUNK && junk[i] >= KVP_HEADER_SIZE &&
                (o.replies == 0 || o.last_status >= 0))
                fail_msg("connection %d: %d replies, last status %d", b * BATCH + i, o.replies,
                         o.last_status);
            /* Noise of a header's length or more is refused as such, at once. */
            if (kinds[i] == PURE_NOISE && lens[i] >= KVP_HEADER_SIZE) {
                assert_int_equal(o.replies, 1);
                assert_int_equal(o.first_opcode, KVP_REPLY_FLAG);
                assert_int_equal(o.first_status, -EPROTO);
                noise_replies++;
            }
        }
        assert_int_equal(kvp_ping(c), 0);
        kvp_client *fresh = kvpt_connect(&daemon_);
        assert_int_equal(kvp_ping(fresh), 0);
        kvp_client_close(fresh);
    }
    assert_true(noise_replies > 0);
    assert_true(kvpt_stat(c, "protocol_errors") - perr0 >= (uint64_t)noise_replies);
    kvp_client_close(c);
    kvpt_assert_clean(&daemon_);
}

/* ---------------------------------------------------------------------------------------- */
/* Every truncation of a valid REGISTER frame.                                               */

static void test_truncated_register(void **state)
{
    (void)state;
    kvp_register_opts o = kvpt_layout("truncated", KVP_TRANSPORT_INLINE);
    struct kvp_register_req req = {.world_size = 1,
                                   .block_size = 16,
                                   .num_layers = 2,
                                   .hidden_dim = 64,
                                   .transport = KVP_WIRE_INLINE};
    snprintf(req.instance_id, sizeof(req.instance_id), "%s", o.instance_id);
    snprintf(req.model_name, sizeof(req.model_name), "%s", o.model_name);
    snprintf(req.dtype, sizeof(req.dtype), "%s", o.dtype);
    snprintf(req.reason, sizeof(req.reason), "requested by worker");
    struct kvp_wbuf w;
    kvp_wbuf_init(&w);
    kvp_encode_register_req(&w, &req);
    size_t total = KVP_HEADER_SIZE + w.len;
    uint8_t *frame = malloc(total);
    struct kvp_header h = {.magic = KVP_MAGIC,
                           .version = KVP_PROTO_VERSION,
                           .opcode = KVP_OP_REGISTER,
                           .request_id = 5,
                           .body_len = (uint32_t)w.len};
    kvp_header_encode(&h, frame);
    memcpy(frame + KVP_HEADER_SIZE, w.data, w.len);

    kvp_client *c = kvpt_connect(&daemon_);
    for (size_t len = 0; len < total; len++) {
        /* Cut and closed outright. */
        int fd = kvpt_raw_connect_or_fail(&daemon_);
        kvpt_raw_send_bytes(fd, frame, len);
        close(fd);

        /* Cut and half-closed: the daemon must close too, without answering anything. */
        fd = kvpt_raw_connect_or_fail(&daemon_);
        kvpt_raw_send_bytes(fd, frame, len);
        assert_int_equal(shutdown(fd, SHUT_WR), 0);
        char b;
        struct timeval tv = {.tv_sec = 5};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        ssize_t n = recv(fd, &b, 1, 0);
        if (n != 0 && !(n < 0 && errno == ECONNRESET))
            fail_msg("frame cut at %zu of %zu bytes: recv %zd (%s)", len, total, n,
                     n < 0 ? strerror(errno) : "a reply");
        close(fd);
        if (len % 16 == 0)
            assert_int_equal(kvp_ping(c), 0);
    }
    assert_int_equal(kvpt_stat_poll(c, "connections", 1, 5000), 1);
    assert_int_equal(kvpt_stat(c, "instances"), 0);
    assert_int_equal(kvpt_log_count(&daemon_, "Instance truncated non-GPU context"), 0);

    /* The whole frame is a valid registration, dropped with its connection. */
    int fd = kvpt_raw_connect_or_fail(&daemon_);
    kvpt_raw_send_bytes(fd, frame, total);
    struct kvpt_reply r;
    assert_int_equal(kvpt_raw_recv(fd, &r), 0);
    assert_int_equal(r.status, 0);
    free(r.body);
    assert_int_equal(kvpt_stat(c, "instances"), 1);
    close(fd);
    assert_int_equal(kvpt_stat_poll(c, "instances", 0, 5000), 0);

    free(frame);
    kvp_wbuf_free(&w);
    kvp_client_close(c);
    kvpt_assert_clean(&daemon_);
}

/* ---------------------------------------------------------------------------------------- */
/* Extreme lengths.                                                                          */

/* A bare header with the given lengths: an error reply (opcode echoed) and a close. */
static void header_refused(uint16_t op, uint32_t body_len, uint64_t payload_len, int want)
{
    int fd = kvpt_raw_connect_or_fail(&daemon_);
    struct kvpt_reply r;
    uint8_t hdr[KVP_HEADER_SIZE];
    struct kvp_header h = {.magic = KVP_MAGIC,
                           .version = KVP_PROTO_VERSION,
                           .opcode = op,
                           .request_id = 9,
                           .body_len = body_len,
                           .payload_len = payload_len};
    kvp_header_encode(&h, hdr);
    kvpt_raw_send_bytes(fd, hdr, sizeof(hdr));
    int rc = kvpt_raw_recv(fd, &r);
    if (rc)
        fail_msg("%s with body_len %u payload_len %llu: no reply (%s)", kvp_opcode_name(op),
                 body_len, (unsigned long long)payload_len, strerror(-rc));
    assert_int_equal(r.status, want);
    free(r.body);
    assert_true(kvpt_raw_closed(fd, 5000));
    close(fd);
}

static void test_huge_lengths(void **state)
{
    (void)state;
    struct kvpt_reply r;
    static struct kvp_wire_slot slots[KVP_MAX_CHUNKS];
    struct kvp_slots_reply sr = {.slots = slots};

    /* Control bodies beyond the limit are refused before anything is read or allocated. */
    header_refused(KVP_OP_REGISTER, UINT32_MAX, 0, -EPROTO);
    header_refused(KVP_OP_LOOKUP, KVP_MAX_BODY + 1, 0, -EPROTO);
    /* A payload on a request that takes none, however large. */
    header_refused(KVP_OP_PREPARE_STORE, 0, UINT64_MAX, -EPROTO);

    /* The largest body allowed, full of noise: read, then refused as malformed. */
    uint8_t *big = malloc(KVP_MAX_BODY);
    for (size_t i = 0; i < KVP_MAX_BODY; i++)
        big[i] = (uint8_t)(i * 131 + 7);
    int fd = kvpt_raw_connect_or_fail(&daemon_);
    assert_int_equal(kvpt_raw_send(fd, KVP_OP_REGISTER, big, KVP_MAX_BODY, 0), 0);
    assert_int_equal(kvpt_raw_recv(fd, &r), 0);
    assert_int_equal(r.status, -EPROTO);
    free(r.body);
    assert_true(kvpt_raw_closed(fd, 5000));
    close(fd);

    /* The largest body allowed, announced and never sent: dropped after --io-timeout. */
    fd = kvpt_raw_connect_or_fail(&daemon_);
    uint8_t hdr[KVP_HEADER_SIZE];
    struct kvp_header h = {.magic = KVP_MAGIC,
                           .version = KVP_PROTO_VERSION,
                           .opcode = KVP_OP_LOOKUP,
                           .request_id = 3,
                           .body_len = KVP_MAX_BODY};
    kvp_header_encode(&h, hdr);
    kvpt_raw_send_bytes(fd, hdr, sizeof(hdr));
    assert_true(kvpt_raw_closed(fd, 10000));
    close(fd);

    /* The largest token list allowed is a valid lookup (65536 chunks, several key windows). */
    kvp_register_opts o = kvpt_layout("lengths", KVP_TRANSPORT_INLINE);
    uint32_t handle;
    fd = kvpt_raw_connect_or_fail(&daemon_);
    assert_int_equal(kvpt_raw_register(fd, &o, &handle, NULL), 0);
    uint32_t *tok = kvpt_tokens(1, KVP_MAX_TOKENS);
    struct kvp_wbuf w;
    kvp_wbuf_init(&w);
    kvp_encode_key_req(&w, handle, 0, KVP_MAX_TOKENS, tok, KVP_MAX_TOKENS, NULL, 0);
    assert_int_equal(kvpt_raw_call(fd, KVP_OP_LOOKUP, w.data, (uint32_t)w.len, &r), 0);
    struct kvp_lookup_reply lr;
    assert_int_equal(kvp_decode_lookup_reply(r.body, r.body_len, &lr), 0);
    assert_int_equal(lr.nchunks, KVP_MAX_TOKENS / C);
    assert_int_equal(lr.cached, 0);
    free(r.body);
    /* ... but not as a store range: too many chunks, and the connection stays. */
    assert_int_equal(kvpt_raw_call(fd, KVP_OP_PREPARE_STORE, w.data, (uint32_t)w.len, &r), -E2BIG);
    free(r.body);
    assert_int_equal(kvpt_raw_call(fd, KVP_OP_PING, NULL, 0, &r), 0);
    free(r.body);
    kvp_wbuf_free(&w);
    free(tok);
    close(fd);

    /* STORE_INLINE with a valid reservation and a wrong payload length, from absurd to off by
     * one: -EINVAL, the connection closes, and the reservation is gone with it. */
    const uint64_t want = 2 * CHUNK_BYTES;
    const uint64_t wrong[] = {UINT64_MAX, 1ull << 63, want + 1, want - 1, 0, CHUNK_BYTES};
    kvp_client *c = kvpt_connect(&daemon_);
    for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++) {
        fd = kvpt_raw_connect_or_fail(&daemon_);
        assert_int_equal(kvpt_raw_register(fd, &o, &handle, NULL), 0);
        assert_int_equal(kvpt_raw_prepare(fd, KVP_OP_PREPARE_STORE, handle, 40, 2 * C, &sr), 0);
        assert_int_equal(sr.nslots, 2);
        assert_int_equal(kvpt_stat(c, "objects_reserved"), 2);
        /* Send what was announced when it is small, to show that it is the length that is
         * refused and not a stall. */
        size_t n = wrong[i] <= want + 1 ? (size_t)wrong[i] : 0;
        if (kvpt_raw_store_inline(fd, handle, sr.id, wrong[i], big, n, &r) != -EINVAL)
            fail_msg("payload_len %llu: status %d (%s)", (unsigned long long)wrong[i], r.status,
                     r.msg);
        free(r.body);
        assert_true(kvpt_raw_closed(fd, 5000));
        close(fd);
        assert_int_equal(kvpt_stat_poll(c, "objects_reserved", 0, 5000), 0);
        assert_int_equal(kvpt_stat_poll(c, "instances", 0, 5000), 0);
    }
    /* The right length still works, and nothing of the refused attempts is visible. */
    fd = kvpt_raw_connect_or_fail(&daemon_);
    assert_int_equal(kvpt_raw_register(fd, &o, &handle, NULL), 0);
    assert_int_equal(kvpt_raw_lookup(fd, handle, 40, 2 * C), 0);
    assert_int_equal(kvpt_raw_prepare(fd, KVP_OP_PREPARE_STORE, handle, 40, 2 * C, &sr), 0);
    assert_int_equal(kvpt_raw_store_inline(fd, handle, sr.id, want, big, want, &r), 0);
    free(r.body);
    assert_int_equal(kvpt_raw_lookup(fd, handle, 40, 2 * C), 2);
    close(fd);

    free(big);
    kvp_client_close(c);
    kvpt_assert_clean(&daemon_);
}

/* ---------------------------------------------------------------------------------------- */
/* Commits, aborts and releases out of order.                                                */

static void test_out_of_order(void **state)
{
    (void)state;
    static struct kvp_wire_slot slots[KVP_MAX_CHUNKS];
    struct kvp_slots_reply sr = {.slots = slots};
    struct kvpt_reply r;
    kvp_register_opts oi = kvpt_layout("ooo-inline", KVP_TRANSPORT_INLINE);
    kvp_register_opts os = kvpt_layout("ooo-other", KVP_TRANSPORT_INLINE);
    kvp_register_opts op = kvpt_layout("ooo-shm", KVP_TRANSPORT_SHM);
    uint32_t h, h2, hs;
    uint8_t data[2 * CHUNK_BYTES];
    kvp_client *c = kvpt_connect(&daemon_);

    int fd = kvpt_raw_connect_or_fail(&daemon_);
    assert_int_equal(kvpt_raw_register(fd, &oi, &h, NULL), 0);
    assert_int_equal(kvpt_raw_register(fd, &os, &h2, NULL), 0);

    /* Before any prepare: nothing to commit, abort or unpin. */
    kvpt_raw_ref_refused(fd, KVP_OP_COMMIT_STORE, h, 1);
    kvpt_raw_ref_refused(fd, KVP_OP_ABORT_STORE, h, 1);
    kvpt_raw_ref_refused(fd, KVP_OP_COMMIT_RETRIEVE, h, 1);
    kvpt_raw_ref_refused(fd, KVP_OP_COMMIT_STORE, h, 0);

    /* A store reservation is not a pin, nor another instance's. */
    assert_int_equal(kvpt_raw_prepare(fd, KVP_OP_PREPARE_STORE, h, 50, 2 * C, &sr), 0);
    assert_int_equal(sr.nslots, 2);
    uint64_t res = sr.id;
    kvpt_raw_ref_refused(fd, KVP_OP_COMMIT_RETRIEVE, h, res);
    kvpt_raw_ref_refused(fd, KVP_OP_COMMIT_STORE, h2, res);
    kvpt_raw_ref_refused(fd, KVP_OP_ABORT_STORE, h2, res);
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 2);
    assert_int_equal(kvpt_raw_lookup(fd, h, 50, 2 * C), 0);

    /* Commit (through the upload), then commit again, abort after commit. */
    kvpt_fill(data, CHUNK_BYTES, 50, 0);
    kvpt_fill(data + CHUNK_BYTES, CHUNK_BYTES, 50, 1);
    assert_int_equal(kvpt_raw_store_inline(fd, h, res, sizeof(data), data, sizeof(data), &r), 0);
    free(r.body);
    kvpt_raw_ref_refused(fd, KVP_OP_COMMIT_STORE, h, res);
    kvpt_raw_ref_refused(fd, KVP_OP_ABORT_STORE, h, res);
    kvpt_raw_ref_refused(fd, KVP_OP_COMMIT_RETRIEVE, h, res);
    assert_int_equal(kvpt_raw_lookup(fd, h, 50, 2 * C), 2);

    /* Prepare, abort, then commit the aborted reservation. */
    assert_int_equal(kvpt_raw_prepare(fd, KVP_OP_PREPARE_STORE, h, 51, 2 * C, &sr), 0);
    assert_int_equal(kvpt_raw_ref(fd, KVP_OP_ABORT_STORE, h, sr.id, &r), 0);
    free(r.body);
    kvpt_raw_ref_refused(fd, KVP_OP_COMMIT_STORE, h, sr.id);
    kvpt_raw_ref_refused(fd, KVP_OP_ABORT_STORE, h, sr.id);
    assert_int_equal(kvpt_raw_lookup(fd, h, 51, 2 * C), 0);
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 0);

    /* Pins: not a store reservation, released exactly once. */
    int fs = kvpt_raw_connect_or_fail(&daemon_);
    assert_int_equal(kvpt_raw_register(fs, &op, &hs, NULL), 0);
    assert_int_equal(kvpt_raw_prepare(fs, KVP_OP_PREPARE_RETRIEVE, hs, 50, 2 * C, &sr), 0);
    assert_int_equal(sr.nslots, 2);
    uint64_t pin = sr.id;
    kvpt_raw_ref_refused(fs, KVP_OP_COMMIT_STORE, hs, pin);
    kvpt_raw_ref_refused(fs, KVP_OP_ABORT_STORE, hs, pin);
    assert_int_equal(kvpt_stat(c, "objects_pinned"), 2);
    assert_int_equal(kvpt_raw_ref(fs, KVP_OP_COMMIT_RETRIEVE, hs, pin, &r), 0);
    free(r.body);
    kvpt_raw_ref_refused(fs, KVP_OP_COMMIT_RETRIEVE, hs, pin);
    assert_int_equal(kvpt_stat(c, "objects_pinned"), 0);

    /* Unregister releases the instance's reservation: a later commit finds nothing. */
    assert_int_equal(kvpt_raw_prepare(fd, KVP_OP_PREPARE_STORE, h, 52, 2 * C, &sr), 0);
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 2);
    assert_int_equal(kvpt_raw_ref(fd, KVP_OP_UNREGISTER, h, 0, &r), 0);
    free(r.body);
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 0);
    kvpt_raw_ref_refused(fd, KVP_OP_COMMIT_STORE, h, sr.id);
    kvpt_raw_ref_refused(fd, KVP_OP_UNREGISTER, h, 0);
    assert_int_equal(kvpt_raw_lookup(fd, h2, 52, 2 * C), 0);

    /* An upload to a reservation that was already committed: refused, and the connection is
     * closed since the payload cannot be skipped. The committed data is untouched. */
    memset(data, 0xee, sizeof(data));
    assert_int_equal(kvpt_raw_store_inline(fd, h2, res, sizeof(data), data, sizeof(data), &r),
                     -ENOENT);
    free(r.body);
    assert_true(kvpt_raw_closed(fd, 5000));
    close(fd);
    close(fs);

    kvp_register_opts check = kvpt_layout("ooo-check", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &check, &inst), 0);
    uint32_t *tok = kvpt_tokens(50, 2 * C);
    kvp_tokens t = {.ids = tok, .count = 2 * C};
    uint8_t out0[CHUNK_BYTES], out1[CHUNK_BYTES];
    void *outs[2] = {out0, out1};
    assert_int_equal(kvp_retrieve(inst, &t, 0, 2 * C, outs), 2);
    assert_true(kvpt_check(out0, CHUNK_BYTES, 50, 0));
    assert_true(kvpt_check(out1, CHUNK_BYTES, 50, 1));
    assert_int_equal(kvp_unregister(inst), 0);
    free(tok);
    kvp_client_close(c);
    kvpt_assert_clean(&daemon_);
}

/* ---------------------------------------------------------------------------------------- */
/* Another connection's reservation and pins, with the real handles.                        */

static void test_foreign_ids(void **state)
{
    (void)state;
    static struct kvp_wire_slot slots[KVP_MAX_CHUNKS];
    struct kvp_slots_reply sr = {.slots = slots};
    struct kvpt_reply r;
    kvp_register_opts oa = kvpt_layout("owner-a", KVP_TRANSPORT_INLINE);
    kvp_register_opts oas = kvpt_layout("owner-a-shm", KVP_TRANSPORT_SHM);
    kvp_register_opts ob = kvpt_layout("intruder-b", KVP_TRANSPORT_INLINE);
    uint32_t ha, has, hb, ha_b;
    uint8_t data[2 * CHUNK_BYTES];
    kvp_client *c = kvpt_connect(&daemon_);

    /* A: committed data (seq 60), a pin on it, and a reservation (seq 61). */
    int a = kvpt_raw_connect_or_fail(&daemon_);
    assert_int_equal(kvpt_raw_register(a, &oa, &ha, NULL), 0);
    assert_int_equal(kvpt_raw_register(a, &oas, &has, NULL), 0);
    assert_int_equal(kvpt_raw_prepare(a, KVP_OP_PREPARE_STORE, ha, 60, 2 * C, &sr), 0);
    kvpt_fill(data, CHUNK_BYTES, 60, 0);
    kvpt_fill(data + CHUNK_BYTES, CHUNK_BYTES, 60, 1);
    assert_int_equal(kvpt_raw_store_inline(a, ha, sr.id, sizeof(data), data, sizeof(data), &r), 0);
    free(r.body);
    assert_int_equal(kvpt_raw_prepare(a, KVP_OP_PREPARE_RETRIEVE, has, 60, 2 * C, &sr), 0);
    uint64_t pin = sr.id;
    assert_int_equal(kvpt_raw_prepare(a, KVP_OP_PREPARE_STORE, ha, 61, 2 * C, &sr), 0);
    uint64_t res = sr.id;
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 2);
    assert_int_equal(kvpt_stat(c, "objects_pinned"), 2);

    /* B knows A's handles and ids exactly (registering A's instance id is refused, since A
     * holds it), and still cannot touch A's holds. */
    int b = kvpt_raw_connect_or_fail(&daemon_);
    assert_int_equal(kvpt_raw_register(b, &ob, &hb, NULL), 0);
    assert_int_equal(kvpt_raw_register(b, &oa, &ha_b, NULL), -EBUSY);
    const uint32_t handles[] = {ha, has, hb};
    for (size_t i = 0; i < 3; i++) {
        kvpt_raw_ref_refused(b, KVP_OP_COMMIT_STORE, handles[i], res);
        kvpt_raw_ref_refused(b, KVP_OP_ABORT_STORE, handles[i], res);
        kvpt_raw_ref_refused(b, KVP_OP_COMMIT_RETRIEVE, handles[i], pin);
        kvpt_raw_ref_refused(b, KVP_OP_COMMIT_RETRIEVE, handles[i], res);
    }
    memset(data, 0xee, sizeof(data));
    assert_int_equal(kvpt_raw_store_inline(b, ha, res, sizeof(data), data, sizeof(data), &r),
                     -ENOENT);
    free(r.body);
    assert_true(kvpt_raw_closed(b, 5000));
    close(b);

    /* A's holds are intact and its own; B's attempt wrote nothing anywhere. */
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 2);
    assert_int_equal(kvpt_stat(c, "objects_pinned"), 2);
    kvpt_fill(data, CHUNK_BYTES, 61, 0);
    kvpt_fill(data + CHUNK_BYTES, CHUNK_BYTES, 61, 1);
    assert_int_equal(kvpt_raw_store_inline(a, ha, res, sizeof(data), data, sizeof(data), &r), 0);
    free(r.body);
    assert_int_equal(kvpt_raw_ref(a, KVP_OP_COMMIT_RETRIEVE, has, pin, &r), 0);
    free(r.body);
    close(a);

    kvp_register_opts check = kvpt_layout("foreign-check", KVP_TRANSPORT_INLINE);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &check, &inst), 0);
    for (uint32_t seq = 60; seq <= 61; seq++) {
        uint32_t *tok = kvpt_tokens(seq, 2 * C);
        kvp_tokens t = {.ids = tok, .count = 2 * C};
        uint8_t out0[CHUNK_BYTES], out1[CHUNK_BYTES];
        void *outs[2] = {out0, out1};
        assert_int_equal(kvp_retrieve(inst, &t, 0, 2 * C, outs), 2);
        assert_true(kvpt_check(out0, CHUNK_BYTES, seq, 0));
        assert_true(kvpt_check(out1, CHUNK_BYTES, seq, 1));
        free(tok);
    }
    assert_int_equal(kvp_unregister(inst), 0);
    kvp_client_close(c);
    kvpt_assert_clean(&daemon_);
}

/* ---------------------------------------------------------------------------------------- */
/* The per-connection hold limit.                                                            */

static void test_hold_limit(void **state)
{
    (void)state;
    static struct kvp_wire_slot slots[KVP_MAX_CHUNKS];
    struct kvp_slots_reply sr = {.slots = slots};
    struct kvpt_reply r;
    kvp_register_opts o = kvpt_layout("hoarder", KVP_TRANSPORT_INLINE);
    uint32_t h;
    kvp_client *c = kvpt_connect(&daemon_);
    uint64_t used0 = kvpt_stat(c, "pool_used");

    int fd = kvpt_raw_connect_or_fail(&daemon_);
    assert_int_equal(kvpt_raw_register(fd, &o, &h, NULL), 0);
    /* 1024 open one-chunk reservations (8 MiB of the 16 MiB pool), then one too many. */
    for (uint32_t i = 0; i < 1024; i++) {
        assert_int_equal(kvpt_raw_prepare(fd, KVP_OP_PREPARE_STORE, h, 100000 + i, C, &sr), 0);
        assert_int_equal(sr.nslots, 1);
    }
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 1024);
    int rc = kvpt_raw_prepare(fd, KVP_OP_PREPARE_STORE, h, 99999, C, &sr);
    assert_int_equal(rc, -EMFILE);
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 1024);
    /* Still usable; closing releases all of them at once. */
    assert_int_equal(kvpt_raw_call(fd, KVP_OP_PING, NULL, 0, &r), 0);
    free(r.body);
    close(fd);
    assert_int_equal(kvpt_stat_poll(c, "objects_reserved", 0, 5000), 0);
    assert_int_equal(kvpt_stat(c, "pool_used"), used0);
    kvp_client_close(c);
    kvpt_assert_clean(&daemon_);
}

/* ---------------------------------------------------------------------------------------- */
/* A flood of connections against --max-clients.                                            */

static void test_connection_flood(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {
        "--l1-size", "4MiB",        "--chunk-size", "16", "--max-clients", "8", "--io-timeout",
        "500",       "--log-level", "info",         NULL};
    kvpt_daemon_start(&d, args);
    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts o = kvpt_layout("flood-survivor", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);

    /* Seven idle raw connections fill the daemon up. */
    int idle[7];
    for (int i = 0; i < 7; i++) {
        idle[i] = kvpt_raw_connect(&d);
        assert_true(idle[i] >= 0);
    }
    assert_int_equal(kvpt_stat_poll(c, "connections", 8, 5000), 8);

    /* More are refused with -EUSERS, whether they speak the protocol or send noise. */
    uint64_t rejected0 = kvpt_stat(c, "connections_rejected");
    for (int i = 0; i < 20; i++) {
        kvp_client *x = NULL;
        kvp_opts xo = {.socket_path = d.socket, .timeout_ms = 5000};
        int rc = kvp_client_open(&xo, &x);
        if (rc != -EUSERS)
            fail_msg("client %d over --max-clients: %d (%s)", i, rc, kvp_strerror(rc));
        int fd = kvpt_raw_connect(&d);
        assert_true(fd >= 0);
        uint8_t noise[64];
        memset(noise, i, sizeof(noise));
        kvpt_raw_send_bytes(fd, noise, sizeof(noise));
        assert_true(kvpt_raw_closed(fd, 5000));
        close(fd);
    }
    assert_int_equal(kvpt_stat(c, "connections_rejected") - rejected0, 40);
    assert_int_equal(kvpt_stat(c, "connections"), 8);

    /* The connected worker is served throughout, and freed slots are usable again. */
    uint32_t *tok = kvpt_tokens(70, 2 * C);
    kvp_tokens t = {.ids = tok, .count = 2 * C};
    uint8_t b0[CHUNK_BYTES], b1[CHUNK_BYTES];
    void *bufs[2] = {b0, b1};
    kvpt_fill(b0, CHUNK_BYTES, 70, 0);
    kvpt_fill(b1, CHUNK_BYTES, 70, 1);
    assert_int_equal(kvp_store(inst, &t, 0, 2 * C, (const void *const *)bufs, NULL), 2);
    for (int i = 0; i < 7; i++)
        close(idle[i]);
    assert_int_equal(kvpt_stat_poll(c, "connections", 1, 5000), 1);
    kvp_client *late = kvpt_connect(&d);
    kvp_register_opts lo = kvpt_layout("flood-late", KVP_TRANSPORT_INLINE);
    kvp_instance *li = NULL;
    assert_int_equal(kvp_register(late, &lo, &li), 0);
    memset(b0, 0, sizeof(b0));
    memset(b1, 0, sizeof(b1));
    assert_int_equal(kvp_retrieve(li, &t, 0, 2 * C, bufs), 2);
    assert_true(kvpt_check(b0, CHUNK_BYTES, 70, 0));
    assert_true(kvpt_check(b1, CHUNK_BYTES, 70, 1));
    free(tok);
    kvp_client_close(late);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

/* ---------------------------------------------------------------------------------------- */
/* A commit with no upload from an inline worker.                                            */

/*
 * An inline worker has no pointers into the pool: COMMIT_STORE of its reservation (instead of
 * STORE_INLINE) would publish whatever its pages held before, for instance an evicted chunk of
 * another key or salt, and every worker would then be served those bytes. It is refused, the
 * reservation is dropped (the client library forgets the plan after any commit), and the
 * connection stays usable.
 */
static void test_inline_commit_without_upload(void **state)
{
    (void)state;
    static struct kvp_wire_slot slots[KVP_MAX_CHUNKS];
    struct kvp_slots_reply sr = {.slots = slots};
    struct kvpt_reply r;
    kvp_register_opts o = kvpt_layout("no-upload", KVP_TRANSPORT_INLINE);
    uint32_t h;
    uint8_t data[2 * CHUNK_BYTES];
    kvp_client *c = kvpt_connect(&daemon_);

    int fd = kvpt_raw_connect_or_fail(&daemon_);
    assert_int_equal(kvpt_raw_register(fd, &o, &h, NULL), 0);
    assert_int_equal(kvpt_raw_prepare(fd, KVP_OP_PREPARE_STORE, h, 80, 2 * C, &sr), 0);
    assert_int_equal(sr.nslots, 2);
    assert_int_equal(kvpt_raw_ref(fd, KVP_OP_COMMIT_STORE, h, sr.id, &r), -EOPNOTSUPP);
    assert_non_null(strstr(r.msg, "STORE_INLINE"));
    free(r.body);
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 0);
    assert_int_equal(kvpt_raw_lookup(fd, h, 80, 2 * C), 0);
    kvpt_raw_ref_refused(fd, KVP_OP_COMMIT_STORE, h, sr.id);

    /* The keys are free, and the proper upload works on the same connection. */
    assert_int_equal(kvpt_raw_prepare(fd, KVP_OP_PREPARE_STORE, h, 80, 2 * C, &sr), 0);
    assert_int_equal(sr.nslots, 2);
    kvpt_fill(data, CHUNK_BYTES, 80, 0);
    kvpt_fill(data + CHUNK_BYTES, CHUNK_BYTES, 80, 1);
    assert_int_equal(kvpt_raw_store_inline(fd, h, sr.id, sizeof(data), data, sizeof(data), &r), 0);
    free(r.body);
    assert_int_equal(kvpt_raw_lookup(fd, h, 80, 2 * C), 2);
    close(fd);

    /* Through the library: kvp_commit_store() on an inline plan fails the same way, and the
     * client stays usable. */
    kvp_register_opts lo = kvpt_layout("no-upload-lib", KVP_TRANSPORT_INLINE);
    kvp_instance *inst = NULL;
    kvp_store_plan sp;
    uint32_t *tok = kvpt_tokens(81, 2 * C);
    kvp_tokens t = {.ids = tok, .count = 2 * C};
    assert_int_equal(kvp_register(c, &lo, &inst), 0);
    assert_int_equal(kvp_prepare_store(inst, &t, 0, 2 * C, &sp), 2);
    assert_int_equal(kvp_commit_store(inst, &sp), -EOPNOTSUPP);
    assert_non_null(strstr(kvp_last_error(c), "STORE_INLINE"));
    assert_int_equal(kvp_ping(c), 0);
    assert_int_equal(kvp_lookup(inst, &t), 0);
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 0);
    assert_int_equal(kvp_unregister(inst), 0);
    free(tok);
    kvp_client_close(c);
    kvpt_assert_clean(&daemon_);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_garbage), cmocka_unit_test(test_truncated_register),
        cmocka_unit_test(test_huge_lengths),   cmocka_unit_test(test_out_of_order),
        cmocka_unit_test(test_foreign_ids),    cmocka_unit_test(test_inline_commit_without_upload),
        cmocka_unit_test(test_hold_limit),     cmocka_unit_test(test_connection_flood),
    };
    return cmocka_run_group_tests(tests, setup, kvpt_group_stop);
}
