/*
 * test_protocol.c - raw frames against the real daemon: every malformed frame gets an error
 * reply and a closed connection, bad values get an error reply on a connection that stays
 * usable, and other clients are never affected.
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

static struct kvpt_daemon daemon_;

static int setup(void **state)
{
    const char *args[] = {"--l1-size", "8MiB", "--chunk-size", "16", "--io-timeout", "500", NULL};
    return kvpt_group_start(state, &daemon_, args);
}

static void send_frame(int fd, uint16_t op, uint16_t version, uint32_t body_len,
                       uint64_t payload_len, const void *body, size_t sent_body)
{
    uint8_t hdr[KVP_HEADER_SIZE];
    struct kvp_header h = {.magic = KVP_MAGIC,
                           .version = version,
                           .opcode = op,
                           .request_id = 77,
                           .body_len = body_len,
                           .payload_len = payload_len};
    kvp_header_encode(&h, hdr);
    assert_int_equal(send(fd, hdr, sizeof(hdr), MSG_NOSIGNAL), (ssize_t)sizeof(hdr));
    if (sent_body)
        assert_int_equal(send(fd, body, sent_body, MSG_NOSIGNAL), (ssize_t)sent_body);
}

/* Reads one reply; returns its status and checks the echo. */
static int read_reply(int fd, uint16_t op, char *msg, size_t msg_size)
{
    uint8_t hdr[KVP_HEADER_SIZE];
    struct kvp_header h;
    assert_int_equal(recv(fd, hdr, sizeof(hdr), MSG_WAITALL), (ssize_t)sizeof(hdr));
    assert_int_equal(kvp_header_decode(hdr, &h), 0);
    assert_int_equal(h.opcode, op | KVP_REPLY_FLAG);
    uint8_t *body = malloc(h.body_len + 1);
    if (h.body_len)
        assert_int_equal(recv(fd, body, h.body_len, MSG_WAITALL), (ssize_t)h.body_len);
    if (h.status < 0 && msg)
        assert_int_equal(kvp_decode_error(body, h.body_len, msg, msg_size), 0);
    free(body);
    return h.status;
}

static bool closed_by_peer(int fd)
{
    char b;
    return recv(fd, &b, 1, 0) == 0;
}

static void test_garbage_header(void **state)
{
    (void)state;
    int fd = kvpt_raw_connect_or_fail(&daemon_);
    uint8_t junk[KVP_HEADER_SIZE];
    memset(junk, 0x5a, sizeof(junk));
    assert_int_equal(send(fd, junk, sizeof(junk), MSG_NOSIGNAL), (ssize_t)sizeof(junk));
    uint8_t hdr[KVP_HEADER_SIZE];
    struct kvp_header h;
    assert_int_equal(recv(fd, hdr, sizeof(hdr), MSG_WAITALL), (ssize_t)sizeof(hdr));
    assert_int_equal(kvp_header_decode(hdr, &h), 0);
    assert_int_equal(h.status, -EPROTO);
    char body[512];
    assert_int_equal(recv(fd, body, h.body_len, MSG_WAITALL), (ssize_t)h.body_len);
    assert_true(closed_by_peer(fd));
    close(fd);
    kvpt_assert_serves(&daemon_);
}

static void test_wrong_version(void **state)
{
    (void)state;
    int fd = kvpt_raw_connect_or_fail(&daemon_);
    send_frame(fd, KVP_OP_PING, 2, 0, 0, NULL, 0);
    char msg[256];
    uint8_t hdr[KVP_HEADER_SIZE];
    assert_int_equal(recv(fd, hdr, sizeof(hdr), MSG_WAITALL), (ssize_t)sizeof(hdr));
    struct kvp_header h;
    assert_int_equal(kvp_header_decode(hdr, &h), 0);
    assert_int_equal(h.status, -EPROTONOSUPPORT);
    assert_int_equal(recv(fd, msg, h.body_len, MSG_WAITALL), (ssize_t)h.body_len);
    assert_true(closed_by_peer(fd));
    close(fd);
    kvpt_assert_serves(&daemon_);
}

static void test_huge_body(void **state)
{
    (void)state;
    int fd = kvpt_raw_connect_or_fail(&daemon_);
    send_frame(fd, KVP_OP_REGISTER, KVP_PROTO_VERSION, 0xfffffff0u, 0, NULL, 0);
    uint8_t hdr[KVP_HEADER_SIZE];
    struct kvp_header h;
    assert_int_equal(recv(fd, hdr, sizeof(hdr), MSG_WAITALL), (ssize_t)sizeof(hdr));
    assert_int_equal(kvp_header_decode(hdr, &h), 0);
    assert_int_equal(h.status, -EPROTO);
    close(fd);
    kvpt_assert_serves(&daemon_);
}

