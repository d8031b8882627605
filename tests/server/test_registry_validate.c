/*
 * test_registry_validate.c - what the registry decides about one registration
 * (src/server/core/registry.h): validation, with a message naming the bad field; the chunk shape
 * derived from the request and the daemon's offer (MLA or not, every dtype, a chunk larger than
 * the pool); and the per-instance transport decision: shm only for a worker that says it mapped
 * the segment, inline otherwise, with the reason the daemon or the worker gave.
 *
 * The table of registered instances: test_registry_table.c; instance identity:
 * test_registry_identity.c.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_assert.h"
#include "registry_fixture.h"

/* Validates a request that must be rejected; the message must contain field. */
static void expect_invalid(const struct kvp_registry *r, const struct kvp_reg_spec *q,
                           const char *field)
{
    struct kvp_registration inst;
    char msg[512] = "";
    int rc = kvp_registry_validate(r, q, &inst, msg, sizeof(msg));
    if (rc != -EINVAL)
        fail_msg("validate = %d, expected -EINVAL (bad %s)", rc, field);
    if (!strstr(msg, field))
        fail_msg("message \"%s\" does not name \"%s\"", msg, field);
}

/* ---- Validation ---- */

static void test_validate_ok_shape(void **state)
{
    (void)state;
    struct kvp_registry *r = new_registry(&offer_shm);
    struct kvp_reg_spec q = good_req("w0");
    struct kvp_registration inst;
    char msg[512] = "";

    assert_rc(kvp_registry_validate(r, &q, &inst, msg, sizeof(msg)), 0);
    assert_int_equal(inst.layout.ndim, 4);
    assert_int_equal(inst.layout.shape[0], 2);
    assert_int_equal(inst.layout.shape[1], 32);
    assert_int_equal(inst.layout.shape[2], 256); /* the offer's chunk size */
    assert_int_equal(inst.layout.shape[3], 1024);
    assert_int_equal(inst.layout.bytes, 2ull * 32 * 256 * 1024 * 2);
    assert_int_equal(inst.dtype_size, 2);
    assert_string_equal(inst.spec.instance_id, "w0");
    assert_string_equal(inst.spec.model_name, "llama-3-8b");
    assert_int_equal(inst.spec.num_layers, 32);

    /* The unsalted key seed is the namespace's, and another model's differs. */
    struct kvp_key_ns ns;
    uint8_t seed[KVP_KEY_SIZE];
    kvp_registration_key_ns(&inst, NULL, 0, &ns);
    assert_rc(kvp_key_seed(&ns, seed), 0);
    assert_memory_equal(inst.seed, seed, KVP_KEY_SIZE);
    struct kvp_registration other;
    snprintf(q.model_name, sizeof(q.model_name), "mistral-7b");
    assert_rc(kvp_registry_validate(r, &q, &other, msg, sizeof(msg)), 0);
    assert_memory_not_equal(other.seed, inst.seed, KVP_KEY_SIZE);
    free_registry(r);
}

