/*
 * test_client_inline.c - libkvpool's inline transfers against the scripted fake daemon: what
 * goes on the wire for STORE_INLINE and comes back from RETRIEVE_INLINE, a daemon that refuses
 * an upload (even before reading it), payloads that do not match their slots, lookups, and
 * argument validation that must stop a request before it is sent.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client/transfer_fixture.h"
#include "common/kvp_assert.h"

/* ---- inline transfers ------------------------------------------------------------------- */

/* The STORE_INLINE payload is the reserved chunks' bytes in slot order, nothing else. */
static void test_inline_store(void **state)
{
    struct xfer_fixture *x = *state;
    struct kvp_wire_slot s[2] = {{.chunk_index = 2, .offset = 8192, .length = CHUNK},
                                 {.chunk_index = 1, .offset = 4096, .length = CHUNK}};
    struct kvp_slots_reply prep = {.id = 12, .nchunks = 3, .cached = 1, .nslots = 2, .slots = s};
    uint8_t c[3][CHUNK];
    const void *chunks[3] = {c[0], c[1], c[2]};
    kvp_tokens seq = {.ids = x->ids, .count = 50};
    kvp_store_result res;

    for (int i = 0; i < 3; i++)
        memset(c[i], 0xa0 + i, CHUNK);
    xfer_script_inline(x);
    xfer_add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    fake_add_count(&x->f, KVP_OP_STORE_INLINE, 2);
    xfer_start_and_open(x);
    kvp_instance *inst = xfer_register_inline(x);

    assert_rc(kvp_store(inst, &seq, 0, 48, chunks, &res), 2);
    assert_int_equal(res.nchunks, 3);
    assert_int_equal(res.stored, 2);
    assert_int_equal(res.cached, 1);
    xfer_finish(x);

    assert_rc(x->f.nreqs, 4);
    const struct fake_req *q = &x->f.reqs[3];
    struct kvp_ref_req r = xfer_sent_ref(x, 3, KVP_OP_STORE_INLINE);
    assert_int_equal(r.handle, HANDLE);
    assert_int_equal(r.id, 12);
    assert_int_equal(q->h.payload_len, 2 * CHUNK);
    assert_memory_equal(q->payload, c[2], CHUNK);
    assert_memory_equal(q->payload + CHUNK, c[1], CHUNK);
}

/*
 * The daemon closes the connection after a failed STORE_INLINE; the library follows, and the
 * next call connects again and registers the instance again, with the same parameters.
 */
static void test_inline_store_error_breaks(void **state)
{
    struct xfer_fixture *x = *state;
    struct kvp_wire_slot s[1] = {{.chunk_index = 0, .offset = 4096, .length = CHUNK}};
    struct kvp_slots_reply prep = {.id = 12, .nchunks = 1, .nslots = 1, .slots = s};
    uint8_t c0[CHUNK] = {0};
    const void *chunks[1] = {c0};
    kvp_tokens seq = {.ids = x->ids, .count = 16};
    kvp_store_plan plan;

    xfer_script_inline(x);
    xfer_add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    fake_add_error(&x->f, KVP_OP_STORE_INLINE, -ENOENT, "no reservation 12");
    xfer_script_inline(x);
    fake_add_reply(&x->f, KVP_OP_PING, NULL);
    xfer_start_and_open(x);
    kvp_instance *inst = xfer_register_inline(x);

    assert_rc(kvp_prepare_store(inst, &seq, 0, 16, &plan), 1);
    assert_null(plan.slots[0].data);
    assert_rc(kvp_store_inline(inst, &plan, chunks), -ENOENT);
    assert_string_equal(kvp_last_error(x->c), "no reservation 12");
    assert_null(plan.slots);
    assert_rc(kvp_ping(x->c), 0);
    xfer_finish(x);

    assert_rc(x->f.nconns, 2);
    assert_rc(x->f.nreqs, 7);
    assert_int_equal(x->f.reqs[4].h.opcode, KVP_OP_HELLO);
    struct kvp_register_req a = xfer_sent_register(x, 1), b = xfer_sent_register(x, 5);
    assert_string_equal(b.instance_id, a.instance_id);
    assert_string_equal(b.model_name, a.model_name);
    assert_string_equal(b.dtype, a.dtype);
    assert_int_equal(b.world_size, a.world_size);
    assert_int_equal(b.worker_rank, a.worker_rank);
    assert_int_equal(b.block_size, a.block_size);
    assert_int_equal(b.num_layers, a.num_layers);
    assert_int_equal(b.hidden_dim, a.hidden_dim);
    assert_int_equal(b.use_mla, a.use_mla);
    assert_int_equal(b.transport, KVP_WIRE_INLINE);
    assert_int_equal(x->f.reqs[6].h.opcode, KVP_OP_PING);
}

/*
 * A payload far larger than the socket buffer, which the daemon refuses without reading it: the
 * send fails halfway (EPIPE), yet the caller gets the daemon's status and message.
 */
