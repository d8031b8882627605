/*
 * test_registry.c - registered instances (src/server/registry.h): validation of a
 * registration, the chunk shape derived from the daemon's offer, the per-instance transport
 * decision, the instance table (stale handles, owners) and instance identity: a namesake with
 * any other identity field is refused with -EEXIST naming the field, an identical one from
 * another connection with -EBUSY naming its pid, the owning connection gets its registration
 * back, and keys come only from the caller's own registration.
 *
 * The registry is about a megabyte (one slot per possible instance), so each case allocates it
 * on the heap. The registry logs one INFO line per registration; the threshold is raised so
 * the test output stays readable.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_assert.h"
#include "log.h"
#include "registry.h"

#define SHM_NAME "kvpool_l1_pool_test"
#define NO_SHM_REASON "SHM disabled: insufficient /dev/shm capacity (need 2 bytes, have 1)"

static const struct kvp_offer offer_shm = {
    .shm_enabled = true,
    .shm_name = SHM_NAME,
    .shm_reason = "",
    .pool_size = 1ull << 30,
    .chunk_tokens = 256,
};

static const struct kvp_offer offer_inline = {
    .shm_enabled = false,
    .shm_name = "",
    .shm_reason = NO_SHM_REASON,
    .pool_size = 1ull << 30,
    .chunk_tokens = 256,
};

static struct kvp_registry *new_registry(const struct kvp_offer *offer)
{
    struct kvp_registry *r = malloc(sizeof(*r));
    assert_non_null(r);
    /* Garbage first: init must not depend on a zeroed struct. */
    memset(r, 0xa5, sizeof(*r));
    kvp_registry_init(r, offer);
    assert_int_equal(kvp_registry_count(r), 0);
    return r;
}

static void free_registry(struct kvp_registry *r)
{
    kvp_registry_destroy(r);
    free(r);
}

static int quiet(void **state)
{
    (void)state;
    kvp_log_threshold = KVP_LOG_ERROR;
    return 0;
}

/* A valid request: bfloat16, 32 layers, hidden 1024, rank 1 of 2, worker on shm. */
static struct kvp_register_req good_req(const char *id)
{
    struct kvp_register_req q;
    memset(&q, 0, sizeof(q));
    snprintf(q.instance_id, sizeof(q.instance_id), "%s", id);
    snprintf(q.model_name, sizeof(q.model_name), "llama-3-8b");
    snprintf(q.dtype, sizeof(q.dtype), "bfloat16");
    q.world_size = 2;
    q.worker_rank = 1;
    q.block_size = 16;
    q.num_layers = 32;
    q.hidden_dim = 1024;
    q.use_mla = 0;
    q.transport = KVP_WIRE_SHM;
    return q;
}

/* Validates a request that must be rejected; the message must contain field. */
static void expect_invalid(const struct kvp_registry *r, const struct kvp_register_req *q,
                           const char *field)
{
    struct kvp_instance inst;
    char msg[512] = "";
    int rc = kvp_registry_validate(r, q, &inst, msg, sizeof(msg));
    if (rc != -EINVAL)
        fail_msg("validate = %d, expected -EINVAL (bad %s)", rc, field);
    if (!strstr(msg, field))
        fail_msg("message \"%s\" does not name \"%s\"", msg, field);
}

/* The peer pid the tests give connection owner. */
#define PID_OF(owner) ((int32_t)(1000 + (owner)))

/* Validates, chooses the transport and tries to register a request for connection owner;
 * returns kvp_registry_add()'s result, with its message in msg. */
static int try_add(struct kvp_registry *r, uint64_t owner, const struct kvp_register_req *q,
                   bool *existing, struct kvp_instance *out, char *msg, size_t msg_size)
{
    struct kvp_instance inst;
    assert_rc(kvp_registry_validate(r, q, &inst, msg, msg_size), 0);
    assert_rc(kvp_registry_choose_transport(r, &inst, msg, msg_size), 0);
    msg[0] = '\0';
    int rc = kvp_registry_add(r, owner, PID_OF(owner), &inst, existing, msg, msg_size);
    if (out)
        *out = inst;
    return rc;
}

/* Validates, chooses the transport and registers a request; returns the handle. */
static uint32_t add(struct kvp_registry *r, uint64_t owner, const struct kvp_register_req *q,
                    bool *existing, struct kvp_instance *out)
{
    struct kvp_instance inst;
    char msg[512];
    assert_rc(try_add(r, owner, q, existing, &inst, msg, sizeof(msg)), 0);
    if (out)
        *out = inst;
    return inst.handle;
}

