/*
 * kvp_assert.h - assertions for kvpool tests on top of cmocka.
 *
 * cmocka prints integers in hex, which makes -EINVAL read as 0xffffffffffffffea. assert_rc()
 * compares return codes and prints both sides in decimal with the expressions and file:line.
 */
#ifndef KVP_TEST_ASSERT_H
#define KVP_TEST_ASSERT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#define assert_rc(actual, expected)                                                         \
    do {                                                                                    \
        long long kvp_a_ = (long long)(actual), kvp_e_ = (long long)(expected);             \
        if (kvp_a_ != kvp_e_)                                                               \
            fail_msg("%s is %lld, expected %s = %lld", #actual, kvp_a_, #expected, kvp_e_); \
    } while (0)

#endif /* KVP_TEST_ASSERT_H */
