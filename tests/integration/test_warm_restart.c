/*
 * test_warm_restart.c - warm restart end to end: a real kvpoold whose pool outlives it.
 *
 * Workers (this process, through libkvpool: an shm and an inline instance with 8 KiB chunks, an
 * shm one with 1 MiB chunks) store chunks; the daemon is SIGKILLed, or stopped with SIGUSR2 (a
 * planned restart), and a new one is started on the same socket. It must:
 *
 *   - after a crash: adopt the dead daemon's pool (one INFO line "Adopted the pool of kvpoold
 *     pid P (after a crash): N chunks, B bytes in T ms", "warm_restart" in the status with the
 *     same figures), serve every committed chunk byte-exact to the same clients (which reconnect
 *     by themselves) and to a new one, count the hits, verify each chunk once on its first read
 *     (warm_restart_verified_chunks, warm_restart_unverified_chunks), never adopt the chunks of
 *     a store that was not committed (its plan answers -ESTALE), and keep the LRU order: the
 *     chunks read last before the crash are evicted last after it; with default (random)
 *     segment names too, the pool found through the index alone; and a pool named with
 *     --shm-name is still there for it after another daemon of the host started meanwhile;
 *   - after SIGUSR2: exit 0 with "Leaving the pool (N chunks, B bytes) in /dev/shm/<name> for
 *     the next kvpoold", leave both files with the index flagged clean, and the next daemon
 *     adopts it as a planned restart, twice in a row;
 *   - after SIGTERM or SIGINT: leave nothing in /dev/shm, neither the pool nor its index
 *     kvpool_widx_<euid>_<XXH3-64 of the socket path> (which exists, 0600 and the daemon's,
 *     while it runs), and the next daemon starts cold.
 *
 * test_warm_refusals.c has the pools that must not be adopted, test_warm_hostile.c the damaged
 * ones, test_warm_soak.c twenty crashes under four workers.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "warm_fixture.h"

#define C KVPW_C

/* ---------------------------------------------------------------------------------------- */
/* (a) A crash                                                                               */