/* ---- Validation ---- */

static void test_validate_ok_shape(void **state)
{
    (void)state;
    struct kvp_registry *r = new_registry(&offer_shm);
    struct kvp_register_req q = good_req("w0");
    struct kvp_instance inst;
    char msg[512] = "";

    assert_rc(kvp_registry_validate(r, &q, &inst, msg, sizeof(msg)), 0);
    assert_int_equal(inst.layout.ndim, 4);
    assert_int_equal(inst.layout.shape[0], 2);
    assert_int_equal(inst.layout.shape[1], 32);
    assert_int_equal(inst.layout.shape[2], 256); /* the offer's chunk size */
    assert_int_equal(inst.layout.shape[3], 1024);
    assert_int_equal(inst.layout.bytes, 2ull * 32 * 256 * 1024 * 2);
    assert_int_equal(inst.dtype_size, 2);
    assert_string_equal(inst.req.instance_id, "w0");
    assert_string_equal(inst.req.model_name, "llama-3-8b");
    assert_int_equal(inst.req.num_layers, 32);
    free_registry(r);
}

static void test_validate_mla_shape(void **state)
{
    (void)state;
    struct kvp_offer offer = offer_shm;
    offer.chunk_tokens = 64;
    struct kvp_registry *r = new_registry(&offer);
    struct kvp_register_req q = good_req("mla");
    struct kvp_instance inst;
    char msg[512];

    q.use_mla = 1;
    q.num_layers = 61;
    q.hidden_dim = 576;
    snprintf(q.dtype, sizeof(q.dtype), "float32");
    assert_rc(kvp_registry_validate(r, &q, &inst, msg, sizeof(msg)), 0);
    assert_int_equal(inst.layout.ndim, 3);
    assert_int_equal(inst.layout.shape[0], 61);
    assert_int_equal(inst.layout.shape[1], 64);
    assert_int_equal(inst.layout.shape[2], 576);
    assert_int_equal(inst.layout.shape[3], 0);
    assert_int_equal(inst.layout.bytes, 61ull * 64 * 576 * 4);
    assert_int_equal(inst.dtype_size, 4);

    /* The same model without MLA has the K/V dimension in front and twice the bytes. */
    q.use_mla = 0;
    assert_rc(kvp_registry_validate(r, &q, &inst, msg, sizeof(msg)), 0);
    assert_int_equal(inst.layout.ndim, 4);
    assert_int_equal(inst.layout.shape[0], 2);
    assert_int_equal(inst.layout.shape[1], 61);
    assert_int_equal(inst.layout.shape[2], 64);
    assert_int_equal(inst.layout.shape[3], 576);
    assert_int_equal(inst.layout.bytes, 2ull * 61 * 64 * 576 * 4);
    free_registry(r);
}

static void test_validate_errors_name_the_field(void **state)
{
    (void)state;
    struct kvp_registry *r = new_registry(&offer_shm);
    struct kvp_register_req q;

    q = good_req("w0");
    q.world_size = 0;
    q.worker_rank = 0;
    expect_invalid(r, &q, "world_size");

    q = good_req("w0");
    q.worker_rank = 2; /* == world_size */
    expect_invalid(r, &q, "worker_rank");
    q.worker_rank = 7;
    expect_invalid(r, &q, "worker_rank");

    q = good_req("w0");
    q.num_layers = 0;
    expect_invalid(r, &q, "num_layers");

    q = good_req("w0");
    q.hidden_dim = 0;
    expect_invalid(r, &q, "hidden_dim");

    q = good_req("w0");
    q.block_size = 0;
    expect_invalid(r, &q, "block_size");

    q = good_req("w0");
    snprintf(q.dtype, sizeof(q.dtype), "float17");
    expect_invalid(r, &q, "dtype");
    expect_invalid(r, &q, "float17");

    q = good_req("w0");
    q.dtype[0] = '\0';
    expect_invalid(r, &q, "dtype");

    q = good_req("");
    expect_invalid(r, &q, "instance_id");

    q = good_req("w0");
    q.model_name[0] = '\0';
    expect_invalid(r, &q, "model_name");

    q = good_req("w0");
    q.use_mla = 2;
    expect_invalid(r, &q, "use_mla");

    q = good_req("w0");
    q.transport = 3;
    expect_invalid(r, &q, "transport");
    free_registry(r);
}

