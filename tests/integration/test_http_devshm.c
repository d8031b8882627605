/*
 * test_http_devshm.c - the SHM decision as the HTTP endpoint reports it, in a container-like
 * /dev/shm of 64 MiB (a private mount namespace, as test_small_devshm.c makes): a 1 GiB pool is
 * refused by the capacity gate, and /api/status names the gate's reason and the free space it
 * saw; a worker gets the inline transport and its row says why; /metrics agrees. Exit 77
 * (skipped) only when the namespace cannot be created.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/kvp_assert.h"
#include "harness.h"
#include "http_client.h"

static void test_gate_reason_in_status(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "1GiB", "--chunk-size", "16", "--http", "127.0.0.1:0", NULL};
    kvpt_daemon_start(&d, args);
    uint16_t port = kvpt_http_port_in_log(d.log, 5000);
    assert_true(port > 0);

    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts o = kvpt_layout("devshm-worker", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_rc(kvp_register(c, &o, &inst), 0);
    assert_int_equal(kvp_instance_get_info(inst)->transport, KVP_TRANSPORT_INLINE);

    int code;
    json_t *st = kvpt_http_json(port, "/api/status", &code);
    assert_int_equal(code, 200);
    assert_non_null(st);
    json_t *shm = json_object_get(st, "shm");
    assert_false(json_is_true(json_object_get(shm, "enabled")));
    assert_string_equal(json_string_value(json_object_get(shm, "backend")), "posix");
    assert_true(json_is_null(json_object_get(shm, "name")));
    char want[200];
    /* The segment (header page and pool) and its warm-restart index (a header page and 64
     * bytes per pool page), which --warm-restart on (the default) keeps beside it. */
    snprintf(want, sizeof(want),
             "SHM disabled: insufficient /dev/shm capacity (need %llu bytes, have %llu)",
             (1ull << 30) + 4096 + 4096 + ((1ull << 30) / 4096) * 64, 64ull << 20);
    assert_string_equal(json_string_value(json_object_get(shm, "disabled_reason")), want);
    assert_int_equal(json_integer_value(json_object_get(shm, "dev_shm_free_bytes")), 64ll << 20);
    json_t *inst0 = json_array_get(json_object_get(st, "instances"), 0);
    assert_string_equal(json_string_value(json_object_get(inst0, "instance_id")), "devshm-worker");
    assert_string_equal(json_string_value(json_object_get(inst0, "transport")), "inline");
    assert_string_equal(json_string_value(json_object_get(inst0, "fallback_reason")), want);
    json_decref(st);

    struct kvpt_http_reply r;
    int found;
    assert_rc(kvpt_http_request(port, "GET", "/metrics", &r), 0);
    assert_int_equal(r.status, 200);
    assert_true(kvpt_metric(r.body, "kvpool_shm_enabled", &found) == 0 && found);
    assert_true(kvpt_metric(r.body, "kvpool_instances{front_end=\"kvpool\",transport=\"inline\"}",
                            &found) == 1 &&
                found);
    assert_true(kvpt_metric(r.body, "kvpool_pool_capacity_bytes", &found) == (1ull << 30) && found);
    kvpt_http_free(&r);

    /* Healthy (a probe must not restart it), but degraded, with what to do about it. */
    assert_rc(kvpt_http_request(port, "GET", "/api/healthcheck", &r), 0);
    assert_int_equal(r.status, 200);
    json_error_t jerr;
    json_t *h = json_loads(r.body, 0, &jerr);
    assert_non_null(h);
    assert_string_equal(json_string_value(json_object_get(h, "status")), "healthy");
    assert_true(json_is_true(json_object_get(h, "degraded")));
    const char *why = json_string_value(json_array_get(json_object_get(h, "reasons"), 0));
    assert_non_null(why);
    assert_string_equal(why, "SHM disabled: /dev/shm has 64.0 MiB free, the pool needs 1.00 GiB: "
                             "give /dev/shm at least 1.00 GiB (docker run --shm-size; in "
                             "Kubernetes an emptyDir with medium Memory), or set --l1-size to at "
                             "most 63.0 MiB; workers copy their chunks through the socket");
    json_decref(h);
    kvpt_http_free(&r);
    /* The status says the same. */
    st = kvpt_http_json(port, "/api/status", &code);
    assert_non_null(st);
    json_t *health = json_object_get(st, "health");
    assert_true(json_is_true(json_object_get(health, "degraded")));
    const char *again = json_string_value(json_array_get(json_object_get(health, "reasons"), 0));
    assert_non_null(again);
    assert_non_null(strstr(again, "SHM disabled: /dev/shm has 64.0 MiB free"));
    assert_null(strstr(again + 1, "SHM disabled")); /* said once */
    json_decref(st);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

int main(void)
{
    if (kvpt_private_devshm("size=64m,mode=1777") != 0)
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gate_reason_in_status),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
