/*
 * test_malformed_ids.c - well-framed requests about the wrong reservations and pins: commits,
 * aborts and releases out of order, another connection's ids with the real handles, and a
 * commit without upload from an inline worker.
 *
 * The rule checked everywhere: each offending request gets an error reply or a closed connection
 * (never a success, never silence on an open connection), the daemon keeps serving (a fresh
 * client pings after every batch) and nothing leaks (no reservation, pin or instance left).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
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
        cmocka_unit_test(test_out_of_order),
        cmocka_unit_test(test_foreign_ids),
        cmocka_unit_test(test_inline_commit_without_upload),
    };
    return cmocka_run_group_tests(tests, setup, kvpt_group_stop);
}