static void test_validate_every_dtype(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        uint32_t size;
    } dt[] = {
        {"float16", 2}, {"bfloat16", 2}, {"float32", 4},       {"float64", 8},
        {"int8", 1},    {"uint8", 1},    {"float8_e4m3fn", 1}, {"float8_e5m2", 1},
    };
    struct kvp_registry *r = new_registry(&offer_shm);
    for (size_t i = 0; i < sizeof(dt) / sizeof(dt[0]); i++) {
        struct kvp_register_req q = good_req("w0");
        struct kvp_instance inst;
        char msg[512];
        snprintf(q.dtype, sizeof(q.dtype), "%s", dt[i].name);
        assert_rc(kvp_registry_validate(r, &q, &inst, msg, sizeof(msg)), 0);
        assert_int_equal(inst.dtype_size, dt[i].size);
        assert_int_equal(inst.layout.bytes, 2ull * 32 * 256 * 1024 * dt[i].size);
    }
    free_registry(r);
}

static void test_chunk_larger_than_pool(void **state)
{
    (void)state;
    /* One chunk of the good request is 2 * 32 * 256 * 1024 * 2 = 32 MiB. */
    const uint64_t chunk = 2ull * 32 * 256 * 1024 * 2;
    struct kvp_offer offer = offer_shm;
    struct kvp_instance inst;
    char msg[512];

    offer.pool_size = chunk;
    struct kvp_registry *r = new_registry(&offer);
    struct kvp_register_req q = good_req("w0");
    assert_rc(kvp_registry_validate(r, &q, &inst, msg, sizeof(msg)), 0);
    free_registry(r);

    offer.pool_size = chunk - 4096;
    r = new_registry(&offer);
    assert_rc(kvp_registry_validate(r, &q, &inst, msg, sizeof(msg)), -EINVAL);
    assert_non_null(strstr(msg, "pool"));
    /* A bigger chunk size in the offer makes a fitting layout too big. */
    free_registry(r);

    offer.pool_size = chunk;
    offer.chunk_tokens = 512;
    r = new_registry(&offer);
    assert_rc(kvp_registry_validate(r, &q, &inst, msg, sizeof(msg)), -EINVAL);
    free_registry(r);

    /* Dimensions whose product overflows 64 bits. */
    r = new_registry(&offer_shm);
    q.num_layers = 0xffffffffu;
    q.hidden_dim = 0xffffffffu;
    snprintf(q.dtype, sizeof(q.dtype), "float64");
    assert_rc(kvp_registry_validate(r, &q, &inst, msg, sizeof(msg)), -EINVAL);
    free_registry(r);
}

/* ---- Transport ---- */

static int choose(const struct kvp_offer *offer, uint8_t transport, const char *reason,
                  struct kvp_instance *inst, char *msg, size_t msg_size)
{
    struct kvp_registry *r = new_registry(offer);
    struct kvp_register_req q = good_req("w0");
    q.transport = transport;
    snprintf(q.reason, sizeof(q.reason), "%s", reason);
    assert_rc(kvp_registry_validate(r, &q, inst, msg, msg_size), 0);
    msg[0] = '\0';
    int rc = kvp_registry_choose_transport(r, inst, msg, msg_size);
    free_registry(r);
    return rc;
}

static void test_transport_shm(void **state)
{
    (void)state;
    struct kvp_instance inst;
    char msg[512];

    assert_rc(choose(&offer_shm, KVP_WIRE_SHM, "", &inst, msg, sizeof(msg)), 0);
    assert_int_equal(inst.transport, KVP_WIRE_SHM);
    assert_string_equal(inst.reason, "");
}

static void test_transport_shm_unavailable(void **state)
{
    (void)state;
    struct kvp_instance inst;
    char msg[512];

    assert_rc(choose(&offer_inline, KVP_WIRE_SHM, "", &inst, msg, sizeof(msg)), -EOPNOTSUPP);
    if (!strstr(msg, NO_SHM_REASON))
        fail_msg("message \"%s\" does not give the daemon's reason", msg);
}

