/*
 * test_client_shm.c - libkvpool's shared-memory transfers against the scripted fake daemon and
 * a real segment made by the test: stores copy into the daemon's slots and commit, retrieves
 * copy out of pinned slots and unpin, two-phase plans; slots outside the pool or of the wrong
 * length are refused and their reservation aborted; slot lists and counts that do not add up
 * are protocol errors.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client/transfer_fixture.h"
#include "common/kvp_assert.h"

/* ---- shm transfers ---------------------------------------------------------------------- */

/* kvp_store copies into the daemon's slots and commits; kvp_retrieve copies out of pinned
 * slots and unpins. Slots deliberately out of memory order. */
static void test_shm_store_retrieve(void **state)
{
    struct xfer_fixture *x = *state;
    struct kvp_wire_slot store_slots[2] = {
        {.chunk_index = 0, .offset = 4096 + 3 * CHUNK, .length = CHUNK},
        {.chunk_index = 1, .offset = 4096, .length = CHUNK},
    };
    struct kvp_slots_reply prep = {.id = 5, .nchunks = 2, .nslots = 2, .slots = store_slots};
    struct kvp_slots_reply pin = {.id = 9, .nchunks = 2, .nslots = 2, .slots = store_slots};
    uint8_t c0[CHUNK], c1[CHUNK], o0[CHUNK], o1[CHUNK];
    const void *chunks[2] = {c0, c1};
    void *out[2] = {o0, o1};
    kvp_tokens seq = {.ids = x->ids, .count = 40, .salt = "s1", .salt_len = 2};
    kvp_store_result res;

    xfer_script_shm(x);
    xfer_add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    fake_add_count(&x->f, KVP_OP_COMMIT_STORE, 2);
    xfer_add_slots_reply(x, KVP_OP_PREPARE_RETRIEVE, &pin);
    fake_add_count(&x->f, KVP_OP_COMMIT_RETRIEVE, 2);
    xfer_start_and_open(x);
    kvp_instance *inst = xfer_register_shm(x);

    memset(c0, 0xc0, sizeof(c0));
    memset(c1, 0xc1, sizeof(c1));
    /* end 40 rounds down to 32: two chunks */
    assert_rc(kvp_store(inst, &seq, 0, 40, chunks, &res), 2);
    assert_int_equal(res.nchunks, 2);
    assert_int_equal(res.stored, 2);
    assert_int_equal(res.cached, 0);
    assert_memory_equal(x->seg + 4096 + 3 * CHUNK, c0, CHUNK);
    assert_memory_equal(x->seg + 4096, c1, CHUNK);

    /* Change the pool behind the library's back: retrieve must read the pool, not a cache. */
    memset(x->seg + 4096, 0xd1, CHUNK);
    memset(o0, 0, sizeof(o0));
    memset(o1, 0, sizeof(o1));
    assert_rc(kvp_retrieve(inst, &seq, 0, 32, out), 2);
    assert_memory_equal(o0, c0, CHUNK);
    assert_int_equal(o1[0], 0xd1);
    assert_int_equal(o1[CHUNK - 1], 0xd1);
    xfer_finish(x);

    /* What went on the wire: the key request, then commit/unpin of the daemon's ids. */
    assert_rc(x->f.nreqs, 6);
    struct kvp_key_req k;
    assert_int_equal(x->f.reqs[2].h.opcode, KVP_OP_PREPARE_STORE);
    assert_rc(kvp_decode_key_req(x->f.reqs[2].body, x->f.reqs[2].h.body_len, &k), 0);
    assert_int_equal(k.handle, HANDLE);
    assert_int_equal(k.start, 0);
    assert_int_equal(k.end, 40);
    assert_int_equal(k.ntokens, 40);
    assert_int_equal(k.salt_len, 2);
    assert_memory_equal(k.salt, "s1", 2);
    for (uint32_t i = 0; i < 40; i++)
        assert_int_equal(kvp_key_token(&k, i), x->ids[i]);
    assert_int_equal(x->f.reqs[2].h.payload_len, 0);
    struct kvp_ref_req r = xfer_sent_ref(x, 3, KVP_OP_COMMIT_STORE);
    assert_int_equal(r.handle, HANDLE);
    assert_int_equal(r.id, 5);
    assert_int_equal(x->f.reqs[4].h.opcode, KVP_OP_PREPARE_RETRIEVE);
    r = xfer_sent_ref(x, 5, KVP_OP_COMMIT_RETRIEVE);
    assert_int_equal(r.id, 9);
}

