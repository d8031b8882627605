/*
 * test_registry_table.c - the registry's table of instances (src/server/core/registry.h): handles
 * are given out and looked up, a removed instance's handle stays stale even when its slot is
 * reused, closing a connection removes exactly its instances, and a full table refuses a new
 * instance with -ENOSPC while still answering the owner and refusing namesakes as usual.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_assert.h"
#include "registry_fixture.h"

static void test_add_and_get(void **state)
{
    (void)state;
    struct kvp_registry *r = new_registry(&offer_shm);
    struct kvp_reg_spec q = good_req("w0");
    struct kvp_registration got;
    bool existing = true;

    uint32_t h = must_add(r, 7, &q, &existing, NULL);
    assert_false(existing);
    assert_int_not_equal(h, 0);
    assert_int_equal(kvp_registry_count(r), 1);
    assert_rc(kvp_registry_get(r, h, &got), 0);
    assert_int_equal(got.handle, h);
    assert_int_equal(got.owner, 7);
    assert_string_equal(got.spec.instance_id, "w0");
    assert_int_equal(got.transport, KVP_REG_SHM);
    assert_int_equal(got.layout.bytes, 2ull * 32 * 256 * 1024 * 2);

    struct kvp_reg_spec q2 = good_req("w1");
    uint32_t h2 = must_add(r, 7, &q2, &existing, NULL);
    assert_false(existing);
    assert_int_not_equal(h2, h);
    assert_int_equal(kvp_registry_count(r), 2);
    assert_rc(kvp_registry_get(r, h2, &got), 0);
    assert_string_equal(got.spec.instance_id, "w1");

    /* Handles nobody was given. */
    assert_rc(kvp_registry_get(r, 0, &got), -ENOENT);
    assert_rc(kvp_registry_get(r, h + 0x10000u, &got), -ENOENT);           /* next generation */
    assert_rc(kvp_registry_get(r, (h & 0xffff0000u) | 5u, &got), -ENOENT); /* unused slot */
    assert_rc(kvp_registry_get(r, (h & 0xffff0000u) | 0xffffu, &got), -ENOENT);
    assert_rc(kvp_registry_get(r, 0xffffffffu, &got), -ENOENT);
    free_registry(r);
}

static void test_stale_handle(void **state)
{
    (void)state;
    struct kvp_registry *r = new_registry(&offer_shm);
    struct kvp_reg_spec q = good_req("w0");
    struct kvp_registration got;
    bool existing;

    uint32_t h = must_add(r, 1, &q, &existing, NULL);
    assert_rc(kvp_registry_remove(r, h, "test"), 0);
    assert_int_equal(kvp_registry_count(r), 0);
    assert_rc(kvp_registry_get(r, h, &got), -ENOENT);
    assert_rc(kvp_registry_remove(r, h, "test"), -ENOENT);

    /* A new instance takes the freed slot but gets a different handle. */
    struct kvp_reg_spec q2 = good_req("w1");
    uint32_t h2 = must_add(r, 1, &q2, &existing, NULL);
    assert_false(existing);
    assert_int_equal(h2 & 0xffffu, h & 0xffffu);
    assert_int_not_equal(h2, h);
    assert_rc(kvp_registry_get(r, h, &got), -ENOENT);
    assert_rc(kvp_registry_remove(r, h, "test"), -ENOENT);
    assert_int_equal(kvp_registry_count(r), 1);
    assert_rc(kvp_registry_get(r, h2, &got), 0);
    assert_string_equal(got.spec.instance_id, "w1");

    /* The same id registered again after removal is a new registration. */
    assert_rc(kvp_registry_remove(r, h2, "test"), 0);
    uint32_t h3 = must_add(r, 1, &q2, &existing, NULL);
    assert_false(existing);
    assert_int_not_equal(h3, h2);
    assert_int_not_equal(h3, h);
    free_registry(r);
}