static void test_transport_inline_keeps_reason(void **state)
{
    (void)state;
    struct kvp_instance inst;
    char msg[512];

    assert_rc(choose(&offer_shm, KVP_WIRE_INLINE, "cannot map segment: EACCES", &inst, msg,
                     sizeof(msg)),
              0);
    assert_int_equal(inst.transport, KVP_WIRE_INLINE);
    assert_string_equal(inst.reason, "cannot map segment: EACCES");

    /* Without a reason the instance still gets one for the log line. */
    assert_rc(choose(&offer_shm, KVP_WIRE_INLINE, "", &inst, msg, sizeof(msg)), 0);
    assert_int_equal(inst.transport, KVP_WIRE_INLINE);
    assert_true(inst.reason[0] != '\0');
}

static void test_transport_auto_is_inline(void **state)
{
    (void)state;
    struct kvp_instance inst;
    char msg[512];

    /* Auto never means shm: only a worker that says it mapped the segment gets shm. */
    assert_rc(choose(&offer_shm, KVP_WIRE_AUTO, "", &inst, msg, sizeof(msg)), 0);
    assert_int_equal(inst.transport, KVP_WIRE_INLINE);
    assert_true(inst.reason[0] != '\0');
}

static void test_transport_daemon_without_shm(void **state)
{
    (void)state;
    struct kvp_instance inst;
    char msg[512];

    assert_rc(choose(&offer_inline, KVP_WIRE_INLINE, "", &inst, msg, sizeof(msg)), 0);
    assert_int_equal(inst.transport, KVP_WIRE_INLINE);
    assert_string_equal(inst.reason, NO_SHM_REASON);

    assert_rc(choose(&offer_inline, KVP_WIRE_AUTO, "", &inst, msg, sizeof(msg)), 0);
    assert_int_equal(inst.transport, KVP_WIRE_INLINE);
    assert_string_equal(inst.reason, NO_SHM_REASON);

    /* The daemon's reason is the real one, whatever the worker says. */
    assert_rc(choose(&offer_inline, KVP_WIRE_INLINE, "requested by worker", &inst, msg,
                     sizeof(msg)),
              0);
    assert_string_equal(inst.reason, NO_SHM_REASON);
}

/* ---- The instance table ---- */

static void test_add_and_get(void **state)
{
    (void)state;
    struct kvp_registry *r = new_registry(&offer_shm);
    struct kvp_register_req q = good_req("w0");
    struct kvp_instance got;
    bool existing = true;

    uint32_t h = add(r, 7, &q, &existing, NULL);
    assert_false(existing);
    assert_int_not_equal(h, 0);
    assert_int_equal(kvp_registry_count(r), 1);
    assert_rc(kvp_registry_get(r, h, &got), 0);
    assert_int_equal(got.handle, h);
    assert_int_equal(got.owner, 7);
    assert_string_equal(got.req.instance_id, "w0");
    assert_int_equal(got.transport, KVP_WIRE_SHM);
    assert_int_equal(got.layout.bytes, 2ull * 32 * 256 * 1024 * 2);

    struct kvp_register_req q2 = good_req("w1");
    uint32_t h2 = add(r, 7, &q2, &existing, NULL);
    assert_false(existing);
    assert_int_not_equal(h2, h);
    assert_int_equal(kvp_registry_count(r), 2);
    assert_rc(kvp_registry_get(r, h2, &got), 0);
    assert_string_equal(got.req.instance_id, "w1");

    /* Handles nobody was given. */
    assert_rc(kvp_registry_get(r, 0, &got), -ENOENT);
    assert_rc(kvp_registry_get(r, h + 0x10000u, &got), -ENOENT);           /* next generation */
    assert_rc(kvp_registry_get(r, (h & 0xffff0000u) | 5u, &got), -ENOENT); /* unused slot */
    assert_rc(kvp_registry_get(r, (h & 0xffff0000u) | 0xffffu, &got), -ENOENT);
    assert_rc(kvp_registry_get(r, 0xffffffffu, &got), -ENOENT);
    free_registry(r);
}

