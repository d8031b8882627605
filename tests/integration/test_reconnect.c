/*
 * test_reconnect.c - a worker outlives daemon restarts: the real kvpoold is stopped (SIGTERM),
 * killed (SIGKILL) and started again on the same socket under a client that keeps its
 * kvp_client and kvp_instance handles.
 *
 *   - Restart between calls: the next store and retrieve succeed byte-exact on both transports
 *     (shm on the new daemon's segment, posix or memfd; inline), through the same kvp_instance
 *     pointers, and the new daemon logs each registration once, with its transport. A posix
 *     daemon killed (SIGKILL) leaves its pool to the next one (warm restart, on by default):
 *     the chunks stored before are found again; after SIGTERM, or with memfd, they are gone.
 *   - Daemon down: a call fails at once with the connect error naming the socket (-ENOENT
 *     after SIGTERM, which removes the socket file; -ECONNREFUSED after SIGKILL, which leaves
 *     it), each later call tries again, and the first call after the daemon is back succeeds.
 *     A call in flight when the daemon dies fails with -ECONNRESET and publishes nothing.
 *   - Plans prepared before a restart: every commit, abort and inline store of one fails with
 *     -ESTALE, frees the plan and publishes nothing, even when the new connection has handed
 *     out the same reservation id for another plan; late writes through their slots change
 *     nothing the new daemon stores.
 *   - Registration refused by the new daemon: EBUSY (another client took the id first) and
 *     EEXIST (a namesake with another model) fail that instance's calls with the daemon's
 *     message while the other instance goes on, until the id is free again; a daemon restarted
 *     with another chunk size makes the instances stale for good (-ESTALE).
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define C 16       /* --chunk-size of the usual daemon */
#define NCHUNKS 4u /* chunks per stored sequence */

static const char *const daemon_args[] = {"--l1-size", "64MiB", "--chunk-size", "16", NULL};
static const char *const memfd_args[] = {"--l1-size", "64MiB",         "--chunk-size",
                                         "16",        "--shm-backend", "memfd",
                                         NULL};

/* The worker's client: short timeouts, so that no waiting can hide in a passing test. */
static kvp_client *open_worker(const struct kvpt_daemon *d)
{
    kvp_opts o = {.socket_path = d->socket, .timeout_ms = 3000};
    kvp_client *c = NULL;
    int rc = kvp_client_open(&o, &c);
    if (rc < 0)
        fail_msg("kvp_client_open: %s", kvp_strerror(rc));
    return c;
}

static kvp_instance *reg(kvp_client *c, const char *id, uint32_t transport)
{
    kvp_register_opts o = kvpt_layout(id, transport);
    kvp_instance *inst = NULL;
    int rc = kvp_register(c, &o, &inst);
    if (rc < 0)
        fail_msg("register %s: %s: %s", id, kvp_strerror(rc), kvp_last_error(c));
    return inst;
}

/* The chunk size of inst's current registration (a restart may change it). */
static uint32_t chunk_tokens(const kvp_instance *inst)
{
    return kvp_instance_get_info(inst)->chunk_tokens;
}

/* kvp_store() of NCHUNKS chunks of sequence seq with content kvpt_fill(seq, i). Returns the
 * call's result; *stored gets the chunks newly stored. */
static int try_store(kvp_instance *inst, uint32_t seq, uint32_t *stored)
{
    uint32_t ct = chunk_tokens(inst);
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
    uint32_t *tok = kvpt_tokens(seq, NCHUNKS * ct);
    kvp_tokens t = {.ids = tok, .count = NCHUNKS * ct};
    void *bufs[NCHUNKS];
    kvp_store_result r;

    for (uint32_t i = 0; i < NCHUNKS; i++) {
        bufs[i] = malloc(bytes);
        assert_non_null(bufs[i]);
        kvpt_fill(bufs[i], bytes, seq, i);
    }
    int rc = kvp_store(inst, &t, 0, NCHUNKS * ct, (const void *const *)bufs, &r);
    if (stored)
        *stored = rc >= 0 ? r.stored : 0;
    for (uint32_t i = 0; i < NCHUNKS; i++)
        free(bufs[i]);
    free(tok);
    return rc;
}

