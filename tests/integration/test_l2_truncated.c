/*
 * test_l2_truncated.c - the L2 write-behind reads pool bytes (to checksum and send a chunk); a
 * segment truncated under the daemon while chunks wait in its queue must neither kill the
 * daemon (SIGBUS) nor put lost bytes into Redis under a valid checksum.
 *
 * Redis is down while the chunks are stored, so that they wait in the write-behind queue; the
 * segment is truncated; Redis comes back and the queue drains.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "redis_fixture.h"

#define SEQ 8

static void test_queue_drains_after_truncation(void **state)
{
    (void)state;
    struct kvpt_redis redis = {.extra = {NULL}};
    struct kvpt_daemon d;
    char path[160];

    kvpt_redis_require();
    kvpt_redis_start(&redis, false);
    kvpt_redis_kill(&redis);
    kvpt_daemon_start(&d, (const char *const[]){"--l1-size", "4MiB", "--chunk-size", "16", "--l2",
                                                redis.url, "--l2-timeout", "300", NULL});
    assert_true(kvpt_log_wait(&d, "unreachable", 5000));
    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts o = kvpt_layout("w", KVP_TRANSPORT_INLINE);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    assert_int_equal(kvpt_store_seq(inst, 1, SEQ), SEQ);
    assert_int_equal(kvpt_stat(c, "l2_backlog_chunks"), SEQ);

    snprintf(path, sizeof(path), "/dev/shm/%s", d.shm_name);
    assert_int_equal(truncate(path, 0), 0);
    kvpt_redis_restart(&redis);
    assert_true(kvpt_log_wait(&d, "reachable again", 15000));
    assert_int_equal(kvpt_stat_poll(c, "l2_backlog_chunks", 0, 10000), 0);

    /* Alive, said once, and nothing of the lost chunks reached Redis. */
    kvpt_assert_serves(&d);
    assert_true(kvpt_log_wait(&d, "shrank to 0 of", 5000));
    assert_int_equal(kvpt_log_count(&d, "shrank to 0 of"), 1);
    assert_int_equal(kvpt_stat(c, "l2_written_chunks"), 0);
    redisContext *rc = kvpt_redis_connect(&redis);
    assert_int_equal(kvpt_redis_keys(rc, "*", NULL, 0), 0);
    redisFree(rc);

    /* Chunks stored from now on (private memory) are copied to L2 as before. */
    assert_int_equal(kvpt_store_seq(inst, 2, SEQ), SEQ);
    assert_int_equal(kvpt_stat_poll(c, "l2_written_chunks", SEQ, 10000), SEQ);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
    kvpt_redis_stop(&redis);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queue_drains_after_truncation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