/* The registration of handle h is still good_req(id)'s, owned by connection 1. */
static void expect_unchanged(struct kvp_registry *r, uint32_t h, const char *id)
{
    struct kvp_instance got;
    struct kvp_register_req q = good_req(id);
    assert_int_equal(kvp_registry_count(r), 1);
    assert_rc(kvp_registry_get(r, h, &got), 0);
    assert_int_equal(got.owner, 1);
    assert_int_equal(got.owner_pid, PID_OF(1));
    assert_string_equal(got.req.instance_id, id);
    assert_string_equal(got.req.model_name, q.model_name);
    assert_string_equal(got.req.dtype, q.dtype);
    assert_int_equal(got.req.world_size, q.world_size);
    assert_int_equal(got.req.worker_rank, q.worker_rank);
    assert_int_equal(got.req.block_size, q.block_size);
    assert_int_equal(got.req.num_layers, q.num_layers);
    assert_int_equal(got.req.hidden_dim, q.hidden_dim);
    assert_int_equal(got.req.use_mla, q.use_mla);
    assert_int_equal(got.transport, KVP_WIRE_SHM);
    assert_int_equal(got.layout.bytes, 2ull * 32 * 256 * 1024 * 2);
}

/* One identity field changed, and the message the refusal must carry. */
struct namesake {
    const char *field;
    void (*change)(struct kvp_register_req *q);
    const char *msg;
};

static void other_model(struct kvp_register_req *q)
{
    snprintf(q->model_name, sizeof(q->model_name), "mistral-7b");
}
static void other_dtype(struct kvp_register_req *q)
{
    snprintf(q->dtype, sizeof(q->dtype), "float16");
}
static void other_world(struct kvp_register_req *q)
{
    q->world_size = 4;
}
static void other_rank(struct kvp_register_req *q)
{
    q->worker_rank = 0;
}
static void other_block(struct kvp_register_req *q)
{
    q->block_size = 32;
}
static void other_layers(struct kvp_register_req *q)
{
    q->num_layers = 40;
}
static void other_hidden(struct kvp_register_req *q)
{
    q->hidden_dim = 4096;
}
static void other_mla(struct kvp_register_req *q)
{
    q->use_mla = 1;
}

static const struct namesake namesakes[] = {
    {"model_name", other_model,
     "instance id rank0 is registered with model_name 'llama-3-8b', not 'mistral-7b'"},
    {"dtype", other_dtype, "instance id rank0 is registered with dtype 'bfloat16', not 'float16'"},
    {"world_size", other_world, "instance id rank0 is registered with world_size 2, not 4"},
    {"worker_rank", other_rank, "instance id rank0 is registered with worker_rank 1, not 0"},
    {"block_size", other_block, "instance id rank0 is registered with block_size 16, not 32"},
    {"num_layers", other_layers, "instance id rank0 is registered with num_layers 32, not 40"},
    {"hidden_dim", other_hidden, "instance id rank0 is registered with hidden_dim 1024, not 4096"},
    {"use_mla", other_mla, "instance id rank0 is registered with use_mla 0, not 1"},
};

/* Every identity field: a namesake that differs in it is refused, from another connection and
 * from the owner alike, and the first registration does not change. */
static void test_namesake_refused_per_field(void **state)
{
    (void)state;
    struct kvp_registry *r = new_registry(&offer_shm);
    struct kvp_register_req q = good_req("rank0");
    bool existing;
    char msg[512];

    uint32_t h = add(r, 1, &q, &existing, NULL);
    assert_false(existing);
    for (size_t i = 0; i < sizeof(namesakes) / sizeof(namesakes[0]); i++) {
        for (uint64_t owner = 1; owner <= 2; owner++) {
            struct kvp_register_req q2 = good_req("rank0");
            namesakes[i].change(&q2);
            existing = true;
            int rc = try_add(r, owner, &q2, &existing, NULL, msg, sizeof(msg));
            if (rc != -EEXIST)
                fail_msg("%s differs (connection %d): add = %d, expected -EEXIST",
                         namesakes[i].field, (int)owner, rc);
            assert_false(existing);
            assert_string_equal(msg, namesakes[i].msg);
            expect_unchanged(r, h, "rank0");
        }
    }
    /* The field is named even when every field differs: the first, in wire order. */
    struct kvp_register_req all = good_req("rank0");
    for (size_t i = 0; i < sizeof(namesakes) / sizeof(namesakes[0]); i++)
        namesakes[i].change(&all);
    all.worker_rank = 3;
    assert_rc(try_add(r, 2, &all, &existing, NULL, msg, sizeof(msg)), -EEXIST);
    assert_non_null(strstr(msg, "model_name"));
    expect_unchanged(r, h, "rank0");

    /* The refused namesake's connection owns nothing. */
    assert_int_equal(kvp_registry_remove_owner(r, 2), 0);
    expect_unchanged(r, h, "rank0");
    free_registry(r);
}

/* Identical parameters from another live connection: -EBUSY naming the owner's pid. Once the
 * owner is gone the id is free for anyone. */