/* Stores sequence seq, which must be new to the daemon. */
static void store_seq(kvp_client *c, kvp_instance *inst, uint32_t seq)
{
    uint32_t stored;
    int rc = try_store(inst, seq, &stored);
    if (rc < 0)
        fail_msg("store of sequence %u: %s: %s", seq, kvp_strerror(rc), kvp_last_error(c));
    assert_int_equal(rc, NCHUNKS);
    assert_int_equal(stored, NCHUNKS);
}

/* Leading cached chunks of sequence seq, or a negative error. */
static int lookup_seq(kvp_instance *inst, uint32_t seq)
{
    uint32_t ct = chunk_tokens(inst);
    uint32_t *tok = kvpt_tokens(seq, NCHUNKS * ct);
    kvp_tokens t = {.ids = tok, .count = NCHUNKS * ct};
    int rc = kvp_lookup(inst, &t);
    free(tok);
    return rc;
}

/* Asserts that all NCHUNKS chunks of sequence seq are cached, byte-exact. */
static void check_seq(kvp_client *c, kvp_instance *inst, uint32_t seq)
{
    uint32_t ct = chunk_tokens(inst);
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
    uint32_t *tok = kvpt_tokens(seq, NCHUNKS * ct);
    kvp_tokens t = {.ids = tok, .count = NCHUNKS * ct};
    void *bufs[NCHUNKS];

    for (uint32_t i = 0; i < NCHUNKS; i++) {
        bufs[i] = calloc(1, bytes);
        assert_non_null(bufs[i]);
    }
    int rc = kvp_retrieve(inst, &t, 0, NCHUNKS * ct, bufs);
    if (rc != (int)NCHUNKS)
        fail_msg("retrieve of sequence %u: %d (%s): %s", seq, rc, kvp_strerror(rc),
                 kvp_last_error(c));
    for (uint32_t i = 0; i < NCHUNKS; i++) {
        if (!kvpt_check(bufs[i], bytes, seq, i))
            fail_msg("chunk %u of sequence %u is not what was stored", i, seq);
        free(bufs[i]);
    }
    free(tok);
}

static void assert_error_mentions(kvp_client *c, const char *what)
{
    if (!strstr(kvp_last_error(c), what))
        fail_msg("last error \"%s\" does not mention \"%s\"", kvp_last_error(c), what);
}

/* ---------------------------------------------------------------------------------------- */
/* (1) Restart between calls                                                                */

