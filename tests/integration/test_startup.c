/*
 * test_startup.c - how kvpoold starts and stops: one owner per socket path, configuration
 * errors found before the pool is reserved and reported in one ERROR line, serving at once while
 * the rest of a large pool is reserved in the background (with progress lines), the command line
 * winning over a bad environment value, and the stop signals (SIGHUP like SIGTERM, SIGPIPE
 * harmless).
 *
 * "Before the pool is reserved" is checked through the log, not a clock: the daemon logs
 * "Reserving N bytes for the pool" before it touches the pool, so a failure that must come
 * first is one whose log has no such line.
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
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static const char *const small[] = {"--l1-size", "16MiB", "--chunk-size", "16", NULL};

static void rm_dir(const struct kvpt_daemon *d)
{
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", d->dir);
    assert_int_equal(system(cmd), 0);
}

static void dump_log(const struct kvpt_daemon *d)
{
    char cmd[320];
    snprintf(cmd, sizeof(cmd), "echo '--- %s:' >&2; cat %s >&2", d->log, d->log);
    if (system(cmd) != 0)
        fprintf(stderr, "(no log)\n");
}

/* The log of a daemon that must have failed with one ERROR line containing want. */
static void expect_one_error(const struct kvpt_daemon *d, const char *want)
{
    if (kvpt_log_count(d, " ERROR ") != 1 || kvpt_log_count(d, want) != 1) {
        dump_log(d);
        fail_msg("expected exactly one ERROR line, containing \"%s\"", want);
    }
}

static bool answers_ping(const char *socket)
{
    kvp_client *c = NULL;
    kvp_opts o = {.socket_path = socket, .timeout_ms = 5000};
    if (kvp_client_open(&o, &c) != 0)
        return false;
    int rc = kvp_ping(c);
    kvp_client_close(c);
    return rc == 0;
}

/* Two daemons started at the same moment on one socket: exactly one serves it. */
static void test_overlapping_starts(void **state)
{
    (void)state;
    struct kvpt_daemon a, b;
    const char *args[] = {"--l1-size", "256MiB", "--chunk-size", "16", NULL};
    kvpt_daemon_spawn(&a, NULL, args);
    kvpt_daemon_spawn(&b, a.socket, args);

    /* Wait until each has either said ready or exited. */
    int status[2] = {-1, -1};
    struct kvpt_daemon *d[2] = {&a, &b};
    for (int i = 0; i < 3000; i++) {
        bool settled = true;
        for (int k = 0; k < 2; k++) {
            if (status[k] < 0 && d[k]->pid > 0)
                status[k] = kvpt_daemon_wait_exit(d[k], 0);
            settled &= status[k] >= 0 || kvpt_log_count(d[k], " ready: ") > 0;
        }
        if (settled)
            break;
        kvpt_sleep_ms(10);
    }
    int ready = kvpt_log_count(&a, " ready: ") + kvpt_log_count(&b, " ready: ");
    if (ready != 1) {
        dump_log(&a);
        dump_log(&b);
        fail_msg("%d daemons reported ready on one socket", ready);
    }
    struct kvpt_daemon *winner = kvpt_log_count(&a, " ready: ") ? &a : &b;
    struct kvpt_daemon *loser = winner == &a ? &b : &a;
    int lost = status[loser == &a ? 0 : 1];
    if (lost < 0)
        lost = kvpt_daemon_wait_exit(loser, 20000);
    assert_int_equal(lost, 1);
    char want[256];
    snprintf(want, sizeof(want), "another kvpoold (pid %d) owns socket %s", (int)winner->pid,
             a.socket);
    expect_one_error(loser, want);
    /* The loser gave up before reserving anything. */
    assert_int_equal(kvpt_log_count(loser, "Reserving"), 0);

    /* The loser's exit left the winner's socket alone. */
    assert_true(answers_ping(a.socket));
    kvpt_daemon_stop(winner);
    struct stat st;
    assert_int_equal(lstat(a.socket, &st), -1); /* the winner removed its own socket */
    kvpt_daemon_stop(loser);
    if (winner != &a)
        rm_dir(&a);
}

