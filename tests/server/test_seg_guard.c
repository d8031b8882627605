/*
 * test_seg_guard.c - the daemon outlives a segment that shrinks under it
 * (src/server/core/seg_guard.h): a read of a truncated page no longer kills the process, the
 * guard trips once, and the mapping keeps working as private memory. Each case runs in a child
 * process, so that a SIGBUS shows as the child's death instead of ending the test program.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/kvp_assert.h"
#include "core/seg_guard.h"
#include "core/segment.h"

#define SIZE (4u << 20)

/* A shared file mapping of SIZE bytes, filled with 0x5a, described as a posix segment. */
static int make(struct kvp_segment *seg, char *path, size_t path_size)
{
    snprintf(path, path_size, "/dev/shm/kvpool_l1_pool_guard_%ld", (long)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    uint8_t *p = ftruncate(fd, SIZE) == 0
                     ? mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                     : MAP_FAILED;
    if (p == MAP_FAILED) {
        close(fd);
        return -1;
    }
    memset(p, 0x5a, SIZE);
    *seg =
        (struct kvp_segment){.base = p, .size = SIZE, .reserved = SIZE, .fd = fd, .shared = true};
    return 0;
}

/* A segment made, its file unlinked (the open descriptor keeps it) and the guard armed over
 * it: 0, or the child's exit code for the step that failed (10: make, 11: arm). */
static int make_armed(struct kvp_segment *seg)
{
    char path[96];
    if (make(seg, path, sizeof(path)) != 0)
        return 10;
    unlink(path);
    return kvp_seg_guard_arm(seg->base, seg->size, seg->fd) != 0 ? 11 : 0;
}

/* Child: the daemon's own read of a truncated page. Returns an exit code. */
static int child_read_after_truncate(void)
{
    struct kvp_segment seg;
    int64_t size_now = 0;

    int rc = make_armed(&seg);
    if (rc)
        return rc;
    if (kvp_seg_guard_tripped() || kvp_seg_guard_check() || kvp_seg_guard_take_report(&size_now))
        return 12; /* nothing happened yet */
    if (ftruncate(seg.fd, 4096) != 0)
        return 13;
    /* Without the guard: SIGBUS here. With it: the read runs again on private memory. */
    volatile uint8_t v = ((volatile uint8_t *)seg.base)[SIZE - 1];
    (void)v;
    if (!kvp_seg_guard_tripped() || kvp_seg_guard_epoch() != 1)
        return 14;
    /* The mapping is private memory now: readable and writable everywhere. */
    memset(seg.base, 0xa5, SIZE);
    if (seg.base[0] != 0xa5 || seg.base[SIZE - 1] != 0xa5)
        return 15;
    /* Reported exactly once, with the size the file had. */
    if (!kvp_seg_guard_take_report(&size_now) || size_now != 4096)
        return 16;
    if (kvp_seg_guard_take_report(&size_now))
        return 17;
    kvp_seg_guard_disarm();
    munmap(seg.base, SIZE);
    close(seg.fd);
    return 0;
}

/* Child: a truncation nobody touched yet is found by the size check, then the pages are safe. */
static int child_check_finds_it(void)
{
    struct kvp_segment seg;
    int rc = make_armed(&seg);
    if (rc)
        return rc;
    if (ftruncate(seg.fd, 0) != 0)
        return 13;
    if (!kvp_seg_guard_check())
        return 14;
    seg.base[SIZE / 2] = 1; /* private memory: no fault */
    kvp_seg_guard_disarm();
    return 0;
}

/* Child: a SIGBUS outside the segment still gets the default action (the guard passes it on). */
static int child_other_sigbus(void)
{
    struct kvp_segment seg;
    int rc = make_armed(&seg);
    if (rc)
        return rc;
    /* Another file mapping, truncated: not the pool. */
    FILE *f = tmpfile();
    if (!f)
        return 12;
    if (ftruncate(fileno(f), 8192) != 0) {
        fclose(f);
        return 12;
    }
    volatile uint8_t *q = mmap(NULL, 8192, PROT_READ, MAP_SHARED, fileno(f), 0);
    rc = q == MAP_FAILED || ftruncate(fileno(f), 0) != 0 ? 13 : 0;
    if (rc == 0)
        (void)q[4096]; /* SIGBUS, not ours: the child dies of it */
    fclose(f);
    return rc;
}

static void run(int (*fn)(void), int want_signal)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* The daemon's state: the default action (cmocka catches SIGBUS in the test runner). */
        signal(SIGBUS, SIG_DFL);
        _exit(fn());
    }
    int st;
    assert_rc(waitpid(pid, &st, 0), pid);
    if (want_signal) {
        assert_true(WIFSIGNALED(st));
        assert_rc(WTERMSIG(st), want_signal);
        return;
    }
    if (WIFSIGNALED(st))
        fail_msg("the process died of signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    assert_rc(WEXITSTATUS(st), 0);
}

static void test_read_after_truncate(void **state)
{
    (void)state;
    run(child_read_after_truncate, 0);
}

static void test_check_finds_it(void **state)
{
    (void)state;
    run(child_check_finds_it, 0);
}

static void test_other_sigbus_passes_on(void **state)
{
    (void)state;
    run(child_other_sigbus, SIGBUS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_after_truncate),
        cmocka_unit_test(test_check_finds_it),
        cmocka_unit_test(test_other_sigbus_passes_on),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