static void restart_under_worker(int sig, const char *const *args)
{
    struct kvpt_daemon d;
    bool memfd = args == memfd_args;
    char line[160];

    kvpt_daemon_start(&d, args);
    kvp_client *w = open_worker(&d);
    kvp_instance *shm = reg(w, "rs-shm", KVP_TRANSPORT_AUTO);
    kvp_instance *inl = reg(w, "rs-inline", KVP_TRANSPORT_INLINE);
    const kvp_instance_info *si = kvp_instance_get_info(shm), *ii = kvp_instance_get_info(inl);
    assert_int_equal(si->transport, KVP_TRANSPORT_SHM);
    assert_int_equal(ii->transport, KVP_TRANSPORT_INLINE);
    store_seq(w, shm, 1);
    store_seq(w, inl, 2);

    assert_int_equal(kvpt_daemon_signal_wait(&d, sig), sig == SIGKILL ? 128 + SIGKILL : 0);
    kvpt_daemon_restart(&d, args);

    /* The worker's next calls just work, with the handles it holds. */
    uint64_t t0 = kvpt_now_ms();
    store_seq(w, shm, 3);
    check_seq(w, shm, 3);
    store_seq(w, inl, 4);
    check_seq(w, inl, 4);
    assert_true(kvpt_now_ms() - t0 < 2000);
    assert_ptr_equal(kvp_instance_get_info(shm), si);
    assert_int_equal(si->transport, KVP_TRANSPORT_SHM);
    assert_string_equal(si->shm_name, memfd ? "" : d.shm_name);
    assert_int_equal(si->chunk_tokens, C);
    assert_int_equal(ii->transport, KVP_TRANSPORT_INLINE);
    assert_string_equal(ii->reason, "requested by worker");

    /* After SIGTERM, or with memfd, a new daemon has a new pool: what the old one held is gone,
     * not resurrected. After SIGKILL of a posix daemon the new one adopted its pool (warm
     * restart, on by default): the chunks are there again, under the same keys. */
    uint32_t kept = sig == SIGKILL && !memfd ? NCHUNKS : 0;
    assert_int_equal(lookup_seq(shm, 1), kept);
    assert_int_equal(lookup_seq(inl, 2), kept);
    if (kept) {
        check_seq(w, shm, 1);
        check_seq(w, inl, 2);
    }
    assert_int_equal(kvpt_stat(w, "instances"), 2);
    assert_int_equal(kvpt_stat(w, "registrations_shm"), 1);
    assert_int_equal(kvpt_stat(w, "registrations_inline"), 1);

    /* One registration line per daemon (the log holds both), with the real transport. */
    if (memfd)
        snprintf(line, sizeof(line),
                 "Instance rs-shm non-GPU context using SHM transport "
                 "(backend=memfd");
    else
        snprintf(line, sizeof(line),
                 "Instance rs-shm non-GPU context using SHM transport (shm_name=%s", d.shm_name);
    assert_int_equal(kvpt_log_count(&d, line), 2);
    assert_int_equal(kvpt_log_count(&d,
                                    "Instance rs-inline non-GPU context using inline transport"),
                     2);

    kvp_client_close(w);
    kvpt_daemon_stop(&d);
}

static void test_restart_sigterm(void **state)
{
    (void)state;
    restart_under_worker(SIGTERM, daemon_args);
}

static void test_restart_sigkill(void **state)
{
    (void)state;
    restart_under_worker(SIGKILL, daemon_args);
}

/* The memfd backend: the new daemon's segment comes over the new socket (MAP_SEGMENT). */
static void test_restart_memfd(void **state)
{
    (void)state;
    restart_under_worker(SIGKILL, memfd_args);
}

/* ---------------------------------------------------------------------------------------- */
/* (2) Calls while the daemon is down, and a call in flight when it dies                    */

struct in_flight {
    kvp_instance *inst;
    atomic_int started;
    int rc;
};

static void *store_in_flight(void *arg)
{
    struct in_flight *f = arg;
    atomic_store(&f->started, 1);
    f->rc = try_store(f->inst, 20, NULL);
    return NULL;
}