/* A second daemon started on a live daemon's socket never removes it, even when stopped. */
static void test_second_start_keeps_first_socket(void **state)
{
    (void)state;
    struct kvpt_daemon a, b;
    kvpt_daemon_start(&a, small);
    kvpt_daemon_spawn(&b, a.socket, small);
    assert_int_equal(kvpt_daemon_wait_exit(&b, 20000), 1);
    char want[256];
    snprintf(want, sizeof(want), "another kvpoold (pid %d) owns socket %s", (int)a.pid, a.socket);
    expect_one_error(&b, want);
    assert_true(answers_ping(a.socket));
    /* Its lock file stays (unlinking a lock file races with the next daemon opening it). */
    char lock[160];
    snprintf(lock, sizeof(lock), "%s.lock", a.socket);
    assert_int_equal(access(lock, F_OK), 0);
    kvpt_daemon_stop(&b);
    assert_int_equal(kvpt_daemon_signal_wait(&a, SIGTERM), 0);
    assert_int_equal(access(a.socket, F_OK), -1);
    assert_int_equal(access(lock, F_OK), 0);
    kvpt_daemon_stop(&a);
}

/*
 * Someone removes the socket and its lock file (a /tmp cleaner, say) and another daemon takes
 * the path: the first daemon's exit must leave the new socket alone.
 */
static void test_replaced_socket_not_unlinked(void **state)
{
    (void)state;
    struct kvpt_daemon a, b;
    char lock[160];
    kvpt_daemon_start(&a, small);
    snprintf(lock, sizeof(lock), "%s.lock", a.socket);
    assert_int_equal(unlink(a.socket), 0);
    assert_int_equal(unlink(lock), 0);

    kvpt_daemon_spawn(&b, a.socket, small);
    assert_true(kvpt_log_wait(&b, " ready: ", 20000));
    assert_true(answers_ping(a.socket));

    assert_int_equal(kvpt_daemon_signal_wait(&a, SIGTERM), 0);
    struct stat st;
    assert_int_equal(lstat(a.socket, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_true(answers_ping(a.socket));
    assert_true(kvpt_log_wait(&a, "is no longer the socket this kvpoold bound", 1000));

    kvpt_daemon_stop(&b);
    assert_int_equal(lstat(a.socket, &st), -1);
    kvpt_daemon_stop(&a);
}

/* A missing socket directory is found before a 4 GiB pool is reserved. */
static void test_missing_directory(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "4GiB", NULL};
    kvpt_daemon_spawn(&d, "/nonexistent/kvpt-dir/s.sock", args);
    assert_int_equal(kvpt_daemon_wait_exit(&d, 20000), 1);
    expect_one_error(&d, "the socket directory /nonexistent/kvpt-dir does not exist");
    assert_int_equal(kvpt_log_count(&d, "Reserving"), 0);
    assert_int_equal(kvpt_log_count(&d, "No such file"), 0);
    assert_false(kvpt_shm_exists(d.shm_name));
    kvpt_daemon_stop(&d);
}

/* A file that is not a socket: refused in words, before the pool, and left as it was. */
static void test_path_not_a_socket(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char dir[] = "/tmp/kvpt-file-XXXXXX", path[160], cmd[160];
    const char *args[] = {"--l1-size", "1GiB", NULL};
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/data.txt", dir);
    FILE *f = fopen(path, "we");
    assert_non_null(f);
    fputs("precious\n", f);
    fclose(f);

    kvpt_daemon_spawn(&d, path, args);
    assert_int_equal(kvpt_daemon_wait_exit(&d, 20000), 1);
    expect_one_error(&d, "exists and is not a socket");
    assert_int_equal(kvpt_log_count(&d, "File exists"), 0);
    assert_int_equal(kvpt_log_count(&d, "Reserving"), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_size, 9);
    kvpt_daemon_stop(&d);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* A --max-clients the descriptor limit cannot serve is a configuration error, in words. */
static void test_max_clients_over_fd_limit(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char cmd[512];
    kvpt_daemon_start(&d, small); /* for a directory; stopped at once */
    assert_int_equal(kvpt_daemon_signal_wait(&d, SIGTERM), 0);
    assert_int_equal(truncate(d.log, 0), 0);
    snprintf(cmd, sizeof(cmd),
             "ulimit -n 200 && exec timeout -s TERM 20 %s --socket %s --l1-size 1GiB "
             "--max-clients 256 --shm-name '' </dev/null >/dev/null 2>%s",
             KVP_TEST_KVPOOLD, d.socket, d.log);
    int st = system(cmd);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 1);
    expect_one_error(&d, "--max-clients 256 needs 320 file descriptors, but the limit is 200");
    assert_int_equal(kvpt_log_count(&d, "Too many"), 0);
    assert_int_equal(kvpt_log_count(&d, "Reserving"), 0);

    /* Within the hard limit the soft one is raised, and the daemon starts. */
    snprintf(cmd, sizeof(cmd),
             "ulimit -Sn 100 && ulimit -Hn 1024 && exec %s --socket %s --l1-size 16MiB "
             "--max-clients 256 --shm-name '' </dev/null >/dev/null 2>%s & echo $! >%s/pid",
             KVP_TEST_KVPOOLD, d.socket, d.log, d.dir);
    assert_int_equal(system(cmd), 0);
    assert_true(kvpt_log_wait(&d, " ready: ", 20000));
    char pidfile[160];
    snprintf(pidfile, sizeof(pidfile), "%s/pid", d.dir);
    FILE *f = fopen(pidfile, "re");
    assert_non_null(f);
    int pid = 0;
    assert_int_equal(fscanf(f, "%d", &pid), 1);
    fclose(f);
    assert_int_equal(kill(pid, SIGTERM), 0);
    assert_true(kvpt_log_wait(&d, "kvpoold stopped", 20000));
    kvpt_daemon_stop(&d);
}

/*
 * Start-up reserves the first part of the pool and serves; the rest is reserved in the
 * background, with progress lines (interval 0: after every 256 MiB step), and handed to the
 * store as it goes, until the whole pool is usable.
 */
static void test_serves_while_reserving(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "768MiB", "--chunk-size", "16", NULL};
    setenv("KVPOOL_PROGRESS_INTERVAL_MS", "0", 1);
    kvpt_daemon_start(&d, args);
    unsetenv("KVPOOL_PROGRESS_INTERVAL_MS");
    assert_int_equal(kvpt_log_count(&d, " ready: pool 805306368 bytes (268431360 reserved, "
                                        "536875008 more in the background), SHM enabled"),
                     1);
    assert_int_equal(kvpt_log_count(&d, "INFO  Reserving 268435456 of 805310464 bytes for the "
                                        "pool (/dev/shm/"),
                     1);
    assert_int_equal(kvpt_log_count(&d, ") before serving"), 1);
    assert_true(kvpt_log_wait(&d, "INFO  Reserved 536875008 bytes for the pool in ", 20000));
    assert_int_equal(kvpt_log_count(&d, "INFO  Reserving 536875008 of 805310464 bytes for the "
                                        "pool (/dev/shm/"),
                     1);
    assert_int_equal(kvpt_log_count(&d, ") in the background"), 1);
    assert_int_equal(kvpt_log_count(&d, "INFO  Reserving the pool: 536870912 of 805310464 bytes "
                                        "(66%)"),
                     1);
    /* The last full step ends 4 KiB short of the end (the header page comes first). */
    assert_int_equal(kvpt_log_count(&d, "INFO  Reserving the pool: 805306368 of 805310464 bytes "
                                        "(99%)"),
                     1);
    assert_int_equal(kvpt_log_count(&d, " GB/s, about "), 2);

    /* The whole pool is usable now: the store's free space says so. */
    kvp_client *c = kvpt_connect(&d);
    assert_int_equal(kvpt_stat(c, "pool_reserved"), 805306368);
    assert_int_equal(kvpt_stat(c, "pool_largest_free"), 805306368);
    kvp_client_close(c);
    assert_int_equal(kvpt_log_count(&d, " WARN "), 0);
    kvpt_daemon_stop(&d);
}

