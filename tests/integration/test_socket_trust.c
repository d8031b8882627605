/*
 * test_socket_trust.c - who is on the other end of the socket. The default socket lives in a
 * private directory that both the daemon and the library refuse when another user owns it or
 * it is writable by group or others; the library refuses a daemon running as a uid it does not
 * trust (KVP_EPEER) unless kvp_opts.trust_uid or $KVPOOL_TRUST_UID allows it.
 *
 * The squatter cases need a second user: as root, the "squatter" daemon runs as nobody (uid
 * 65534) and directories are handed to nobody with chown. Those cases are skipped (with the
 * reason on stderr) when the test does not run as root; the rest runs as any user. Every daemon
 * here uses --shm-name "" (inline only), so no segment is involved.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
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

#define NOBODY 65534

/* A daemon started by this test itself: as another uid, or without --socket. */
struct proc {
    pid_t pid;
    char log[160];
};

/*
 * Starts kvpoold with args (NULL-terminated) and stderr to log. uid >= 0: the child drops to that
 * uid (and gid) first. xdg: XDG_RUNTIME_DIR for the child, or NULL to unset it.
 */
static void start(struct proc *p, const char *log, long uid, const char *xdg,
                  const char *const *args)
{
    const char *argv[24];
    int argc = 0;

    argv[argc++] = KVP_TEST_KVPOOLD;
    for (int i = 0; args[i]; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;
    snprintf(p->log, sizeof(p->log), "%s", log);
    p->pid = fork();
    assert_true(p->pid >= 0);
    if (p->pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0 || dup2(fd, 2) < 0)
            _exit(126);
        if (uid >= 0 &&
            (setgroups(0, NULL) != 0 || setgid((gid_t)uid) != 0 || setuid((uid_t)uid) != 0))
            _exit(125);
        if (xdg)
            setenv("XDG_RUNTIME_DIR", xdg, 1);
        else
            unsetenv("XDG_RUNTIME_DIR");
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
}

/* Waits for the daemon's exit; returns its status, or -1 if it still runs after timeout_ms. */
static int wait_exit(struct proc *p, int timeout_ms)
{
    int st;
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            p->pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        kvpt_sleep_ms(10);
    }
    return -1;
}

static void stop(struct proc *p)
{
    if (p->pid > 0) {
        kill(p->pid, SIGTERM);
        assert_int_equal(wait_exit(p, 20000), 0);
    }
}

static bool log_has(const struct proc *p, const char *s)
{
    char buf[8192];
    FILE *f = fopen(p->log, "re");
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    if (!strstr(buf, s))
        fprintf(stderr, "log %s lacks \"%s\":\n%s\n", p->log, s, buf);
    return strstr(buf, s) != NULL;
}

/* Waits until the log says "ready"; fails the test if the daemon exits first. */
static void wait_ready(struct proc *p)
{
    for (int i = 0; i < 3000; i++) {
        FILE *f = fopen(p->log, "re");
        char line[1024];
        bool ready = false;
        while (f && !ready && fgets(line, sizeof(line), f))
            ready = strstr(line, " ready: ") != NULL;
        if (f)
            fclose(f);
        if (ready)
            return;
        int st;
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            p->pid = 0;
            log_has(p, "(the daemon exited during start-up)");
            fail_msg("kvpoold exited during start-up (status 0x%x)", st);
        }
        kvpt_sleep_ms(10);
    }
    fail_msg("kvpoold did not become ready");
}

static char *tmpdir(char *buf, size_t size)
{
    snprintf(buf, size, "/tmp/kvpt-trust-XXXXXX");
    assert_non_null(mkdtemp(buf));
    return buf;
}

static void rmtree(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
}

static bool need_root(void)
{
    if (geteuid() == 0)
        return true;
    fprintf(stderr, "skipped: a second uid (nobody) needs root to run a daemon as it\n");
    return false;
}

/* Opens a client on the default path (socket_path NULL, $KVPOOL_SOCKET unset). */
static int open_default(kvp_client **c)
{
    kvp_opts o = {.timeout_ms = 5000};
    unsetenv("KVPOOL_SOCKET");
    return kvp_client_open(&o, c);
}

/* ---------------------------------------------------------------------------------------- */
/* The default socket's private directory                                                   */

