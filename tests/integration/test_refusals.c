/*
 * test_refusals.c - connections the daemon does not serve are answered, and never at the
 * expense of the others.
 *
 * A peer the credential policy refuses may connect and send nothing; hundreds of such
 * connections must not keep allowed workers from being served (the part that needs a second
 * user runs a child as nobody, 65534, and is skipped when the test does not run as root). A
 * connection the daemon cannot serve (no thread, no memory for it: injected with
 * KVPOOL_FAULT_CONN, which needs a build with KVP_FAULT_INJECTION) gets an error reply, not a
 * silent close.
 */
#include <errno.h>
#include <grp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/wire.h"
#include "harness.h"

#define NOBODY 65534
#define SILENT 300 /* refused connections that send nothing */

/*
 * In a child as nobody: opens up to SILENT connections that never send a byte (each connect
 * bounded by 100 ms, so a daemon that does not accept cannot stall it), reports how many it
 * got on report, and holds them until hold is closed. Returns an exit code.
 */
static int silent_flood(const struct kvpt_daemon *d, int report, int hold)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    struct timeval tv = {.tv_sec = 0, .tv_usec = 100000};
    int n = 0;

    if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0)
        return 77;
    if (strlen(d->socket) >= sizeof(addr.sun_path))
        return 1;
    memcpy(addr.sun_path, d->socket, strlen(d->socket) + 1);
    for (int i = 0; i < SILENT; i++) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            break;
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0)
            n++; /* kept open, silent, until the child exits */
        else
            close(fd);
    }
    if (write(report, &n, sizeof(n)) != sizeof(n))
        return 1;
    char c;
    while (read(hold, &c, 1) > 0)
        ;
    return 0;
}

/* Hundreds of silent refused connections: an allowed worker is still served at once. */
static void test_silent_refusals_do_not_lock_out(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    int report[2], hold[2];
    if (geteuid() != 0)
        skip();
    kvpt_daemon_start(&d,
                      (const char *const[]){"--l1-size", "4MiB", "--socket-mode", "0666", NULL});
    assert_int_equal(chmod(d.dir, 0755), 0);
    assert_int_equal(pipe(report), 0);
    assert_int_equal(pipe(hold), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(report[0]);
        close(hold[1]);
        _exit(silent_flood(&d, report[1], hold[0]));
    }
    close(report[1]);
    close(hold[0]);
    int n = -1;
    ssize_t r = read(report[0], &n, sizeof(n));
    close(report[0]);
    if (r != sizeof(n)) {
        close(hold[1]);
        int st;
        waitpid(pid, &st, 0);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 77)
            skip();
        fail_msg("the child did not report");
    }
    fprintf(stderr, "%d silent refused connections open\n", n);

    /* While they are all open and silent: an allowed client connects, is greeted and pings. */
    kvp_client *c = NULL;
    kvp_opts o = {.socket_path = d.socket, .timeout_ms = 10000};
    int rc = kvp_client_open(&o, &c);
    if (rc != 0)
        fail_msg("an allowed client was not served: %s (%s)", kvp_strerror(rc), kvp_last_error(c));
    assert_int_equal(kvp_ping(c), 0);
    kvp_client_close(c);

    close(hold[1]);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* Every one of them was accepted and refused, not left in the backlog. */
    assert_true(n == SILENT);
    kvpt_daemon_stop(&d);
}

/* In a child as nobody: connects, lets the daemon accept and refuse before it sends HELLO, and
 * expects the refusal as the answer. Returns an exit code. */
static int late_hello(const struct kvpt_daemon *d)
{
    struct kvpt_reply r = {.body = NULL};
    if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0)
        return 77;
    int fd = kvpt_raw_connect(d);
    if (fd < 0)
        return 1;
    kvpt_sleep_ms(50);
    int rc = kvpt_raw_call(fd, KVP_OP_HELLO, NULL, 0, &r);
    fprintf(stderr, "late HELLO: %d %s\n", rc, r.msg);
    free(r.body);
    return rc == -EACCES && strstr(r.msg, "not allowed") ? 0 : 1;
}

/* A refused peer whose request comes after the refusal is still told why. */
static void test_late_request_is_answered(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    if (geteuid() != 0)
        skip();
    kvpt_daemon_start(&d,
                      (const char *const[]){"--l1-size", "4MiB", "--socket-mode", "0666", NULL});
    assert_int_equal(chmod(d.dir, 0755), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(late_hello(&d));
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 77)
        skip();
    assert_int_equal(WEXITSTATUS(st), 0);
    kvpt_daemon_stop(&d);
}

/* Starts d with KVPOOL_FAULT_CONN=what and waits for its ready line. */
static void start_with_fault(struct kvpt_daemon *d, const char *what)
{
#ifndef KVP_FAULT_INJECTION
    (void)d;
    (void)what;
    fprintf(stderr, "skipped: built without KVP_FAULT_INJECTION\n");
    skip();
#else
    setenv("KVPOOL_FAULT_CONN", what, 1);
    kvpt_daemon_spawn(d, NULL, (const char *const[]){"--l1-size", "4MiB", NULL});
    unsetenv("KVPOOL_FAULT_CONN");
    assert_true(kvpt_log_wait(d, "ready:", 30000));
#endif
}

/* No connection can be served: each gets the error, through the client library too. */
static void check_unserved(const struct kvpt_daemon *d, int status, const char *msg)
{
    kvp_client *c = NULL;
    kvp_opts o = {.socket_path = d->socket, .timeout_ms = 5000};
    int rc = kvp_client_open(&o, &c);
    fprintf(stderr, "open: %d %s\n", rc, kvp_last_error(c));
    assert_int_equal(rc, status);
    assert_non_null(strstr(kvp_last_error(c), msg));
    kvp_client_close(c);

    int fd = kvpt_raw_connect_or_fail(d);
    struct kvpt_reply r;
    assert_int_equal(kvpt_raw_call(fd, KVP_OP_PING, NULL, 0, &r), status);
    free(r.body);
    assert_non_null(strstr(r.msg, msg));
    close(fd);
}

static void test_no_thread_is_answered(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    start_with_fault(&d, "thread");
    check_unserved(&d, -EAGAIN, "cannot serve a new connection now");
    kvpt_daemon_stop(&d);
}

static void test_no_memory_is_answered(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    start_with_fault(&d, "memory");
    check_unserved(&d, -ENOMEM, "no memory for this connection");
    kvpt_daemon_stop(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_silent_refusals_do_not_lock_out),
        cmocka_unit_test(test_late_request_is_answered),
        cmocka_unit_test(test_no_thread_is_answered),
        cmocka_unit_test(test_no_memory_is_answered),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