/*
 * A large pool serves at once: a worker registers, stores and retrieves while the rest is
 * still being reserved (pages come from the reserved part only, so nothing can fault), the
 * reserved part only grows, and a stop request during the warm-up ends the daemon cleanly.
 */
static void test_store_and_stop_during_warmup(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "4GiB", "--chunk-size", "16", NULL};
    kvpt_daemon_start(&d, args);
    assert_int_equal(kvpt_log_count(&d, " ready: pool 4294967296 bytes (268431360 reserved, "
                                        "4026535936 more in the background)"),
                     1);

    kvp_client *c = kvpt_connect(&d);
    uint64_t before = kvpt_stat(c, "pool_reserved");
    assert_true(before >= 268431360 && before <= 4294967296ull);
    kvp_register_opts o = kvpt_layout_big("warm", KVP_TRANSPORT_SHM);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    assert_int_equal(kvp_instance_get_info(inst)->transport, KVP_TRANSPORT_SHM);
    assert_int_equal(kvpt_store_seq(inst, 7, 32), 32);
    kvpt_retrieve_seq(inst, 7, 32);
    assert_true(kvpt_stat(c, "pool_reserved") >= before);
    kvp_client_close(c);

    assert_int_equal(kvpt_daemon_signal_wait(&d, SIGTERM), 0);
    assert_false(kvpt_shm_exists(d.shm_name));
    assert_int_equal(access(d.socket, F_OK), -1);
    assert_int_equal(kvpt_log_count(&d, " ERROR "), 0);
    assert_int_equal(kvpt_log_count(&d, " WARN "), 0);
    kvpt_daemon_stop(&d);
}