static void test_inline_store_rejected_early(void **state)
{
    struct xfer_fixture *x = *state;
    enum { BIG = 2 * 1 * CT * 4096 * 2, N = 16 }; /* 256 KiB chunks, 4 MiB payload */
    struct kvp_register_reply r = xfer_register_reply(KVP_WIRE_INLINE, NULL, "SHM disabled");
    struct kvp_wire_slot s[N];
    struct kvp_slots_reply prep = {.id = 12, .nchunks = N, .nslots = N, .slots = s};
    static uint32_t ids[N * CT];
    kvp_tokens seq = {.ids = ids, .count = N * CT};
    const void *chunks[N];
    kvp_store_plan plan;

    r.shape[3] = 4096;
    r.chunk_bytes = BIG;
    for (int i = 0; i < N; i++)
        s[i] = (struct kvp_wire_slot){.chunk_index = (uint32_t)i,
                                      .offset = 4096 + (uint64_t)i * BIG,
                                      .length = BIG};
    uint8_t *data = calloc(1, BIG);
    assert_non_null(data);
    for (int i = 0; i < N; i++)
        chunks[i] = data;

    fake_add_hello(&x->f);
    xfer_add_register_reply(x, &r);
    xfer_add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    fake_add_error(&x->f, KVP_OP_STORE_INLINE, -ENOENT, "no reservation 12 on this connection");
    x->f.steps[x->f.nsteps - 1].action = FAKE_REPLY_EARLY;
    fake_add_hello(&x->f);
    xfer_add_register_reply(x, &r);
    fake_add_reply(&x->f, KVP_OP_PING, NULL);
    xfer_start_and_open(x);
    kvp_instance *inst = xfer_register_inline(x);

    assert_rc(kvp_prepare_store(inst, &seq, 0, N * CT, &plan), N);
    assert_rc(kvp_store_inline(inst, &plan, chunks), -ENOENT);
    assert_string_equal(kvp_last_error(x->c), "no reservation 12 on this connection");
    /* The daemon hung up: the next call is on a new connection. */
    assert_rc(kvp_ping(x->c), 0);
    xfer_finish(x);
    assert_rc(x->f.nconns, 2);
    free(data);
}

/* RETRIEVE_INLINE payload lands in out[i]; buffers past the cached run are not touched. */
static void test_inline_retrieve(void **state)
{
    struct xfer_fixture *x = *state;
    struct kvp_wire_slot s[2] = {{.chunk_index = 0, .offset = 4096, .length = CHUNK},
                                 {.chunk_index = 1, .offset = 8192, .length = CHUNK}};
    struct kvp_slots_reply m = {.id = 0, .nchunks = 3, .nslots = 2, .slots = s};
    uint8_t o[3][CHUNK];
    void *out[3] = {o[0], o[1], o[2]};
    kvp_tokens seq = {.ids = x->ids, .count = 48};
    struct kvp_wbuf w;

    xfer_script_inline(x);
    kvp_wbuf_init(&w);
    kvp_encode_slots_reply(&w, &m);
    struct fake_step *st = fake_add_reply(&x->f, KVP_OP_RETRIEVE_INLINE, &w);
    st->payload = malloc(2 * CHUNK);
    st->payload_len = 2 * CHUNK;
    memset(st->payload, 0x11, CHUNK);
    memset(st->payload + CHUNK, 0x22, CHUNK);
    fake_add_reply(&x->f, KVP_OP_PING, NULL);
    xfer_start_and_open(x);
    kvp_instance *inst = xfer_register_inline(x);

    memset(o, 0xee, sizeof(o));
    assert_rc(kvp_retrieve(inst, &seq, 0, 48, out), 2);
    assert_int_equal(o[0][0], 0x11);
    assert_int_equal(o[0][CHUNK - 1], 0x11);
    assert_int_equal(o[1][0], 0x22);
    assert_int_equal(o[1][CHUNK - 1], 0x22);
    assert_int_equal(o[2][0], 0xee);
    /* The stream is still in step. */
    assert_rc(kvp_ping(x->c), 0);
    /* Prepare-retrieve is an shm operation. */
    kvp_retrieve_plan plan;
    assert_rc(kvp_prepare_retrieve(inst, &seq, 0, 48, &plan), KVP_ENOSHM);
    xfer_finish(x);
    assert_rc(x->f.nreqs, 4);
}

static void test_inline_retrieve_payload_mismatch(void **state)
{
    struct xfer_fixture *x = *state;
    struct kvp_wire_slot s[2] = {{.chunk_index = 0, .offset = 4096, .length = CHUNK},
                                 {.chunk_index = 1, .offset = 8192, .length = CHUNK}};
    struct kvp_slots_reply m = {.id = 0, .nchunks = 2, .nslots = 2, .slots = s};
    uint8_t o[2][CHUNK];
    void *out[2] = {o[0], o[1]};
    kvp_tokens seq = {.ids = x->ids, .count = 32};
    struct kvp_wbuf w;

    xfer_script_inline(x);
    kvp_wbuf_init(&w);
    kvp_encode_slots_reply(&w, &m);
    struct fake_step *st = fake_add_reply(&x->f, KVP_OP_RETRIEVE_INLINE, &w);
    st->payload = calloc(1, CHUNK);
    st->payload_len = CHUNK; /* one chunk's bytes for two slots */
    xfer_start_and_open(x);
    kvp_instance *inst = xfer_register_inline(x);
    assert_rc(kvp_retrieve(inst, &seq, 0, 32, out), KVP_EPROTO);
    assert_rc(kvp_ping(x->c), -ENOTCONN);
    xfer_finish(x);
}

