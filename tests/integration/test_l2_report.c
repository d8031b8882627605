/*
 * test_l2_report.c - what the HTTP endpoint says about the L2 tier: the "l2" object of
 * /api/status (state "up", "down" or "auth_failed", and the reason in words while it is not
 * up) and the health check, which stays 200 "healthy" (a liveness probe must not restart a
 * daemon that serves from L1) but says that it is degraded, and why. Redis is killed and
 * restarted under a running daemon; a fake server refuses the password.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/kvp_assert.h"
#include "fake_redis.h"
#include "harness.h"
#include "http_client.h"
#include "redis_fixture.h"

/* GET /api/status's "l2" object (a new reference). */
static json_t *l2_of(uint16_t port)
{
    int status = 0;
    json_t *st = kvpt_http_json(port, "/api/status", &status);
    assert_non_null(st);
    assert_int_equal(status, 200);
    json_t *l2 = json_object_get(st, "l2");
    assert_true(json_is_object(l2));
    json_incref(l2);
    json_decref(st);
    return l2;
}

/* Polls /api/status until l2.state is want (up to 15 s); returns the "l2" object. */
static json_t *wait_state(uint16_t port, const char *want)
{
    json_t *l2 = NULL;
    for (int i = 0; i < 150; i++) {
        json_decref(l2);
        l2 = l2_of(port);
        if (strcmp(json_string_value(json_object_get(l2, "state")), want) == 0)
            return l2;
        kvpt_sleep_ms(100);
    }
    fail_msg("l2.state is still %s, not %s", json_string_value(json_object_get(l2, "state")), want);
    return NULL;
}

/* The health check: always 200 "healthy"; *reason the first degraded reason or NULL. */
static json_t *health(uint16_t port, const char **reason)
{
    int status = 0;
    json_t *h = kvpt_http_json(port, "/api/healthcheck", &status);
    assert_non_null(h);
    assert_int_equal(status, 200);
    assert_string_equal(json_string_value(json_object_get(h, "status")), "healthy");
    json_t *reasons = json_object_get(h, "reasons");
    *reason = NULL;
    if (json_is_true(json_object_get(h, "degraded"))) {
        assert_true(json_is_array(reasons));
        assert_int_equal(json_array_size(reasons), 1);
        *reason = json_string_value(json_array_get(reasons, 0));
        assert_non_null(*reason);
    } else {
        /* Exactly LMCache's answer when nothing is degraded. */
        assert_int_equal(json_object_size(h), 1);
    }
    return h;
}

static void test_down_and_up(void **state)
{
    (void)state;
    struct kvpt_redis r = {0};
    struct kvpt_daemon d;
    const char *why;
    kvpt_redis_start(&r, true);
    const char *args[] = {"--chunk-size", "16",           "--l2", r.url, "--http",
                          "127.0.0.1:0",  "--l2-timeout", "500",  NULL};
    kvpt_daemon_start(&d, args);
    uint16_t port = kvpt_http_port_in_log(d.log, 5000);
    assert_true(port > 0);

    json_t *l2 = wait_state(port, "up");
    assert_true(json_is_true(json_object_get(l2, "up")));
    assert_true(json_is_null(json_object_get(l2, "reason")));
    json_decref(l2);
    json_decref(health(port, &why));
    assert_null(why);

    kvpt_redis_kill(&r);
    l2 = wait_state(port, "down");
    assert_true(json_is_false(json_object_get(l2, "up")));
    const char *reason = json_string_value(json_object_get(l2, "reason"));
    assert_non_null(reason);
    assert_true(strlen(reason) > 0);
    json_t *h = health(port, &why);
    assert_non_null(why);
    assert_true(strncmp(why, "l2 down: ", 9) == 0);
    json_decref(h);
    json_decref(l2);

    kvpt_redis_restart(&r);
    json_decref(wait_state(port, "up"));
    json_decref(health(port, &why));
    assert_null(why);
    kvpt_daemon_stop(&d);
    kvpt_redis_stop(&r);
}

static void test_auth_failed(void **state)
{
    (void)state;
    struct kvpt_fake_redis f = {0};
    struct kvpt_daemon d;
    char url[256];
    const char *why;
    assert_rc(kvpt_fake_redis_start(&f, KVPT_FAKE_WRONGPASS), 0);
    snprintf(url, sizeof(url), "unix://:wr0ngpw@%s", f.path);
    const char *args[] = {"--chunk-size", "16", "--l2", url, "--http", "127.0.0.1:0", NULL};
    kvpt_daemon_start(&d, args);
    uint16_t port = kvpt_http_port_in_log(d.log, 5000);
    assert_true(port > 0);

    json_t *l2 = wait_state(port, "auth_failed");
    const char *reason = json_string_value(json_object_get(l2, "reason"));
    assert_non_null(reason);
    assert_non_null(strstr(reason, "WRONGPASS"));
    assert_null(strstr(reason, "wr0ngpw"));
    json_t *h = health(port, &why);
    assert_non_null(why);
    assert_true(strncmp(why, "l2 auth_failed: ", 16) == 0);
    json_decref(h);
    json_decref(l2);
    assert_int_equal(kvpt_log_count(&d, "authentication failed"), 1);
    kvpt_daemon_stop(&d);
    kvpt_fake_redis_stop(&f);
}

int main(void)
{
    kvpt_redis_require();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_down_and_up),
        cmocka_unit_test(test_auth_failed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