static void test_daemon_down(void **state)
{
    (void)state;
    struct kvpt_daemon d;

    kvpt_daemon_start(&d, daemon_args);
    kvp_client *w = open_worker(&d);
    kvp_instance *shm = reg(w, "dn-shm", KVP_TRANSPORT_AUTO);
    kvp_instance *inl = reg(w, "dn-inline", KVP_TRANSPORT_INLINE);
    store_seq(w, shm, 10);

    /* SIGTERM removes the socket file: -ENOENT, naming the socket, at once, every call. */
    assert_int_equal(kvpt_daemon_signal_wait(&d, SIGTERM), 0);
    for (int i = 0; i < 3; i++) {
        uint64_t t0 = kvpt_now_ms();
        assert_int_equal(lookup_seq(shm, 10), -ENOENT);
        assert_error_mentions(w, d.socket);
        assert_error_mentions(w, "reconnect");
        assert_true(kvpt_now_ms() - t0 < 1000);
    }
    assert_int_equal(try_store(inl, 11, NULL), -ENOENT);
    assert_int_equal(kvp_ping(w), -ENOENT);
    kvpt_daemon_restart(&d, daemon_args);
    store_seq(w, shm, 12);
    check_seq(w, shm, 12);
    store_seq(w, inl, 13);
    check_seq(w, inl, 13);

    /* SIGKILL leaves the socket file behind: nobody listens, -ECONNREFUSED. */
    assert_int_equal(kvpt_daemon_signal_wait(&d, SIGKILL), 128 + SIGKILL);
    assert_int_equal(kvp_ping(w), -ECONNREFUSED);
    assert_error_mentions(w, d.socket);
    assert_int_equal(lookup_seq(inl, 13), -ECONNREFUSED);
    kvpt_daemon_restart(&d, daemon_args);
    assert_int_equal(kvp_ping(w), 0);
    /* The SIGKILLed daemon's pool was adopted (warm restart): sequence 12 is still there. */
    assert_int_equal(lookup_seq(shm, 12), NCHUNKS);

    /* A store in flight: the daemon is stopped while it waits for its reply, then killed. */
    struct in_flight f = {.inst = shm};
    pthread_t tid;
    kvpt_stop_process(d.pid);
    assert_int_equal(pthread_create(&tid, NULL, store_in_flight, &f), 0);
    while (!atomic_load(&f.started))
        kvpt_sleep_ms(1);
    kvpt_sleep_ms(300); /* the request is in the stopped daemon's socket by now */
    assert_int_equal(kvpt_daemon_signal_wait(&d, SIGKILL), 128 + SIGKILL);
    assert_int_equal(pthread_join(tid, NULL), 0);
    if (f.rc != -ECONNRESET && f.rc != -EPIPE)
        fail_msg("store in flight: %d (%s): %s", f.rc, kvp_strerror(f.rc), kvp_last_error(w));
    assert_error_mentions(w, "kvpoold closed the connection");
    kvpt_daemon_restart(&d, daemon_args);
    /* The next call reconnects; nothing of the interrupted store exists. */
    assert_int_equal(lookup_seq(shm, 20), 0);
    assert_int_equal(kvpt_stat(w, "objects_reserved"), 0);
    store_seq(w, shm, 20);
    check_seq(w, shm, 20);

    kvp_client_close(w);
    kvpt_daemon_stop(&d);
}

/* ---------------------------------------------------------------------------------------- */
/* (3) Plans prepared before a restart                                                      */

static kvp_tokens seq_tokens(uint32_t seq, uint32_t **tok)
{
    *tok = kvpt_tokens(seq, NCHUNKS * C);
    return (kvp_tokens){.ids = *tok, .count = NCHUNKS * C};
}

static void fill_plan(kvp_store_plan *p, uint32_t seq)
{
    for (uint32_t i = 0; i < p->nslots; i++)
        kvpt_fill(p->slots[i].data, (size_t)p->slots[i].length, seq, p->slots[i].chunk_index);
}

