/*
 * test_l2_faults.c - the L2 tier when Redis fails: killed while workers store, down at
 * start-up, frozen (a slow Redis). Workers' stores and L1 retrieves go on without waiting, the
 * state change is logged once, write-behind resumes when Redis is back, and the write-behind
 * counters add up: every queued copy is written, dropped, failed or skipped.
 *
 * Layout: kvpt_layout() with --chunk-size 16: 8 KiB chunks.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "harness.h"
#include "redis_fixture.h"

#define C 16
#define SEQ 12
#define SLOW_MS 1000 /* what "did not wait for Redis" means, sanitizers included */

static struct kvpt_redis redis_;

static int setup(void **state)
{
    (void)state;
    kvpt_redis_require();
    kvpt_redis_start(&redis_, true);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kvpt_redis_stop(&redis_);
    return 0;
}

static void start_daemon(struct kvpt_daemon *d, const char *queue)
{
    const char *args[] = {"--l1-size",    "8MiB", "--chunk-size", "16",  "--l2", redis_.url,
                          "--l2-timeout", "300",  "--l2-queue",   queue, NULL};
    kvpt_daemon_start(d, args);
}

static kvp_instance *reg(kvp_client *c, const char *id)
{
    kvp_register_opts o = kvpt_layout(id, KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    return inst;
}

/* Runs one store and one L1-hit retrieve and lookup; none may take SLOW_MS. */
static void store_and_hit(kvp_instance *inst, uint32_t seq, uint32_t hit_seq)
{
    uint64_t t0 = kvpt_now_ms();
    kvpt_store_seq(inst, seq, SEQ);
    uint64_t t1 = kvpt_now_ms();
    kvpt_assert_seq(inst, hit_seq, SEQ, SEQ);
    uint64_t t2 = kvpt_now_ms();
    if (t1 - t0 > SLOW_MS || t2 - t1 > SLOW_MS)
        fail_msg("store took %llu ms, L1 lookup + retrieve %llu ms: the worker waited for L2",
                 (unsigned long long)(t1 - t0), (unsigned long long)(t2 - t1));
}

/* Every queued copy ended one way or another (nothing is pending any more). */
static void assert_counters_add_up(kvp_client *c)
{
    assert_int_equal(kvpt_stat_poll(c, "l2_backlog_chunks", 0, 20000), 0);
    /* The last copy taken off the queue may still be in flight: give it its timeout. */
    uint64_t queued = kvpt_stat(c, "l2_write_queued"), done = 0;
    for (int i = 0; i < 200 && done != queued; i++) {
        done = kvpt_stat(c, "l2_written_chunks") + kvpt_stat(c, "l2_write_dropped") +
               kvpt_stat(c, "l2_write_failed") + kvpt_stat(c, "l2_write_evicted");
        if (done != queued)
            kvpt_sleep_ms(50);
    }
    assert_int_equal(done, queued);
}

static void test_killed_while_storing(void **state)
{
    (void)state;
    struct kvpt_daemon a, b;
    /* 32 chunks of backlog at most: an outage of 120 chunks drops the oldest 88 or more. */
    start_daemon(&a, "256KiB");
    kvp_client *c = kvpt_connect(&a);
    kvp_instance *inst = reg(c, "faulty");
    kvpt_store_seq(inst, 3000, SEQ);
    assert_int_equal(kvpt_stat_poll(c, "l2_written_chunks", SEQ, 10000), SEQ);
    assert_int_equal(kvpt_stat(c, "l2_up"), 1);

    kvpt_redis_kill(&redis_);
    for (uint32_t s = 3001; s <= 3010; s++)
        store_and_hit(inst, s, 3000);
    assert_true(kvpt_log_wait(&a, "unreachable", 5000));
    assert_int_equal(kvpt_stat(c, "l2_up"), 0);
    /* Lookups past L1 skip L2 at once while it is down. */
    uint64_t t0 = kvpt_now_ms();
    kvpt_assert_seq(inst, 3000, SEQ, 2 * SEQ);
    assert_true(kvpt_now_ms() - t0 < SLOW_MS);
    /* The copy in flight when Redis died failed; the rest beyond 32 chunks were dropped. */
    assert_true(kvpt_stat(c, "l2_write_dropped") + kvpt_stat(c, "l2_write_failed") >=
                10 * SEQ - 32);
    assert_true(kvpt_stat(c, "l2_backlog_chunks") <= 32);
    assert_true(kvpt_stat(c, "l2_backlog_bytes") <= 256 * 1024);

    /* Back: the state change is logged once each way and the backlog drains. */
    kvpt_redis_restart(&redis_);
    assert_true(kvpt_log_wait(&a, "reachable again", 15000));
    if (kvpt_log_count(&a, "unreachable") != 1) {
        char cmd[256];
        snprintf(cmd, sizeof(cmd), "grep L2 %s >&2", a.log);
        (void)!system(cmd);
    }
    assert_int_equal(kvpt_log_count(&a, "unreachable"), 1);
    assert_int_equal(kvpt_stat(c, "l2_outages"), 1);
    assert_counters_add_up(c);
    assert_true(kvpt_stat(c, "l2_errors") >= 1);

    /* The newest sequence, stored while Redis was down, reached it after all. */
    start_daemon(&b, "256KiB");
    kvp_client *cb = kvpt_connect(&b);
    kvpt_assert_seq(reg(cb, "reader"), 3010, SEQ, SEQ);
    kvp_client_close(cb);
    kvpt_daemon_stop(&b);

    /* And new stores are copied again. */
    uint64_t written = kvpt_stat(c, "l2_written_chunks");
    kvpt_store_seq(inst, 3011, SEQ);
    assert_int_equal(kvpt_stat_poll(c, "l2_written_chunks", written + SEQ, 10000), written + SEQ);
    assert_counters_add_up(c);
    kvp_client_close(c);
    kvpt_daemon_stop(&a);
}

static void test_down_at_start(void **state)
{
    (void)state;
    struct kvpt_daemon a;
    kvpt_redis_kill(&redis_);
    start_daemon(&a, "256MiB");
    assert_true(kvpt_log_wait(&a, "unreachable", 5000));
    kvp_client *c = kvpt_connect(&a);
    kvp_instance *inst = reg(c, "early");
    kvpt_store_seq(inst, 3100, SEQ);
    store_and_hit(inst, 3101, 3100);
    assert_int_equal(kvpt_stat(c, "l2_up"), 0);
    assert_int_equal(kvpt_stat(c, "l2_backlog_chunks"), 2 * SEQ);

    kvpt_redis_restart(&redis_);
    assert_true(kvpt_log_wait(&a, "reachable again", 15000));
    assert_int_equal(kvpt_stat_poll(c, "l2_written_chunks", 2 * SEQ, 10000), 2 * SEQ);
    assert_counters_add_up(c);
    assert_int_equal(kvpt_log_count(&a, "unreachable"), 1);
    kvp_client_close(c);
    kvpt_daemon_stop(&a);
}

/* A frozen Redis (SIGSTOP) answers nothing: L1 hits do not notice, copies time out. */
static void test_frozen(void **state)
{
    (void)state;
    struct kvpt_daemon a;
    start_daemon(&a, "256MiB");
    kvp_client *c = kvpt_connect(&a);
    kvp_instance *inst = reg(c, "frozen");
    kvpt_store_seq(inst, 3200, SEQ);
    assert_int_equal(kvpt_stat_poll(c, "l2_written_chunks", SEQ, 10000), SEQ);

    kill(redis_.pid, SIGSTOP);
    for (uint32_t s = 3201; s <= 3203; s++)
        store_and_hit(inst, s, 3200);
    assert_true(kvpt_log_wait(&a, "unreachable", 5000));
    kill(redis_.pid, SIGCONT);
    assert_true(kvpt_log_wait(&a, "reachable again", 15000));
    assert_counters_add_up(c);
    kvp_client_close(c);
    kvpt_daemon_stop(&a);
}

/* The server's count of refused logins (INFO commandstats: AUTH's failed calls). */
static uint64_t denied_auths(const struct kvpt_redis *r)
{
    redisContext *c = kvpt_redis_connect(r);
    freeReplyObject(kvpt_redis_cmd(c, "AUTH s3cretpw"));
    redisReply *rep = kvpt_redis_cmd(c, "INFO commandstats");
    const char *p = rep->type == REDIS_REPLY_STRING ? strstr(rep->str, "cmdstat_auth:") : NULL;
    p = p ? strstr(p, "failed_calls=") : NULL;
    assert_non_null(p);
    uint64_t n = strtoull(p + strlen("failed_calls="), NULL, 10);
    freeReplyObject(rep);
    redisFree(c);
    return n;
}

/* A password Redis requires: from the URL or a file, never in the daemon's log. */
static void test_credentials(void **state)
{
    (void)state;
    struct kvpt_redis r = {.extra = {"--requirepass", "s3cretpw", NULL}};
    struct kvpt_daemon a, b;
    char url[512], pwfile[300], bad_url[512];
    kvpt_redis_start(&r, false);
    snprintf(bad_url, sizeof(bad_url), "unix://:wr0ngpw@%s", r.sock);
    snprintf(url, sizeof(url), "unix://%s", r.sock);
    snprintf(pwfile, sizeof(pwfile), "%s/pw", r.dir);
    FILE *f = fopen(pwfile, "w");
    assert_non_null(f);
    fputs("s3cretpw\n", f);
    fclose(f);
    chmod(pwfile, 0644);

    /* A wrong password: said so once (not "unreachable"), the daemon serves, and the attempts
     * back off (1 s, 2 s, 4 s, 8 s...) whatever the workers do meanwhile: over 16 s, 4 more
     * at most (a backoff capped at 5 s, as for an unreachable server, would make 7). */
    const char *a_args[] = {"--chunk-size", "16", "--l2", bad_url, "--l2-connections", "1", NULL};
    kvpt_daemon_start(&a, a_args);
    assert_true(kvpt_log_wait(&a, "authentication failed", 5000));
    assert_true(kvpt_log_wait(&a, "unix://:***@", 0));
    uint64_t denied0 = denied_auths(&r), t0 = kvpt_now_ms();
    kvp_client *ca = kvpt_connect(&a);
    kvp_instance *inst = reg(ca, "denied");
    for (uint32_t s = 3300; kvpt_now_ms() - t0 < 16000; s++) {
        kvpt_store_seq(inst, s, SEQ);
        kvpt_assert_seq(inst, s, SEQ, 2 * SEQ); /* a lookup past L1 */
        kvpt_sleep_ms(200);
    }
    uint64_t denied = denied_auths(&r) - denied0;
    if (denied > 5)
        fail_msg("%llu failed AUTH in 16 s after the first: no backoff",
                 (unsigned long long)denied);
    assert_int_equal(kvpt_stat(ca, "l2_up"), 0);
    assert_int_equal(kvpt_log_count(&a, "authentication failed"), 1);
    assert_int_equal(kvpt_log_count(&a, "unreachable"), 0);
    kvp_client_close(ca);

    /* The password from a file: a warning about its mode, and the copies go through. */
    const char *b_args[] = {"--chunk-size", "16", "--l2", url, "--l2-password-file", pwfile, NULL};
    kvpt_daemon_start(&b, b_args);
    assert_true(kvpt_log_wait(&b, "can be read by group or others", 0));
    kvp_client *cb = kvpt_connect(&b);
    kvpt_store_seq(reg(cb, "allowed"), 3301, SEQ);
    assert_int_equal(kvpt_stat_poll(cb, "l2_written_chunks", SEQ, 10000), SEQ);
    kvp_client_close(cb);

    assert_int_equal(kvpt_log_count(&a, "wr0ngpw"), 0);
    assert_int_equal(kvpt_log_count(&b, "s3cretpw"), 0);
    kvpt_daemon_stop(&a);
    kvpt_daemon_stop(&b);
    kvpt_redis_stop(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_killed_while_storing),
        cmocka_unit_test(test_down_at_start),
        cmocka_unit_test(test_frozen),
        cmocka_unit_test(test_credentials),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
