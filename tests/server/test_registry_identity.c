/*
 * test_registry_identity.c - instance identity in the registry (src/server/core/registry.h): an
 * instance id names one registration of one connection. A namesake with any other identity
 * field is refused with -EEXIST naming the field, an identical one from another connection with
 * -EBUSY naming its pid, the owning connection gets its registration back, and keys come only
 * from the caller's own registration.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_assert.h"
#include "registry_fixture.h"

/* The registration of handle h is still good_req(id)'s, owned by connection 1. */
static void expect_unchanged(struct kvp_registry *r, uint32_t h, const char *id)
{
    struct kvp_registration got;
    struct kvp_reg_spec q = good_req(id);
    assert_int_equal(kvp_registry_count(r), 1);
    assert_rc(kvp_registry_get(r, h, &got), 0);
    assert_int_equal(got.owner, 1);
    assert_int_equal(got.owner_pid, PID_OF(1));
    assert_string_equal(got.spec.instance_id, id);
    assert_string_equal(got.spec.model_name, q.model_name);
    assert_string_equal(got.spec.dtype, q.dtype);
    assert_int_equal(got.spec.world_size, q.world_size);
    assert_int_equal(got.spec.worker_rank, q.worker_rank);
    assert_int_equal(got.spec.block_size, q.block_size);
    assert_int_equal(got.spec.num_layers, q.num_layers);
    assert_int_equal(got.spec.hidden_dim, q.hidden_dim);
    assert_int_equal(got.spec.use_mla, q.use_mla);
    assert_int_equal(got.transport, KVP_REG_SHM);
    assert_int_equal(got.layout.bytes, 2ull * 32 * 256 * 1024 * 2);
}

/* One identity field changed, and the message the refusal must carry. */
struct namesake {
    const char *field;
    void (*change)(struct kvp_reg_spec *q);
    const char *msg;
};

