/*
 * test_client_reconnect.c - libkvpool after the daemon went away, against the scripted fake
 * daemon: the next call reconnects and registers every instance again; plans of the lost
 * connection fail with -ESTALE without a request; a daemon back with another layout makes the
 * instance stale for good; an instance the new daemon refuses fails its own calls while the
 * client's other instances go on.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client/transfer_fixture.h"
#include "common/kvp_assert.h"

/* ---- reconnect --------------------------------------------------------------------------- */

static void add_lookup_reply(struct xfer_fixture *x, uint32_t nchunks, uint32_t cached)
{
    struct kvp_lookup_reply m = {.nchunks = nchunks, .cached = cached};
    struct kvp_wbuf w;
    kvp_wbuf_init(&w);
    kvp_encode_lookup_reply(&w, &m);
    fake_add_reply(&x->f, KVP_OP_LOOKUP, &w);
}

/*
 * A plan prepared before a reconnect: its commit is refused with -ESTALE without a request,
 * even though the new connection hands out the same reservation id; its slot pointers stay
 * writable but no longer reach the segment; the new plan's pointers are a new mapping's.
 */
static void test_reconnect_stale_shm_plan(void **state)
{
    struct xfer_fixture *x = *state;
    struct kvp_wire_slot s[1] = {{.chunk_index = 0, .offset = 4096, .length = CHUNK}};
    struct kvp_slots_reply prep = {.id = 12, .nchunks = 1, .nslots = 1, .slots = s};
    kvp_register_opts o = xfer_reg_opts(KVP_TRANSPORT_AUTO);
    kvp_tokens seq = {.ids = x->ids, .count = 16};
    kvp_store_plan old_plan, new_plan;
    kvp_instance *inst = NULL;

    xfer_seg_create(x, xfer_nonce_a, SEG_SIZE);
    struct kvp_register_reply r = xfer_register_reply(KVP_WIRE_SHM, x->seg_name, NULL);
    xfer_add_hello_shm(x, xfer_nonce_a);
    xfer_add_register_reply(x, &r);
    xfer_add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    fake_add(&x->f, KVP_OP_PING, FAKE_CLOSE);
    xfer_add_hello_shm(x, xfer_nonce_a);
    xfer_add_register_reply(x, &r);
    add_lookup_reply(x, 1, 0);
    xfer_add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    fake_add_count(&x->f, KVP_OP_COMMIT_STORE, 1);
    xfer_start_and_open(x);

    assert_rc(kvp_register(x->c, &o, &inst), 0);
    assert_rc(kvp_prepare_store(inst, &seq, 0, 16, &old_plan), 1);
    uint8_t *old_ptr = old_plan.slots[0].data;
    int rc = kvp_ping(x->c);
    assert_true(rc == -ECONNRESET || rc == -EPIPE);

    /* The next call reconnects, registers again and goes on; same instance handle object. */
    assert_rc(kvp_lookup(inst, &seq), 0);
    assert_int_equal(kvp_instance_get_info(inst)->transport, KVP_TRANSPORT_SHM);

    /* A late write through the old plan lands harmlessly. */
    memset(old_ptr, 0xab, CHUNK);
    assert_int_equal(x->seg[4096], 0);
    assert_rc(kvp_commit_store(inst, &old_plan), -ESTALE);
    assert_non_null(strstr(kvp_last_error(x->c), "reconnected"));
    assert_null(old_plan.slots);
    assert_int_equal(old_plan.reservation, 0);

    assert_rc(kvp_prepare_store(inst, &seq, 0, 16, &new_plan), 1);
    assert_ptr_not_equal(new_plan.slots[0].data, old_ptr);
    memset(new_plan.slots[0].data, 0x5a, CHUNK);
    assert_int_equal(x->seg[4096], 0x5a);
    assert_rc(kvp_commit_store(inst, &new_plan), 1);
    xfer_finish(x);

    /* HELLO, REGISTER, PREPARE, PING | HELLO, REGISTER, LOOKUP, PREPARE, COMMIT: exactly one
     * commit of reservation 12, the new one. */
    assert_rc(x->f.nconns, 2);
    assert_rc(x->f.nreqs, 9);
    struct kvp_register_req q = xfer_sent_register(x, 5);
    assert_int_equal(q.transport, KVP_WIRE_SHM);
    struct kvp_ref_req cm = xfer_sent_ref(x, 8, KVP_OP_COMMIT_STORE);
    assert_int_equal(cm.id, 12);
}

/* A plan whose connection is lost but not replaced yet is stale too; so are abort, inline
 * store and retrieve commits of stale plans, and each frees the plan. */
static void test_stale_plan_on_lost_connection(void **state)
{
    struct xfer_fixture *x = *state;
    struct kvp_wire_slot s[1] = {{.chunk_index = 0, .offset = 4096, .length = CHUNK}};
    struct kvp_slots_reply prep = {.id = 12, .nchunks = 1, .nslots = 1, .slots = s};
    uint8_t c0[CHUNK] = {0};
    const void *chunks[1] = {c0};
    kvp_tokens seq = {.ids = x->ids, .count = 16};
    kvp_store_plan a, b;

    xfer_script_inline(x);
    xfer_add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    prep.id = 13;
    xfer_add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    fake_add(&x->f, KVP_OP_PING, FAKE_CLOSE);
    xfer_start_and_open(x);
    kvp_instance *inst = xfer_register_inline(x);

    assert_rc(kvp_prepare_store(inst, &seq, 0, 16, &a), 1);
    assert_rc(kvp_prepare_store(inst, &seq, 0, 16, &b), 1);
    int rc = kvp_ping(x->c);
    assert_true(rc == -ECONNRESET || rc == -EPIPE);
    assert_rc(kvp_store_inline(inst, &a, chunks), -ESTALE);
    assert_non_null(strstr(kvp_last_error(x->c), "lost"));
    assert_null(a.slots);
    assert_rc(kvp_abort_store(inst, &b), -ESTALE);
    assert_null(b.slots);
    /* Unregistering an instance of a lost connection needs no daemon. */
    assert_rc(kvp_unregister(inst), 0);
    xfer_finish(x);
    assert_rc(x->f.nreqs, 5);
    assert_rc(x->f.nconns, 1);
}