static void test_namesake_other_connection_busy(void **state)
{
    (void)state;
    struct kvp_registry *r = new_registry(&offer_shm);
    struct kvp_register_req q = good_req("rank0");
    struct kvp_instance got;
    bool existing;
    char msg[512], want[128];

    uint32_t h = add(r, 1, &q, &existing, NULL);
    existing = true;
    assert_rc(try_add(r, 2, &q, &existing, NULL, msg, sizeof(msg)), -EBUSY);
    assert_false(existing);
    snprintf(want, sizeof(want), "instance id rank0 in use by another connection, pid %d",
             (int)PID_OF(1));
    assert_string_equal(msg, want);
    expect_unchanged(r, h, "rank0");

    /* Another transport is no identity: still busy, still unchanged. */
    struct kvp_register_req inl = good_req("rank0");
    inl.transport = KVP_WIRE_INLINE;
    snprintf(inl.reason, sizeof(inl.reason), "requested by worker");
    assert_rc(try_add(r, 2, &inl, &existing, NULL, msg, sizeof(msg)), -EBUSY);
    expect_unchanged(r, h, "rank0");

    /* The other connection cannot use or end the owner's handle either. */
    assert_rc(kvp_registry_get_owned(r, h, 2, &got), -ENOENT);
    assert_rc(kvp_registry_get_owned(r, h, 1, &got), 0);
    assert_int_equal(kvp_registry_remove_owner(r, 2), 0);
    expect_unchanged(r, h, "rank0");

    /* The owner closes: the second connection can now register the id. */
    assert_int_equal(kvp_registry_remove_owner(r, 1), 1);
    existing = true;
    uint32_t h2 = add(r, 2, &q, &existing, &got);
    assert_false(existing);
    assert_int_not_equal(h2, h);
    assert_int_equal(got.owner, 2);
    assert_int_equal(got.owner_pid, PID_OF(2));
    free_registry(r);
}

/* The owning connection registering the same parameters again gets its registration back,
 * unchanged, even when it now asks for another transport. */
static void test_same_connection_returns_existing(void **state)
{
    (void)state;
    struct kvp_registry *r = new_registry(&offer_shm);
    struct kvp_register_req q = good_req("rank0");
    struct kvp_instance second;
    bool existing;

    uint32_t h = add(r, 1, &q, &existing, NULL);
    assert_false(existing);
    struct kvp_register_req q2 = good_req("rank0");
    q2.transport = KVP_WIRE_INLINE;
    snprintf(q2.reason, sizeof(q2.reason), "requested by worker");
    existing = false;
    assert_int_equal(add(r, 1, &q2, &existing, &second), h);
    assert_true(existing);
    assert_int_equal(second.owner, 1);
    assert_int_equal(second.transport, KVP_WIRE_SHM);
    assert_string_equal(second.req.model_name, "llama-3-8b");
    expect_unchanged(r, h, "rank0");
    assert_int_equal(kvp_registry_remove_owner(r, 1), 1);
    assert_int_equal(kvp_registry_count(r), 0);
    free_registry(r);
}

/* Seeds of the key chain, as handlers.c derives them from a handle. */
static void seed_of(struct kvp_registry *r, uint32_t h, uint64_t owner, const char *salt,
                    uint8_t seed[KVP_KEY_SIZE])
{
    struct kvp_instance inst;
    struct kvp_key_ns ns;
    assert_rc(kvp_registry_get_owned(r, h, owner, &inst), 0);
    kvp_instance_key_ns(&inst, salt, (uint32_t)strlen(salt), &ns);
    assert_rc(kvp_key_seed(&ns, seed), 0);
}

/* The key namespace comes from the caller's own registration: a refused namesake has no handle
 * of its own, cannot use the owner's, and its own registration under another id keys apart. */