static void test_stale_plans(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    uint32_t *ta, *tb, *tc, *ti, *tr, *tx;
    kvp_store_plan pa, pb, pc, pi, px;
    kvp_retrieve_plan pr;

    kvpt_daemon_start(&d, daemon_args);
    kvp_client *w = open_worker(&d);
    kvp_instance *shm = reg(w, "st-shm", KVP_TRANSPORT_AUTO);
    kvp_instance *inl = reg(w, "st-inline", KVP_TRANSPORT_INLINE);
    size_t bytes = kvp_instance_get_info(inl)->chunk_bytes;
    kvp_tokens a = seq_tokens(30, &ta), c = seq_tokens(32, &tc);
    kvp_tokens in = seq_tokens(33, &ti), r = seq_tokens(34, &tr), x = seq_tokens(35, &tx);

    /* The first hold of the old connection: the new connection's first hold gets its id. */
    assert_int_equal(kvp_prepare_store(shm, &c, 0, NCHUNKS * C, &pc), NCHUNKS);
    fill_plan(&pc, 32);
    assert_int_equal(kvp_prepare_store(shm, &a, 0, NCHUNKS * C, &pa), NCHUNKS);
    fill_plan(&pa, 30);
    assert_int_equal(kvp_prepare_store(inl, &in, 0, NCHUNKS * C, &pi), NCHUNKS);
    assert_int_equal(kvp_prepare_store(shm, &x, 0, NCHUNKS * C, &px), NCHUNKS);
    store_seq(w, shm, 34);
    assert_int_equal(kvp_prepare_retrieve(shm, &r, 0, NCHUNKS * C, &pr), NCHUNKS);

    assert_int_equal(kvpt_daemon_signal_wait(&d, SIGTERM), 0);
    kvpt_daemon_restart(&d, daemon_args);

    /* Committed as the first call after the restart: its daemon is gone, so is the plan. */
    assert_int_equal(kvp_commit_store(shm, &pa), -ESTALE);
    assert_error_mentions(w, "lost");
    assert_null(pa.slots);
    assert_int_equal(pa.reservation, 0);

    /* The next call reconnects. A new plan on the new connection gets the id the old
     * connection's first plan had; committing the old plan must not publish the new one. */
    assert_int_equal(lookup_seq(shm, 30), 0);
    kvp_tokens b = seq_tokens(31, &tb);
    assert_int_equal(kvp_prepare_store(shm, &b, 0, NCHUNKS * C, &pb), NCHUNKS);
    print_message("old plan reservation %llu, new plan reservation %llu\n",
                  (unsigned long long)pc.reservation, (unsigned long long)pb.reservation);
    assert_int_equal(pb.reservation, pc.reservation);
    fill_plan(&pb, 31);
    /* Late writes through the stale plan land nowhere the new daemon can see. */
    for (uint32_t i = 0; i < pc.nslots; i++) {
        assert_ptr_not_equal(pc.slots[i].data, pb.slots[0].data);
        memset(pc.slots[i].data, 0xab, (size_t)pc.slots[i].length);
    }
    assert_int_equal(kvp_commit_store(shm, &pc), -ESTALE);
    assert_error_mentions(w, "reconnected");
    assert_null(pc.slots);
    assert_int_equal(lookup_seq(shm, 31), 0);
    assert_int_equal(lookup_seq(shm, 32), 0);
    assert_int_equal(kvp_commit_store(shm, &pb), NCHUNKS);
    check_seq(w, shm, 31);

    /* Inline store, abort and retrieve commit of stale plans: -ESTALE, freed, nothing sent. */
    void *chunks[NCHUNKS];
    for (uint32_t i = 0; i < NCHUNKS; i++) {
        chunks[i] = malloc(bytes);
        assert_non_null(chunks[i]);
        kvpt_fill(chunks[i], bytes, 33, i);
    }
    assert_int_equal(kvp_store_inline(inl, &pi, (const void *const *)chunks), -ESTALE);
    assert_null(pi.slots);
    assert_int_equal(lookup_seq(inl, 33), 0);
    assert_int_equal(kvp_abort_store(shm, &px), -ESTALE);
    assert_null(px.slots);
    assert_int_equal(kvp_commit_retrieve(shm, &pr), -ESTALE);
    assert_null(pr.slots);
    assert_int_equal(kvp_commit_retrieve(shm, &pr), 0); /* released plans stay released */

    /* The instances work on the new daemon, and nothing is left reserved or pinned there. */
    store_seq(w, inl, 33);
    check_seq(w, inl, 33);
    assert_int_equal(kvpt_stat(w, "objects_reserved"), 0);
    assert_int_equal(kvpt_stat(w, "store_chunks_committed"), 2 * NCHUNKS);

    for (uint32_t i = 0; i < NCHUNKS; i++)
        free(chunks[i]);
    free(ta);
    free(tb);
    free(tc);
    free(ti);
    free(tr);
    free(tx);
    kvp_client_close(w);
    kvpt_daemon_stop(&d);
}

/* ---------------------------------------------------------------------------------------- */
/* (4) Registration refused by the new daemon                                               */

