/*
 * test_security.c - who may connect (SO_PEERCRED policy), file modes of the socket and the
 * segment, and tenant isolation by cache salt. Parts that need a second user run a child
 * process as "nobody" (uid/gid 65534); they are skipped when the test does not run as root.
 */
#include <errno.h>
#include <grp.h>
#include <setjmp.h>
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

#define C 16
#define NOBODY 65534

/* Child exit codes. */
enum { CHILD_OK = 0, CHILD_FAIL = 1, CHILD_NOPRIV = 77 };

/*
 * Runs as nobody: opens a client and registers with auto transport. want_open is the expected
 * kvp_client_open result; want_msg a substring of its message (or NULL); want_transport the
 * expected transport when the open succeeds.
 */
static int as_nobody(const struct kvpt_daemon *d, int want_open, const char *want_msg,
                     uint32_t want_transport, const char *want_reason)
{
    if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0)
        return CHILD_NOPRIV;
    kvp_client *c = NULL;
    kvp_opts o = {.socket_path = d->socket, .timeout_ms = 5000};
    int rc = kvp_client_open(&o, &c);
    if (rc != want_open) {
        fprintf(stderr, "open: %d (%s), want %d\n", rc, kvp_strerror(rc), want_open);
        return CHILD_FAIL;
    }
    if (rc != 0) {
        if (want_msg && !strstr(kvp_last_error(c), want_msg)) {
            fprintf(stderr, "message '%s' lacks '%s'\n", kvp_last_error(c), want_msg);
            return CHILD_FAIL;
        }
        kvp_client_close(c);
        return CHILD_OK;
    }
    kvp_register_opts ro = kvpt_layout("nobody-worker", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    if (kvp_register(c, &ro, &inst) != 0)
        return CHILD_FAIL;
    const kvp_instance_info *info = kvp_instance_get_info(inst);
    if (info->transport != want_transport || (want_reason && !strstr(info->reason, want_reason))) {
        fprintf(stderr, "transport %u reason '%s'\n", info->transport, info->reason);
        return CHILD_FAIL;
    }
    kvp_client_close(c);
    return CHILD_OK;
}

static void run_as_nobody(const struct kvpt_daemon *d, int want_open, const char *want_msg,
                          uint32_t want_transport, const char *want_reason)
{
    if (geteuid() != 0)
        skip();
    /* Let nobody reach the socket inside the test's private directory. */
    assert_int_equal(chmod(d->dir, 0755), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(as_nobody(d, want_open, want_msg, want_transport, want_reason));
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == CHILD_NOPRIV)
        skip();
    assert_int_equal(WEXITSTATUS(st), CHILD_OK);
}

/* Default socket mode 0600: another user cannot even connect. */
static void test_socket_mode_blocks_other_users(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "4MiB", NULL};
    kvpt_daemon_start(&d, args);
    run_as_nobody(&d, -EACCES, NULL, 0, NULL);
    kvpt_daemon_stop(&d);
}

/* An open socket file is not enough: the peer-credential policy still refuses. */
static void test_peer_credentials_refused(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "4MiB", "--socket-mode", "0666", NULL};
    kvpt_daemon_start(&d, args);
    run_as_nobody(&d, -EACCES, NULL, 0, NULL);
    assert_true(kvpt_log_wait(&d, "uid 65534 gid 65534: not allowed", 5000));
    kvp_client *c = kvpt_connect(&d);
    assert_int_equal(kvpt_stat(c, "connections_rejected"), 1);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

/*
 * Allowed by uid: nobody connects, but cannot open the owner-only segment, so it falls back to
 * inline by itself and the daemon's log says why.
 */
static void test_allow_uid(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "4MiB", "--socket-mode", "0666", "--allow-uid",
                          "123,65534", NULL};
    kvpt_daemon_start(&d, args);
    run_as_nobody(&d, 0, NULL, KVP_TRANSPORT_INLINE, "Permission denied");
    assert_true(kvpt_log_wait(&d,
                              "Instance nobody-worker non-GPU context using inline transport "
                              "(cannot open /dev/shm/",
                              5000));
    kvpt_daemon_stop(&d);
}

/* Allowed by group, and a group-readable segment lets it use shared memory. */
static void test_allow_gid_and_group_segment(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "4MiB",       "--socket-mode", "0666", "--allow-gid",
                          "65534",     "--shm-mode", "0660",          NULL};
    kvpt_daemon_start(&d, args);
    char path[160];
    struct stat st;
    snprintf(path, sizeof(path), "/dev/shm/%s", d.shm_name);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0660);
    /* Give the segment to nobody's group, as an operator would with a shared group. */
    assert_int_equal(chown(path, 0, NOBODY), 0);
    run_as_nobody(&d, 0, NULL, KVP_TRANSPORT_SHM, NULL);
    kvpt_daemon_stop(&d);
}

static void test_bad_security_options(void **state)
{
    (void)state;
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "%s --shm-mode 0666 2>/dev/null", KVP_TEST_KVPOOLD);
    assert_int_equal(WEXITSTATUS(system(cmd)), 2); /* never world-accessible */
    snprintf(cmd, sizeof(cmd), "%s --allow-uid root 2>/dev/null", KVP_TEST_KVPOOLD);
    assert_int_equal(WEXITSTATUS(system(cmd)), 2);
    snprintf(cmd, sizeof(cmd), "%s --shm-backend tmpfs 2>/dev/null", KVP_TEST_KVPOOLD);
    assert_int_equal(WEXITSTATUS(system(cmd)), 2);
}

/* The cache salt isolates tenants: same tokens, different salt, never the same chunks. */
static void test_salt_isolation(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "4MiB", "--chunk-size", "16", NULL};
    kvpt_daemon_start(&d, args);
    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts o = kvpt_layout("tenant", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
    uint32_t *tok = kvpt_tokens(50, 4 * C);
    kvp_tokens a = {.ids = tok, .count = 4 * C, .salt = "tenant-a", .salt_len = 8};
    kvp_tokens b = a, none = a;
    b.salt = "tenant-b";
    none.salt = NULL;
    none.salt_len = 0;

    void *bufs[4];
    for (uint32_t i = 0; i < 4; i++) {
        bufs[i] = malloc(bytes);
        kvpt_fill(bufs[i], bytes, 50, i);
    }
    assert_int_equal(kvp_store(inst, &a, 0, 4 * C, (const void *const *)bufs, NULL), 4);
    assert_int_equal(kvp_lookup(inst, &a), 4);
    assert_int_equal(kvp_lookup(inst, &b), 0);
    assert_int_equal(kvp_lookup(inst, &none), 0);
    assert_int_equal(kvp_retrieve(inst, &b, 0, 4 * C, bufs), 0);
    /* Tenant b storing the same tokens gets its own chunks, not "cached". */
    kvp_store_result r;
    assert_int_equal(kvp_store(inst, &b, 0, 4 * C, (const void *const *)bufs, &r), 4);
    assert_int_equal(r.cached, 0);
    for (uint32_t i = 0; i < 4; i++)
        free(bufs[i]);
    free(tok);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_socket_mode_blocks_other_users),
        cmocka_unit_test(test_peer_credentials_refused),
        cmocka_unit_test(test_allow_uid),
        cmocka_unit_test(test_allow_gid_and_group_segment),
        cmocka_unit_test(test_bad_security_options),
        cmocka_unit_test(test_salt_isolation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
