/*
 * test_shm_squatting.c - another user's file in /dev/shm never keeps the daemon from starting
 * or from offering shared memory.
 *
 * Any local user can create files in /dev/shm. With a predictable default segment name (the
 * pid), one could create and lock the names of the pids the next daemons would get; a daemon
 * then refused to start (root) or fell back to inline for everyone. The default name has a
 * random part now. Here the daemon's pid is known before it runs (the test forks it), the old
 * predictable name is planted, owned by nobody and locked, and the daemon must start with
 * shared memory under another name, leaving the planted file alone. A name given with
 * --shm-name that another user holds is refused with a message that says so. Making a file of
 * another uid needs root: skipped otherwise.
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
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define NOBODY 65534

/* Creates /dev/shm/<name> as nobody's, locked by the returned descriptor. */
static int plant(const char *name)
{
    char path[160];
    snprintf(path, sizeof(path), "/%s", name);
    shm_unlink(path);
    int fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    assert_true(fd >= 0);
    assert_int_equal(fchown(fd, NOBODY, NOBODY), 0);
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
    return fd;
}

/*
 * Forks kvpoold with no --shm-name (the default name) and, before it execs, plants the name
 * that a pid-based default would have had. d is filled like kvpt_daemon_spawn() does; *planted
 * receives the planted descriptor and name.
 */
static int spawn_default_named(struct kvpt_daemon *d, char *planted, size_t planted_size)
{
    int go[2];
    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "/tmp/kvpt-XXXXXX");
    assert_non_null(mkdtemp(d->dir));
    snprintf(d->socket, sizeof(d->socket), "%s/kvpool.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/kvpoold.log", d->dir);
    assert_int_equal(pipe(go), 0);
    pid_t parent = getpid();
    d->pid = fork();
    assert_true(d->pid >= 0);
    if (d->pid == 0) {
        char c;
        close(go[1]);
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent || read(go[0], &c, 1) != 1)
            _exit(125);
        int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0 || dup2(fd, STDERR_FILENO) < 0)
            _exit(126);
        execl(KVP_TEST_KVPOOLD, KVP_TEST_KVPOOLD, "--socket", d->socket, "--log-level", "debug",
              "--http", "off", "--l1-size", "4MiB", (char *)NULL);
        _exit(127);
    }
    close(go[0]);
    snprintf(planted, planted_size, "kvpool_l1_pool_%d", (int)d->pid);
    int fd = plant(planted);
    assert_int_equal(write(go[1], "x", 1), 1);
    close(go[1]);
    return fd;
}

static void test_planted_default_name(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char planted[64], path[96];
    if (geteuid() != 0)
        skip();
    int fd = spawn_default_named(&d, planted, sizeof(planted));
    if (!kvpt_log_wait(&d, "ready:", 30000)) {
        char cmd[256];
        snprintf(cmd, sizeof(cmd), "cat %s >&2", d.log);
        if (system(cmd) != 0)
            fprintf(stderr, "(no daemon log)\n");
        close(fd);
        snprintf(path, sizeof(path), "/dev/shm/%s", planted);
        unlink(path);
        fail_msg("kvpoold did not start with /dev/shm/%s planted", planted);
        return;
    }
    assert_true(kvpt_log_wait(&d, "SHM enabled (shm_name=kvpool_l1_pool_", 1000));
    /* Not under the planted name (a prefix of the one used, which starts with the pid). */
    char exact[80];
    snprintf(exact, sizeof(exact), "shm_name=%s)", planted);
    assert_int_equal(kvpt_log_count(&d, exact), 0);

    /* A worker of the daemon's user maps the pool. */
    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts o = kvpt_layout("w", KVP_TRANSPORT_SHM);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    const kvp_instance_info *info = kvp_instance_get_info(inst);
    assert_int_equal(info->transport, KVP_TRANSPORT_SHM);
    assert_string_not_equal(info->shm_name, planted);
    kvp_client_close(c);

    /* The planted file is untouched: still nobody's, still locked by its owner. */
    struct stat st;
    snprintf(path, sizeof(path), "/dev/shm/%s", planted);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_uid, NOBODY);
    int probe = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(probe >= 0);
    assert_int_equal(flock(probe, LOCK_EX | LOCK_NB), -1);
    close(probe);
    kvpt_daemon_stop(&d);
    close(fd);
    assert_int_equal(unlink(path), 0);
}

/* --shm-name given, and another user holds it: one clear ERROR line, exit status 1. */
static void test_planted_given_name(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char name[64], path[96];
    if (geteuid() != 0)
        skip();
    snprintf(name, sizeof(name), "kvpool_l1_pool_squat_%d", (int)getpid());
    int fd = plant(name);
    kvpt_daemon_spawn(&d, NULL,
                      (const char *const[]){"--l1-size", "4MiB", "--shm-name", name, NULL});
    int status = kvpt_daemon_wait_exit(&d, 30000);
    close(fd);
    snprintf(path, sizeof(path), "/dev/shm/%s", name);
    assert_int_equal(unlink(path), 0); /* still there: nobody removed it */
    assert_int_equal(status, 1);
    assert_true(kvpt_log_wait(&d, "belongs to uid 65534", 1000));
    assert_true(kvpt_log_wait(&d, "Refusing to start", 1000));
    kvpt_daemon_stop(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_planted_default_name),
        cmocka_unit_test(test_planted_given_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