static void test_validate_mla_shape(void **state)
{
    (void)state;
    struct kvp_offer offer = offer_shm;
    offer.chunk_tokens = 64;
    struct kvp_registry *r = new_registry(&offer);
    struct kvp_reg_spec q = good_req("mla");
    struct kvp_registration inst;
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
    struct kvp_reg_spec q;

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
    q.transport = KVP_REG_ENVELOPE + 1;
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
        struct kvp_reg_spec q = good_req("w0");
        struct kvp_registration inst;
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
    struct kvp_registration inst;
    char msg[512];

    offer.pool_size = chunk;
    struct kvp_registry *r = new_registry(&offer);
    struct kvp_reg_spec q = good_req("w0");
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

/* Validates a registration asking for transport with reason, then decides its transport with
 * cannot_map as the evidence (NULL: the worker can map the segment). */
static int choose_as(const struct kvp_offer *offer, uint8_t transport, const char *reason,
                     const char *cannot_map, struct kvp_registration *inst, char *msg,
                     size_t msg_size)
{
    struct kvp_registry *r = new_registry(offer);
    struct kvp_reg_spec q = good_req("w0");
    q.transport = transport;
    snprintf(q.reason, sizeof(q.reason), "%s", reason);
    assert_rc(kvp_registry_validate(r, &q, inst, msg, msg_size), 0);
    msg[0] = '\0';
    int rc = kvp_registry_choose_transport(r, inst, cannot_map, msg, msg_size);
    free_registry(r);
    return rc;
}

/* choose_as() with evidence that the worker can map the segment. */
static int choose(const struct kvp_offer *offer, uint8_t transport, const char *reason,
                  struct kvp_registration *inst, char *msg, size_t msg_size)
{
    return choose_as(offer, transport, reason, NULL, inst, msg, msg_size);
}

static void test_transport_shm(void **state)
{
    (void)state;
    struct kvp_registration inst;
    char msg[512];

    assert_rc(choose(&offer_shm, KVP_REG_SHM, "", &inst, msg, sizeof(msg)), 0);
    assert_int_equal(inst.transport, KVP_REG_SHM);
    assert_string_equal(inst.reason, "");
}

/* A claim of shm without evidence that the worker can map the segment gets inline, with the
 * evidence's reason, not the worker's. */
static void test_transport_shm_claim_overruled(void **state)
{
    (void)state;
    struct kvp_registration inst;
    char msg[512];

    assert_rc(choose_as(&offer_shm, KVP_REG_SHM, "", "uid 65534 cannot open it", &inst, msg,
                        sizeof(msg)),
              0);
    assert_int_equal(inst.transport, KVP_REG_INLINE);
    assert_string_equal(inst.reason, "uid 65534 cannot open it");
    /* An inline request is not affected by the evidence. */
    assert_rc(choose_as(&offer_shm, KVP_REG_INLINE, "asked", "uid 65534 cannot open it", &inst, msg,
                        sizeof(msg)),
              0);
    assert_int_equal(inst.transport, KVP_REG_INLINE);
    assert_string_equal(inst.reason, "asked");
}

static void test_transport_shm_unavailable(void **state)
{
    (void)state;
    struct kvp_registration inst;
    char msg[512];

    assert_rc(choose(&offer_inline, KVP_REG_SHM, "", &inst, msg, sizeof(msg)), -EOPNOTSUPP);
    if (!strstr(msg, NO_SHM_REASON))
        fail_msg("message \"%s\" does not give the daemon's reason", msg);
}

static void test_transport_inline_keeps_reason(void **state)
{
    (void)state;
    struct kvp_registration inst;
    char msg[512];

    assert_rc(choose(&offer_shm, KVP_REG_INLINE, "cannot map segment: EACCES", &inst, msg,
                     sizeof(msg)),
              0);
    assert_int_equal(inst.transport, KVP_REG_INLINE);
    assert_string_equal(inst.reason, "cannot map segment: EACCES");

    /* Without a reason the instance still gets one for the log line. */
    assert_rc(choose(&offer_shm, KVP_REG_INLINE, "", &inst, msg, sizeof(msg)), 0);
    assert_int_equal(inst.transport, KVP_REG_INLINE);
    assert_true(inst.reason[0] != '\0');
}

static void test_transport_auto_is_inline(void **state)
{
    (void)state;
    struct kvp_registration inst;
    char msg[512];

    /* Auto never means shm: only a worker that says it mapped the segment gets shm. */
    assert_rc(choose(&offer_shm, KVP_REG_AUTO, "", &inst, msg, sizeof(msg)), 0);
    assert_int_equal(inst.transport, KVP_REG_INLINE);
    assert_true(inst.reason[0] != '\0');
}

/* Pickle (LMCache's transport, asked by its front end) is kept as asked, with its reason, or
 * the daemon's when it has no segment. */
static void test_transport_pickle(void **state)
{
    (void)state;
    struct kvp_registration inst;
    char msg[512];

    assert_rc(choose(&offer_shm, KVP_REG_PICKLE, "--shm-backend memfd", &inst, msg, sizeof(msg)),
              0);
    assert_int_equal(inst.transport, KVP_REG_PICKLE);
    assert_string_equal(inst.reason, "--shm-backend memfd");
    assert_string_equal(kvp_reg_transport_name(inst.transport), "pickle");
    assert_rc(choose(&offer_inline, KVP_REG_PICKLE, "", &inst, msg, sizeof(msg)), 0);
    assert_int_equal(inst.transport, KVP_REG_PICKLE);
    assert_string_equal(inst.reason, NO_SHM_REASON);
}

/* Envelope (LMCache 0.5.7's tensor envelope, asked by its front end) is kept as asked too, and
 * a transport beyond it is refused. */
static void test_transport_envelope(void **state)
{
    (void)state;
    struct kvp_registration inst;
    char msg[512];

    assert_rc(choose(&offer_shm, KVP_REG_ENVELOPE, "SHM disabled by configuration", &inst, msg,
                     sizeof(msg)),
              0);
    assert_int_equal(inst.transport, KVP_REG_ENVELOPE);
    assert_string_equal(inst.reason, "SHM disabled by configuration");
    assert_string_equal(kvp_reg_transport_name(inst.transport), "envelope");
    assert_true(kvp_reg_transport_in_band(KVP_REG_ENVELOPE));
    assert_true(kvp_reg_transport_in_band(KVP_REG_PICKLE));
    assert_false(kvp_reg_transport_in_band(KVP_REG_INLINE));
    assert_false(kvp_reg_transport_in_band(KVP_REG_SHM));
    assert_rc(choose(&offer_inline, KVP_REG_ENVELOPE, "", &inst, msg, sizeof(msg)), 0);
    assert_int_equal(inst.transport, KVP_REG_ENVELOPE);
    assert_string_equal(inst.reason, NO_SHM_REASON);

    struct kvp_registry *r = new_registry(&offer_shm);
    struct kvp_reg_spec q = good_req("w5");
    q.transport = KVP_REG_ENVELOPE;
    assert_rc(kvp_registry_validate(r, &q, &inst, msg, sizeof(msg)), 0);
    q.transport = KVP_REG_ENVELOPE + 1;
    expect_invalid(r, &q, "4 (envelope)");
    free_registry(r);
}

/* An instance on shm whose worker could not map the segment after all moves to pickle, once,
 * and only at its owner's request. */
static void test_leave_shm(void **state)
{
    (void)state;
    struct kvp_registry *r = new_registry(&offer_shm);
    struct kvp_reg_spec q = good_req("w0");
    struct kvp_registration inst, got;
    char msg[512];
    bool existing;
    uint32_t total, shm;

    q.transport = KVP_REG_SHM;
    assert_rc(kvp_registry_validate(r, &q, &inst, msg, sizeof(msg)), 0);
    assert_rc(kvp_registry_choose_transport(r, &inst, NULL, msg, sizeof(msg)), 0);
    inst.owner = 7;
    assert_rc(kvp_registry_add(r, &inst, 0, &existing, msg, sizeof(msg)), 0);
    kvp_registry_count_transports(r, &total, &shm);
    assert_int_equal(shm, 1);
    assert_rc(kvp_registry_leave_shm(r, inst.handle, 8, KVP_REG_PICKLE, "x"), -ENOENT);
    assert_rc(kvp_registry_leave_shm(r, inst.handle, 7, KVP_REG_PICKLE, "could not map"), 1);
    assert_rc(kvp_registry_leave_shm(r, inst.handle, 7, KVP_REG_PICKLE, "again"), 0);
    assert_rc(kvp_registry_get(r, inst.handle, &got), 0);
    assert_int_equal(got.transport, KVP_REG_PICKLE);
    assert_string_equal(got.reason, "could not map");
    kvp_registry_count_transports(r, &total, &shm);
    assert_int_equal(total, 1);
    assert_int_equal(shm, 0);
    free_registry(r);
}

static void test_transport_daemon_without_shm(void **state)
{
    (void)state;
    struct kvp_registration inst;
    char msg[512];

    assert_rc(choose(&offer_inline, KVP_REG_INLINE, "", &inst, msg, sizeof(msg)), 0);
    assert_int_equal(inst.transport, KVP_REG_INLINE);
    assert_string_equal(inst.reason, NO_SHM_REASON);

    assert_rc(choose(&offer_inline, KVP_REG_AUTO, "", &inst, msg, sizeof(msg)), 0);
    assert_int_equal(inst.transport, KVP_REG_INLINE);
    assert_string_equal(inst.reason, NO_SHM_REASON);

    /* The daemon's reason is the real one, whatever the worker says. */
    assert_rc(choose(&offer_inline, KVP_REG_INLINE, "requested by worker", &inst, msg, sizeof(msg)),
              0);
    assert_string_equal(inst.reason, NO_SHM_REASON);
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
        cmocka_unit_test(test_transport_shm_claim_overruled),
        cmocka_unit_test(test_transport_shm_unavailable),
        cmocka_unit_test(test_transport_inline_keeps_reason),
        cmocka_unit_test(test_transport_auto_is_inline),
        cmocka_unit_test(test_transport_daemon_without_shm),
        cmocka_unit_test(test_transport_pickle),
        cmocka_unit_test(test_transport_envelope),
        cmocka_unit_test(test_leave_shm),
    };
    return cmocka_run_group_tests(tests, quiet_log, NULL);
}