static void test_malformed_body(void **state)
{
    (void)state;
    int fd = kvpt_raw_connect_or_fail(&daemon_);
    uint8_t body[5] = {1, 2, 3, 4, 5};
    char msg[256];
    send_frame(fd, KVP_OP_REGISTER, KVP_PROTO_VERSION, sizeof(body), 0, body, sizeof(body));
    assert_int_equal(read_reply(fd, KVP_OP_REGISTER, msg, sizeof(msg)), -EPROTO);
    assert_non_null(strstr(msg, "malformed"));
    assert_true(closed_by_peer(fd));
    close(fd);

    /* A token count beyond the limit. */
    fd = kvpt_raw_connect_or_fail(&daemon_);
    struct kvp_wbuf w;
    kvp_wbuf_init(&w);
    kvp_put_u32(&w, 1);
    kvp_put_u32(&w, 0);
    kvp_put_u32(&w, 16);
    kvp_put_u16(&w, 0);
    kvp_put_u32(&w, KVP_MAX_TOKENS + 1);
    send_frame(fd, KVP_OP_LOOKUP, KVP_PROTO_VERSION, (uint32_t)w.len, 0, w.data, w.len);
    assert_int_equal(read_reply(fd, KVP_OP_LOOKUP, msg, sizeof(msg)), -EPROTO);
    assert_true(closed_by_peer(fd));
    kvp_wbuf_free(&w);
    close(fd);
    kvpt_assert_serves(&daemon_);
}

static void test_payload_where_none_allowed(void **state)
{
    (void)state;
    int fd = kvpt_raw_connect_or_fail(&daemon_);
    send_frame(fd, KVP_OP_PING, KVP_PROTO_VERSION, 0, 1 << 20, NULL, 0);
    assert_int_equal(read_reply(fd, KVP_OP_PING, NULL, 0), -EPROTO);
    assert_true(closed_by_peer(fd));
    close(fd);
    kvpt_assert_serves(&daemon_);
}

static void test_bad_values_keep_connection(void **state)
{
    (void)state;
    int fd = kvpt_raw_connect_or_fail(&daemon_);
    char msg[256];
    struct kvp_wbuf w;
    kvp_wbuf_init(&w);

    /* Unknown handle. */
    struct kvp_ref_req ref = {.handle = 0xdeadbeef, .id = 1};
    kvp_encode_ref_req(&w, &ref);
    send_frame(fd, KVP_OP_COMMIT_STORE, KVP_PROTO_VERSION, (uint32_t)w.len, 0, w.data, w.len);
    assert_int_equal(read_reply(fd, KVP_OP_COMMIT_STORE, msg, sizeof(msg)), -ENOENT);
    assert_non_null(strstr(msg, "reservation"));

    kvp_wbuf_reset(&w);
    uint32_t tok[32] = {0};
    kvp_encode_key_req(&w, 0xdeadbeef, 0, 32, tok, 32, NULL, 0);
    send_frame(fd, KVP_OP_LOOKUP, KVP_PROTO_VERSION, (uint32_t)w.len, 0, w.data, w.len);
    assert_int_equal(read_reply(fd, KVP_OP_LOOKUP, msg, sizeof(msg)), -ENOENT);
    assert_non_null(strstr(msg, "unknown instance"));

    /* Still usable. */
    send_frame(fd, KVP_OP_PING, KVP_PROTO_VERSION, 0, 0, NULL, 0);
    assert_int_equal(read_reply(fd, KVP_OP_PING, NULL, 0), 0);
    kvp_wbuf_free(&w);
    close(fd);
}

