/*
 * test_config_l2.c - the L2 tier's options (--l2, --l2-password-file, --l2-ttl,
 * --l2-connections, --l2-queue, --l2-timeout): defaults, values from the command line and the
 * environment, and errors that never show a password of the URL.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/config.h"
#include "common/kvp_assert.h"
#include "config_fixture.h"

static void test_defaults(void **state)
{
    (void)state;
    struct run r;
    parse(&r, NULL);
    expect_ok(&r);
    assert_string_equal(r.cfg.l2_url, "");
    assert_string_equal(r.cfg.l2_password_file, "");
    assert_int_equal(r.cfg.l2_ttl_s, 0);
    assert_int_equal(r.cfg.l2_connections, 2);
    assert_int_equal(r.cfg.l2_queue_bytes, 256ull << 20);
    assert_int_equal(r.cfg.l2_timeout_ms, 1000);
    run_free(&r);
}

static void test_values(void **state)
{
    (void)state;
    struct run r;
    parse(&r, "--l2", "redis-cluster://a:7000,b:7001", "--l2-ttl", "3600", "--l2-connections", "8",
          "--l2-queue", "1GiB", "--l2-timeout", "250", "--l2-password-file", "/etc/kv/pw", NULL);
    expect_ok(&r);
    assert_string_equal(r.cfg.l2_url, "redis-cluster://a:7000,b:7001");
    assert_int_equal(r.cfg.l2_ttl_s, 3600);
    assert_int_equal(r.cfg.l2_connections, 8);
    assert_int_equal(r.cfg.l2_queue_bytes, 1ull << 30);
    assert_int_equal(r.cfg.l2_timeout_ms, 250);
    assert_string_equal(r.cfg.l2_password_file, "/etc/kv/pw");
    run_free(&r);

    parse(&r, "--l2", "redis://h:1", "--l2", "off", NULL);
    expect_ok(&r);
    assert_string_equal(r.cfg.l2_url, "");
    run_free(&r);

    setenv("KVPOOL_L2", "unix:///run/redis.sock?db=1", 1);
    setenv("KVPOOL_L2_CONNECTIONS", "3", 1);
    parse(&r, NULL);
    expect_ok(&r);
    assert_string_equal(r.cfg.l2_url, "unix:///run/redis.sock?db=1");
    assert_int_equal(r.cfg.l2_connections, 3);
    run_free(&r);
    unsetenv("KVPOOL_L2");
    unsetenv("KVPOOL_L2_CONNECTIONS");
}

static void test_errors_hide_the_password(void **state)
{
    (void)state;
    struct run r;
    parse(&r, "--l2", "rediss://user:s3cret@h:1", NULL);
    expect_einval(&r, "invalid l2 URL", "command line", "unknown scheme", NULL);
    assert_null(strstr(r.err, "s3cret"));
    run_free(&r);

    parse(&r, "--l2", "redis://user:s3cret@h:99999", NULL);
    expect_einval(&r, "invalid l2 URL", "bad port", NULL);
    assert_null(strstr(r.err, "s3cret"));
    run_free(&r);

    setenv("KVPOOL_L2", "redis://:s3cret@h:1/x", 1);
    parse(&r, NULL);
    expect_einval(&r, "invalid l2 URL", "KVPOOL_L2", "database", NULL);
    assert_null(strstr(r.err, "s3cret"));
    run_free(&r);

    /* Overridden by the command line: only noted, and still not shown. */
    parse(&r, "--l2", "redis://h:1", NULL);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.err, "ignoring invalid KVPOOL_L2"));
    assert_null(strstr(r.err, "s3cret"));
    run_free(&r);
    unsetenv("KVPOOL_L2");
}

static void test_limits(void **state)
{
    (void)state;
    struct run r;
    parse(&r, "--l2-connections", "0", NULL);
    expect_einval(&r, "l2-connections", "1 to 64", NULL);
    run_free(&r);
    parse(&r, "--l2-connections", "65", NULL);
    expect_einval(&r, "l2-connections", NULL);
    run_free(&r);
    parse(&r, "--l2-timeout", "5", NULL);
    expect_einval(&r, "l2-timeout", NULL);
    run_free(&r);
    parse(&r, "--l2-queue", "lots", NULL);
    expect_einval(&r, "l2-queue", NULL);
    run_free(&r);
    parse(&r, "--l2-ttl", "-1", NULL);
    expect_einval(&r, "l2-ttl", NULL);
    run_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_defaults, clean_env, clean_env),
        cmocka_unit_test_setup_teardown(test_values, clean_env, clean_env),
        cmocka_unit_test_setup_teardown(test_errors_hide_the_password, clean_env, clean_env),
        cmocka_unit_test_setup_teardown(test_limits, clean_env, clean_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
