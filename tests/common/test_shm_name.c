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
    char small[10], other[256];

    assert_rc(kvp_shm_name_random(4242, out, sizeof(out)), 0);
    assert_int_equal(strlen(out), strlen("kvpool_l1_pool_4242_") + KVP_SHM_NAME_RANDOM_HEX);
    assert_memory_equal(out, "kvpool_l1_pool_4242_", strlen("kvpool_l1_pool_4242_"));
    assert_true(kvp_shm_name_is_default(out));
    /* Nobody can predict it: two draws differ (by chance once in 2^64). */
    assert_rc(kvp_shm_name_random(4242, other, sizeof(other)), 0);
    assert_string_not_equal(out, other);
    /* The default name is itself normal. */
    char again[256];
    assert_rc(kvp_shm_name_normalize(out, again, sizeof(again)), 0);
    assert_string_equal(again, out);
    assert_rc(kvp_shm_name_random(4242, small, sizeof(small)), -ENAMETOOLONG);
}

static void test_default_name_form(void **state)
{
    (void)state;
    assert_true(kvp_shm_name_is_default("kvpool_l1_pool_4242"));
    assert_true(kvp_shm_name_is_default("kvpool_l1_pool_1_0123456789abcdef"));
    assert_false(kvp_shm_name_is_default("kvpool_l1_pool_"));
    assert_false(kvp_shm_name_is_default("kvpool_l1_pool_named"));
    assert_false(kvp_shm_name_is_default("kvpool_l1_pool_1_0123456789ABCDEF"));
    assert_false(kvp_shm_name_is_default("kvpool_l1_pool_1_0123456789abcde"));
    assert_false(kvp_shm_name_is_default("kvpool_l1_pool_1_0123456789abcdef0"));
    assert_false(kvp_shm_name_is_default("kvpool_l1_pool_1_"));
    assert_false(kvp_shm_name_is_default("other_4242"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_added), cmocka_unit_test(test_prefix_kept),
        cmocka_unit_test(test_rejected),     cmocka_unit_test(test_too_long),
        cmocka_unit_test(test_default_name), cmocka_unit_test(test_default_name_form),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
