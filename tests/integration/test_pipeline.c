/*
 * test_pipeline.c - commits sent without waiting (KVP_REQ_NOREPLY, docs/PROTOCOL.md "Pipelined
 * commits"), on raw frames and through the library.
 *
 * On the wire: such a commit gets no reply; its failure answers the next request that expects a
 * reply, which is then not performed (status KVP_EPIPELINED, a message naming the commit, its
 * error and the refused request), and the connection serves on; a second failure before that
 * is counted in the same message; the flag on any other request, or an unknown flag bit, is a
 * framing error that closes the connection; the CPU hint bits are accepted on any request.
 * Through the library: a pipelined store is applied before the same client's next request and
 * reads back byte-exact, and unknown kvp_opts.flags bits are refused; KVPOOL_POLL_US is checked.
 * In order: a retrieve right after a pipelined commit finds its chunks, and pins of a connection
 * that ends are released.
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/msg.h"
#include "common/wire.h"
#include "harness.h"

static struct kvpt_daemon daemon_;

static int setup(void **state)
{
    static const char *const args[] = {"--l1-size", "16MiB", "--chunk-size", "16", NULL};
    return kvpt_group_start(state, &daemon_, args);
}

/* Sends a (handle, id) commit with KVP_REQ_NOREPLY. */
static void post_ref(int fd, uint16_t op, uint32_t handle, uint64_t id)
{
    struct kvp_wbuf w;
    struct kvp_ref_req ref = {.handle = handle, .id = id};
    kvp_wbuf_init(&w);
    kvp_encode_ref_req(&w, &ref);
    assert_int_equal(w.err, 0);
    assert_int_equal(kvpt_raw_send_flags(fd, op, w.data, (uint32_t)w.len, 0, KVP_REQ_NOREPLY), 0);
    kvp_wbuf_free(&w);
}

/* Nothing arrives on fd within ms milliseconds. */
static bool silent(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, ms) == 0;
}

static void expect_in(const char *msg, const char *want)
{
    if (!strstr(msg, want))
        fail_msg("\"%s\" not in \"%s\"", want, msg);
}

/* A failed commit without reply: silence, then the next request is refused in its stead. */
static void test_failure_answers_next_request(void **state)
{
    (void)state;
    struct kvpt_reply r;
    uint32_t h;
    int fd = kvpt_raw_connect_or_fail(&daemon_);
    kvp_register_opts o = kvpt_layout("pipe-a", KVP_TRANSPORT_INLINE);
    assert_int_equal(kvpt_raw_register(fd, &o, &h, NULL), 0);

    post_ref(fd, KVP_OP_COMMIT_STORE, h, 999);
    assert_true(silent(fd, 200));
    assert_int_equal(kvpt_raw_keyed(fd, KVP_OP_LOOKUP, h, 1, 32, &r), KVP_EPIPELINED);
    expect_in(r.msg, "COMMIT_STORE #");
    expect_in(r.msg, "sent without waiting for its reply, failed with ENOENT");
    expect_in(r.msg, "no reservation 999");
    expect_in(r.msg, "this LOOKUP was not performed");
    free(r.body);

    /* Reported once: the connection serves as before. */
    assert_int_equal(kvpt_raw_keyed(fd, KVP_OP_LOOKUP, h, 1, 32, &r), 0);
    free(r.body);
    assert_int_equal(kvpt_raw_call(fd, KVP_OP_PING, NULL, 0, &r), 0);
    free(r.body);
    close(fd);
    kvpt_assert_clean(&daemon_);
}

/*
 * A real reservation whose pipelined commit fails (an inline instance's slots were never
 * written, so the daemon drops it): no reply, the reservation is gone at once, and a second
 * failure before the next request is counted in the same answer.
 */