static void test_remove_owner(void **state)
{
    (void)state;
    struct kvp_registry *r = new_registry(&offer_shm);
    struct kvp_registration got;
    bool existing;
    struct kvp_reg_spec qa = good_req("a"), qb = good_req("b"), qc = good_req("c"),
                        qd = good_req("d");

    uint32_t ha = must_add(r, 10, &qa, &existing, NULL);
    uint32_t hc = must_add(r, 20, &qc, &existing, NULL);
    uint32_t hb = must_add(r, 10, &qb, &existing, NULL);
    uint32_t hd = must_add(r, 30, &qd, &existing, NULL);
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
    struct kvp_registration inst;
    char msg[512];
    bool existing;
    uint32_t first = 0;

    for (int i = 0; i < KVP_MAX_INSTANCES; i++) {
        char id[32];
        snprintf(id, sizeof(id), "w%d", i);
        struct kvp_reg_spec q = good_req(id);
        uint32_t h = must_add(r, 1, &q, &existing, NULL);
        if (i == 0)
            first = h;
    }
    assert_int_equal(kvp_registry_count(r), KVP_MAX_INSTANCES);

    struct kvp_reg_spec q = good_req("one-too-many");
    assert_rc(kvp_registry_validate(r, &q, &inst, msg, sizeof(msg)), 0);
    assert_rc(kvp_registry_choose_transport(r, &inst, NULL, msg, sizeof(msg)), 0);
    inst.owner = 1;
    inst.owner_pid = PID_OF(1);
    assert_rc(kvp_registry_add(r, &inst, 0, &existing, msg, sizeof(msg)), -ENOSPC);
    assert_non_null(strstr(msg, "too many instances"));
    assert_int_equal(kvp_registry_count(r), KVP_MAX_INSTANCES);

    /* When the table is full, the owner still gets its registration back, and a namesake
     * from another connection is still refused as busy, not as full. */
    struct kvp_reg_spec dup = good_req("w0");
    assert_int_equal(must_add(r, 1, &dup, &existing, NULL), first);
    assert_true(existing);
    assert_rc(try_add(r, 2, &dup, &existing, NULL, msg, sizeof(msg)), -EBUSY);
    dup.num_layers = 2;
    assert_rc(try_add(r, 2, &dup, &existing, NULL, msg, sizeof(msg)), -EEXIST);
    assert_non_null(strstr(msg, "num_layers"));

    /* Freeing one slot makes room again. */
    assert_rc(kvp_registry_remove(r, first, "test"), 0);
    assert_rc(kvp_registry_add(r, &inst, 0, &existing, msg, sizeof(msg)), 0);
    assert_false(existing);
    assert_int_equal(kvp_registry_count(r), KVP_MAX_INSTANCES);
    assert_int_equal(kvp_registry_remove_owner(r, 1), KVP_MAX_INSTANCES);
    assert_int_equal(kvp_registry_count(r), 0);
    free_registry(r);
}

/* Registers instance id of front end front for owner; returns kvp_registry_add()'s code. */
static int add_front(struct kvp_registry *r, uint64_t owner, const char *front, const char *id,
                     char *msg, size_t msg_size)
{
    struct kvp_registration inst;
    struct kvp_reg_spec q = good_req(id);
    bool existing;
    assert_rc(kvp_registry_validate(r, &q, &inst, msg, msg_size), 0);
    assert_rc(kvp_registry_choose_transport(r, &inst, NULL, msg, msg_size), 0);
    inst.owner = owner;
    inst.owner_pid = PID_OF(owner);
    snprintf(inst.frontend, sizeof(inst.frontend), "%s", front);
    return kvp_registry_add(r, &inst, 0, &existing, msg, msg_size);
}

/* Two front ends share the table: neither can take the other's reserve. */
static void test_frontend_share(void **state)
{
    (void)state;
    struct kvp_registry *r = new_registry(&offer_shm);
    char id[32], msg[512];
    uint32_t share = KVP_MAX_INSTANCES - KVP_REGISTRY_RESERVE;

    kvp_registry_share(r, 2);
    for (uint32_t i = 0; i < share; i++) {
        snprintf(id, sizeof(id), "l%u", i);
        assert_rc(add_front(r, 100 + i, "lmcache", id, msg, sizeof(msg)), 0);
    }
    assert_rc(add_front(r, 9000, "lmcache", "one-more", msg, sizeof(msg)), -EDQUOT);
    assert_non_null(strstr(msg, "the lmcache front end has 768 instances registered"));
    /* kvpool's own front end still has its reserve, up to the whole table. */
    for (uint32_t i = 0; i < KVP_REGISTRY_RESERVE; i++) {
        snprintf(id, sizeof(id), "k%u", i);
        assert_rc(add_front(r, 1, "kvpool", id, msg, sizeof(msg)), 0);
    }
    assert_int_equal(kvp_registry_count(r), KVP_MAX_INSTANCES);
    assert_rc(add_front(r, 1, "kvpool", "full", msg, sizeof(msg)), -ENOSPC);
    free_registry(r);

    /* One front end alone may fill the table. */
    r = new_registry(&offer_shm);
    kvp_registry_share(r, 1);
    for (uint32_t i = 0; i < KVP_MAX_INSTANCES; i++) {
        snprintf(id, sizeof(id), "k%u", i);
        assert_rc(add_front(r, 1 + i, "kvpool", id, msg, sizeof(msg)), 0);
    }
    free_registry(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_and_get),    cmocka_unit_test(test_stale_handle),
        cmocka_unit_test(test_remove_owner),   cmocka_unit_test(test_table_full),
        cmocka_unit_test(test_frontend_share),
    };
    return cmocka_run_group_tests(tests, quiet_log, NULL);
}
