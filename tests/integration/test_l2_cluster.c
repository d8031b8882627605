/*
 * test_l2_cluster.c - the L2 tier on a three-master Redis Cluster on loopback ports: two
 * daemons given one seed node share chunks spread over all masters (slot routing, one EXISTS
 * pipeline per node), and after `redis-cli --cluster reshard` moves the slots of a master that
 * holds some of them, a daemon whose slot map predates the move follows MOVED and still
 * serves them byte-exact.
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
#include "redis_fixture.h"

#define SEQ 24

static struct kvpt_cluster cluster_;

static int setup(void **state)
{
    (void)state;
    kvpt_redis_require();
    kvpt_cluster_start(&cluster_);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kvpt_cluster_stop(&cluster_);
    return 0;
}

static void start_daemon(struct kvpt_daemon *d)
{
    const char *args[] = {"--l1-size",  "8MiB",         "--chunk-size", "16", "--l2",
                          cluster_.url, "--l2-timeout", "2000",         NULL};
    kvpt_daemon_start(d, args);
}

static kvp_instance *reg(kvp_client *c, const char *id, uint32_t transport)
{
    kvp_register_opts o = kvpt_layout(id, transport);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    return inst;
}

/* Keys of kvpool values held by node i. */
static size_t node_keys(int i)
{
    redisContext *c = kvpt_redis_connect(&cluster_.node[i]);
    size_t n = kvpt_redis_keys(c, "kvpool:v1:*", NULL, 0);
    redisFree(c);
    return n;
}

static void test_share_and_reshard(void **state)
{
    (void)state;
    struct kvpt_daemon a, b, d;
    start_daemon(&a);
    start_daemon(&b);
    start_daemon(&d);
    kvp_client *ca = kvpt_connect(&a), *cb = kvpt_connect(&b), *cd = kvpt_connect(&d);
    kvp_instance *ia = reg(ca, "writer", KVP_TRANSPORT_SHM);
    kvp_instance *ib = reg(cb, "reader", KVP_TRANSPORT_INLINE);
    kvp_instance *id = reg(cd, "late", KVP_TRANSPORT_SHM);

    /* Keys spread over the three masters (the seed node alone holds about a third). */
    kvpt_store_seq(ia, 4000, SEQ);
    assert_int_equal(kvpt_stat_poll(ca, "l2_written_chunks", SEQ, 20000), SEQ);
    size_t k0 = node_keys(0), k1 = node_keys(1), k2 = node_keys(2);
    assert_int_equal(k0 + k1 + k2, SEQ);
    assert_true(k0 > 0 && k1 > 0 && k2 > 0);
    assert_int_equal(kvpt_stat(ca, "l2_write_failed"), 0);

    /* B finds and serves them all. */
    kvpt_assert_seq(ib, 4000, SEQ, SEQ);
    assert_int_equal(kvpt_stat(cb, "l2_hits"), SEQ);

    /* D learns the slot map now (a lookup of something else), before the move. */
    kvpt_store_seq(ia, 4001, 4);
    assert_int_equal(kvpt_stat_poll(ca, "l2_written_chunks", SEQ + 4, 20000), SEQ + 4);
    kvpt_assert_seq(id, 4001, 4, 4);

    /* Every slot of master 1 moves to master 2, with its keys. */
    kvpt_cluster_reshard(&cluster_, 1, 2, 16384);
    assert_int_equal(node_keys(1), 0);
    assert_int_equal(node_keys(0) + node_keys(2), SEQ + 4);

    /* D's map is stale: MOVED sends it to master 2, the data is intact. */
    kvpt_assert_seq(id, 4000, SEQ, SEQ);
    assert_true(kvpt_stat(cd, "l2_redirects") >= 1);
    assert_int_equal(kvpt_stat(cd, "l2_corrupt"), 0);

    /* A keeps writing through the new map. */
    uint64_t written = kvpt_stat(ca, "l2_written_chunks");
    kvpt_store_seq(ia, 4002, 6);
    assert_int_equal(kvpt_stat_poll(ca, "l2_written_chunks", written + 6, 20000), written + 6);
    assert_int_equal(kvpt_stat(ca, "l2_write_failed"), 0);
    kvpt_assert_seq(ib, 4002, 6, 6);

    kvp_client_close(ca);
    kvp_client_close(cb);
    kvp_client_close(cd);
    kvpt_daemon_stop(&a);
    kvpt_daemon_stop(&b);
    kvpt_daemon_stop(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_share_and_reshard),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
