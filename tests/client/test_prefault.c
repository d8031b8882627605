/*
 * test_prefault.c - the library pre-faults only what the daemon reserved (src/client/shm_map.c).
 *
 * A pool whose background reservation stopped short (/dev/shm filled up) has pages nobody
 * allocated; on a full tmpfs, touching one is SIGBUS. The fallback of kernels without
 * MADV_POPULATE_WRITE (before Linux 5.14) touches pages; KVPOOL_PREFAULT=touch forces it here.
 * Each case runs in a child process, in a mount namespace of its own with a small tmpfs, so
 * that the tmpfs can be filled and a SIGBUS shows as the child's death. It needs root (or
 * CAP_SYS_ADMIN) for the namespace; skipped (77) otherwise.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/seg_header.h"
#include "shm_map.h"

#define MIB (1ull << 20)
#define SEG_SIZE (32 * MIB) /* announced and mapped */
#define RESERVED (4 * MIB)  /* allocated, as the header says */
#define TMPFS_OPTS "size=8m"

enum { CHILD_OK = 0, CHILD_FAIL = 1, CHILD_SKIP = 77 };

/* A tmpfs of its own at dir, in a private mount namespace. Returns 0, or CHILD_SKIP. */
static int private_tmpfs(const char *dir)
{
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", dir, "tmpfs", 0, TMPFS_OPTS) != 0) {
        fprintf(stderr,
                "skipped: cannot mount a private tmpfs (%s); needs root or "
                "CAP_SYS_ADMIN\n",
                strerror(errno));
        return CHILD_SKIP;
    }
    return 0;
}

/*
 * In dir: a SEG_SIZE segment of which the first RESERVED bytes are allocated, its header
 * saying so (final or not), then a file that takes all the space left. Returns the segment's
 * descriptor, or -1.
 */
static int make_segment(const char *dir, const uint8_t *nonce, bool final)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/seg", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)SEG_SIZE) != 0 || posix_fallocate(fd, 0, RESERVED) != 0)
        return -1;
    uint8_t *p = mmap(NULL, KVP_SEG_HEADER, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return -1;
    kvp_seg_header_write(p, nonce, SEG_SIZE, 1);
    kvp_seg_header_publish_reserved(p, RESERVED, final);
    munmap(p, KVP_SEG_HEADER);

    snprintf(path, sizeof(path), "%s/filler", dir);
    int filler = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (filler < 0)
        return -1;
    for (off_t off = 0; posix_fallocate(filler, off, (off_t)MIB) == 0; off += (off_t)MIB)
        ;
    close(filler);
    return fd;
}

/* The Rss (KiB) of this process's mapping that starts at addr (/proc/self/smaps), 0 if none. */
static uint64_t rss_kib_of(const void *addr)
{
    char line[512], start[32];
    unsigned long long kib = 0;
    bool in = false;
    FILE *f = fopen("/proc/self/smaps", "re");
    if (!f)
        return 0;
    snprintf(start, sizeof(start), "%lx-", (unsigned long)addr);
    while (fgets(line, sizeof(line), f)) {
        if (strchr(line, '-') && strncmp(line, start, strlen(start)) == 0)
            in = true;
        else if (in && sscanf(line, "Rss: %llu kB", &kib) == 1)
            break;
    }
    fclose(f);
    return in ? kib : 0;
}

/* Maps the segment with the touch fallback forced and lets the pre-fault thread run; final as
 * in make_segment(). Returns an exit code; a wrong touch kills the process with SIGBUS. */
static int child(const char *dir, bool final)
{
    uint8_t nonce[KVP_SEG_NONCE_SIZE] = {1, 2, 3};
    struct kvp_shm_map m;
    char reason[256];

    int rc = private_tmpfs(dir);
    if (rc)
        return rc;
    int fd = make_segment(dir, nonce, final);
    if (fd < 0) {
        fprintf(stderr, "cannot make the segment: %s\n", strerror(errno));
        return CHILD_FAIL;
    }
    setenv("KVPOOL_PREFAULT", "touch", 1);
    rc = kvp_shm_map_fd(&m, fd, SEG_SIZE, nonce, "test segment", reason, sizeof(reason));
    close(fd);
    if (rc != 0) {
        fprintf(stderr, "map: %d %s\n", rc, reason);
        return CHILD_FAIL;
    }
    if (!final) {
        /* The daemon is still reserving: the thread waits for it. It now says it stopped. */
        usleep(100000);
        kvp_seg_header_publish_reserved(m.base, RESERVED, true);
    }
    kvp_shm_map_prefault_wait(&m);
    /* The reserved pages were pre-faulted: they are mapped in this process now. */
    uint64_t rss = rss_kib_of(m.base);
    kvp_shm_map_close(&m);
    if (rss * 1024 < RESERVED - KVP_SEG_HEADER) {
        fprintf(stderr, "only %llu KiB of the mapping are resident, %llu reserved\n",
                (unsigned long long)rss, (unsigned long long)RESERVED / 1024);
        return CHILD_FAIL;
    }
    return CHILD_OK;
}

static void run(bool final)
{
    char dir[] = "/tmp/kvpt-prefault-XXXXXX";
    assert_non_null(mkdtemp(dir));
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(child(dir, final));
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    rmdir(dir);
    if (WIFSIGNALED(st))
        fail_msg("the pre-fault thread killed the worker with signal %d (%s): it touched a page "
                 "the daemon never reserved",
                 WTERMSIG(st), strsignal(WTERMSIG(st)));
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == CHILD_SKIP)
        skip();
    assert_int_equal(WEXITSTATUS(st), CHILD_OK);
}

/* The reservation stopped short for good: the touch stops at its end. */
static void test_touch_stops_at_reserved(void **state)
{
    (void)state;
    run(true);
}

/* The reservation is still going: the thread waits for the header, then stops at its end. */
static void test_touch_follows_reservation(void **state)
{
    (void)state;
    run(false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_touch_stops_at_reserved),
        cmocka_unit_test(test_touch_follows_reservation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
