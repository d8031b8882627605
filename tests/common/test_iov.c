/*
 * test_iov.c - kvp_iov_advance(): resuming gathered I/O after partial transfers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/iov.h"

static void test_partial_and_whole(void **state)
{
    (void)state;
    char a[4], b[6], c[3];
    struct iovec v[4] = {{a, 4}, {NULL, 0}, {b, 6}, {c, 3}};

    /* Nothing moved: a leading entry with bytes left stays first. */
    assert_int_equal(kvp_iov_advance(v, 4, 0, 0), 0);
    /* Part of the first entry. */
    assert_int_equal(kvp_iov_advance(v, 4, 0, 3), 0);
    assert_ptr_equal(v[0].iov_base, a + 3);
    assert_int_equal(v[0].iov_len, 1);
    /* The rest of it, the empty entry and 2 bytes of b. */
    assert_int_equal(kvp_iov_advance(v, 4, 0, 3), 2);
    assert_ptr_equal(v[2].iov_base, b + 2);
    assert_int_equal(v[2].iov_len, 4);
    /* Exactly to the end of b: the next entry is c, untouched. */
    assert_int_equal(kvp_iov_advance(v, 4, 2, 4), 3);
    assert_ptr_equal(v[3].iov_base, c);
    assert_int_equal(v[3].iov_len, 3);
    /* Everything. */
    assert_int_equal(kvp_iov_advance(v, 4, 3, 3), 4);
}

static void test_leading_empty_entries(void **state)
{
    (void)state;
    char a[2];
    struct iovec v[3] = {{NULL, 0}, {NULL, 0}, {a, 2}};
    assert_int_equal(kvp_iov_advance(v, 3, 0, 0), 2);
    struct iovec none[1] = {{NULL, 0}};
    assert_int_equal(kvp_iov_advance(none, 1, 0, 0), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_partial_and_whole),
        cmocka_unit_test(test_leading_empty_entries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
