/*
 * test_lifecycle.c - what happens around crashes and restarts: a worker killed between prepare
 * and commit, SIGTERM cleanup, a stale segment from a killed daemon, a segment held by a live
 * daemon, a socket held by a live daemon, the names of the daemon's threads.
 */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define C 16

static const char *const small[] = {"--l1-size", "16MiB", "--chunk-size", "16", NULL};

/*
 * Child: connect, register, prepare a store, scribble half the data into the slots (or start an
 * inline upload and stop half-way), tell the parent, then wait to be killed.
 */
static void crash_child(const struct kvpt_daemon *d, int fd, uint32_t transport)
{
    kvp_client *c = NULL;
    kvp_instance *inst = NULL;
    kvp_opts o = {.socket_path = d->socket, .timeout_ms = 5000};
    kvp_register_opts ro = kvpt_layout(transport == KVP_TRANSPORT_SHM ? "victim-shm"
                                                                      : "victim-inline",
                                       transport);
    kvp_store_plan sp;
    uint32_t *tok = kvpt_tokens(42, 8 * C);
    kvp_tokens t = {.ids = tok, .count = 8 * C};

    if (kvp_client_open(&o, &c) || kvp_register(c, &ro, &inst) ||
        kvp_prepare_store(inst, &t, 0, 8 * C, &sp) != 8)
        _exit(3);
    if (transport == KVP_TRANSPORT_SHM)
        for (uint32_t i = 0; i < sp.nslots / 2; i++)
            memset(sp.slots[i].data, 0xab, sp.slots[i].length);
    if (write(fd, "r", 1) != 1)
        _exit(4);
    pause();
    _exit(0);
}

static void test_killed_worker_releases_everything(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    kvpt_daemon_start(&d, small);
    kvp_client *c = kvpt_connect(&d);
    uint64_t used = kvpt_stat(c, "pool_used");

    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(p[0]);
        crash_child(&d, p[1], KVP_TRANSPORT_SHM);
    }
    close(p[1]);
    char ch;
    assert_int_equal(read(p[0], &ch, 1), 1);
    close(p[0]);
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 8);
    assert_true(kvpt_stat(c, "pool_used") > used);

    kill(child, SIGKILL);
    waitpid(child, NULL, 0);

    /* Released at once on disconnect, not at a timeout. */
    assert_int_equal(kvpt_stat_wait(&d, "objects_reserved", 0, 5000), 0);
    assert_int_equal(kvpt_stat(c, "pool_used"), used);
    assert_int_equal(kvpt_stat(c, "instances"), 0);
    assert_true(kvpt_log_wait(&d, "Instance victim-shm unregistered (connection closed)", 5000));

    /* Nothing half-written is visible, and the key can be stored afresh. */
    kvp_register_opts ro = kvpt_layout("survivor", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    uint32_t *tok = kvpt_tokens(42, 8 * C);
    kvp_tokens t = {.ids = tok, .count = 8 * C};
    kvp_store_result r;
    assert_int_equal(kvp_register(c, &ro, &inst), 0);
    assert_int_equal(kvp_lookup(inst, &t), 0);
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
    void *bufs[8];
    for (uint32_t i = 0; i < 8; i++) {
        bufs[i] = malloc(bytes);
        kvpt_fill(bufs[i], bytes, 42, i);
    }
    assert_int_equal(kvp_store(inst, &t, 0, 8 * C, (const void *const *)bufs, &r), 8);
    assert_int_equal(r.busy, 0);
    for (uint32_t i = 0; i < 8; i++)
        memset(bufs[i], 0, bytes);
    assert_int_equal(kvp_retrieve(inst, &t, 0, 8 * C, bufs), 8);
    for (uint32_t i = 0; i < 8; i++) {
        assert_true(kvpt_check(bufs[i], bytes, 42, i));
        free(bufs[i]);
    }
    free(tok);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

/* A client that closes its connection between requests (every `kvpool` command does) is
 * logged as such, not as a connection reset. */
static void test_client_close_logged(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "16MiB", "--chunk-size", "16", "--log-level", "debug", NULL};
    kvpt_daemon_start(&d, args);
    kvp_client *c = kvpt_connect(&d);
    assert_int_equal(kvp_ping(c), 0);
    kvp_client_close(c);
    assert_true(kvpt_log_wait(&d, "closed by its client", 5000));
    assert_int_equal(kvpt_log_count(&d, "reset by peer"), 0);
    kvpt_daemon_stop(&d);
}