/* ---- lookup and argument checks --------------------------------------------------------- */

static void test_lookup(void **state)
{
    struct xfer_fixture *x = *state;
    struct kvp_lookup_reply good = {.nchunks = 3, .cached = 2}, bad = {.nchunks = 2, .cached = 1};
    kvp_tokens seq = {.ids = x->ids, .count = 50};
    struct kvp_wbuf w;

    xfer_script_inline(x);
    kvp_wbuf_init(&w);
    kvp_encode_lookup_reply(&w, &good);
    fake_add_reply(&x->f, KVP_OP_LOOKUP, &w);
    kvp_encode_lookup_reply(&w, &bad);
    fake_add_reply(&x->f, KVP_OP_LOOKUP, &w);
    xfer_start_and_open(x);
    kvp_instance *inst = xfer_register_inline(x);

    assert_rc(kvp_lookup(inst, &seq), 2);
    /* 50 tokens are 3 full chunks: a reply about 2 is about something else. */
    assert_rc(kvp_lookup(inst, &seq), KVP_EPROTO);
    xfer_finish(x);

    struct kvp_key_req k;
    assert_rc(kvp_decode_key_req(x->f.reqs[2].body, x->f.reqs[2].h.body_len, &k), 0);
    assert_int_equal(k.start, 0);
    assert_int_equal(k.end, 50);
    assert_int_equal(k.ntokens, 50);
    assert_int_equal(k.salt_len, 0);
}

/* Bad arguments fail with -EINVAL / -E2BIG and nothing is sent. */
static void test_keyed_validation(void **state)
{
    struct xfer_fixture *x = *state;
    uint8_t c0[CHUNK];
    const void *chunks[2] = {c0, NULL};
    void *out[2] = {c0, NULL};
    kvp_tokens seq = {.ids = x->ids, .count = 64};
    kvp_store_plan plan;
    uint8_t salt[300] = {0};

    xfer_script_inline(x);
    xfer_start_and_open(x);
    kvp_instance *inst = xfer_register_inline(x);

    assert_rc(kvp_lookup(inst, NULL), -EINVAL);
    kvp_tokens big = {.ids = x->ids, .count = KVP_MAX_TOKENS + 1};
    assert_rc(kvp_lookup(inst, &big), -EINVAL);
    kvp_tokens noids = {.ids = NULL, .count = 4};
    assert_rc(kvp_lookup(inst, &noids), -EINVAL);
    kvp_tokens salty = {.ids = x->ids, .count = 64, .salt = salt, .salt_len = 257};
    assert_rc(kvp_lookup(inst, &salty), -EINVAL);
    kvp_tokens nosalt = {.ids = x->ids, .count = 64, .salt = NULL, .salt_len = 3};
    assert_rc(kvp_lookup(inst, &nosalt), -EINVAL);

    assert_rc(kvp_prepare_store(inst, &seq, 8, 64, &plan), -EINVAL); /* unaligned start */
    assert_non_null(strstr(kvp_last_error(x->c), "multiple"));
    assert_rc(kvp_prepare_store(inst, &seq, 0, 65, &plan), -EINVAL);  /* end past count */
    assert_rc(kvp_prepare_store(inst, &seq, 32, 16, &plan), -EINVAL); /* end before start */
    assert_rc(kvp_prepare_store(inst, &seq, 0, 64, NULL), -EINVAL);
    /* 4097 chunks */
    static uint32_t many[4097 * CT];
    kvp_tokens huge = {.ids = many, .count = 4097 * CT};
    assert_rc(kvp_prepare_store(inst, &huge, 0, 4097 * CT, &plan), -E2BIG);

    /* Every chunk of the range needs a buffer. */
    assert_rc(kvp_store(inst, &seq, 0, 32, chunks, NULL), -EINVAL);
    assert_rc(kvp_store(inst, &seq, 0, 32, NULL, NULL), -EINVAL);
    assert_rc(kvp_retrieve(inst, &seq, 0, 32, out), -EINVAL);
    assert_rc(kvp_retrieve(inst, &seq, 0, 32, NULL), -EINVAL);
    xfer_finish(x);
    assert_rc(x->f.nreqs, 2);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, xfer_setup, xfer_teardown)
    const struct CMUnitTest tests[] = {
        T(test_inline_store),
        T(test_inline_store_error_breaks),
        T(test_inline_store_rejected_early),
        T(test_inline_retrieve),
        T(test_inline_retrieve_payload_mismatch),
        T(test_lookup),
        T(test_keyed_validation),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