static void other_model(struct kvp_reg_spec *q)
{
    snprintf(q->model_name, sizeof(q->model_name), "mistral-7b");
}
static void other_dtype(struct kvp_reg_spec *q)
{
    snprintf(q->dtype, sizeof(q->dtype), "float16");
}
static void other_world(struct kvp_reg_spec *q)
{
    q->world_size = 4;
}
static void other_rank(struct kvp_reg_spec *q)
{
    q->worker_rank = 0;
}
static void other_block(struct kvp_reg_spec *q)
{
    q->block_size = 32;
}
static void other_layers(struct kvp_reg_spec *q)
{
    q->num_layers = 40;
}
static void other_hidden(struct kvp_reg_spec *q)
{
    q->hidden_dim = 4096;
}
static void other_mla(struct kvp_reg_spec *q)
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
    struct kvp_reg_spec q = good_req("rank0");
    bool existing;
    char msg[512];

    uint32_t h = must_add(r, 1, &q, &existing, NULL);
    assert_false(existing);
    for (size_t i = 0; i < sizeof(namesakes) / sizeof(namesakes[0]); i++) {
        for (uint64_t owner = 1; owner <= 2; owner++) {
            struct kvp_reg_spec q2 = good_req("rank0");
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
    struct kvp_reg_spec all = good_req("rank0");
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
    struct kvp_reg_spec q = good_req("rank0");
    struct kvp_registration got;
    bool existing;
    char msg[512], want[128];

    uint32_t h = must_add(r, 1, &q, &existing, NULL);
    existing = true;
    assert_rc(try_add(r, 2, &q, &existing, NULL, msg, sizeof(msg)), -EBUSY);
    assert_false(existing);
    snprintf(want, sizeof(want), "instance id rank0 in use by another connection, pid %d",
             (int)PID_OF(1));
    assert_string_equal(msg, want);
    expect_unchanged(r, h, "rank0");

    /* Another transport is no identity: still busy, still unchanged. */
    struct kvp_reg_spec inl = good_req("rank0");
    inl.transport = KVP_REG_INLINE;
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
    uint32_t h2 = must_add(r, 2, &q, &existing, &got);
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
    struct kvp_reg_spec q = good_req("rank0");
    struct kvp_registration second;
    bool existing;

    uint32_t h = must_add(r, 1, &q, &existing, NULL);
    assert_false(existing);
    struct kvp_reg_spec q2 = good_req("rank0");
    q2.transport = KVP_REG_INLINE;
    snprintf(q2.reason, sizeof(q2.reason), "requested by worker");
    existing = false;
    assert_int_equal(must_add(r, 1, &q2, &existing, &second), h);
    assert_true(existing);
    assert_int_equal(second.owner, 1);
    assert_int_equal(second.transport, KVP_REG_SHM);
    assert_string_equal(second.spec.model_name, "llama-3-8b");
    expect_unchanged(r, h, "rank0");
    assert_int_equal(kvp_registry_remove_owner(r, 1), 1);
    assert_int_equal(kvp_registry_count(r), 0);
    free_registry(r);
}

/* Seeds of the key chain, as handlers.c derives them from a handle. */
static void seed_of(struct kvp_registry *r, uint32_t h, uint64_t owner, const char *salt,
                    uint8_t seed[KVP_KEY_SIZE])
{
    struct kvp_registration inst;
    struct kvp_key_ns ns;
    assert_rc(kvp_registry_get_owned(r, h, owner, &inst), 0);
    kvp_registration_key_ns(&inst, salt, (uint32_t)strlen(salt), &ns);
    assert_rc(kvp_key_seed(&ns, seed), 0);
}

/* The key namespace comes from the caller's own registration: a refused namesake has no handle
 * of its own, cannot use the owner's, and its own registration under another id keys apart. */
static void test_keys_from_own_registration(void **state)
{
    (void)state;
    struct kvp_registry *r = new_registry(&offer_shm);
    struct kvp_reg_spec llama = good_req("rank0"), mistral = good_req("rank0");
    struct kvp_registration inst;
    struct kvp_key_ns ns;
    bool existing;
    char msg[512];
    uint8_t a[KVP_KEY_SIZE], a2[KVP_KEY_SIZE], b[KVP_KEY_SIZE], a_salted[KVP_KEY_SIZE];

    other_model(&mistral);
    other_layers(&mistral);
    uint32_t ha = must_add(r, 1, &llama, &existing, NULL);
    assert_rc(try_add(r, 2, &mistral, &existing, &inst, msg, sizeof(msg)), -EEXIST);
    assert_rc(kvp_registry_get_owned(r, ha, 2, &inst), -ENOENT);

    snprintf(mistral.instance_id, sizeof(mistral.instance_id), "rank0-mistral");
    uint32_t hb = must_add(r, 2, &mistral, &existing, NULL);
    assert_rc(kvp_registry_get_owned(r, hb, 1, &inst), -ENOENT);

    /* Every namespace field is the handle's registration's. */
    assert_rc(kvp_registry_get_owned(r, hb, 2, &inst), 0);
    kvp_registration_key_ns(&inst, "s", 1, &ns);
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
    struct kvp_reg_spec m0 = good_req("mla0"), m1 = good_req("mla1");
    m0.use_mla = m1.use_mla = 1;
    m0.worker_rank = 0;
    uint32_t h0 = must_add(r, 1, &m0, &existing, NULL), h1 = must_add(r, 2, &m1, &existing, NULL);
    seed_of(r, h0, 1, "", a);
    seed_of(r, h1, 2, "", b);
    assert_memory_equal(a, b, KVP_KEY_SIZE);
    free_registry(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_namesake_refused_per_field),
        cmocka_unit_test(test_namesake_other_connection_busy),
        cmocka_unit_test(test_same_connection_returns_existing),
        cmocka_unit_test(test_keys_from_own_registration),
    };
    return cmocka_run_group_tests(tests, quiet_log, NULL);
}
