/*
 * test_notify.c - the service-manager notifications (src/server/base/notify.h): the datagrams that
 * arrive on the socket $NOTIFY_SOCKET names, as systemd would receive them, for a path socket and
 * an abstract one; nothing without $NOTIFY_SOCKET; one warning, not one per message, when the
 * socket is not there.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/log.h"
#include "base/notify.h"
#include "common/kvp_assert.h"

static char dir[64];
static int sock = -1;

/* A datagram socket at dir/notify.sock, named by NOTIFY_SOCKET. */
static int setup(void **state)
{
    (void)state;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(dir, sizeof(dir), "/tmp/kvpt-notify-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(a.sun_path, sizeof(a.sun_path), "%s/notify.sock", dir);
    sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(sock >= 0);
    assert_rc(bind(sock, (struct sockaddr *)&a, sizeof(a)), 0);
    setenv("NOTIFY_SOCKET", a.sun_path, 1);
    return 0;
}

static int teardown(void **state)
{
    char path[128];
    (void)state;
    close(sock);
    snprintf(path, sizeof(path), "%s/notify.sock", dir);
    unlink(path);
    unsetenv("NOTIFY_SOCKET");
    return rmdir(dir);
}

/* The next datagram on fd within 2 s, NUL-terminated in buf; fails the test if none comes. */
static void recv_msg(int fd, char *buf, size_t size)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_rc(poll(&p, 1, 2000), 1);
    ssize_t n = recv(fd, buf, size - 1, 0);
    assert_true(n > 0);
    buf[n] = '\0';
}

/* True if a datagram is waiting on fd. */
static bool pending(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 100) == 1;
}

static void test_ready(void **state)
{
    (void)state;
    char buf[2048], want[256];

    assert_true(kvp_notify_enabled());
    /* A status is one line: a newline (a socket path may hold one) becomes a space. */
    kvp_notify_ready("kvpoold 1.0.0 ready: pool 1 bytes, socket /tmp/a\nb.sock");
    recv_msg(sock, buf, sizeof(buf));
    snprintf(want, sizeof(want),
             "READY=1\nSTATUS=kvpoold 1.0.0 ready: pool 1 bytes, socket /tmp/a b.sock\n"
             "MAINPID=%ld",
             (long)getpid());
    assert_string_equal(buf, want);
}

static void test_progress_and_stopping(void **state)
{
    (void)state;
    char buf[2048], want[256];

    kvp_notify_progress("Reserving the pool: 1 of 2 bytes (50%)");
    recv_msg(sock, buf, sizeof(buf));
    snprintf(want, sizeof(want),
             "STATUS=Reserving the pool: 1 of 2 bytes (50%%)\nEXTEND_TIMEOUT_USEC=%llu",
             (unsigned long long)KVP_NOTIFY_EXTEND_USEC);
    assert_string_equal(buf, want);
    assert_true(KVP_NOTIFY_EXTEND_USEC >= 30ull * 1000 * 1000);

    /* While serving: the status alone, no timeout extension, still one line. */
    kvp_notify_status("Reserving the pool:\n3 of 4 bytes");
    recv_msg(sock, buf, sizeof(buf));
    assert_string_equal(buf, "STATUS=Reserving the pool: 3 of 4 bytes");

    kvp_notify_stopping();
    recv_msg(sock, buf, sizeof(buf));
    assert_non_null(strstr(buf, "STOPPING=1"));
    assert_false(pending(sock));
}

/* systemd's own socket is abstract ("@/org/freedesktop/systemd1/notify"). */
static void test_abstract_socket(void **state)
{
    (void)state;
    char name[64], buf[2048];
    struct sockaddr_un a = {.sun_family = AF_UNIX};

    int len = snprintf(name, sizeof(name), "kvpt-notify-%ld", (long)getpid());
    memcpy(a.sun_path + 1, name, (size_t)len);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_rc(bind(fd, (struct sockaddr *)&a,
                   (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len)),
              0);
    char env[80];
    snprintf(env, sizeof(env), "@%s", name);
    setenv("NOTIFY_SOCKET", env, 1);
    kvp_notify_stopping();
    recv_msg(fd, buf, sizeof(buf));
    assert_non_null(strstr(buf, "STOPPING=1"));
    close(fd);
}

static void test_disabled_without_variable(void **state)
{
    (void)state;
    unsetenv("NOTIFY_SOCKET");
    assert_false(kvp_notify_enabled());
    kvp_notify_ready("ready");
    kvp_notify_progress("progress");
    kvp_notify_stopping();
    assert_false(pending(sock));

    /* An empty variable is no socket either. */
    setenv("NOTIFY_SOCKET", "", 1);
    assert_false(kvp_notify_enabled());
}

/* A socket that is not there: one WARN line naming it, then silence. */
static void test_unreachable_warns_once(void **state)
{
    (void)state;
    char path[128], text[4096];
    int p[2];

    snprintf(path, sizeof(path), "%s/absent.sock", dir);
    setenv("NOTIFY_SOCKET", path, 1);
    assert_rc(pipe2(p, O_CLOEXEC), 0);
    int saved = dup(STDERR_FILENO);
    assert_rc(dup2(p[1], STDERR_FILENO), STDERR_FILENO);
    close(p[1]);
    kvp_log_threshold = KVP_LOG_INFO;
    kvp_notify_progress("one");
    kvp_notify_progress("two");
    kvp_notify_ready("three");
    assert_rc(dup2(saved, STDERR_FILENO), STDERR_FILENO);
    close(saved);
    ssize_t n = read(p[0], text, sizeof(text) - 1);
    close(p[0]);
    assert_true(n > 0);
    text[n] = '\0';
    assert_non_null(strstr(text, "WARN  Cannot notify the service manager at NOTIFY_SOCKET="));
    assert_non_null(strstr(text, path));
    assert_non_null(strstr(text, "No such file or directory"));
    assert_int_equal(strchr(text, '\n') - text + 1, n); /* one line */
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_ready),
        T(test_progress_and_stopping),
        T(test_abstract_socket),
        T(test_disabled_without_variable),
        T(test_unreachable_warns_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