static void test_crash_adopted(void **state)
{
    (void)state;
    struct kvpt_daemon *d = kvpw_fresh_daemon();
    struct kvpw_workers w;
    char name[96], line[2048];
    struct stat st;

    kvpt_daemon_start(d, kvpw_args64);
    /* The index exists from the start, the daemon's alone. */
    kvpw_assert_widx_exists(d);
    kvpw_widx_name(d->socket, name, sizeof(name));
    char path[160];
    snprintf(path, sizeof(path), "/dev/shm/%s", name);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(st.st_uid, geteuid());

    kvpw_workers_open(d, &w);
    kvpw_store_data_set(&w);
    /* A store in progress when the daemon dies: slots written, never committed. */
    uint32_t *tok = kvpt_tokens(150, 4 * C);
    kvp_tokens t = {.ids = tok, .count = 4 * C};
    kvp_store_plan sp;
    assert_int_equal(kvp_prepare_store(w.shm, &t, 0, 4 * C, &sp), 4);
    for (uint32_t i = 0; i < sp.nslots; i++)
        kvpt_fill(sp.slots[i].data, KVPW_SMALL, 150, sp.slots[i].chunk_index);

    int dead = (int)d->pid;
    assert_int_equal(kvpt_daemon_signal_wait(d, SIGKILL), 128 + SIGKILL);
    /* A crash leaves both files. */
    assert_true(kvpt_shm_exists(d->shm_name));
    assert_true(kvpt_shm_exists(name));
    kvpt_daemon_restart(d, kvpw_args64);

    /* One adoption line, naming the dead daemon and what it held; nothing refused. */
    int pid;
    const char *kind;
    unsigned long long chunks, bytes;
    kvpw_adopted_line(d, &pid, &kind, &chunks, &bytes, line, sizeof(line));
    print_message("%s\n", line);
    assert_int_equal(pid, dead);
    assert_string_equal(kind, "crash");
    assert_int_equal(chunks, kvpw_data_set_chunks());
    assert_int_equal(bytes, kvpw_data_set_bytes());
    assert_null(strstr(line, "; dropped"));
    kvpw_assert_log_count(d, KVPW_ADOPTED, 1);
    kvpw_assert_log_count(d, KVPW_REFUSED, 0);

    /* The same clients: their next calls reconnect and register again; the plan from before
     * the crash is refused. Nothing is verified before it is read. */
    assert_int_equal(kvp_ping(w.c), 0);
    assert_int_equal(kvpt_stat(w.c, "objects_committed"), kvpw_data_set_chunks());
    assert_int_equal(kvpt_stat(w.c, "warm_restart_unverified_chunks"), kvpw_data_set_chunks());
    assert_int_equal(kvpt_stat(w.c, "warm_restart_verified_chunks"), 0);
    assert_int_equal(kvpt_stat(w.c, "warm_restart_corrupt_chunks"), 0);
    json_t *doc = kvpw_status(w.c);
    json_t *warm = kvpw_warm_of(doc);
    assert_true(json_is_true(json_object_get(warm, "enabled")));
    assert_string_equal(json_string_value(json_object_get(warm, "kind")), "adopted");
    assert_true(json_is_false(json_object_get(warm, "planned")));
    assert_int_equal(kvpw_jint(warm, "previous_pid"), dead);
    assert_int_equal(kvpw_jint(warm, "adopted_chunks"), kvpw_data_set_chunks());
    assert_int_equal(kvpw_jint(warm, "adopted_bytes"), kvpw_data_set_bytes());
    assert_int_equal(kvpw_jint(warm, "dropped_chunks"), 0);
    assert_true(json_is_null(json_object_get(warm, "reason")));
    json_decref(doc);
    assert_int_equal(kvp_commit_store(w.shm, &sp), -ESTALE);

    /* Every committed chunk is found and served byte-exact, the uncommitted ones are not. */
    uint64_t hits = kvpt_stat(w.c, "lookup_hit_chunks");
    kvpw_check_data_set(&w);
    assert_int_equal(kvp_lookup(w.shm, &t), 0);
    assert_int_equal(kvpt_stat(w.c, "lookup_hit_chunks"), hits + kvpw_data_set_chunks());
    assert_int_equal(kvpt_stat(w.c, "warm_restart_verified_chunks"), kvpw_data_set_chunks());
    assert_int_equal(kvpt_stat(w.c, "warm_restart_unverified_chunks"), 0);
    assert_int_equal(kvpt_stat(w.c, "warm_restart_corrupt_chunks"), 0);
    /* Read again: verified once only. Stores go on beside the adopted chunks. */
    kvpw_check_data_set(&w);
    assert_int_equal(kvpt_stat(w.c, "warm_restart_verified_chunks"), kvpw_data_set_chunks());
    assert_int_equal(kvpt_store_seq(w.shm, 150, 4), 4);
    assert_int_equal(kvpt_store_seq(w.big, 151, 3), 3);
    kvpw_check_data_set(&w);
    kvpt_assert_seq(w.inl, 150, 4, 4);
    kvpt_assert_seq(w.big, 151, 3, 3);
    free(tok);
    kvp_client_close(w.c);

    /* A fresh client sees the same. */
    struct kvpw_workers w2;
    kvpw_workers_open(d, &w2);
    kvpw_check_data_set(&w2);
    kvp_client_close(w2.c);

    /* A plain stop afterwards leaves nothing. */
    kvpt_daemon_stop(d);
    assert_false(kvpt_shm_exists(d->shm_name));
    assert_false(kvpt_shm_exists(name));
}

/*
 * Another daemon of the host, on its own socket, starting while the crashed one's pool waits for
 * its successor: a pool named with --shm-name is no leftover to it (nor is its index), so the
 * successor still adopts it (README: several daemons on one host).
 */
static void test_other_daemon_leaves_named_pool(void **state)
{
    (void)state;
    struct kvpt_daemon *d = kvpw_fresh_daemon();
    struct kvpt_daemon other;
    struct kvpw_workers w;
    char name[96];

    kvpw_crashed_with_data(d);
    kvpw_widx_name(d->socket, name, sizeof(name));
    kvpt_daemon_start(&other, kvpw_args64);
    assert_true(kvpt_shm_exists(d->shm_name));
    assert_true(kvpt_shm_exists(name));
    kvpt_daemon_stop(&other);

    kvpt_daemon_restart(d, kvpw_args64);
    kvpw_assert_log_count(d, KVPW_ADOPTED, 1);
    kvpw_workers_open(d, &w);
    assert_int_equal(kvpt_stat(w.c, "objects_committed"), kvpw_data_set_chunks());
    kvpw_check_data_set(&w);
    kvp_client_close(w.c);
    kvpt_daemon_stop(d);
}

/*
 * Default segment names: kvpool_l1_pool_<pid>_<random>, new at every start. The next daemon on
 * the socket finds its predecessor's pool through the index alone, adopts it under the old name
 * (workers map that one), and a plain stop afterwards removes it and the index.
 */
