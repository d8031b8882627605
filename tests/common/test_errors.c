/*
 * test_errors.c - return-code names and texts (src/common/errors.c): kvpool's own codes from the
 * KVP_ERRNO_MAP table, errno values from the C library, unknown codes formatted, from any thread.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "common/errors.h"

static void test_kvpool_codes(void **state)
{
    (void)state;
#define CHECK_CODE(name, val, msg)                         \
    assert_string_equal(kvp_err_name(val), "KVP_E" #name); \
    assert_string_equal(kvp_strerror(val), msg);           \
    assert_true(-(val) > 4095); /* outside the errno range */
    KVP_ERRNO_MAP(CHECK_CODE)
#undef CHECK_CODE
    assert_string_equal(kvp_err_name(KVP_EPEER), "KVP_EPEER");
}

static void test_errno_codes(void **state)
{
    (void)state;
    assert_string_equal(kvp_err_name(-EINVAL), "EINVAL");
    assert_string_equal(kvp_err_name(-ENOSPC), "ENOSPC");
    assert_string_equal(kvp_err_name(-EPERM), "EPERM");
    assert_string_equal(kvp_strerror(-ENOENT), "No such file or directory");
    assert_string_equal(kvp_err_name(0), "OK");
    assert_string_equal(kvp_err_name(5), "OK");
    assert_string_equal(kvp_strerror(0), "success");
}

static void test_unknown_codes(void **state)
{
    (void)state;
    assert_string_equal(kvp_err_name(-9999), "E9999");
    assert_string_equal(kvp_strerror(-9999), "unknown error -9999");
    assert_non_null(kvp_err_name(-2147483647 - 1));
    assert_non_null(kvp_strerror(-2147483647 - 1));
}

/* Each thread gets its own buffer for unknown codes. */
static void *name_in_thread(void *arg)
{
    (void)arg;
    return (void *)(strcmp(kvp_err_name(-9998), "E9998") == 0 ? "ok" : NULL);
}

static void test_threads(void **state)
{
    (void)state;
    pthread_t t;
    void *res = NULL;
    const char *mine = kvp_err_name(-9997);
    assert_int_equal(pthread_create(&t, NULL, name_in_thread, NULL), 0);
    assert_int_equal(pthread_join(t, &res), 0);
    assert_non_null(res);
    assert_string_equal(mine, "E9997");
}

static void test_version(void **state)
{
    (void)state;
    uint32_t v = kvp_version();
    assert_int_equal(v >> 16, KVP_VERSION_MAJOR);
    assert_int_equal((v >> 8) & 0xff, KVP_VERSION_MINOR);
    assert_int_equal(v & 0xff, KVP_VERSION_PATCH);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kvpool_codes),  cmocka_unit_test(test_errno_codes),
        cmocka_unit_test(test_unknown_codes), cmocka_unit_test(test_threads),
        cmocka_unit_test(test_version),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