/* A daemon back with another chunk size: the instance is stale for good (its registration on
 * the new daemon is dropped), the client itself goes on. */
static void test_reconnect_layout_changed(void **state)
{
    struct xfer_fixture *x = *state;
    kvp_tokens seq = {.ids = x->ids, .count = 64};

    xfer_script_inline(x);
    fake_add(&x->f, KVP_OP_PING, FAKE_CLOSE);
    fake_add_hello(&x->f);
    struct kvp_register_reply r = xfer_register_reply(KVP_WIRE_INLINE, NULL, "SHM disabled");
    r.chunk_tokens = 2 * CT;
    r.shape[2] = 2 * CT;
    r.chunk_bytes = 2 * CHUNK;
    r.handle = HANDLE + 1;
    xfer_add_register_reply(x, &r);
    fake_add_reply(&x->f, KVP_OP_UNREGISTER, NULL);
    fake_add_reply(&x->f, KVP_OP_PING, NULL);
    xfer_start_and_open(x);
    kvp_instance *inst = xfer_register_inline(x);

    int rc = kvp_ping(x->c);
    assert_true(rc == -ECONNRESET || rc == -EPIPE);
    assert_rc(kvp_lookup(inst, &seq), -ESTALE);
    assert_non_null(strstr(kvp_last_error(x->c), "32-token chunks"));
    assert_non_null(strstr(kvp_last_error(x->c), "worker-0"));
    /* The old layout is still what the instance reports, and it is not registered again. */
    assert_int_equal(kvp_instance_get_info(inst)->chunk_tokens, CT);
    assert_rc(kvp_lookup(inst, &seq), -ESTALE);
    assert_rc(kvp_ping(x->c), 0);
    assert_rc(kvp_unregister(inst), 0);
    xfer_finish(x);

    /* HELLO, REGISTER, PING | HELLO, REGISTER, UNREGISTER (of the new registration), PING. */
    assert_rc(x->f.nreqs, 7);
    struct kvp_ref_req u = xfer_sent_ref(x, 5, KVP_OP_UNREGISTER);
    assert_int_equal(u.handle, HANDLE + 1);
}

/*
 * An instance the new daemon refuses fails its own calls with the daemon's error, one attempt
 * per call, while the client's other instance goes on; once the daemon accepts, it is back.
 */
static void test_reconnect_refused_instance(void **state)
{
    struct xfer_fixture *x = *state;
    kvp_register_opts oa = xfer_reg_opts(KVP_TRANSPORT_INLINE),
                      ob = xfer_reg_opts(KVP_TRANSPORT_INLINE);
    struct kvp_register_reply r = xfer_register_reply(KVP_WIRE_INLINE, NULL, "requested by worker");
    kvp_tokens seq = {.ids = x->ids, .count = 32};
    kvp_instance *a = NULL, *b = NULL;

    oa.instance_id = "worker-a";
    ob.instance_id = "worker-b";
    fake_add_hello(&x->f);
    xfer_add_register_reply(x, &r);
    xfer_add_register_reply(x, &r);
    fake_add(&x->f, KVP_OP_PING, FAKE_CLOSE);
    fake_add_hello(&x->f);
    fake_add_error(&x->f, KVP_OP_REGISTER, -EBUSY, "instance id worker-a in use, pid 4242");
    xfer_add_register_reply(x, &r); /* b: registered again after a, in the original order */
    add_lookup_reply(x, 2, 1);      /* b's lookup */
    fake_add_error(&x->f, KVP_OP_REGISTER, -EBUSY, "instance id worker-a in use, pid 4242");
    xfer_add_register_reply(x, &r); /* a, at its second call */
    add_lookup_reply(x, 2, 2);      /* a's lookup */
    xfer_start_and_open(x);

    assert_rc(kvp_register(x->c, &oa, &a), 0);
    assert_rc(kvp_register(x->c, &ob, &b), 0);
    int rc = kvp_ping(x->c);
    assert_true(rc == -ECONNRESET || rc == -EPIPE);

    /* a's call reconnects: a is refused, b is registered again, and the call reports a's
     * refusal without asking a second time. */
    assert_rc(kvp_lookup(a, &seq), -EBUSY);
    assert_non_null(strstr(kvp_last_error(x->c), "cannot register instance worker-a again"));
    assert_non_null(strstr(kvp_last_error(x->c), "pid 4242"));
    assert_rc(kvp_lookup(b, &seq), 1);
    /* Each later call of a makes one attempt. */
    assert_rc(kvp_lookup(a, &seq), -EBUSY);
    assert_rc(kvp_lookup(a, &seq), 2);
    xfer_finish(x);

    assert_rc(x->f.nreqs, 11);
    assert_string_equal(xfer_sent_register(x, 5).instance_id, "worker-a");
    assert_string_equal(xfer_sent_register(x, 6).instance_id, "worker-b");
    assert_string_equal(xfer_sent_register(x, 8).instance_id, "worker-a");
    assert_string_equal(xfer_sent_register(x, 9).instance_id, "worker-a");
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, xfer_setup, xfer_teardown)
    const struct CMUnitTest tests[] = {
        T(test_reconnect_stale_shm_plan),
        T(test_stale_plan_on_lost_connection),
        T(test_reconnect_layout_changed),
        T(test_reconnect_refused_instance),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
