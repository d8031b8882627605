/*
 * test_client_transfer.c - libkvpool's registration and transfer logic against the scripted
 * fake daemon: which transport the library tells the daemon and why, slot checks against a real
 * shared-memory segment made by the test, what goes on the wire for stores and retrieves on
 * both transports, and argument validation that must stop a request before it is sent.
 *
 * Layout used throughout: 16 tokens per chunk (the fake's HELLO), float16, 1 layer, hidden 4,
 * so a chunk is 2 * 1 * 16 * 4 * 2 = 256 bytes.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client/fake_daemon.h"
#include "common/kvp_assert.h"
#include "common/seg_header.h"
#include "kvpool.h"

#define CT 16
#define CHUNK 256u
#define SEG_SIZE (4096u + 8 * CHUNK)
#define HANDLE 0x00050001u

static const uint8_t nonce_a[KVP_NONCE_SIZE] = "0123456789abcdef";
static const uint8_t nonce_b[KVP_NONCE_SIZE] = "fedcba9876543210";

struct fixture {
    struct fake_daemon f;
    char seg_name[64];
    uint8_t *seg; /* the test's own mapping of the segment */
    size_t seg_size;
    kvp_client *c;
    uint32_t ids[256];
};

/* Creates a segment as the daemon would (its header page announces SEG_SIZE bytes, the size
 * HELLO announces), file_size bytes long. */