static void test_crash_adopted_default_name(void **state)
{
    (void)state;
    struct kvpt_daemon *d = kvpw_fresh_daemon();
    struct kvpw_workers w;
    char name[96], old[96], line[2048];
    kvpw_start_default_name(d, kvpw_args64);
    snprintf(old, sizeof(old), "%s", d->shm_name);
    kvpw_note_leftover(old);
    kvpw_widx_name(d->socket, name, sizeof(name));
    kvpw_workers_open(d, &w);
    kvpw_store_data_set(&w);
    int dead = (int)d->pid;
    assert_int_equal(kvpt_daemon_signal_wait(d, SIGKILL), 128 + SIGKILL);
    kvpw_start_default_name(d, kvpw_args64);
    int pid;
    const char *kind;
    unsigned long long chunks, bytes;
    kvpw_adopted_line(d, &pid, &kind, &chunks, &bytes, line, sizeof(line));
    assert_int_equal(pid, dead);
    assert_int_equal(chunks, kvpw_data_set_chunks());
    assert_string_equal(d->shm_name, old);
    kvpw_check_data_set(&w);
    assert_string_equal(kvp_instance_get_info(w.shm)->shm_name, old);
    kvp_client_close(w.c);
    kvpt_daemon_stop(d);
    assert_false(kvpt_shm_exists(old));
    assert_false(kvpt_shm_exists(name));
}

/*
 * LRU order survives: A (at the start of the pool) is stored first and read last, B after it and
 * never read again. After the crash, stores that need room evict B's chunks, never A's: an
 * adoption that took the order from the pages (A first) would evict A.
 */
static void test_crash_keeps_lru_order(void **state)
{
    (void)state;
    struct kvpt_daemon *d = kvpw_fresh_daemon();
    struct kvpw_workers w;
    kvpt_daemon_start(d, kvpw_args64);
    kvpw_workers_open(d, &w);
    assert_int_equal(kvpt_store_seq(w.big, 201, 16), 16); /* A: 16 MiB */
    assert_int_equal(kvpt_store_seq(w.big, 202, 16), 16); /* B: 16 MiB */
    kvpt_retrieve_seq(w.big, 201, 16);                    /* A used last */
    assert_int_equal(kvpt_daemon_signal_wait(d, SIGKILL), 128 + SIGKILL);
    kvpt_daemon_restart(d, kvpw_args64);
    kvpw_assert_log_count(d, KVPW_ADOPTED, 1);
    assert_int_equal(kvp_ping(w.c), 0);
    assert_int_equal(kvpt_stat(w.c, "objects_committed"), 32);
    assert_int_equal(kvpt_stat(w.c, "evictions"), 0);

    /* 40 MiB more into a 64 MiB pool holding 32: 8 MiB must go. */
    assert_int_equal(kvpt_store_seq(w.big, 203, 40), 40);
    uint64_t evicted = kvpt_stat(w.c, "evictions");
    print_message("evictions after the restart: %llu\n", (unsigned long long)evicted);
    assert_true(evicted >= 8);
    uint32_t *ta = kvpt_tokens(201, 16 * C), *tb = kvpt_tokens(202, 16 * C);
    kvp_tokens a = {.ids = ta, .count = 16 * C}, b = {.ids = tb, .count = 16 * C};
    assert_int_equal(kvp_lookup(w.big, &a), 16);
    assert_true(kvp_lookup(w.big, &b) < 16);
    kvpt_assert_seq(w.big, 201, 16, 16);
    free(ta);
    free(tb);
    kvp_client_close(w.c);
    kvpt_daemon_stop(d);
}

/* ---------------------------------------------------------------------------------------- */
/* (b) A planned restart                                                                     */