static void test_sigterm_cleans_up(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    kvpt_daemon_start(&d, small);
    char name[96], sock[128];
    snprintf(name, sizeof(name), "%s", d.shm_name);
    snprintf(sock, sizeof(sock), "%s", d.socket);
    assert_true(kvpt_shm_exists(name));

    /* A connected worker with a reservation must not keep the daemon from stopping. */
    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts ro = kvpt_layout("term", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    kvp_store_plan sp;
    uint32_t *tok = kvpt_tokens(9, 2 * C);
    kvp_tokens t = {.ids = tok, .count = 2 * C};
    assert_int_equal(kvp_register(c, &ro, &inst), 0);
    assert_int_equal(kvp_prepare_store(inst, &t, 0, 2 * C, &sp), 2);

    assert_int_equal(kvpt_daemon_signal_wait(&d, SIGTERM), 0);
    assert_false(kvpt_shm_exists(name));
    assert_int_equal(access(sock, F_OK), -1);
    assert_true(kvpt_log_wait(&d, "kvpoold stopped", 1000));
    /* The lock file that stays is explained, once. */
    char lock_line[256];
    snprintf(lock_line, sizeof(lock_line), "%s.lock stays: the next kvpoold on this socket", sock);
    assert_int_equal(kvpt_log_count(&d, lock_line), 1);
    /* The worker learns at once that the daemon is gone. */
    assert_true(kvp_ping(c) < 0);
    free(sp.slots);
    free(tok);
    kvp_client_close(c);
    d.pid = 0;
    kvpt_daemon_stop(&d);
}

static void test_stale_segment_replaced(void **state)
{
    (void)state;
    struct kvpt_daemon d1, d2;
    kvpt_daemon_start(&d1, small);
    char name[96];
    snprintf(name, sizeof(name), "%s", d1.shm_name);
    assert_int_equal(kvpt_daemon_signal_wait(&d1, SIGKILL), 128 + SIGKILL);
    assert_true(kvpt_shm_exists(name)); /* SIGKILL leaves the segment behind */

    const char *args[] = {"--l1-size", "16MiB", "--chunk-size", "16", "--shm-name", name, NULL};
    kvpt_daemon_start(&d2, args);
    assert_true(kvpt_log_wait(&d2, "Replacing stale segment", 5000));
    assert_true(kvpt_log_wait(&d2, "SHM enabled", 5000));

    kvp_client *c = kvpt_connect(&d2);
    kvp_register_opts ro = kvpt_layout("after-restart", KVP_TRANSPORT_SHM);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &ro, &inst), 0);
    assert_int_equal(kvp_instance_get_info(inst)->transport, KVP_TRANSPORT_SHM);
    kvp_client_close(c);
    kvpt_daemon_stop(&d2);
    assert_false(kvpt_shm_exists(name));
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", d1.dir);
    assert_int_equal(system(cmd), 0);
}

static void test_live_segment_refused(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    kvpt_daemon_start(&d, small);

    char sock[160], log[160], cmd[512];
    snprintf(sock, sizeof(sock), "%s/second.sock", d.dir);
    snprintf(log, sizeof(log), "%s/second.log", d.dir);
    snprintf(cmd, sizeof(cmd), "%s --socket %s --l1-size 16MiB --shm-name %s 2>%s",
             KVP_TEST_KVPOOLD, sock, d.shm_name, log);
    int st = system(cmd);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 1);
    snprintf(cmd, sizeof(cmd), "grep -q 'is in use by a running kvpoold' %s", log);
    assert_int_equal(system(cmd), 0);

    /* The same socket path is refused too, without touching the first daemon's files. */
    snprintf(cmd, sizeof(cmd), "%s --socket %s --l1-size 16MiB 2>%s", KVP_TEST_KVPOOLD, d.socket,
             log);
    st = system(cmd);
    assert_int_equal(WEXITSTATUS(st), 1);
    snprintf(cmd, sizeof(cmd), "grep -q 'another kvpoold (pid [0-9]*) owns socket' %s", log);
    assert_int_equal(system(cmd), 0);

    /* The first daemon is unaffected. */
    kvp_client *c = kvpt_connect(&d);
    assert_int_equal(kvp_ping(c), 0);
    kvp_client_close(c);
    assert_true(kvpt_shm_exists(d.shm_name));
    kvpt_daemon_stop(&d);
}

static void test_socket_permissions(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    struct stat st;
    kvpt_daemon_start(&d, small);
    assert_int_equal(stat(d.socket, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);
    char path[160];
    snprintf(path, sizeof(path), "/dev/shm/%s", d.shm_name);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    kvpt_daemon_stop(&d);
}

/* True when one of pid's threads is named name (/proc/PID/task/TID/comm). */
static bool has_thread(pid_t pid, const char *name)
{
    char path[64], comm[32];
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *dir = opendir(path);
    bool found = false;
    struct dirent *e;

    assert_non_null(dir);
    /* cppcheck-suppress readdirCalled ; readdir_r is deprecated, and dir is private to this call */
    while (!found && (e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%.16s/comm", (int)pid, e->d_name);
        FILE *f = fopen(path, "re");
        if (f && fgets(comm, sizeof(comm), f)) {
            comm[strcspn(comm, "\n")] = '\0';
            found = strcmp(comm, name) == 0;
        }
        if (f)
            fclose(f);
    }
    closedir(dir);
    return found;
}

/* Each of the daemon's threads says what it is to top -H, ps -L and perf. */
static void test_thread_names(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char dir[] = "/tmp/kvpt-lmc-XXXXXX", lmc[96];
    assert_non_null(mkdtemp(dir)); /* mode 0700: kvpoold refuses a socket others could replace */
    snprintf(lmc, sizeof(lmc), "ipc://%s/lmc.sock", dir);
    const char *const args[] = {"--l1-size", "16MiB",  "--chunk-size", "16", "--lmcache",
                                lmc,         "--http", "127.0.0.1:0",  NULL};
    kvpt_daemon_start(&d, args);
    kvp_client *c = kvpt_connect(&d);
    assert_int_equal(kvp_ping(c), 0);
    static const char *const names[] = {"kvp-expiry", "kvp-lmcache", "kvp-http", "kvp-refusals",
                                        "kvp-session"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!has_thread(d.pid, names[i]))
            fail_msg("no thread named %s in kvpoold", names[i]);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
    unlink(lmc + strlen("ipc://"));
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_killed_worker_releases_everything),
        cmocka_unit_test(test_sigterm_cleans_up),
        cmocka_unit_test(test_client_close_logged),
        cmocka_unit_test(test_stale_segment_replaced),
        cmocka_unit_test(test_live_segment_refused),
        cmocka_unit_test(test_socket_permissions),
        cmocka_unit_test(test_thread_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