static void test_keys_from_own_registration(void **state)
{
    (void)state;
    struct kvp_registry *r = new_registry(&offer_shm);
    struct kvp_register_req llama = good_req("rank0"), mistral = good_req("rank0");
    struct kvp_instance inst;
    struct kvp_key_ns ns;
    bool existing;
    char msg[512];
    uint8_t a[KVP_KEY_SIZE], a2[KVP_KEY_SIZE], b[KVP_KEY_SIZE], a_salted[KVP_KEY_SIZE];

    other_model(&mistral);
    other_layers(&mistral);
    uint32_t ha = add(r, 1, &llama, &existing, NULL);
    assert_rc(try_add(r, 2, &mistral, &existing, &inst, msg, sizeof(msg)), -EEXIST);
    assert_rc(kvp_registry_get_owned(r, ha, 2, &inst), -ENOENT);

    snprintf(mistral.instance_id, sizeof(mistral.instance_id), "rank0-mistral");
    uint32_t hb = add(r, 2, &mistral, &existing, NULL);
    assert_rc(kvp_registry_get_owned(r, hb, 1, &inst), -ENOENT);

    /* Every namespace field is the handle's registration's. */
    assert_rc(kvp_registry_get_owned(r, hb, 2, &inst), 0);
    kvp_instance_key_ns(&inst, "s", 1, &ns);
    assert_string_equal(ns.model_name, "mistral-7b");
    assert_string_equal(ns.dtype, "bfloat16");
    assert_int_equal(ns.world_size, 2);
    assert_int_equal(ns.rank, 1);
    assert_int_equal(ns.ndim, 4);
    assert_int_equal(ns.shape[1], 40);
    assert_int_equal(ns.salt_len, 1);
    assert_memory_equal(ns.salt, "s", 1);

    seed_of(r, ha, 1, "", a);
    seed_of(r, ha, 1, "", a2);
    seed_of(r, hb, 2, "", b);
    seed_of(r, ha, 1, "tenant", a_salted);
    assert_memory_equal(a, a2, KVP_KEY_SIZE);
    assert_memory_not_equal(a, b, KVP_KEY_SIZE);
    assert_memory_not_equal(a, a_salted, KVP_KEY_SIZE);

    /* MLA: every rank of a model shares the namespace. */
    struct kvp_register_req m0 = good_req("mla0"), m1 = good_req("mla1");
    m0.use_mla = m1.use_mla = 1;
    m0.worker_rank = 0;
    uint32_t h0 = add(r, 1, &m0, &existing, NULL), h1 = add(r, 2, &m1, &existing, NULL);
    seed_of(r, h0, 1, "", a);
    seed_of(r, h1, 2, "", b);
    assert_memory_equal(a, b, KVP_KEY_SIZE);
    free_registry(r);
}

static void test_stale_handle(void **state)
{
    (void)state;
    struct kvp_registry *r = new_registry(&offer_shm);
    struct kvp_register_req q = good_req("w0");
    struct kvp_instance got;
    bool existing;

    uint32_t h = add(r, 1, &q, &existing, NULL);
    assert_rc(kvp_registry_remove(r, h, "test"), 0);
    assert_int_equal(kvp_registry_count(r), 0);
    assert_rc(kvp_registry_get(r, h, &got), -ENOENT);
    assert_rc(kvp_registry_remove(r, h, "test"), -ENOENT);

    /* A new instance takes the freed slot but gets a different handle. */
    struct kvp_register_req q2 = good_req("w1");
    uint32_t h2 = add(r, 1, &q2, &existing, NULL);
    assert_false(existing);
    assert_int_equal(h2 & 0xffffu, h & 0xffffu);
    assert_int_not_equal(h2, h);
    assert_rc(kvp_registry_get(r, h, &got), -ENOENT);
    assert_rc(kvp_registry_remove(r, h, "test"), -ENOENT);
    assert_int_equal(kvp_registry_count(r), 1);
    assert_rc(kvp_registry_get(r, h2, &got), 0);
    assert_string_equal(got.req.instance_id, "w1");

    /* The same id registered again after removal is a new registration. */
    assert_rc(kvp_registry_remove(r, h2, "test"), 0);
    uint32_t h3 = add(r, 1, &q2, &existing, NULL);
    assert_false(existing);
    assert_int_not_equal(h3, h2);
    assert_int_not_equal(h3, h);
    free_registry(r);
}