static const char *const default_args[] = {"--shm-name", "", "--l1-size", "4MiB", NULL};

/* No directory yet: the daemon creates it 0700, and a client on the default path connects. */
static void test_default_dir_created_private(void **state)
{
    (void)state;
    char xdg[64], dir[96], log[128];
    struct stat st;
    struct proc p = {.pid = 0};

    tmpdir(xdg, sizeof(xdg));
    snprintf(dir, sizeof(dir), "%s/kvpool", xdg);
    snprintf(log, sizeof(log), "%s/kvpoold.log", xdg);
    start(&p, log, -1, xdg, default_args);
    wait_ready(&p);
    assert_int_equal(lstat(dir, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_equal(st.st_uid, geteuid());

    setenv("XDG_RUNTIME_DIR", xdg, 1);
    kvp_client *c = NULL;
    assert_int_equal(open_default(&c), 0);
    assert_int_equal(kvp_ping(c), 0);
    kvp_client_close(c);
    stop(&p);
    unsetenv("XDG_RUNTIME_DIR");
    rmtree(xdg);
}

/* A directory writable by others: both sides refuse it, naming the mode. */
static void test_default_dir_open_mode_refused(void **state)
{
    (void)state;
    char xdg[64], dir[96], log[128];
    struct proc p = {.pid = 0};

    tmpdir(xdg, sizeof(xdg));
    snprintf(dir, sizeof(dir), "%s/kvpool", xdg);
    snprintf(log, sizeof(log), "%s/kvpoold.log", xdg);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(chmod(dir, 0777), 0);

    start(&p, log, -1, xdg, default_args);
    assert_int_equal(wait_exit(&p, 10000), 1);
    assert_true(log_has(&p, "ERROR Refusing to start: the socket directory"));
    assert_true(log_has(&p, "has mode 0777: writable by group or others"));

    /* A socket that some other daemon put there anyway is not used by the library. */
    char sock[128];
    snprintf(sock, sizeof(sock), "%s/kvpool.sock", dir);
    struct kvpt_daemon d;
    kvpt_daemon_spawn(&d, sock, (const char *const[]){"--shm-name", "", NULL});
    assert_true(kvpt_log_wait(&d, " ready: ", 10000));
    setenv("XDG_RUNTIME_DIR", xdg, 1);
    kvp_client *c = NULL;
    assert_int_equal(open_default(&c), -EPERM);
    assert_null(c);
    assert_non_null(strstr(kvp_last_error(NULL), "writable by group or others"));
    /* Named explicitly while it is not the default path, it is the caller's choice (while it
     * is the default path, it is judged the same whichever way it was named). */
    kvp_opts o = {.socket_path = sock, .timeout_ms = 5000};
    assert_int_equal(kvp_client_open(&o, &c), -EPERM);
    unsetenv("XDG_RUNTIME_DIR");
    assert_int_equal(kvp_client_open(&o, &c), 0);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
    rmtree(xdg);
}

/* A directory of another user (the squatter made it first): both sides refuse, naming the uid. */
static void test_default_dir_of_other_user_refused(void **state)
{
    (void)state;
    char xdg[64], dir[96], log[128], want[160];
    struct proc p = {.pid = 0};

    if (!need_root())
        skip();
    tmpdir(xdg, sizeof(xdg));
    snprintf(dir, sizeof(dir), "%s/kvpool", xdg);
    snprintf(log, sizeof(log), "%s/kvpoold.log", xdg);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(chown(dir, NOBODY, NOBODY), 0);

    start(&p, log, -1, xdg, default_args);
    assert_int_equal(wait_exit(&p, 10000), 1);
    snprintf(want, sizeof(want), "belongs to uid %d, not to uid %d", NOBODY, (int)geteuid());
    assert_true(log_has(&p, want));
    /* Nothing was created inside the squatter's directory. */
    char lock[128];
    snprintf(lock, sizeof(lock), "%s/kvpool.sock.lock", dir);
    assert_int_equal(access(lock, F_OK), -1);

    setenv("XDG_RUNTIME_DIR", xdg, 1);
    kvp_client *c = NULL;
    assert_int_equal(open_default(&c), -EPERM);
    assert_non_null(strstr(kvp_last_error(NULL), want));
    unsetenv("XDG_RUNTIME_DIR");
    rmtree(xdg);
}

/* ---------------------------------------------------------------------------------------- */
/* The daemon's credentials, checked by the library                                         */

/* A daemon of nobody that lets root connect: the squatter of an explicit path. */
static void start_nobody_daemon(struct proc *p, char *dir, size_t dsize, char *sock, size_t ssize)
{
    char log[128];
    tmpdir(dir, dsize);
    assert_int_equal(chown(dir, NOBODY, NOBODY), 0);
    snprintf(sock, ssize, "%s/kvpool.sock", dir);
    snprintf(log, sizeof(log), "%s/kvpoold.log", dir);
    const char *args[] = {"--socket", sock,        "--allow-uid", "0", "--shm-name",
                          "",         "--l1-size", "4MiB",        NULL};
    start(p, log, NOBODY, NULL, args);
    wait_ready(p);
}

static void test_untrusted_daemon_refused(void **state)
{
    (void)state;
    char dir[64], sock[128], want[64];
    struct proc p = {.pid = 0};

    if (!need_root())
        skip();
    unsetenv("KVPOOL_TRUST_UID");
    start_nobody_daemon(&p, dir, sizeof(dir), sock, sizeof(sock));

    kvp_client *c = NULL;
    kvp_opts o = {.socket_path = sock, .timeout_ms = 5000};
    assert_int_equal(kvp_client_open(&o, &c), KVP_EPEER);
    assert_null(c);
    snprintf(want, sizeof(want), "runs as uid %d", NOBODY);
    assert_non_null(strstr(kvp_last_error(NULL), want));
    assert_non_null(strstr(kvp_last_error(NULL), "KVPOOL_TRUST_UID"));
    assert_string_equal(kvp_strerror(KVP_EPEER),
                        "the daemon runs as a user this process does not trust");

    /* Trusted through the option... */
    o.trust_uid = NOBODY;
    assert_int_equal(kvp_client_open(&o, &c), 0);
    assert_int_equal(kvp_ping(c), 0);
    kvp_client_close(c);

    /* ...or through the environment (a list), but not through a typo. */
    o.trust_uid = 0;
    setenv("KVPOOL_TRUST_UID", "1000,65534", 1);
    assert_int_equal(kvp_client_open(&o, &c), 0);
    kvp_client_close(c);
    setenv("KVPOOL_TRUST_UID", "1000", 1);
    assert_int_equal(kvp_client_open(&o, &c), KVP_EPEER);
    setenv("KVPOOL_TRUST_UID", "nobody", 1);
    assert_int_equal(kvp_client_open(&o, &c), -EINVAL);
    assert_non_null(strstr(kvp_last_error(NULL), "KVPOOL_TRUST_UID"));
    unsetenv("KVPOOL_TRUST_UID");

    /* The command-line client says the same, and exits 1. */
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s --socket %s ping 2>&1 | grep -q 'runs as uid %d'; exit $?",
             KVP_TEST_CLI, sock, NOBODY);
    assert_int_equal(system(cmd), 0);

    stop(&p);
    rmtree(dir);
}

/* A daemon of our own uid needs no trust settings (every other integration test relies on it);
 * root's daemon is trusted by every user: run a client as nobody against ours. */
static void test_root_daemon_trusted_by_others(void **state)
{
    (void)state;
    struct kvpt_daemon d;

    if (!need_root())
        skip();
    kvpt_daemon_start(&d, (const char *const[]){"--allow-uid", "65534", "--socket-mode", "0666",
                                                "--shm-name", "", NULL});
    assert_int_equal(chmod(d.dir, 0755), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0)
            _exit(125);
        kvp_client *c = NULL;
        kvp_opts o = {.socket_path = d.socket, .timeout_ms = 5000};
        int rc = kvp_client_open(&o, &c);
        if (rc == 0)
            rc = kvp_ping(c);
        kvp_client_close(c);
        _exit(rc == 0 ? 0 : 1);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    kvpt_daemon_stop(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_dir_created_private),
        cmocka_unit_test(test_default_dir_open_mode_refused),
        cmocka_unit_test(test_default_dir_of_other_user_refused),
        cmocka_unit_test(test_untrusted_daemon_refused),
        cmocka_unit_test(test_root_daemon_trusted_by_others),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