/*
 * A pool of exactly one reservation step: the first step covers the header page too, so 4096
 * bytes of the pool are left for the background, and the ready line says so rather than "the
 * rest" (which reads as most of the pool).
 */
static void test_pool_of_one_step(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "256MiB", "--chunk-size", "16", NULL};
    kvpt_daemon_start(&d, args);
    assert_int_equal(kvpt_log_count(&d, " ready: pool 268435456 bytes (268431360 reserved, 4096 "
                                        "more in the background), "),
                     1);
    assert_int_equal(kvpt_log_count(&d, "the rest in the background"), 0);
    assert_int_equal(kvpt_stat_wait(&d, "pool_reserved", 268435456, 20000), 268435456);
    kvpt_daemon_stop(&d);
}

/* The command line wins over a bad environment value; without it the value is fatal. */
static void test_bad_env_overridden(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    setenv("KVPOOL_L1_SIZE", "1KiB", 1);
    kvpt_daemon_start(&d, small);
    assert_true(kvpt_log_wait(&d, "ignoring invalid KVPOOL_L1_SIZE '1KiB'", 1000));
    assert_true(kvpt_log_wait(&d, "ready: pool 16777216 bytes", 1000));
    kvpt_daemon_stop(&d);

    const char *no_size[] = {"--chunk-size", "16", NULL};
    kvpt_daemon_spawn(&d, NULL, no_size);
    unsetenv("KVPOOL_L1_SIZE");
    assert_int_equal(kvpt_daemon_wait_exit(&d, 20000), 2);
    assert_true(kvpt_log_wait(&d, "invalid l1-size '1KiB' (from KVPOOL_L1_SIZE)", 1000));
    kvpt_daemon_stop(&d);
}

/*
 * SIGPIPE does nothing; SIGHUP reloads the configuration (test_reload.c) and never stops the
 * daemon, even without a configuration file; SIGTERM stops it and cleans up.
 */
static void test_sighup_and_sigpipe(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    kvpt_daemon_start(&d, small);
    char name[96];
    snprintf(name, sizeof(name), "%s", d.shm_name);
    assert_true(kvpt_shm_exists(name));

    /* A connected client has a thread in the daemon: the signal may land anywhere. */
    kvp_client *c = kvpt_connect(&d);
    assert_int_equal(kill(d.pid, SIGPIPE), 0);
    kvpt_sleep_ms(100);
    assert_int_equal(kvp_ping(c), 0);

    assert_int_equal(kill(d.pid, SIGHUP), 0);
    assert_true(kvpt_log_wait(&d, "Reloaded the configuration: nothing changed", 5000));
    assert_int_equal(kvp_ping(c), 0);
    assert_true(kvpt_shm_exists(name));
    assert_int_equal(kvpt_log_count(&d, "kvpoold stopping"), 0);
    kvp_client_close(c);

    assert_int_equal(kvpt_daemon_signal_wait(&d, SIGTERM), 0);
    assert_false(kvpt_shm_exists(name));
    assert_int_equal(access(d.socket, F_OK), -1);
    assert_true(kvpt_log_wait(&d, "kvpoold stopped", 1000));
    kvpt_daemon_stop(&d);
}

/* A failed case skips its own clean-up: no variable it set may reach the next case. */
static int clean_env(void **state)
{
    (void)state;
    unsetenv("KVPOOL_L1_SIZE");
    unsetenv("KVPOOL_PROGRESS_INTERVAL_MS");
    return 0;
}

#define T(f) cmocka_unit_test_teardown(f, clean_env)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_overlapping_starts),
        T(test_second_start_keeps_first_socket),
        T(test_replaced_socket_not_unlinked),
        T(test_missing_directory),
        T(test_path_not_a_socket),
        T(test_max_clients_over_fd_limit),
        T(test_serves_while_reserving),
        T(test_store_and_stop_during_warmup),
        T(test_pool_of_one_step),
        T(test_bad_env_overridden),
        T(test_sighup_and_sigpipe),
    };
    return cmocka_run_group_tests(tests, clean_env, NULL);
}