/* Two-phase store by hand: the plan reports every category and slots point into the pool. */
static void test_shm_prepare_plan(void **state)
{
    struct xfer_fixture *x = *state;
    struct kvp_wire_slot s[1] = {{.chunk_index = 2, .offset = 4096 + CHUNK, .length = CHUNK}};
    struct kvp_slots_reply prep = {
        .id = 77, .nchunks = 4, .cached = 1, .busy = 1, .no_space = 1, .nslots = 1, .slots = s};
    kvp_tokens seq = {.ids = x->ids, .count = 64};
    kvp_store_plan plan;

    xfer_script_shm(x);
    xfer_add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    fake_add_count(&x->f, KVP_OP_ABORT_STORE, 1);
    xfer_start_and_open(x);
    kvp_instance *inst = xfer_register_shm(x);

    assert_rc(kvp_prepare_store(inst, &seq, 0, 64, &plan), 1);
    assert_int_equal(plan.reservation, 77);
    assert_int_equal(plan.nchunks, 4);
    assert_int_equal(plan.cached, 1);
    assert_int_equal(plan.busy, 1);
    assert_int_equal(plan.no_space, 1);
    assert_int_equal(plan.nslots, 1);
    assert_int_equal(plan.slots[0].chunk_index, 2);
    assert_int_equal(plan.slots[0].length, CHUNK);
    assert_int_equal(plan.slots[0].offset, 4096 + CHUNK);
    /* The slot is the pool's memory at that offset (the test maps the same segment). */
    assert_non_null(plan.slots[0].data);
    memset(plan.slots[0].data, 0x42, CHUNK);
    assert_int_equal(x->seg[4096 + CHUNK - 1], 0);
    assert_int_equal(x->seg[4096 + CHUNK], 0x42);
    assert_int_equal(x->seg[4096 + 2 * CHUNK - 1], 0x42);
    assert_int_equal(x->seg[4096 + 2 * CHUNK], 0);

    assert_rc(kvp_abort_store(inst, &plan), 0);
    assert_null(plan.slots);
    assert_int_equal(plan.reservation, 0);
    /* Releasing twice is harmless and sends nothing. */
    assert_rc(kvp_abort_store(inst, &plan), 0);
    assert_rc(kvp_commit_store(inst, &plan), 0);
    xfer_finish(x);
    assert_rc(x->f.nreqs, 4);
    assert_int_equal(xfer_sent_ref(x, 3, KVP_OP_ABORT_STORE).id, 77);
}

/* Slots outside the pool are refused and their reservation is aborted. */
static void check_bad_slot(struct xfer_fixture *x, uint64_t offset, uint64_t length)
{
    struct kvp_wire_slot s[1] = {{.chunk_index = 0, .offset = offset, .length = length}};
    struct kvp_slots_reply prep = {.id = 31, .nchunks = 1, .nslots = 1, .slots = s};
    kvp_tokens seq = {.ids = x->ids, .count = 16};
    kvp_store_plan plan;

    xfer_script_shm(x);
    xfer_add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    fake_add_count(&x->f, KVP_OP_ABORT_STORE, 1);
    fake_add_reply(&x->f, KVP_OP_PING, NULL);
    xfer_start_and_open(x);
    kvp_instance *inst = xfer_register_shm(x);

    assert_rc(kvp_prepare_store(inst, &seq, 0, 16, &plan), KVP_EBADSLOT);
    assert_null(plan.slots);
    assert_int_equal(plan.nslots, 0);
    assert_true(kvp_last_error(x->c)[0] != '\0');
    /* The connection is still fine. */
    assert_rc(kvp_ping(x->c), 0);
    xfer_finish(x);
    assert_rc(x->f.nreqs, 5);
    assert_int_equal(xfer_sent_ref(x, 3, KVP_OP_ABORT_STORE).id, 31);
}

static void test_bad_slot_header_page(void **state)
{
    check_bad_slot(*state, 0, CHUNK);
}

static void test_bad_slot_past_end(void **state)
{
    check_bad_slot(*state, SEG_SIZE - CHUNK + 1, CHUNK);
}

static void test_bad_slot_wraps(void **state)
{
    check_bad_slot(*state, UINT64_MAX - 16, CHUNK);
}

