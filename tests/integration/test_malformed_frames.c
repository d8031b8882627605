/*
 * test_malformed_frames.c - broken framing in bulk, beyond the single cases of test_protocol.c:
 * random bytes on hundreds of connections, every truncation of a valid frame, and extreme
 * lengths (bodies and payloads beyond the limits, a body announced and never sent, the largest
 * token list, STORE_INLINE with a wrong payload length).
 *
 * The rule checked everywhere: each offending request gets an error reply or a closed connection
 * (never a success, never silence on an open connection), the daemon keeps serving (a fresh
 * client pings after every batch) and nothing leaks (no reservation, pin or instance left).
 *
 * Requests that are well framed but name the wrong ids: test_malformed_ids.c; limits on what a
 * connection may hold and on connections: test_malformed_limits.c.
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
#include "malformed.h"

static struct kvpt_daemon daemon_;

static int setup(void **state)
{
    static const char *const args[] = MALFORMED_DAEMON_ARGS;
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_garbage),
        cmocka_unit_test(test_truncated_register),
        cmocka_unit_test(test_huge_lengths),
    };
    return cmocka_run_group_tests(tests, setup, kvpt_group_stop);
}