static void test_planned_restart(void **state)
{
    (void)state;
    struct kvpt_daemon *d = kvpw_fresh_daemon();
    struct kvpw_workers w;
    char name[96], line[2048], want[512];

    kvpt_daemon_start(d, kvpw_args64);
    kvpw_widx_name(d->socket, name, sizeof(name));
    kvpw_workers_open(d, &w);
    kvpw_store_data_set(&w);
    int old = (int)d->pid;

    assert_int_equal(kvpt_daemon_signal_wait(d, SIGUSR2), 0);
    snprintf(want, sizeof(want),
             "Leaving the pool (%llu chunks, %llu bytes) in /dev/shm/%s for the next kvpoold",
             (unsigned long long)kvpw_data_set_chunks(), (unsigned long long)kvpw_data_set_bytes(),
             d->shm_name);
    kvpw_assert_log_count(d, want, 1);
    assert_true(kvpt_shm_exists(d->shm_name));
    assert_true(kvpt_shm_exists(name));
    struct kvpw_map m;
    kvpw_map_shm(name, &m);
    assert_true(kvpw_widx_header(&m)->flags & KVP_WIDX_CLEAN);
    kvpw_unmap_shm(&m);

    kvpt_daemon_restart(d, kvpw_args64);
    int pid;
    const char *kind;
    unsigned long long chunks, bytes;
    kvpw_adopted_line(d, &pid, &kind, &chunks, &bytes, line, sizeof(line));
    print_message("%s\n", line);
    assert_int_equal(pid, old);
    assert_string_equal(kind, "planned");
    assert_int_equal(chunks, kvpw_data_set_chunks());
    assert_int_equal(bytes, kvpw_data_set_bytes());
    kvpw_check_data_set(&w);
    json_t *doc = kvpw_status(w.c);
    json_t *warm = kvpw_warm_of(doc);
    assert_string_equal(json_string_value(json_object_get(warm, "kind")), "adopted");
    assert_true(json_is_true(json_object_get(warm, "planned")));
    assert_int_equal(kvpw_jint(warm, "previous_pid"), old);
    json_decref(doc);
    assert_int_equal(kvpt_stat(w.c, "warm_restart_verified_chunks"), kvpw_data_set_chunks());

    /* Twice in a row, with new chunks in between. */
    assert_int_equal(kvpt_store_seq(w.shm, 160, 5), 5);
    old = (int)d->pid;
    assert_int_equal(kvpt_daemon_signal_wait(d, SIGUSR2), 0);
    kvpt_daemon_restart(d, kvpw_args64);
    kvpw_adopted_line(d, &pid, &kind, &chunks, &bytes, line, sizeof(line));
    assert_int_equal(pid, old);
    assert_int_equal(chunks, kvpw_data_set_chunks() + 5);
    kvpw_check_data_set(&w);
    kvpt_assert_seq(w.inl, 160, 5, 5);
    kvp_client_close(w.c);

    kvpt_daemon_stop(d);
    assert_false(kvpt_shm_exists(d->shm_name));
    assert_false(kvpt_shm_exists(name));
}

/* ---------------------------------------------------------------------------------------- */
/* (c) A plain stop                                                                          */

static void stop_leaves_nothing(int sig)
{
    struct kvpt_daemon *d = kvpw_fresh_daemon();
    struct kvpw_workers w;
    char name[96];
    kvpt_daemon_start(d, kvpw_args64);
    kvpw_widx_name(d->socket, name, sizeof(name));
    kvpw_assert_widx_exists(d);
    kvpw_workers_open(d, &w);
    kvpw_store_data_set(&w);
    kvp_client_close(w.c);
    assert_int_equal(kvpt_daemon_signal_wait(d, sig), 0);
    assert_false(kvpt_shm_exists(d->shm_name));
    assert_false(kvpt_shm_exists(name));
    kvpw_assert_log_count(d, "Leaving the pool", 0);
    /* The next daemon on the socket starts cold. */
    kvpt_daemon_restart(d, kvpw_args64);
    kvpw_assert_log_count(d, KVPW_ADOPTED, 0);
    kvpw_assert_log_count(d, KVPW_REFUSED, 0);
    kvpw_assert_cold_and_serving(d, 1);
    kvpt_daemon_stop(d);
    assert_false(kvpt_shm_exists(name));
}

static void test_sigterm_leaves_nothing(void **state)
{
    (void)state;
    stop_leaves_nothing(SIGTERM);
}

static void test_sigint_leaves_nothing(void **state)
{
    (void)state;
    stop_leaves_nothing(SIGINT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_crash_adopted, kvpw_teardown),
        cmocka_unit_test_teardown(test_crash_adopted_default_name, kvpw_teardown),
        cmocka_unit_test_teardown(test_other_daemon_leaves_named_pool, kvpw_teardown),
        cmocka_unit_test_teardown(test_crash_keeps_lru_order, kvpw_teardown),
        cmocka_unit_test_teardown(test_planned_restart, kvpw_teardown),
        cmocka_unit_test_teardown(test_sigterm_leaves_nothing, kvpw_teardown),
        cmocka_unit_test_teardown(test_sigint_leaves_nothing, kvpw_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
