/*
 * test_shm_name.c - normalisation of the shared-memory segment name (shm_name.c).
 */
#include <errno.h>
#include <string.h>

#include "common/kvp_assert.h"
#include "common/shm_name.h"

#define NAME_MAX_LEN 127

static char out[256];

static int norm(const char *name)
{
    memset(out, '#', sizeof(out));
    return kvp_shm_name_normalize(name, out, sizeof(out));
}

static void test_prefix_added(void **state)
{
    (void)state;
    assert_rc(norm("/x"), 0);
    assert_string_equal(out, "kvpool_l1_pool_x");
    assert_rc(norm("x"), 0);
    assert_string_equal(out, "kvpool_l1_pool_x");
    assert_rc(norm("prod-pool.1"), 0);
    assert_string_equal(out, "kvpool_l1_pool_prod-pool.1");
}

static void test_prefix_kept(void **state)
{
    (void)state;
    assert_rc(norm("kvpool_l1_pool_abc"), 0);
    assert_string_equal(out, "kvpool_l1_pool_abc");
    assert_rc(norm("/kvpool_l1_pool_abc"), 0);
    assert_string_equal(out, "kvpool_l1_pool_abc");
    /* A partial prefix is not the prefix. */
    assert_rc(norm("kvpool_l1_abc"), 0);
    assert_string_equal(out, "kvpool_l1_pool_kvpool_l1_abc");
}

static void test_rejected(void **state)
{
    (void)state;
    assert_rc(norm(NULL), -EINVAL);
    assert_rc(norm(""), -EINVAL);
    assert_rc(norm("/"), -EINVAL);
    assert_rc(norm("//"), -EINVAL);
    assert_rc(norm("//x"), -EINVAL);
    assert_rc(norm("a/b"), -EINVAL);
    assert_rc(norm("/a/"), -EINVAL);
    assert_rc(norm("a\nb"), -EINVAL);
    assert_rc(norm("a\x7f"), -EINVAL);
}

static void test_too_long(void **state)
{
    (void)state;
    char name[300];
    size_t room = NAME_MAX_LEN - strlen(KVP_SHM_PREFIX);

    /* Just fits 127 bytes with the prefix added. */
    memset(name, 'a', room);
    name[room] = '\0';
    assert_rc(norm(name), 0);
    assert_int_equal(strlen(out), NAME_MAX_LEN);
    /* One more byte does not. */
    name[room] = 'a';
    name[room + 1] = '\0';
    assert_rc(norm(name), -ENAMETOOLONG);

    /* Already prefixed: 127 is fine, 128 is not. */
    memset(name, 'b', sizeof(name));
    memcpy(name, KVP_SHM_PREFIX, strlen(KVP_SHM_PREFIX));
    name[NAME_MAX_LEN] = '\0';
    assert_rc(norm(name), 0);
    name[NAME_MAX_LEN] = 'b';
    name[NAME_MAX_LEN + 1] = '\0';
    assert_rc(norm(name), -ENAMETOOLONG);

    /* An output buffer too small for the result. */
    char small[8];
    assert_rc(kvp_shm_name_normalize("x", small, sizeof(small)), -ENAMETOOLONG);
}

static void test_default_name(void **state)
{
    (void)state;
    char small[10];

    assert_rc(kvp_shm_name_default(4242, out, sizeof(out)), 0);
    assert_string_equal(out, "kvpool_l1_pool_4242");
    assert_rc(kvp_shm_name_default(1, out, sizeof(out)), 0);
    assert_string_equal(out, "kvpool_l1_pool_1");
    /* The default name is itself normal. */
    char again[256];
    assert_rc(kvp_shm_name_normalize(out, again, sizeof(again)), 0);
    assert_string_equal(again, out);
    assert_rc(kvp_shm_name_default(4242, small, sizeof(small)), -ENAMETOOLONG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_added), cmocka_unit_test(test_prefix_kept),
        cmocka_unit_test(test_rejected),     cmocka_unit_test(test_too_long),
        cmocka_unit_test(test_default_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