static void test_failed_commit_drops_reservation(void **state)
{
    (void)state;
    struct kvpt_reply r;
    static struct kvp_wire_slot slots[KVP_MAX_CHUNKS];
    struct kvp_slots_reply sr = {.slots = slots};
    uint32_t h;
    int fd = kvpt_raw_connect_or_fail(&daemon_);
    kvp_client *c = kvpt_connect(&daemon_);
    kvp_register_opts o = kvpt_layout("pipe-b", KVP_TRANSPORT_INLINE);
    assert_int_equal(kvpt_raw_register(fd, &o, &h, NULL), 0);
    assert_int_equal(kvpt_raw_prepare(fd, KVP_OP_PREPARE_STORE, h, 2, 64, &sr), 0);
    assert_int_equal(sr.nslots, 4);
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 4);

    post_ref(fd, KVP_OP_COMMIT_STORE, h, sr.id);
    post_ref(fd, KVP_OP_COMMIT_RETRIEVE, h, 12345);
    assert_true(silent(fd, 200));
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 0);
    assert_int_equal(kvpt_stat(c, "objects_committed"), 0);

    assert_int_equal(kvpt_raw_call(fd, KVP_OP_PING, NULL, 0, &r), KVP_EPIPELINED);
    expect_in(r.msg, "failed (and 1 later one(s)) with EOPNOTSUPP");
    expect_in(r.msg, "this PING was not performed");
    free(r.body);
    assert_int_equal(kvpt_raw_call(fd, KVP_OP_PING, NULL, 0, &r), 0);
    free(r.body);
    kvp_client_close(c);
    close(fd);
    kvpt_assert_clean(&daemon_);
}

/*
 * In order, and nothing left behind: a pipelined commit is applied before the next request of
 * its connection (a retrieve right after it finds every chunk), and a connection that ends
 * with a pin still held has it released.
 */
static void test_applied_in_order_then_released(void **state)
{
    (void)state;
    static struct kvp_wire_slot slots[KVP_MAX_CHUNKS];
    struct kvp_slots_reply sr = {.slots = slots};
    uint32_t h;
    int fd = kvpt_raw_connect_or_fail(&daemon_);
    kvp_register_opts o = kvpt_layout("pipe-order", KVP_TRANSPORT_SHM);
    assert_int_equal(kvpt_raw_register(fd, &o, &h, NULL), 0);
    assert_int_equal(kvpt_raw_prepare(fd, KVP_OP_PREPARE_STORE, h, 300, 64, &sr), 0);
    assert_int_equal(sr.nslots, 4);
    post_ref(fd, KVP_OP_COMMIT_STORE, h, sr.id);
    assert_int_equal(kvpt_raw_prepare(fd, KVP_OP_PREPARE_RETRIEVE, h, 300, 64, &sr), 0);
    assert_int_equal(sr.nslots, 4);

    kvp_client *c = kvpt_connect(&daemon_);
    assert_int_equal(kvpt_stat(c, "objects_pinned"), 4);
    close(fd); /* the pins go with the connection */
    assert_int_equal(kvpt_stat_poll(c, "objects_pinned", 0, 5000), 0);
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 0);
    assert_true(kvpt_stat(c, "objects_committed") >= 4);
    kvp_client_close(c);
    kvpt_assert_clean(&daemon_);
}

/* The flag on a request that is not a commit, or an unknown flag bit: answered, then closed. */
static void test_bad_flags_close(void **state)
{
    (void)state;
    const uint32_t bad[] = {KVP_REQ_NOREPLY, 0x2, 0x8000};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct kvpt_reply r;
        int fd = kvpt_raw_connect_or_fail(&daemon_);
        assert_int_equal(kvpt_raw_send_flags(fd, KVP_OP_PING, NULL, 0, 0, bad[i]), 0);
        assert_int_equal(kvpt_raw_recv(fd, &r), 0);
        assert_int_equal(r.status, -EPROTO);
        free(r.body);
        assert_true(kvpt_raw_closed(fd, 5000));
        close(fd);
    }
    kvpt_assert_clean(&daemon_);
}