/* A length other than chunk_bytes is a lie about the layout. */
static void test_bad_slot_length(void **state)
{
    struct xfer_fixture *x = *state;
    struct kvp_wire_slot s[1] = {{.chunk_index = 0, .offset = 4096, .length = CHUNK - 1}};
    struct kvp_slots_reply prep = {.id = 3, .nchunks = 1, .nslots = 1, .slots = s};
    kvp_tokens seq = {.ids = x->ids, .count = 16};
    kvp_store_plan plan;

    xfer_script_shm(x);
    xfer_add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    xfer_start_and_open(x);
    kvp_instance *inst = xfer_register_shm(x);
    assert_rc(kvp_prepare_store(inst, &seq, 0, 16, &plan), KVP_EBADSLOT);
    xfer_finish(x);
}

/* Retrieve slots must be the leading chunks in order. */
static void test_retrieve_slots_out_of_order(void **state)
{
    struct xfer_fixture *x = *state;
    struct kvp_wire_slot s[2] = {{.chunk_index = 1, .offset = 4096, .length = CHUNK},
                                 {.chunk_index = 0, .offset = 4096 + CHUNK, .length = CHUNK}};
    struct kvp_slots_reply pin = {.id = 4, .nchunks = 2, .nslots = 2, .slots = s};
    kvp_tokens seq = {.ids = x->ids, .count = 32};
    kvp_retrieve_plan plan;

    xfer_script_shm(x);
    xfer_add_slots_reply(x, KVP_OP_PREPARE_RETRIEVE, &pin);
    xfer_start_and_open(x);
    kvp_instance *inst = xfer_register_shm(x);
    assert_rc(kvp_prepare_retrieve(inst, &seq, 0, 32, &plan), KVP_EPROTO);
    assert_null(plan.slots);
    xfer_finish(x);
}

/* Every chunk of a store range must be accounted for exactly once. */
static void test_store_counts_must_add_up(void **state)
{
    struct xfer_fixture *x = *state;
    struct kvp_slots_reply prep = {.id = 0, .nchunks = 3, .cached = 1, .nslots = 0};
    kvp_tokens seq = {.ids = x->ids, .count = 48};
    kvp_store_plan plan;

    xfer_script_shm(x);
    xfer_add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    xfer_start_and_open(x);
    kvp_instance *inst = xfer_register_shm(x);
    assert_rc(kvp_prepare_store(inst, &seq, 0, 48, &plan), KVP_EPROTO);
    xfer_finish(x);
}

/* A hold comes with slots and slots with a hold: a plan must be able to tell its connection. */
static void test_hold_without_slots(void **state)
{
    struct xfer_fixture *x = *state;
    struct kvp_wire_slot s[1] = {{.chunk_index = 0, .offset = 4096, .length = CHUNK}};
    struct kvp_slots_reply held = {.id = 7, .nchunks = 1, .cached = 1, .nslots = 0};
    struct kvp_slots_reply free_slots = {.id = 0, .nchunks = 1, .nslots = 1, .slots = s};
    kvp_tokens seq = {.ids = x->ids, .count = 16};
    kvp_store_plan plan;
    kvp_retrieve_plan rplan;

    xfer_script_shm(x);
    xfer_add_slots_reply(x, KVP_OP_PREPARE_STORE, &held);
    xfer_start_and_open(x);
    kvp_instance *inst = xfer_register_shm(x);
    assert_rc(kvp_prepare_store(inst, &seq, 0, 16, &plan), KVP_EPROTO);
    assert_non_null(strstr(kvp_last_error(x->c), "id 7 for 0 slots"));
    assert_null(plan.slots);
    xfer_finish(x);

    /* The same segment, a new fake: slots without a pin. */
    fake_cleanup(&x->f);
    fake_init(&x->f);
    xfer_add_hello_shm(x, xfer_nonce_a);
    struct kvp_register_reply r = xfer_register_reply(KVP_WIRE_SHM, x->seg_name, NULL);
    xfer_add_register_reply(x, &r);
    xfer_add_slots_reply(x, KVP_OP_PREPARE_RETRIEVE, &free_slots);
    xfer_start_and_open(x);
    inst = xfer_register_shm(x);
    assert_rc(kvp_prepare_retrieve(inst, &seq, 0, 16, &rplan), KVP_EPROTO);
    assert_null(rplan.slots);
    xfer_finish(x);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, xfer_setup, xfer_teardown)
    const struct CMUnitTest tests[] = {
        T(test_shm_store_retrieve),
        T(test_shm_prepare_plan),
        T(test_bad_slot_header_page),
        T(test_bad_slot_past_end),
        T(test_bad_slot_wraps),
        T(test_bad_slot_length),
        T(test_retrieve_slots_out_of_order),
        T(test_store_counts_must_add_up),
        T(test_hold_without_slots),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