/* Commits of another connection's reservation are refused; the owner's commit still works. */
static void test_foreign_reservation(void **state)
{
    (void)state;
    kvp_client *a = kvpt_connect(&daemon_);
    kvp_register_opts o = kvpt_layout("owner", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    kvp_store_plan sp;
    uint32_t *tok = kvpt_tokens(31, 32);
    kvp_tokens t = {.ids = tok, .count = 32};
    assert_int_equal(kvp_register(a, &o, &inst), 0);
    assert_int_equal(kvp_prepare_store(inst, &t, 0, 32, &sp), 2);

    int fd = kvpt_raw_connect_or_fail(&daemon_);
    struct kvp_wbuf w;
    char msg[256];
    kvp_wbuf_init(&w);
    /* Same handle and id, other connection. */
    struct kvp_ref_req ref = {.handle = 0, .id = sp.reservation};
    /* The handle is private to the library; try every plausible one. */
    for (uint32_t slot = 0; slot < 4; slot++) {
        for (uint32_t gen = 1; gen < 4; gen++) {
            ref.handle = gen << 16 | slot;
            kvp_wbuf_reset(&w);
            kvp_encode_ref_req(&w, &ref);
            send_frame(fd, KVP_OP_COMMIT_STORE, KVP_PROTO_VERSION, (uint32_t)w.len, 0, w.data,
                       w.len);
            assert_int_equal(read_reply(fd, KVP_OP_COMMIT_STORE, msg, sizeof(msg)), -ENOENT);
        }
    }
    kvp_wbuf_free(&w);
    close(fd);
    assert_int_equal(kvp_lookup(inst, &t), 0);
    for (uint32_t i = 0; i < sp.nslots; i++)
        memset(sp.slots[i].data, 1, sp.slots[i].length);
    assert_int_equal(kvp_commit_store(inst, &sp), 2);
    assert_int_equal(kvp_lookup(inst, &t), 2);
    free(tok);
    kvp_client_close(a);
}

/*
 * Frames need not arrive one per read: three whole requests and the start of a fourth in one
 * write, the rest of the fourth later, are answered in order, each with its own request id.
 */
static void test_frames_across_reads(void **state)
{
    (void)state;
    int fd = kvpt_raw_connect_or_fail(&daemon_);
    uint8_t buf[4 * KVP_HEADER_SIZE];
    for (uint64_t i = 0; i < 4; i++) {
        struct kvp_header h = {.magic = KVP_MAGIC,
                               .version = KVP_PROTO_VERSION,
                               .opcode = KVP_OP_PING,
                               .request_id = 100 + i};
        kvp_header_encode(&h, buf + i * KVP_HEADER_SIZE);
    }
    size_t first = 3 * KVP_HEADER_SIZE + 10;
    assert_int_equal(send(fd, buf, first, MSG_NOSIGNAL), (ssize_t)first);
    usleep(50000);
    assert_int_equal(send(fd, buf + first, sizeof(buf) - first, MSG_NOSIGNAL),
                     (ssize_t)(sizeof(buf) - first));
    for (uint64_t i = 0; i < 4; i++) {
        uint8_t hdr[KVP_HEADER_SIZE];
        struct kvp_header h;
        assert_int_equal(recv(fd, hdr, sizeof(hdr), MSG_WAITALL), (ssize_t)sizeof(hdr));
        assert_int_equal(kvp_header_decode(hdr, &h), 0);
        assert_int_equal(h.opcode, KVP_OP_PING | KVP_REPLY_FLAG);
        assert_int_equal(h.request_id, 100 + i);
        assert_int_equal(h.status, 0);
        if (h.body_len) {
            uint8_t *body = malloc(h.body_len);
            assert_non_null(body);
            assert_int_equal(recv(fd, body, h.body_len, MSG_WAITALL), (ssize_t)h.body_len);
            free(body);
        }
    }
    close(fd);
}

/* A client that stalls mid-frame is dropped after --io-timeout; an idle one is not. */
static void test_stalled_client_dropped(void **state)
{
    (void)state;
    int idle = kvpt_raw_connect_or_fail(&daemon_);
    int fd = kvpt_raw_connect_or_fail(&daemon_);
    uint8_t half[10] = {0};
    assert_int_equal(send(fd, half, sizeof(half), MSG_NOSIGNAL), (ssize_t)sizeof(half));
    assert_true(kvpt_log_wait(&daemon_, "stalled mid-frame", 5000));
    assert_true(closed_by_peer(fd));
    close(fd);

    send_frame(idle, KVP_OP_PING, KVP_PROTO_VERSION, 0, 0, NULL, 0);
    assert_int_equal(read_reply(idle, KVP_OP_PING, NULL, 0), 0);
    close(idle);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_garbage_header),
        cmocka_unit_test(test_wrong_version),
        cmocka_unit_test(test_huge_body),
        cmocka_unit_test(test_malformed_body),
        cmocka_unit_test(test_payload_where_none_allowed),
        cmocka_unit_test(test_bad_values_keep_connection),
        cmocka_unit_test(test_foreign_reservation),
        cmocka_unit_test(test_frames_across_reads),
        cmocka_unit_test(test_stalled_client_dropped),
    };
    return cmocka_run_group_tests(tests, setup, kvpt_group_stop);
}
