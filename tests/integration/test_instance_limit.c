/*
 * test_instance_limit.c - the per-client limit on registered instances (--max-instances-per-
 * client, KVPOOL_MAX_INSTANCES_PER_CLIENT) through the real kvpoold: one client cannot take
 * the whole instance table. The registration beyond the limit is refused with EDQUOT and a
 * message naming the limit and the option; the client's other instances keep working, another
 * client still registers, and an unregistered instance makes room again.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"

/* Registers instance "<prefix>-<i>" on c; returns kvp_register()'s result. */
static int reg(kvp_client *c, const char *prefix, int i, kvp_instance **out)
{
    char id[64];
    snprintf(id, sizeof(id), "%s-%d", prefix, i);
    kvp_register_opts o = kvpt_layout(id, KVP_TRANSPORT_AUTO);
    return kvp_register(c, &o, out);
}

/* The default (64): a client registers 64 instances, not 65; another client still can. */
static void test_default_limit(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "16MiB", "--chunk-size", "16", NULL};
    kvpt_daemon_start(&d, args);

    kvp_client *a = kvpt_connect(&d), *b = kvpt_connect(&d);
    kvp_instance *inst[65] = {0}, *other = NULL;
    for (int i = 0; i < 64; i++)
        assert_int_equal(reg(a, "a", i, &inst[i]), 0);
    assert_int_equal(reg(a, "a", 64, &inst[64]), -EDQUOT);
    assert_non_null(strstr(kvp_last_error(a), "64"));
    assert_non_null(strstr(kvp_last_error(a), "--max-instances-per-client"));
    assert_int_equal(reg(b, "b", 0, &other), 0);
    assert_int_equal(kvpt_stat(a, "instances"), 65);

    kvp_client_close(a);
    kvp_client_close(b);
    kvpt_daemon_stop(&d);
}

/* A limit of 3 from the environment: the fourth is refused until one of the three goes. */
static void test_limit_from_env(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "16MiB", "--chunk-size", "16", NULL};
    setenv("KVPOOL_MAX_INSTANCES_PER_CLIENT", "3", 1);
    kvpt_daemon_start(&d, args);
    unsetenv("KVPOOL_MAX_INSTANCES_PER_CLIENT");

    kvp_client *a = kvpt_connect(&d);
    kvp_instance *inst[4] = {0};
    for (int i = 0; i < 3; i++)
        assert_int_equal(reg(a, "w", i, &inst[i]), 0);
    assert_int_equal(reg(a, "w", 3, &inst[3]), -EDQUOT);
    assert_non_null(strstr(kvp_last_error(a), "3"));

    /* The refused registration changed nothing: the others still store and look up. */
    uint32_t *tok = kvpt_tokens(1, 16);
    kvp_tokens t = {.ids = tok, .count = 16};
    size_t bytes = kvp_instance_get_info(inst[0])->chunk_bytes;
    void *buf = malloc(bytes);
    assert_non_null(buf);
    kvpt_fill(buf, bytes, 7, 0);
    assert_int_equal(kvp_store(inst[0], &t, 0, 16, (const void *const *)&buf, NULL), 1);
    assert_int_equal(kvp_lookup(inst[0], &t), 1);
    free(buf);
    free(tok);

    /* Unregistering one makes room for another. */
    assert_int_equal(kvp_unregister(inst[1]), 0);
    assert_int_equal(reg(a, "w", 3, &inst[3]), 0);
    assert_int_equal(kvpt_stat(a, "instances"), 3);

    kvp_client_close(a);
    kvpt_daemon_stop(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_limit),
        cmocka_unit_test(test_limit_from_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
