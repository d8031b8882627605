/*
 * test_segment_truncated.c - the daemon outlives a posix segment truncated under it.
 *
 * A worker of the daemon's user can ftruncate the segment. The daemon then copies from and into
 * pages that are gone: it must not die, must say so once, and must go on serving every worker
 * inline from private memory (docs/SECURITY.md, "A segment that shrinks"). The test process is
 * also a worker with the segment mapped: it never touches its mapping after the truncation
 * (that would be SIGBUS here, which is the library's documented limit, not the daemon's).
 * The L2 write-behind's read of pool bytes is tested in test_l2_truncated.c.
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

#include "harness.h"

#define C 16
#define N 4

static kvp_instance *reg(kvp_client *c, const char *id, uint32_t transport)
{
    kvp_register_opts o = kvpt_layout(id, transport);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    return inst;
}

static void test_truncated_under_traffic(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char path[160];
    kvpt_daemon_start(&d, (const char *const[]){"--l1-size", "4MiB", "--chunk-size", "16", NULL});
    kvp_client *ci = kvpt_connect(&d), *cs = kvpt_connect(&d);
    kvp_instance *in = reg(ci, "inline-worker", KVP_TRANSPORT_INLINE);
    kvp_instance *sh = reg(cs, "shm-worker", KVP_TRANSPORT_AUTO);
    assert_int_equal(kvp_instance_get_info(sh)->transport, KVP_TRANSPORT_SHM);
    assert_int_equal(kvpt_store_seq(in, 1, N), N);
    assert_int_equal(kvpt_store_seq(sh, 2, N), N);

    snprintf(path, sizeof(path), "/dev/shm/%s", d.shm_name);
    assert_int_equal(truncate(path, 0), 0);

    /* The daemon sends from pages that are gone: this retrieve may fail, the daemon may not. */
    size_t bytes = kvp_instance_get_info(in)->chunk_bytes;
    void *bufs[N];
    for (int i = 0; i < N; i++)
        bufs[i] = malloc(bytes);
    uint32_t *tok = kvpt_tokens(1, N * C);
    kvp_tokens t = {.ids = tok, .count = N * C};
    int rc = kvp_retrieve(in, &t, 0, N * C, bufs);
    fprintf(stderr, "retrieve after the truncation: %d (%s)\n", rc, kvp_strerror(rc));
    kvpt_assert_serves(&d);

    /* Said once. */
    assert_true(kvpt_log_wait(&d, "shrank to 0 of", 5000));
    kvpt_sleep_ms(1500);
    assert_int_equal(kvpt_log_count(&d, "shrank to 0 of"), 1);

    /* The lost chunks are gone, not served as zeros. */
    assert_int_equal(kvp_lookup(in, &t), 0);
    /* Inline traffic works again, byte-exact, out of private memory. */
    assert_int_equal(kvpt_store_seq(in, 3, N), N);
    kvpt_retrieve_seq(in, 3, N);

    /* The shm worker's connection was closed; its library registers again, now inline. */
    assert_int_equal(kvp_ping(cs), 0);
    assert_int_equal(kvpt_store_seq(sh, 4, N), N);
    const kvp_instance_info *info = kvp_instance_get_info(sh);
    fprintf(stderr, "shm worker now: transport %u (%s)\n", info->transport, info->reason);
    assert_int_equal(info->transport, KVP_TRANSPORT_INLINE);
    kvpt_retrieve_seq(sh, 4, N);

    /* A new worker is offered no shared memory, even if it claims to have mapped it. */
    kvp_client *cn = kvpt_connect(&d);
    kvp_instance *nw = reg(cn, "late-worker", KVP_TRANSPORT_AUTO);
    assert_int_equal(kvp_instance_get_info(nw)->transport, KVP_TRANSPORT_INLINE);
    kvp_client_close(cn);

    for (int i = 0; i < N; i++)
        free(bufs[i]);
    free(tok);
    kvp_client_close(ci);
    kvp_client_close(cs);
    kvpt_daemon_stop(&d); /* a clean exit, status 0 */
}

int main(void)
{
    /* The library's pre-fault thread touches the mapping on its own; under load it may still be
     * at it when the segment shrinks, which would be the test's SIGBUS, not the daemon's. */
    setenv("KVPOOL_PREFAULT", "0", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_truncated_under_traffic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