static void test_reregistration_refused(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char pid[32];

    kvpt_daemon_start(&d, daemon_args);
    kvp_client *w = open_worker(&d);
    kvp_instance *a = reg(w, "cf-a", KVP_TRANSPORT_AUTO);
    kvp_instance *b = reg(w, "cf-b", KVP_TRANSPORT_INLINE);
    store_seq(w, a, 40);
    store_seq(w, b, 41);

    /* EBUSY: another client registers cf-a on the new daemon before the worker's next call. */
    assert_int_equal(kvpt_daemon_signal_wait(&d, SIGTERM), 0);
    kvpt_daemon_restart(&d, daemon_args);
    kvp_client *other = kvpt_connect(&d);
    kvp_instance *taken = reg(other, "cf-a", KVP_TRANSPORT_AUTO);
    store_seq(w, b, 42); /* reconnects; cf-b goes on */
    assert_int_equal(lookup_seq(a, 40), -EBUSY);
    assert_error_mentions(w, "cf-a");
    snprintf(pid, sizeof(pid), "pid %d", (int)getpid());
    assert_error_mentions(w, pid);
    assert_int_equal(try_store(a, 43, NULL), -EBUSY); /* every call of cf-a asks again */
    assert_int_equal(kvp_ping(w), 0);
    check_seq(w, b, 42);
    (void)taken;
    kvp_client_close(other);
    kvpt_stat_wait(&d, "instances", 1, 5000);
    store_seq(w, a, 43); /* the id is free again: cf-a is back */
    check_seq(w, a, 43);
    assert_int_equal(kvp_instance_get_info(a)->transport, KVP_TRANSPORT_SHM);

    /* EEXIST: a namesake with another model took the id. */
    assert_int_equal(kvpt_daemon_signal_wait(&d, SIGKILL), 128 + SIGKILL);
    kvpt_daemon_restart(&d, daemon_args);
    other = kvpt_connect(&d);
    kvp_register_opts namesake = kvpt_layout("cf-a", KVP_TRANSPORT_AUTO);
    namesake.model_name = "another-model";
    kvp_instance *ns = NULL;
    assert_int_equal(kvp_register(other, &namesake, &ns), 0);
    assert_int_equal(lookup_seq(a, 43), -EEXIST);
    assert_error_mentions(w, "model_name");
    assert_error_mentions(w, "another-model");
    store_seq(w, b, 44);
    kvp_client_close(other);
    kvpt_stat_wait(&d, "instances", 1, 5000);
    /* The SIGKILLed daemon's pool was adopted (warm restart): cf-a's chunks are back with it. */
    assert_int_equal(lookup_seq(a, 43), NCHUNKS);
    store_seq(w, a, 45);
    check_seq(w, a, 45);

    /* Another chunk size: the worker's buffers no longer fit, the instances are stale for good
     * and the new daemon keeps no registration of them; the client itself goes on. */
    const char *const bigger[] = {"--l1-size", "64MiB", "--chunk-size", "32", NULL};
    assert_int_equal(kvpt_daemon_signal_wait(&d, SIGTERM), 0);
    kvpt_daemon_restart(&d, bigger);
    assert_int_equal(lookup_seq(a, 45), -ESTALE);
    assert_error_mentions(w, "32-token chunks");
    assert_int_equal(lookup_seq(b, 44), -ESTALE);
    assert_int_equal(try_store(b, 46, NULL), -ESTALE);
    assert_int_equal(chunk_tokens(a), C);
    assert_int_equal(kvp_ping(w), 0);
    assert_int_equal(kvpt_stat(w, "instances"), 0);
    assert_int_equal(kvp_unregister(a), 0);
    assert_int_equal(kvp_unregister(b), 0);
    a = reg(w, "cf-a", KVP_TRANSPORT_AUTO);
    assert_int_equal(chunk_tokens(a), 32);
    store_seq(w, a, 47);
    check_seq(w, a, 47);

    kvp_client_close(w);
    kvpt_daemon_stop(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_restart_sigterm), cmocka_unit_test(test_restart_sigkill),
        cmocka_unit_test(test_restart_memfd),   cmocka_unit_test(test_daemon_down),
        cmocka_unit_test(test_stale_plans),     cmocka_unit_test(test_reregistration_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
