/*
 * test_faults_restart.c - the daemon SIGKILLed and restarted on the same socket and segment
 * name while a client is connected: the client reconnects at its next call without an error or
 * a wait, the old pool's data is not resurrected, its plan from before the restart is refused
 * (-ESTALE) and writing through that plan's old slot pointers changes nothing stored now.
 * test_reconnect.c has the rest of that story. This is the cold restart (--warm-restart off);
 * the warm one is tested by test_warm_*.c.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/msg.h"
#include "common/wire.h"
#include "harness.h"

#define C 16

/* --io-timeout far beyond every wait below: whatever is released was released by the close.
 * --warm-restart off: this is the cold restart, whose new daemon reaps the dead one's pool and
 * starts empty; the warm one, which adopts it, is test_warm_restart.c's (and the stale plan
 * written after it, test_warm_hostile.c's). */
static const char *const fault_args[] = {
    "--l1-size", "64MiB",          "--chunk-size", "16", "--io-timeout",
    "60000",     "--warm-restart", "off",          NULL};

/* ---------------------------------------------------------------------------------------- */
/* Daemon SIGKILL and restart under a connected client.                                      */

static void test_daemon_restart_under_client(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    kvpt_daemon_start(&d, fault_args);

    /* The old client: shm, committed data, and an open reservation with slot pointers. */
    kvp_opts o = {.socket_path = d.socket, .timeout_ms = 3000};
    kvp_client *old = NULL;
    kvp_instance *oi = NULL;
    kvp_register_opts ro = kvpt_layout("before-crash", KVP_TRANSPORT_SHM);
    assert_int_equal(kvp_client_open(&o, &old), 0);
    assert_int_equal(kvp_register(old, &ro, &oi), 0);
    size_t bytes = kvp_instance_get_info(oi)->chunk_bytes;
    kvpt_store_seq(oi, 300, 4);
    uint32_t *tok = kvpt_tokens(301, 8 * C);
    kvp_tokens t = {.ids = tok, .count = 8 * C};
    kvp_store_plan sp;
    assert_int_equal(kvp_prepare_store(oi, &t, 0, 8 * C, &sp), 8);

    assert_int_equal(kvpt_daemon_signal_wait(&d, SIGKILL), 128 + SIGKILL);
    assert_true(kvpt_shm_exists(d.shm_name));
    kvpt_daemon_restart(&d, fault_args);
    assert_true(kvpt_log_wait(&d, "Replacing stale segment", 5000));

    /* The old client notices at its next call and reconnects to the new daemon, registering
     * its instance again: no error, no timeout, and the old pool's data is not resurrected. */
    uint64_t t0 = kvpt_now_ms();
    int rc = kvp_ping(old);
    if (rc != 0)
        fail_msg("ping after the daemon restarted: %d (%s): %s", rc, kvp_strerror(rc),
                 kvp_last_error(old));
    assert_int_equal(kvp_lookup(oi, &t), 0);
    kvpt_assert_seq(oi, 300, 0, 4);
    assert_int_equal(kvp_instance_get_info(oi)->transport, KVP_TRANSPORT_SHM);
    assert_true(kvpt_now_ms() - t0 < 3000); /* no call waited for its timeout */

    /* A new client works against the new daemon, on shm, with a fresh pool. */
    kvp_client *c = kvpt_connect(&d);
    kvp_instance *ni = NULL, *nl = NULL;
    kvp_register_opts rn = kvpt_layout("after-restart", KVP_TRANSPORT_SHM);
    kvp_register_opts rl = kvpt_layout("after-restart-inline", KVP_TRANSPORT_INLINE);
    assert_int_equal(kvp_register(c, &rn, &ni), 0);
    assert_int_equal(kvp_register(c, &rl, &nl), 0);
    assert_int_equal(kvp_instance_get_info(ni)->transport, KVP_TRANSPORT_SHM);
    kvpt_assert_seq(ni, 300, 0, 4); /* the old pool's data is gone, not resurrected */
    kvpt_store_seq(ni, 301, 8);
    kvpt_store_seq(nl, 302, 4);

    /*
     * The old client's plan still has slot pointers into the old mapping, which the reconnect
     * kept in place but cut off from any segment. Writing through them (they cover the same
     * offsets the new chunks got) changes nothing that is stored now, and the plan cannot be
     * committed on the new connection.
     */
    assert_int_equal(sp.nslots, 8);
    for (uint32_t i = 0; i < sp.nslots; i++)
        memset(sp.slots[i].data, 0xab, bytes);
    kvpt_assert_seq(ni, 301, 8, 8);
    kvpt_assert_seq(nl, 301, 8, 8);
    kvpt_assert_seq(ni, 302, 4, 4);
    assert_int_equal(kvp_commit_store(oi, &sp), -ESTALE);
    assert_null(sp.slots);
    kvpt_assert_seq(oi, 301, 8, 8);
    kvp_client_close(c);
    kvp_client_close(old);
    free(tok);

    char name[96];
    snprintf(name, sizeof(name), "%s", d.shm_name);
    kvpt_daemon_stop(&d);
    assert_false(kvpt_shm_exists(name));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_daemon_restart_under_client),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