static void test_remove_owner(void **state)
{
    (void)state;
    struct kvp_registry *r = new_registry(&offer_shm);
    struct kvp_instance got;
    bool existing;
    struct kvp_register_req qa = good_req("a"), qb = good_req("b"), qc = good_req("c"),
                            qd = good_req("d");

    uint32_t ha = add(r, 10, &qa, &existing, NULL);
    uint32_t hc = add(r, 20, &qc, &existing, NULL);
    uint32_t hb = add(r, 10, &qb, &existing, NULL);
    uint32_t hd = add(r, 30, &qd, &existing, NULL);
    assert_int_equal(kvp_registry_count(r), 4);

    assert_int_equal(kvp_registry_remove_owner(r, 10), 2);
    assert_int_equal(kvp_registry_count(r), 2);
    assert_rc(kvp_registry_get(r, ha, &got), -ENOENT);
    assert_rc(kvp_registry_get(r, hb, &got), -ENOENT);
    assert_rc(kvp_registry_get(r, hc, &got), 0);
    assert_int_equal(got.owner, 20);
    assert_rc(kvp_registry_get(r, hd, &got), 0);

    assert_int_equal(kvp_registry_remove_owner(r, 10), 0);
    assert_int_equal(kvp_registry_remove_owner(r, 99), 0);
    assert_int_equal(kvp_registry_remove_owner(r, 20), 1);
    assert_int_equal(kvp_registry_count(r), 1);
    assert_rc(kvp_registry_get(r, hd, &got), 0);
    free_registry(r);
}

static void test_table_full(void **state)
{
    (void)state;
    struct kvp_registry *r = new_registry(&offer_shm);
    struct kvp_instance inst;
    char msg[512];
    bool existing;
    uint32_t first = 0;

    for (int i = 0; i < KVP_MAX_INSTANCES; i++) {
        char id[32];
        snprintf(id, sizeof(id), "w%d", i);
        struct kvp_register_req q = good_req(id);
        uint32_t h = add(r, 1, &q, &existing, NULL);
        if (i == 0)
            first = h;
    }
    assert_int_equal(kvp_registry_count(r), KVP_MAX_INSTANCES);

    struct kvp_register_req q = good_req("one-too-many");
    assert_rc(kvp_registry_validate(r, &q, &inst, msg, sizeof(msg)), 0);
    assert_rc(kvp_registry_choose_transport(r, &inst, msg, sizeof(msg)), 0);
    assert_rc(kvp_registry_add(r, 1, PID_OF(1), &inst, &existing, msg, sizeof(msg)), -ENOSPC);
    assert_non_null(strstr(msg, "too many instances"));
    assert_int_equal(kvp_registry_count(r), KVP_MAX_INSTANCES);

    /* When the table is full, the owner still gets its registration back, and a namesake
     * from another connection is still refused as busy, not as full. */
    struct kvp_register_req dup = good_req("w0");
    assert_int_equal(add(r, 1, &dup, &existing, NULL), first);
    assert_true(existing);
    assert_rc(try_add(r, 2, &dup, &existing, NULL, msg, sizeof(msg)), -EBUSY);
    dup.num_layers = 2;
    assert_rc(try_add(r, 2, &dup, &existing, NULL, msg, sizeof(msg)), -EEXIST);
    assert_non_null(strstr(msg, "num_layers"));

    /* Freeing one slot makes room again. */
    assert_rc(kvp_registry_remove(r, first, "test"), 0);
    assert_rc(kvp_registry_add(r, 1, PID_OF(1), &inst, &existing, msg, sizeof(msg)), 0);
    assert_false(existing);
    assert_int_equal(kvp_registry_count(r), KVP_MAX_INSTANCES);
    assert_int_equal(kvp_registry_remove_owner(r, 1), KVP_MAX_INSTANCES);
    assert_int_equal(kvp_registry_count(r), 0);
    free_registry(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_validate_ok_shape),
        cmocka_unit_test(test_validate_mla_shape),
        cmocka_unit_test(test_validate_errors_name_the_field),
        cmocka_unit_test(test_validate_every_dtype),
        cmocka_unit_test(test_chunk_larger_than_pool),
        cmocka_unit_test(test_transport_shm),
        cmocka_unit_test(test_transport_shm_unavailable),
        cmocka_unit_test(test_transport_inline_keeps_reason),
        cmocka_unit_test(test_transport_auto_is_inline),
        cmocka_unit_test(test_transport_daemon_without_shm),
        cmocka_unit_test(test_add_and_get),
        cmocka_unit_test(test_namesake_refused_per_field),
        cmocka_unit_test(test_namesake_other_connection_busy),
        cmocka_unit_test(test_same_connection_returns_existing),
        cmocka_unit_test(test_keys_from_own_registration),
        cmocka_unit_test(test_stale_handle),
        cmocka_unit_test(test_remove_owner),
        cmocka_unit_test(test_table_full),
    };
    return cmocka_run_group_tests(tests, quiet, NULL);
}