/* The CPU hint rides on any request, with any CPU number, and changes no answer. */
static void test_cpu_hint_accepted(void **state)
{
    (void)state;
    const uint32_t cpus[] = {1, 2, 1000, KVP_REQ_CPU_MAX + 1};
    int fd = kvpt_raw_connect_or_fail(&daemon_);
    for (size_t i = 0; i < sizeof(cpus) / sizeof(cpus[0]); i++) {
        struct kvpt_reply r;
        assert_int_equal(kvpt_raw_send_flags(fd, KVP_OP_PING, NULL, 0, 0,
                                             cpus[i] << KVP_REQ_CPU_SHIFT),
                         0);
        assert_int_equal(kvpt_raw_recv(fd, &r), 0);
        assert_int_equal(r.status, 0);
        free(r.body);
    }
    close(fd);
    kvpt_assert_clean(&daemon_);
}

/*
 * Through the library, on shm: stores and retrieves back to back, each commit pipelined; every
 * one is applied before the next request of the same client, so each retrieve finds what the
 * store before it wrote, and the pins of the retrieves are gone after one more round trip.
 */
static void test_library_back_to_back(void **state)
{
    (void)state;
    kvp_client *c = kvpt_connect(&daemon_);
    kvp_register_opts o = kvpt_layout("pipe-lib", KVP_TRANSPORT_SHM);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
    uint64_t before = kvpt_stat(c, "objects_committed");
    void *in = malloc(bytes), *out = malloc(bytes);
    assert_non_null(in);
    assert_non_null(out);
    for (uint32_t seq = 100; seq < 140; seq++) {
        uint32_t *tok = kvpt_tokens(seq, 16);
        kvp_tokens t = {.ids = tok, .count = 16};
        kvpt_fill(in, bytes, seq, 0);
        assert_int_equal(kvp_store(inst, &t, 0, 16, (const void *const *)&in, NULL), 1);
        assert_int_equal(kvp_retrieve(inst, &t, 0, 16, &out), 1);
        assert_true(kvpt_check(out, bytes, seq, 0));
        free(tok);
    }
    assert_int_equal(kvp_ping(c), 0);
    assert_int_equal(kvpt_stat(c, "objects_pinned"), 0);
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 0);
    assert_int_equal(kvpt_stat(c, "objects_committed") - before, 40);

    /* Unknown option bits are refused, not ignored. */
    kvp_opts bad = {.socket_path = daemon_.socket, .flags = 0x2};
    kvp_client *x = NULL;
    assert_int_equal(kvp_client_open(&bad, &x), -EINVAL);
    assert_null(x);
    free(in);
    free(out);
    kvp_client_close(c);
}

/*
 * KVPOOL_POLL_US bounds the yield-polling for a reply (src/client/conn.c): 0 turns it off and
 * the calls work the same; a value that is not microseconds up to 10000 is refused when the
 * client opens, with the variable named.
 */
static void test_poll_setting(void **state)
{
    (void)state;
    kvp_opts o = {.socket_path = daemon_.socket};
    kvp_client *c = NULL;
    const char *bad[] = {"x", "-1", "10001", "5us"};

    setenv("KVPOOL_POLL_US", "0", 1);
    assert_int_equal(kvp_client_open(&o, &c), 0);
    unsetenv("KVPOOL_POLL_US");
    kvp_register_opts ro = kvpt_layout("poll-off", KVP_TRANSPORT_SHM);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &ro, &inst), 0);
    assert_int_equal(kvpt_store_seq(inst, 200, 4), 4);
    kvpt_assert_seq(inst, 200, 4, 4);
    kvp_client_close(c);

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        c = NULL;
        setenv("KVPOOL_POLL_US", bad[i], 1);
        assert_int_equal(kvp_client_open(&o, &c), -EINVAL);
        unsetenv("KVPOOL_POLL_US");
        assert_null(c);
        expect_in(kvp_last_error(NULL), "KVPOOL_POLL_US must be microseconds from 0 to 10000");
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failure_answers_next_request),
        cmocka_unit_test(test_failed_commit_drops_reservation),
        cmocka_unit_test(test_applied_in_order_then_released),
        cmocka_unit_test(test_bad_flags_close),
        cmocka_unit_test(test_cpu_hint_accepted),
        cmocka_unit_test(test_library_back_to_back),
        cmocka_unit_test(test_poll_setting),
    };
    return cmocka_run_group_tests(tests, setup, kvpt_group_stop);
}