static void seg_create(struct fixture *x, const uint8_t *nonce, size_t file_size)
{
    static int counter;
    char path[80];

    snprintf(x->seg_name, sizeof(x->seg_name), "kvpool_l1_pool_test%d_%d", (int)getpid(),
             counter++);
    snprintf(path, sizeof(path), "/%s", x->seg_name);
    int fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_rc(ftruncate(fd, (off_t)file_size), 0);
    x->seg = mmap(NULL, file_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(x->seg != MAP_FAILED);
    close(fd);
    x->seg_size = file_size;
    if (file_size >= KVP_SEG_HEADER)
        kvp_seg_header_write(x->seg, nonce, SEG_SIZE, (uint32_t)getpid());
    else
        memcpy(x->seg, KVP_SEG_MAGIC, 8);
}

static int setup(void **state)
{
    struct fixture *x = calloc(1, sizeof(*x));
    assert_non_null(x);
    fake_init(&x->f);
    for (uint32_t i = 0; i < 256; i++)
        x->ids[i] = i * 3 + 1;
    *state = x;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *x = *state;
    char path[80];

    kvp_client_close(x->c);
    fake_cleanup(&x->f);
    if (x->seg) {
        munmap(x->seg, x->seg_size);
        snprintf(path, sizeof(path), "/%s", x->seg_name);
        shm_unlink(path);
    }
    free(x);
    return 0;
}

/* HELLO offering the fixture's segment (announced as SEG_SIZE) with the given nonce. */
static void add_hello_shm(struct fixture *x, const uint8_t *nonce)
{
    struct kvp_hello_reply h = fake_hello_msg(x->seg_name, SEG_SIZE, nonce, NULL);
    fake_add_hello_msg(&x->f, &h);
}

static struct kvp_register_reply register_reply(uint8_t transport, const char *shm_name,
                                                const char *reason)
{
    struct kvp_register_reply r = {
        .handle = HANDLE,
        .transport = transport,
        .ndim = 4,
        .chunk_tokens = CT,
        .shape = {2, 1, CT, 4},
        .chunk_bytes = CHUNK,
        .dtype_size = 2,
        .segment_size = shm_name ? SEG_SIZE : 0,
    };
    snprintf(r.dtype, sizeof(r.dtype), "float16");
    snprintf(r.shm_name, sizeof(r.shm_name), "%s", shm_name ? shm_name : "");
    snprintf(r.reason, sizeof(r.reason), "%s", reason ? reason : "");
    return r;
}

static void add_register_reply(struct fixture *x, const struct kvp_register_reply *r)
{
    struct kvp_wbuf w;
    kvp_wbuf_init(&w);
    kvp_encode_register_reply(&w, r);
    fake_add_reply(&x->f, KVP_OP_REGISTER, &w);
}

static void add_slots_reply(struct fixture *x, uint16_t op, struct kvp_slots_reply *m)
{
    struct kvp_wbuf w;
    kvp_wbuf_init(&w);
    kvp_encode_slots_reply(&w, m);
    fake_add_reply(&x->f, op, &w);
}

static kvp_register_opts reg_opts(uint32_t transport)
{
    return (kvp_register_opts){
        .instance_id = "worker-0",
        .model_name = "tiny",
        .world_size = 1,
        .worker_rank = 0,
        .block_size = 16,
        .num_layers = 1,
        .hidden_dim = 4,
        .dtype = "float16",
        .transport = transport,
    };
}

static void start_and_open(struct fixture *x)
{
    kvp_opts o = {.socket_path = x->f.path, .timeout_ms = 2000};
    fake_start(&x->f);
    assert_rc(kvp_client_open(&o, &x->c), 0);
}

static void finish(struct fixture *x)
{
    kvp_client_close(x->c);
    x->c = NULL;
    fake_join(&x->f);
}

/* Decodes the REGISTER request the library sent as request number i. */
static struct kvp_register_req sent_register(struct fixture *x, int i)
{
    struct kvp_register_req r;
    assert_true(i < x->f.nreqs);
    assert_int_equal(x->f.reqs[i].h.opcode, KVP_OP_REGISTER);
    assert_rc(kvp_decode_register_req(x->f.reqs[i].body, x->f.reqs[i].h.body_len, &r), 0);
    return r;
}

static struct kvp_ref_req sent_ref(struct fixture *x, int i, uint16_t op)
{
    struct kvp_ref_req r;
    assert_true(i < x->f.nreqs);
    assert_int_equal(x->f.reqs[i].h.opcode, op);
    assert_rc(kvp_decode_ref_req(x->f.reqs[i].body, x->f.reqs[i].h.body_len, &r), 0);
    return r;
}

/* ---- registration ----------------------------------------------------------------------- */

/* No SHM offered: auto goes inline with the daemon's reason; strict SHM fails locally. */
static void test_register_no_shm(void **state)
{
    struct fixture *x = *state;
    struct kvp_register_reply r = register_reply(KVP_WIRE_INLINE, NULL, "no room in /dev/shm");
    struct kvp_hello_reply h = fake_hello_msg(NULL, 0, NULL, "no room in /dev/shm");
    kvp_register_opts o = reg_opts(KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;

    fake_add_hello_msg(&x->f, &h);
    add_register_reply(x, &r);
    start_and_open(x);

    assert_rc(kvp_register(x->c, &o, &inst), 0);
    const kvp_instance_info *info = kvp_instance_get_info(inst);
    assert_int_equal(info->transport, KVP_TRANSPORT_INLINE);
    assert_int_equal(info->chunk_tokens, CT);
    assert_int_equal(info->ndim, 4);
    assert_int_equal(info->shape[0], 2);
    assert_int_equal(info->shape[3], 4);
    assert_int_equal(info->chunk_bytes, CHUNK);
    assert_int_equal(info->dtype_size, 2);
    assert_string_equal(info->dtype, "float16");
    assert_string_equal(info->shm_name, "");
    assert_string_equal(info->reason, "no room in /dev/shm");

    o = reg_opts(KVP_TRANSPORT_SHM);
    o.instance_id = "worker-1";
    kvp_instance *strict = (kvp_instance *)&o;
    assert_rc(kvp_register(x->c, &o, &strict), KVP_ENOSHM);
    assert_null(strict);
    assert_non_null(strstr(kvp_last_error(x->c), "no room in /dev/shm"));
    finish(x);

    /* HELLO and one REGISTER: the strict request never reached the daemon. */
    assert_rc(x->f.nreqs, 2);
    struct kvp_register_req q = sent_register(x, 1);
    assert_string_equal(q.instance_id, "worker-0");
    assert_string_equal(q.model_name, "tiny");
    assert_string_equal(q.dtype, "float16");
    assert_int_equal(q.world_size, 1);
    assert_int_equal(q.block_size, 16);
    assert_int_equal(q.num_layers, 1);
    assert_int_equal(q.hidden_dim, 4);
    assert_int_equal(q.transport, KVP_WIRE_INLINE);
    assert_string_equal(q.reason, "no room in /dev/shm");
}

static void test_register_shm(void **state)
{
    struct fixture *x = *state;
    kvp_register_opts o = reg_opts(KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;

    seg_create(x, nonce_a, SEG_SIZE);
    add_hello_shm(x, nonce_a);
    struct kvp_register_reply r = register_reply(KVP_WIRE_SHM, x->seg_name, NULL);
    add_register_reply(x, &r);
    fake_add_reply(&x->f, KVP_OP_UNREGISTER, NULL);
    start_and_open(x);

    assert_rc(kvp_register(x->c, &o, &inst), 0);
    assert_int_equal(kvp_instance_get_info(inst)->transport, KVP_TRANSPORT_SHM);
    assert_string_equal(kvp_instance_get_info(inst)->shm_name, x->seg_name);
    assert_rc(kvp_unregister(inst), 0);
    finish(x);

    struct kvp_register_req q = sent_register(x, 1);
    assert_int_equal(q.transport, KVP_WIRE_SHM);
    assert_string_equal(q.reason, "");
    struct kvp_ref_req u = sent_ref(x, 2, KVP_OP_UNREGISTER);
    assert_int_equal(u.handle, HANDLE);
    assert_int_equal(u.id, 0);
}

static void test_register_requested_inline(void **state)
{
    struct fixture *x = *state;
    kvp_register_opts o = reg_opts(KVP_TRANSPORT_INLINE);
    kvp_instance *inst = NULL;

    seg_create(x, nonce_a, SEG_SIZE);
    add_hello_shm(x, nonce_a);
    struct kvp_register_reply r = register_reply(KVP_WIRE_INLINE, NULL, "requested by worker");
    add_register_reply(x, &r);
    start_and_open(x);
    assert_rc(kvp_register(x->c, &o, &inst), 0);
    assert_int_equal(kvp_instance_get_info(inst)->transport, KVP_TRANSPORT_INLINE);
    finish(x);

    struct kvp_register_req q = sent_register(x, 1);
    assert_int_equal(q.transport, KVP_WIRE_INLINE);
    assert_string_equal(q.reason, "requested by worker");
}

/* Runs auto and strict registrations against a segment that cannot be used and checks that
 * auto falls back with a reason containing `why` and strict fails without a request. */
static void check_unusable_segment(struct fixture *x, const char *why)
{
    kvp_register_opts o = reg_opts(KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;

    struct kvp_register_reply r = register_reply(KVP_WIRE_INLINE, NULL, "whatever it said");
    add_register_reply(x, &r);
    start_and_open(x);
    assert_rc(kvp_register(x->c, &o, &inst), 0);
    assert_int_equal(kvp_instance_get_info(inst)->transport, KVP_TRANSPORT_INLINE);

    o = reg_opts(KVP_TRANSPORT_SHM);
    assert_rc(kvp_register(x->c, &o, &inst), KVP_ENOSHM);
    if (!strstr(kvp_last_error(x->c), why))
        fail_msg("last error \"%s\" does not mention \"%s\"", kvp_last_error(x->c), why);
    finish(x);

    assert_rc(x->f.nreqs, 2);
    struct kvp_register_req q = sent_register(x, 1);
    assert_int_equal(q.transport, KVP_WIRE_INLINE);
    if (!strstr(q.reason, why))
        fail_msg("reason \"%s\" does not mention \"%s\"", q.reason, why);
}

static void test_register_nonce_mismatch(void **state)
{
    struct fixture *x = *state;
    seg_create(x, nonce_b, SEG_SIZE);
    add_hello_shm(x, nonce_a);
    check_unusable_segment(x, "segment nonce mismatch: not this daemon's pool");
}

static void test_register_bad_magic(void **state)
{
    struct fixture *x = *state;
    seg_create(x, nonce_a, SEG_SIZE);
    memcpy(x->seg, "NOTKVPOO", 8);
    add_hello_shm(x, nonce_a);
    check_unusable_segment(x, "no kvpool header");
}

static void test_register_missing_segment(void **state)
{
    struct fixture *x = *state;
    struct kvp_hello_reply h = fake_hello_msg("kvpool_l1_pool_does_not_exist_42", SEG_SIZE, nonce_a,
                                              NULL);
    fake_add_hello_msg(&x->f, &h);
    check_unusable_segment(x, "cannot open /dev/shm/kvpool_l1_pool_does_not_exist_42: "
                              "No such file or directory");
}

/* A file shorter than announced must not be mapped (touching it would be SIGBUS). */
static void test_register_short_segment(void **state)
{
    struct fixture *x = *state;
    seg_create(x, nonce_a, 4096);
    add_hello_shm(x, nonce_a);
    check_unusable_segment(x, "daemon announced");
}

/* A daemon refusing shm for a strict request: KVP_ENOSHM, not -EOPNOTSUPP. */
static void test_register_eopnotsupp(void **state)
{
    struct fixture *x = *state;
    kvp_register_opts o = reg_opts(KVP_TRANSPORT_SHM);
    kvp_instance *inst = NULL;

    seg_create(x, nonce_a, SEG_SIZE);
    add_hello_shm(x, nonce_a);
    fake_add_error(&x->f, KVP_OP_REGISTER, -EOPNOTSUPP, "SHM is disabled");
    start_and_open(x);
    assert_rc(kvp_register(x->c, &o, &inst), KVP_ENOSHM);
    assert_string_equal(kvp_last_error(x->c), "SHM is disabled");
    finish(x);
}

static void test_register_daemon_error(void **state)
{
    struct fixture *x = *state;
    kvp_register_opts o = reg_opts(KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;

    fake_add_hello(&x->f);
    fake_add_error(&x->f, KVP_OP_REGISTER, -EINVAL, "num_layers must be >= 1");
    start_and_open(x);
    o.num_layers = 0;
    assert_rc(kvp_register(x->c, &o, &inst), -EINVAL);
    assert_null(inst);
    assert_string_equal(kvp_last_error(x->c), "num_layers must be >= 1");
    finish(x);
}

static void test_register_validation(void **state)
{
    struct fixture *x = *state;
    char long_id[200];
    kvp_register_opts o;
    kvp_instance *inst = NULL;

    memset(long_id, 'i', sizeof(long_id) - 1);
    long_id[128] = '\0';
    fake_add_hello(&x->f);
    start_and_open(x);

    o = reg_opts(0);
    o.instance_id = long_id;
    assert_rc(kvp_register(x->c, &o, &inst), -ENAMETOOLONG);
    o = reg_opts(0);
    o.model_name = NULL;
    assert_rc(kvp_register(x->c, &o, &inst), -EINVAL);
    o = reg_opts(0);
    o.dtype = "";
    assert_rc(kvp_register(x->c, &o, &inst), -EINVAL);
    o = reg_opts(0);
    o.transport = 3;
    assert_rc(kvp_register(x->c, &o, &inst), -EINVAL);
    assert_rc(kvp_register(x->c, NULL, &inst), -EINVAL);
    assert_rc(kvp_register(NULL, &o, &inst), -EINVAL);
    assert_rc(kvp_register(x->c, &o, NULL), -EINVAL);
    finish(x);
    assert_rc(x->f.nreqs, 1);
}

/* A reply whose chunk_bytes does not match its own shape and dtype cannot size copies. */
static void test_register_inconsistent_reply(void **state)
{
    struct fixture *x = *state;
    kvp_register_opts o = reg_opts(KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    struct kvp_register_reply r = register_reply(KVP_WIRE_INLINE, NULL, "x");

    r.chunk_bytes = CHUNK * 2;
    fake_add_hello(&x->f);
    add_register_reply(x, &r);
    start_and_open(x);
    assert_rc(kvp_register(x->c, &o, &inst), KVP_EPROTO);
    assert_null(inst);
    finish(x);
}

/* ---- shm transfers ---------------------------------------------------------------------- */

static kvp_instance *register_shm(struct fixture *x)
{
    kvp_register_opts o = reg_opts(KVP_TRANSPORT_SHM);
    kvp_instance *inst = NULL;

    assert_rc(kvp_register(x->c, &o, &inst), 0);
    assert_int_equal(kvp_instance_get_info(inst)->transport, KVP_TRANSPORT_SHM);
    return inst;
}

static void script_shm(struct fixture *x)
{
    seg_create(x, nonce_a, SEG_SIZE);
    add_hello_shm(x, nonce_a);
    struct kvp_register_reply r = register_reply(KVP_WIRE_SHM, x->seg_name, NULL);
    add_register_reply(x, &r);
}

/* kvp_store copies into the daemon's slots and commits; kvp_retrieve copies out of pinned
 * slots and unpins. Slots deliberately out of memory order. */
static void test_shm_store_retrieve(void **state)
{
    struct fixture *x = *state;
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

    script_shm(x);
    add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    fake_add_count(&x->f, KVP_OP_COMMIT_STORE, 2);
    add_slots_reply(x, KVP_OP_PREPARE_RETRIEVE, &pin);
    fake_add_count(&x->f, KVP_OP_COMMIT_RETRIEVE, 2);
    start_and_open(x);
    kvp_instance *inst = register_shm(x);

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
    finish(x);

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
    struct kvp_ref_req r = sent_ref(x, 3, KVP_OP_COMMIT_STORE);
    assert_int_equal(r.handle, HANDLE);
    assert_int_equal(r.id, 5);
    assert_int_equal(x->f.reqs[4].h.opcode, KVP_OP_PREPARE_RETRIEVE);
    r = sent_ref(x, 5, KVP_OP_COMMIT_RETRIEVE);
    assert_int_equal(r.id, 9);
}

/* Two-phase store by hand: the plan reports every category and slots point into the pool. */
static void test_shm_prepare_plan(void **state)
{
    struct fixture *x = *state;
    struct kvp_wire_slot s[1] = {{.chunk_index = 2, .offset = 4096 + CHUNK, .length = CHUNK}};
    struct kvp_slots_reply prep = {
        .id = 77, .nchunks = 4, .cached = 1, .busy = 1, .no_space = 1, .nslots = 1, .slots = s};
    kvp_tokens seq = {.ids = x->ids, .count = 64};
    kvp_store_plan plan;

    script_shm(x);
    add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    fake_add_count(&x->f, KVP_OP_ABORT_STORE, 1);
    start_and_open(x);
    kvp_instance *inst = register_shm(x);

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
    finish(x);
    assert_rc(x->f.nreqs, 4);
    assert_int_equal(sent_ref(x, 3, KVP_OP_ABORT_STORE).id, 77);
}

/* Slots outside the pool are refused and their reservation is aborted. */
static void check_bad_slot(struct fixture *x, uint64_t offset, uint64_t length)
{
    struct kvp_wire_slot s[1] = {{.chunk_index = 0, .offset = offset, .length = length}};
    struct kvp_slots_reply prep = {.id = 31, .nchunks = 1, .nslots = 1, .slots = s};
    kvp_tokens seq = {.ids = x->ids, .count = 16};
    kvp_store_plan plan;

    script_shm(x);
    add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    fake_add_count(&x->f, KVP_OP_ABORT_STORE, 1);
    fake_add_reply(&x->f, KVP_OP_PING, NULL);
    start_and_open(x);
    kvp_instance *inst = register_shm(x);

    assert_rc(kvp_prepare_store(inst, &seq, 0, 16, &plan), KVP_EBADSLOT);
    assert_null(plan.slots);
    assert_int_equal(plan.nslots, 0);
    assert_true(kvp_last_error(x->c)[0] != '\0');
    /* The connection is still fine. */
    assert_rc(kvp_ping(x->c), 0);
    finish(x);
    assert_rc(x->f.nreqs, 5);
    assert_int_equal(sent_ref(x, 3, KVP_OP_ABORT_STORE).id, 31);
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
    struct fixture *x = *state;
    struct kvp_wire_slot s[1] = {{.chunk_index = 0, .offset = 4096, .length = CHUNK - 1}};
    struct kvp_slots_reply prep = {.id = 3, .nchunks = 1, .nslots = 1, .slots = s};
    kvp_tokens seq = {.ids = x->ids, .count = 16};
    kvp_store_plan plan;

    script_shm(x);
    add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    start_and_open(x);
    kvp_instance *inst = register_shm(x);
    assert_rc(kvp_prepare_store(inst, &seq, 0, 16, &plan), KVP_EBADSLOT);
    finish(x);
}

/* Retrieve slots must be the leading chunks in order. */
static void test_retrieve_slots_out_of_order(void **state)
{
    struct fixture *x = *state;
    struct kvp_wire_slot s[2] = {{.chunk_index = 1, .offset = 4096, .length = CHUNK},
                                 {.chunk_index = 0, .offset = 4096 + CHUNK, .length = CHUNK}};
    struct kvp_slots_reply pin = {.id = 4, .nchunks = 2, .nslots = 2, .slots = s};
    kvp_tokens seq = {.ids = x->ids, .count = 32};
    kvp_retrieve_plan plan;

    script_shm(x);
    add_slots_reply(x, KVP_OP_PREPARE_RETRIEVE, &pin);
    start_and_open(x);
    kvp_instance *inst = register_shm(x);
    assert_rc(kvp_prepare_retrieve(inst, &seq, 0, 32, &plan), KVP_EPROTO);
    assert_null(plan.slots);
    finish(x);
}

/* Every chunk of a store range must be accounted for exactly once. */
static void test_store_counts_must_add_up(void **state)
{
    struct fixture *x = *state;
    struct kvp_slots_reply prep = {.id = 0, .nchunks = 3, .cached = 1, .nslots = 0};
    kvp_tokens seq = {.ids = x->ids, .count = 48};
    kvp_store_plan plan;

    script_shm(x);
    add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    start_and_open(x);
    kvp_instance *inst = register_shm(x);
    assert_rc(kvp_prepare_store(inst, &seq, 0, 48, &plan), KVP_EPROTO);
    finish(x);
}

/* A hold comes with slots and slots with a hold: a plan must be able to tell its connection. */
static void test_hold_without_slots(void **state)
{
    struct fixture *x = *state;
    struct kvp_wire_slot s[1] = {{.chunk_index = 0, .offset = 4096, .length = CHUNK}};
    struct kvp_slots_reply held = {.id = 7, .nchunks = 1, .cached = 1, .nslots = 0};
    struct kvp_slots_reply free_slots = {.id = 0, .nchunks = 1, .nslots = 1, .slots = s};
    kvp_tokens seq = {.ids = x->ids, .count = 16};
    kvp_store_plan plan;
    kvp_retrieve_plan rplan;

    script_shm(x);
    add_slots_reply(x, KVP_OP_PREPARE_STORE, &held);
    start_and_open(x);
    kvp_instance *inst = register_shm(x);
    assert_rc(kvp_prepare_store(inst, &seq, 0, 16, &plan), KVP_EPROTO);
    assert_non_null(strstr(kvp_last_error(x->c), "id 7 for 0 slots"));
    assert_null(plan.slots);
    finish(x);

    /* The same segment, a new fake: slots without a pin. */
    fake_cleanup(&x->f);
    fake_init(&x->f);
    add_hello_shm(x, nonce_a);
    struct kvp_register_reply r = register_reply(KVP_WIRE_SHM, x->seg_name, NULL);
    add_register_reply(x, &r);
    add_slots_reply(x, KVP_OP_PREPARE_RETRIEVE, &free_slots);
    start_and_open(x);
    inst = register_shm(x);
    assert_rc(kvp_prepare_retrieve(inst, &seq, 0, 16, &rplan), KVP_EPROTO);
    assert_null(rplan.slots);
    finish(x);
}

/* ---- inline transfers ------------------------------------------------------------------- */

static kvp_instance *register_inline(struct fixture *x)
{
    kvp_register_opts o = reg_opts(KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;

    assert_rc(kvp_register(x->c, &o, &inst), 0);
    assert_int_equal(kvp_instance_get_info(inst)->transport, KVP_TRANSPORT_INLINE);
    return inst;
}

static void script_inline(struct fixture *x)
{
    fake_add_hello(&x->f);
    struct kvp_register_reply r = register_reply(KVP_WIRE_INLINE, NULL, "SHM disabled");
    add_register_reply(x, &r);
}

/* The STORE_INLINE payload is the reserved chunks' bytes in slot order, nothing else. */
static void test_inline_store(void **state)
{
    struct fixture *x = *state;
    struct kvp_wire_slot s[2] = {{.chunk_index = 2, .offset = 8192, .length = CHUNK},
                                 {.chunk_index = 1, .offset = 4096, .length = CHUNK}};
    struct kvp_slots_reply prep = {.id = 12, .nchunks = 3, .cached = 1, .nslots = 2, .slots = s};
    uint8_t c[3][CHUNK];
    const void *chunks[3] = {c[0], c[1], c[2]};
    kvp_tokens seq = {.ids = x->ids, .count = 50};
    kvp_store_result res;

    for (int i = 0; i < 3; i++)
        memset(c[i], 0xa0 + i, CHUNK);
    script_inline(x);
    add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    fake_add_count(&x->f, KVP_OP_STORE_INLINE, 2);
    start_and_open(x);
    kvp_instance *inst = register_inline(x);

    assert_rc(kvp_store(inst, &seq, 0, 48, chunks, &res), 2);
    assert_int_equal(res.nchunks, 3);
    assert_int_equal(res.stored, 2);
    assert_int_equal(res.cached, 1);
    finish(x);

    assert_rc(x->f.nreqs, 4);
    const struct fake_req *q = &x->f.reqs[3];
    struct kvp_ref_req r = sent_ref(x, 3, KVP_OP_STORE_INLINE);
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
    struct fixture *x = *state;
    struct kvp_wire_slot s[1] = {{.chunk_index = 0, .offset = 4096, .length = CHUNK}};
    struct kvp_slots_reply prep = {.id = 12, .nchunks = 1, .nslots = 1, .slots = s};
    uint8_t c0[CHUNK] = {0};
    const void *chunks[1] = {c0};
    kvp_tokens seq = {.ids = x->ids, .count = 16};
    kvp_store_plan plan;

    script_inline(x);
    add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    fake_add_error(&x->f, KVP_OP_STORE_INLINE, -ENOENT, "no reservation 12");
    script_inline(x);
    fake_add_reply(&x->f, KVP_OP_PING, NULL);
    start_and_open(x);
    kvp_instance *inst = register_inline(x);

    assert_rc(kvp_prepare_store(inst, &seq, 0, 16, &plan), 1);
    assert_null(plan.slots[0].data);
    assert_rc(kvp_store_inline(inst, &plan, chunks), -ENOENT);
    assert_string_equal(kvp_last_error(x->c), "no reservation 12");
    assert_null(plan.slots);
    assert_rc(kvp_ping(x->c), 0);
    finish(x);

    assert_rc(x->f.nconns, 2);
    assert_rc(x->f.nreqs, 7);
    assert_int_equal(x->f.reqs[4].h.opcode, KVP_OP_HELLO);
    struct kvp_register_req a = sent_register(x, 1), b = sent_register(x, 5);
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
    struct fixture *x = *state;
    enum { BIG = 2 * 1 * CT * 4096 * 2, N = 16 }; /* 256 KiB chunks, 4 MiB payload */
    struct kvp_register_reply r = register_reply(KVP_WIRE_INLINE, NULL, "SHM disabled");
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
    add_register_reply(x, &r);
    add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    fake_add_error(&x->f, KVP_OP_STORE_INLINE, -ENOENT, "no reservation 12 on this connection");
    x->f.steps[x->f.nsteps - 1].action = FAKE_REPLY_EARLY;
    fake_add_hello(&x->f);
    add_register_reply(x, &r);
    fake_add_reply(&x->f, KVP_OP_PING, NULL);
    start_and_open(x);
    kvp_instance *inst = register_inline(x);

    assert_rc(kvp_prepare_store(inst, &seq, 0, N * CT, &plan), N);
    assert_rc(kvp_store_inline(inst, &plan, chunks), -ENOENT);
    assert_string_equal(kvp_last_error(x->c), "no reservation 12 on this connection");
    /* The daemon hung up: the next call is on a new connection. */
    assert_rc(kvp_ping(x->c), 0);
    finish(x);
    assert_rc(x->f.nconns, 2);
    free(data);
}

/* RETRIEVE_INLINE payload lands in out[i]; buffers past the cached run are not touched. */
static void test_inline_retrieve(void **state)
{
    struct fixture *x = *state;
    struct kvp_wire_slot s[2] = {{.chunk_index = 0, .offset = 4096, .length = CHUNK},
                                 {.chunk_index = 1, .offset = 8192, .length = CHUNK}};
    struct kvp_slots_reply m = {.id = 0, .nchunks = 3, .nslots = 2, .slots = s};
    uint8_t o[3][CHUNK];
    void *out[3] = {o[0], o[1], o[2]};
    kvp_tokens seq = {.ids = x->ids, .count = 48};
    struct kvp_wbuf w;

    script_inline(x);
    kvp_wbuf_init(&w);
    kvp_encode_slots_reply(&w, &m);
    struct fake_step *st = fake_add_reply(&x->f, KVP_OP_RETRIEVE_INLINE, &w);
    st->payload = malloc(2 * CHUNK);
    st->payload_len = 2 * CHUNK;
    memset(st->payload, 0x11, CHUNK);
    memset(st->payload + CHUNK, 0x22, CHUNK);
    fake_add_reply(&x->f, KVP_OP_PING, NULL);
    start_and_open(x);
    kvp_instance *inst = register_inline(x);

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
    finish(x);
    assert_rc(x->f.nreqs, 4);
}

static void test_inline_retrieve_payload_mismatch(void **state)
{
    struct fixture *x = *state;
    struct kvp_wire_slot s[2] = {{.chunk_index = 0, .offset = 4096, .length = CHUNK},
                                 {.chunk_index = 1, .offset = 8192, .length = CHUNK}};
    struct kvp_slots_reply m = {.id = 0, .nchunks = 2, .nslots = 2, .slots = s};
    uint8_t o[2][CHUNK];
    void *out[2] = {o[0], o[1]};
    kvp_tokens seq = {.ids = x->ids, .count = 32};
    struct kvp_wbuf w;

    script_inline(x);
    kvp_wbuf_init(&w);
    kvp_encode_slots_reply(&w, &m);
    struct fake_step *st = fake_add_reply(&x->f, KVP_OP_RETRIEVE_INLINE, &w);
    st->payload = calloc(1, CHUNK);
    st->payload_len = CHUNK; /* one chunk's bytes for two slots */
    start_and_open(x);
    kvp_instance *inst = register_inline(x);
    assert_rc(kvp_retrieve(inst, &seq, 0, 32, out), KVP_EPROTO);
    assert_rc(kvp_ping(x->c), -ENOTCONN);
    finish(x);
}

/* ---- lookup and argument checks --------------------------------------------------------- */

static void test_lookup(void **state)
{
    struct fixture *x = *state;
    struct kvp_lookup_reply good = {.nchunks = 3, .cached = 2}, bad = {.nchunks = 2, .cached = 1};
    kvp_tokens seq = {.ids = x->ids, .count = 50};
    struct kvp_wbuf w;

    script_inline(x);
    kvp_wbuf_init(&w);
    kvp_encode_lookup_reply(&w, &good);
    fake_add_reply(&x->f, KVP_OP_LOOKUP, &w);
    kvp_encode_lookup_reply(&w, &bad);
    fake_add_reply(&x->f, KVP_OP_LOOKUP, &w);
    start_and_open(x);
    kvp_instance *inst = register_inline(x);

    assert_rc(kvp_lookup(inst, &seq), 2);
    /* 50 tokens are 3 full chunks: a reply about 2 is about something else. */
    assert_rc(kvp_lookup(inst, &seq), KVP_EPROTO);
    finish(x);

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
    struct fixture *x = *state;
    uint8_t c0[CHUNK];
    const void *chunks[2] = {c0, NULL};
    void *out[2] = {c0, NULL};
    kvp_tokens seq = {.ids = x->ids, .count = 64};
    kvp_store_plan plan;
    uint8_t salt[300] = {0};

    script_inline(x);
    start_and_open(x);
    kvp_instance *inst = register_inline(x);

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
    finish(x);
    assert_rc(x->f.nreqs, 2);
}

/* ---- reconnect --------------------------------------------------------------------------- */

static void add_lookup_reply(struct fixture *x, uint32_t nchunks, uint32_t cached)
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
    struct fixture *x = *state;
    struct kvp_wire_slot s[1] = {{.chunk_index = 0, .offset = 4096, .length = CHUNK}};
    struct kvp_slots_reply prep = {.id = 12, .nchunks = 1, .nslots = 1, .slots = s};
    kvp_register_opts o = reg_opts(KVP_TRANSPORT_AUTO);
    kvp_tokens seq = {.ids = x->ids, .count = 16};
    kvp_store_plan old_plan, new_plan;
    kvp_instance *inst = NULL;

    seg_create(x, nonce_a, SEG_SIZE);
    struct kvp_register_reply r = register_reply(KVP_WIRE_SHM, x->seg_name, NULL);
    add_hello_shm(x, nonce_a);
    add_register_reply(x, &r);
    add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    fake_add(&x->f, KVP_OP_PING, FAKE_CLOSE);
    add_hello_shm(x, nonce_a);
    add_register_reply(x, &r);
    add_lookup_reply(x, 1, 0);
    add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    fake_add_count(&x->f, KVP_OP_COMMIT_STORE, 1);
    start_and_open(x);

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
    finish(x);

    /* HELLO, REGISTER, PREPARE, PING | HELLO, REGISTER, LOOKUP, PREPARE, COMMIT: exactly one
     * commit of reservation 12, the new one. */
    assert_rc(x->f.nconns, 2);
    assert_rc(x->f.nreqs, 9);
    struct kvp_register_req q = sent_register(x, 5);
    assert_int_equal(q.transport, KVP_WIRE_SHM);
    struct kvp_ref_req cm = sent_ref(x, 8, KVP_OP_COMMIT_STORE);
    assert_int_equal(cm.id, 12);
}

/* A plan whose connection is lost but not replaced yet is stale too; so are abort, inline
 * store and retrieve commits of stale plans, and each frees the plan. */
static void test_stale_plan_on_lost_connection(void **state)
{
    struct fixture *x = *state;
    struct kvp_wire_slot s[1] = {{.chunk_index = 0, .offset = 4096, .length = CHUNK}};
    struct kvp_slots_reply prep = {.id = 12, .nchunks = 1, .nslots = 1, .slots = s};
    uint8_t c0[CHUNK] = {0};
    const void *chunks[1] = {c0};
    kvp_tokens seq = {.ids = x->ids, .count = 16};
    kvp_store_plan a, b;

    script_inline(x);
    add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    prep.id = 13;
    add_slots_reply(x, KVP_OP_PREPARE_STORE, &prep);
    fake_add(&x->f, KVP_OP_PING, FAKE_CLOSE);
    start_and_open(x);
    kvp_instance *inst = register_inline(x);

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
    finish(x);
    assert_rc(x->f.nreqs, 5);
    assert_rc(x->f.nconns, 1);
}

/* A daemon back with another chunk size: the instance is stale for good (its registration on
 * the new daemon is dropped), the client itself goes on. */
static void test_reconnect_layout_changed(void **state)
{
    struct fixture *x = *state;
    kvp_tokens seq = {.ids = x->ids, .count = 64};

    script_inline(x);
    fake_add(&x->f, KVP_OP_PING, FAKE_CLOSE);
    fake_add_hello(&x->f);
    struct kvp_register_reply r = register_reply(KVP_WIRE_INLINE, NULL, "SHM disabled");
    r.chunk_tokens = 2 * CT;
    r.shape[2] = 2 * CT;
    r.chunk_bytes = 2 * CHUNK;
    r.handle = HANDLE + 1;
    add_register_reply(x, &r);
    fake_add_reply(&x->f, KVP_OP_UNREGISTER, NULL);
    fake_add_reply(&x->f, KVP_OP_PING, NULL);
    start_and_open(x);
    kvp_instance *inst = register_inline(x);

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
    finish(x);

    /* HELLO, REGISTER, PING | HELLO, REGISTER, UNREGISTER (of the new registration), PING. */
    assert_rc(x->f.nreqs, 7);
    struct kvp_ref_req u = sent_ref(x, 5, KVP_OP_UNREGISTER);
    assert_int_equal(u.handle, HANDLE + 1);
}

/*
 * An instance the new daemon refuses fails its own calls with the daemon's error, one attempt
 * per call, while the client's other instance goes on; once the daemon accepts, it is back.
 */
static void test_reconnect_refused_instance(void **state)
{
    struct fixture *x = *state;
    kvp_register_opts oa = reg_opts(KVP_TRANSPORT_INLINE), ob = reg_opts(KVP_TRANSPORT_INLINE);
    struct kvp_register_reply r = register_reply(KVP_WIRE_INLINE, NULL, "requested by worker");
    kvp_tokens seq = {.ids = x->ids, .count = 32};
    kvp_instance *a = NULL, *b = NULL;

    oa.instance_id = "worker-a";
    ob.instance_id = "worker-b";
    fake_add_hello(&x->f);
    add_register_reply(x, &r);
    add_register_reply(x, &r);
    fake_add(&x->f, KVP_OP_PING, FAKE_CLOSE);
    fake_add_hello(&x->f);
    fake_add_error(&x->f, KVP_OP_REGISTER, -EBUSY, "instance id worker-a in use, pid 4242");
    add_register_reply(x, &r); /* b: registered again after a, in the original order */
    add_lookup_reply(x, 2, 1); /* b's lookup */
    fake_add_error(&x->f, KVP_OP_REGISTER, -EBUSY, "instance id worker-a in use, pid 4242");
    add_register_reply(x, &r); /* a, at its second call */
    add_lookup_reply(x, 2, 2); /* a's lookup */
    start_and_open(x);

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
    finish(x);

    assert_rc(x->f.nreqs, 11);
    assert_string_equal(sent_register(x, 5).instance_id, "worker-a");
    assert_string_equal(sent_register(x, 6).instance_id, "worker-b");
    assert_string_equal(sent_register(x, 8).instance_id, "worker-a");
    assert_string_equal(sent_register(x, 9).instance_id, "worker-a");
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_register_no_shm),
        T(test_register_shm),
        T(test_register_requested_inline),
        T(test_register_nonce_mismatch),
        T(test_register_bad_magic),
        T(test_register_missing_segment),
        T(test_register_short_segment),
        T(test_register_eopnotsupp),
        T(test_register_daemon_error),
        T(test_register_validation),
        T(test_register_inconsistent_reply),
        T(test_shm_store_retrieve),
        T(test_shm_prepare_plan),
        T(test_bad_slot_header_page),
        T(test_bad_slot_past_end),
        T(test_bad_slot_wraps),
        T(test_bad_slot_length),
        T(test_retrieve_slots_out_of_order),
        T(test_store_counts_must_add_up),
        T(test_hold_without_slots),
        T(test_inline_store),
        T(test_inline_store_error_breaks),
        T(test_inline_store_rejected_early),
        T(test_inline_retrieve),
        T(test_inline_retrieve_payload_mismatch),
        T(test_lookup),
        T(test_keyed_validation),
        T(test_reconnect_stale_shm_plan),
        T(test_stale_plan_on_lost_connection),
        T(test_reconnect_layout_changed),
        T(test_reconnect_refused_instance),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
