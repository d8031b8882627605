/*
 * test_segment.c - the pool's memory (src/server/core/segment.h): shared segments under /dev/shm,
 * their header page, the liveness lock that tells a running daemon from a dead one, private
 * memory, and the reservation of every page at creation; and the adoption of a dead daemon's
 * segment by a warm restart (kvp_segment_adopt(), kvp_segment_leave()).
 *
 * Segment names carry the test's pid, so parallel runs never collide; the teardown unlinks the
 * case's name whatever happened. The ENOSPC cases need a /dev/shm that can be filled: a child
 * process enters a private mount namespace and mounts a small tmpfs there. Children report
 * through their exit status (0 = as expected, 77 = the environment cannot do this, anything
 * else = which check failed, with details on stderr), never through cmocka.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/log.h"
#include "common/kvp_assert.h"
#include "common/shm_name.h"
#include "core/segment.h"
#include "core/shm_gate.h"

#define MIB (1ull << 20)
#define EXIT_SKIP 77

/* Per-case state: the segment name in use. */
struct ctx {
    char name[96];
    char path[128]; /* /dev/shm/<name> */
};

static int setup(void **state)
{
    static int seq;
    struct ctx *c = calloc(1, sizeof(*c));
    if (!c)
        return -1;
    snprintf(c->name, sizeof(c->name), "kvpool_l1_pool_ut_%ld_%d", (long)getpid(), seq++);
    snprintf(c->path, sizeof(c->path), "/dev/shm/%s", c->name);
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    struct ctx *c = *state;
    char shm[112];
    snprintf(shm, sizeof(shm), "/%s", c->name);
    shm_unlink(shm);
    free(c);
    return 0;
}

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Reads the header page of the file at path, independently of any mapping. */
static void read_file_header(const char *path, uint8_t h[64])
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        fail_msg("open %s: %s", path, strerror(errno));
    /* cppcheck-suppress invalidFunctionArg ; fail_msg() does not return, so fd >= 0 here */
    assert_int_equal(pread(fd, h, 64, 0), 64);
    /* cppcheck-suppress invalidFunctionArg ; fail_msg() does not return, so fd >= 0 here */
    close(fd);
}

/* Checks a header page for the documented layout. */
static void check_header(const uint8_t *h, const uint8_t nonce[16], uint64_t size, pid_t pid)
{
    assert_memory_equal(h, KVP_SEG_MAGIC, 8);
    assert_int_equal(get_le(h + 8, 4), 1);
    assert_int_equal(get_le(h + 12, 4), KVP_SEG_HEADER);
    assert_memory_equal(h + 16, nonce, 16);
    assert_int_equal(get_le(h + 32, 8), size);
    assert_int_equal(get_le(h + 40, 4), (uint64_t)pid);
}

static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

static void expect_no_file(const char *path)
{
    struct stat st;
    if (stat(path, &st) == 0)
        fail_msg("%s still exists", path);
    assert_int_equal(errno, ENOENT);
}

static void test_create_shared(void **state)
{
    struct ctx *c = *state;
    struct kvp_segment seg = KVP_SEGMENT_INIT;
    const uint64_t size = KVP_SEG_HEADER + MIB;
    char why[256] = "unset";
    struct stat st;
    uint8_t h[64];

    assert_rc(kvp_segment_create_shared(&seg, c->name, size, 0600, why, sizeof(why)), 0);
    assert_string_equal(why, "");
    assert_true(seg.shared);
    assert_non_null(seg.base);
    assert_int_equal(seg.size, size);
    assert_string_equal(seg.name, c->name);
    assert_true(seg.fd >= 0);
    assert_true(fcntl(seg.fd, F_GETFD) & FD_CLOEXEC);
    assert_false(all_zero(seg.nonce, sizeof(seg.nonce)));

    /* The file: a regular file of the full size, readable and writable by the owner only. */
    if (stat(c->path, &st) != 0)
        fail_msg("stat %s: %s", c->path, strerror(errno));
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(st.st_size, size);
    /* Every page is allocated, not a sparse file. */
    assert_true((uint64_t)st.st_blocks * 512 >= size);

    /* The header, through the mapping and through the file. */
    check_header(seg.base, seg.nonce, size, getpid());
    bool final = false;
    assert_int_equal(kvp_seg_header_reserved(seg.base, &final), size);
    assert_true(final);
    read_file_header(c->path, h);
    check_header(h, seg.nonce, size, getpid());

    /* The mapping is the file: a byte written at the end of the pool is in the file. */
    seg.base[size - 1] = 0x5a;
    int fd = open(c->path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    uint8_t b = 0;
    assert_int_equal(pread(fd, &b, 1, (off_t)(size - 1)), 1);
    assert_int_equal(b, 0x5a);

    /* The liveness lock is held: another open file description cannot take it. */
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), -1);
    assert_int_equal(errno, EWOULDBLOCK);
    close(fd);

    kvp_segment_destroy(&seg);
    expect_no_file(c->path);
    assert_null(seg.base);
    assert_int_equal(seg.fd, -1);
    assert_false(seg.shared);
    assert_string_equal(seg.name, "");
}

static void test_two_segments_have_different_nonces(void **state)
{
    struct ctx *c = *state;
    struct kvp_segment a = KVP_SEGMENT_INIT, b = KVP_SEGMENT_INIT;
    char why[256], name_b[128];

    snprintf(name_b, sizeof(name_b), "%s_b", c->name);
    assert_rc(kvp_segment_create_shared(&a, c->name, KVP_SEG_HEADER + MIB, 0600, why, sizeof(why)),
              0);
    int rc = kvp_segment_create_shared(&b, name_b, KVP_SEG_HEADER + MIB, 0600, why, sizeof(why));
    if (rc != 0) {
        kvp_segment_destroy(&a);
        fail_msg("second segment: %d %s", rc, why);
    }
    assert_memory_not_equal(a.nonce, b.nonce, sizeof(a.nonce));
    kvp_segment_destroy(&b);
    kvp_segment_destroy(&a);
}

static void test_busy_same_process(void **state)
{
    struct ctx *c = *state;
    struct kvp_segment a = KVP_SEGMENT_INIT, b = KVP_SEGMENT_INIT;
    const uint64_t size = KVP_SEG_HEADER + MIB;
    char why[256] = "", pid[32];
    uint8_t h[64];

    assert_rc(kvp_segment_create_shared(&a, c->name, size, 0600, why, sizeof(why)), 0);
    assert_rc(kvp_segment_create_shared(&b, c->name, 2 * size, 0600, why, sizeof(why)), -EBUSY);
    if (!strstr(why, "in use"))
        fail_msg("why \"%s\" does not say \"in use\"", why);
    /* The message names the holder, read from the header. */
    snprintf(pid, sizeof(pid), "pid %ld", (long)getpid());
    if (!strstr(why, pid))
        fail_msg("why \"%s\" does not name the holder (%s)", why, pid);

    /* The failed attempt left nothing behind and did not touch the live segment. */
    assert_null(b.base);
    assert_int_equal(b.fd, -1);
    assert_false(b.shared);
    read_file_header(c->path, h);
    check_header(h, a.nonce, size, getpid());
    kvp_segment_destroy(&b);
    struct stat st;
    assert_int_equal(stat(c->path, &st), 0);
    assert_int_equal(st.st_size, size);

    kvp_segment_destroy(&a);
    expect_no_file(c->path);
}

static void test_busy_other_process(void **state)
{
    struct ctx *c = *state;
    struct kvp_segment a = KVP_SEGMENT_INIT;
    char why[256];

    assert_rc(kvp_segment_create_shared(&a, c->name, KVP_SEG_HEADER + MIB, 0600, why, sizeof(why)),
              0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct kvp_segment b = KVP_SEGMENT_INIT;
        int rc = kvp_segment_create_shared(&b, c->name, KVP_SEG_HEADER + MIB, 0600, why,
                                           sizeof(why));
        if (rc != -EBUSY) {
            fprintf(stderr, "child: create = %d (%s), expected -EBUSY\n", rc, why);
            _exit(1);
        }
        if (!strstr(why, "in use")) {
            fprintf(stderr, "child: why \"%s\" does not say \"in use\"\n", why);
            _exit(2);
        }
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    kvp_segment_destroy(&a);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* The owner dies without cleaning up (SIGKILL): the next daemon replaces its segment. */
static void test_stale_after_owner_killed(void **state)
{
    struct ctx *c = *state;
    struct kvp_segment seg = KVP_SEGMENT_INIT;
    const uint64_t size = KVP_SEG_HEADER + MIB;
    char why[256];
    uint8_t old_nonce[16], h[64];
    int pfd[2];

    assert_int_equal(pipe(pfd), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct kvp_segment s = KVP_SEGMENT_INIT;
        close(pfd[0]);
        if (kvp_segment_create_shared(&s, c->name, size, 0600, why, sizeof(why)) != 0) {
            fprintf(stderr, "child: create failed: %s\n", why);
            _exit(1);
        }
        if (write(pfd[1], s.nonce, sizeof(s.nonce)) != (ssize_t)sizeof(s.nonce))
            _exit(2);
        for (;;)
            pause();
    }
    close(pfd[1]);
    ssize_t n = read(pfd[0], old_nonce, sizeof(old_nonce));
    close(pfd[0]);
    kill(pid, SIGKILL);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(n, (ssize_t)sizeof(old_nonce));
    assert_true(WIFSIGNALED(status));

    /* The dead daemon's file is still there, with its header. */
    read_file_header(c->path, h);
    check_header(h, old_nonce, size, pid);

    assert_rc(kvp_segment_create_shared(&seg, c->name, size, 0600, why, sizeof(why)), 0);
    assert_memory_not_equal(seg.nonce, old_nonce, sizeof(old_nonce));
    read_file_header(c->path, h);
    check_header(h, seg.nonce, size, getpid());
    kvp_segment_destroy(&seg);
    expect_no_file(c->path);
}

/* A namesake that nobody locks (not even a kvpool segment) is replaced as well. */
static void test_stale_unlocked_file(void **state)
{
    struct ctx *c = *state;
    struct kvp_segment seg = KVP_SEGMENT_INIT;
    const uint64_t size = KVP_SEG_HEADER + 2 * MIB;
    char shm[112], why[256];
    struct stat st;
    uint8_t h[64];

    snprintf(shm, sizeof(shm), "/%s", c->name);
    int fd = shm_open(shm, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 8192), 0);
    assert_int_equal(pwrite(fd, "not a kvpool segment", 20, 0), 20);
    close(fd);

    assert_rc(kvp_segment_create_shared(&seg, c->name, size, 0600, why, sizeof(why)), 0);
    assert_int_equal(stat(c->path, &st), 0);
    assert_int_equal(st.st_size, size);
    assert_int_equal(st.st_mode & 07777, 0600);
    read_file_header(c->path, h);
    check_header(h, seg.nonce, size, getpid());
    kvp_segment_destroy(&seg);
    expect_no_file(c->path);
}

static void test_invalid_name(void **state)
{
    (void)state;
    struct kvp_segment seg = KVP_SEGMENT_INIT;
    char why[256] = "";

    int rc = kvp_segment_create_shared(&seg, "kvpool_l1_pool_a/b", KVP_SEG_HEADER + MIB, 0600, why,
                                       sizeof(why));
    assert_true(rc < 0);
    assert_true(rc != -EBUSY);
    assert_true(why[0] != '\0');
    assert_null(seg.base);
    assert_int_equal(seg.fd, -1);
}

static void test_private(void **state)
{
    (void)state;
    struct kvp_segment seg = KVP_SEGMENT_INIT;
    const uint64_t size = KVP_SEG_HEADER + MIB;

    assert_rc(kvp_segment_create_private(&seg, size), 0);
    assert_non_null(seg.base);
    assert_false(seg.shared);
    assert_int_equal(seg.fd, -1);
    assert_string_equal(seg.name, "");
    assert_int_equal(seg.size, size);
    check_header(seg.base, seg.nonce, size, getpid());
    assert_false(all_zero(seg.nonce, sizeof(seg.nonce)));

    /* The whole pool is usable memory. */
    memset(seg.base + KVP_SEG_HEADER, 0xab, size - KVP_SEG_HEADER);
    assert_int_equal(seg.base[size - 1], 0xab);

    /* Anonymous memory: the mapping is not backed by any file. */
    FILE *maps = fopen("/proc/self/maps", "r");
    if (maps) {
        char line[512], start[32];
        snprintf(start, sizeof(start), "%lx-", (unsigned long)(uintptr_t)seg.base);
        while (fgets(line, sizeof(line), maps))
            if (strncmp(line, start, strlen(start)) == 0 && strstr(line, "/dev/shm"))
                fail_msg("private segment is a file mapping: %s", line);
        fclose(maps);
    }
    kvp_segment_destroy(&seg);
    assert_null(seg.base);
    assert_int_equal(seg.fd, -1);
}

static void test_destroy_null_and_init(void **state)
{
    (void)state;
    struct kvp_segment seg = KVP_SEGMENT_INIT;

    kvp_segment_destroy(NULL);
    kvp_segment_destroy(&seg);
    assert_int_equal(seg.fd, -1);
    assert_null(seg.base);
    /* Twice is fine too. */
    kvp_segment_destroy(&seg);
    assert_int_equal(seg.fd, -1);
}

/*
 * BUG (src/server/core/segment.c, kvp_segment_destroy(), "if (seg->fd >= 0) close(seg->fd)"):
 * segment.h promises that destroy is safe on a zeroed segment, but a zeroed struct has fd 0,
 * so destroy closes file descriptor 0, which belongs to someone else (stdin, or whatever the
 * daemon opened after stdin was closed). Expected: a zeroed segment owns no descriptor and
 * destroy leaves fd 0 alone.
 */
static void test_destroy_zeroed_keeps_fd0(void **state)
{
    (void)state;
    struct kvp_segment seg;

    /* Make fd 0 a known open file, and keep the original stdin to restore it. */
    int saved = fcntl(0, F_DUPFD_CLOEXEC, 3);
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    assert_true(devnull >= 0);
    assert_int_equal(dup2(devnull, 0), 0);
    close(devnull);

    memset(&seg, 0, sizeof(seg));
    kvp_segment_destroy(&seg);
    int still_open = fcntl(0, F_GETFD) != -1;

    if (saved >= 0) {
        dup2(saved, 0);
        close(saved);
    } else {
        close(0);
    }
    if (!still_open)
        fail_msg("kvp_segment_destroy() of a zeroed segment closed file descriptor 0");
}

/* ---- ENOSPC on reservation, in a private mount namespace ---- */

/*
 * Runs fn(name) in a child that has its own mount namespace with a tmpfs (mount options
 * tmpfs_opts) on /dev/shm. Returns the child's exit status (0 = all checks passed); skips the
 * case when the environment does not allow the namespace.
 */
static int in_small_dev_shm(const char *tmpfs_opts, int (*fn)(const char *name), const char *name)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (unshare(CLONE_NEWNS) != 0) {
            fprintf(stderr, "unshare(CLONE_NEWNS): %s\n", strerror(errno));
            _exit(errno == EPERM || errno == EINVAL || errno == ENOSYS ? EXIT_SKIP : 100);
        }
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
            fprintf(stderr, "making mounts private: %s\n", strerror(errno));
            _exit(errno == EPERM || errno == EACCES ? EXIT_SKIP : 101);
        }
        if (mount("tmpfs", KVP_SHM_DIR, "tmpfs", MS_NOSUID | MS_NODEV, tmpfs_opts) != 0) {
            fprintf(stderr, "mounting tmpfs (%s) on %s: %s\n", tmpfs_opts, KVP_SHM_DIR,
                    strerror(errno));
            _exit(errno == EPERM || errno == EACCES || errno == ENOENT ? EXIT_SKIP : 102);
        }
        _exit(fn(name));
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status))
        fail_msg("child died with signal %d", WIFSIGNALED(status) ? WTERMSIG(status) : -1);
    if (WEXITSTATUS(status) == EXIT_SKIP) {
        fprintf(stderr,
                "skipped: cannot mount a private tmpfs on %s (needs root or "
                "CAP_SYS_ADMIN; see the message above)\n",
                KVP_SHM_DIR);
        skip();
    }
    return WEXITSTATUS(status);
}

/* Child side: checks that creating size bytes fails with ENOSPC and leaves nothing behind. */
static int expect_enospc(const char *name, uint64_t size)
{
    struct kvp_segment seg = KVP_SEGMENT_INIT;
    char why[256] = "", path[128];

    int rc = kvp_segment_create_shared(&seg, name, size, 0600, why, sizeof(why));
    if (rc != -ENOSPC) {
        fprintf(stderr, "child: create(%llu) = %d (%s), expected -ENOSPC\n",
                (unsigned long long)size, rc, why);
        if (rc == 0)
            kvp_segment_destroy(&seg);
        return 10;
    }
    if (!strstr(why, "reserve")) {
        fprintf(stderr, "child: why \"%s\" does not mention the reservation\n", why);
        return 11;
    }
    snprintf(path, sizeof(path), "%s/%s", KVP_SHM_DIR, name);
    if (access(path, F_OK) == 0 || errno != ENOENT) {
        fprintf(stderr, "child: %s was left behind\n", path);
        return 12;
    }
    if (seg.base || seg.fd != -1 || seg.shared) {
        fprintf(stderr, "child: failed segment is not clean (fd %d)\n", seg.fd);
        return 13;
    }
    return 0;
}

static int child_too_small(const char *name)
{
    kvp_log_threshold = KVP_LOG_ERROR;
    return expect_enospc(name, 16 * MIB);
}

static void test_enospc_small_tmpfs(void **state)
{
    struct ctx *c = *state;
    int code = in_small_dev_shm("size=8m", child_too_small, c->name);
    assert_int_equal(code, 0);
}

/* The gate sees enough space, then /dev/shm fills up before the segment is created. */
static int child_filled_after_gate(const char *name)
{
    struct kvp_gate_probe probe;
    char log[512], reason[512], filler[128];
    const uint64_t size = 16 * MIB;

    kvp_log_threshold = KVP_LOG_ERROR;
    kvp_shm_gate_probe(KVP_SHM_DIR, &probe);
    if (probe.err) {
        fprintf(stderr, "child: probe: %s\n", strerror(probe.err));
        return 20;
    }
    if (kvp_shm_gate_decide(size, &probe, log, sizeof(log), reason, sizeof(reason)) !=
        KVP_GATE_OK) {
        fprintf(stderr, "child: gate refused %llu bytes: %s\n", (unsigned long long)size, log);
        return 21;
    }

    /* Someone else takes 24 of the 32 MiB. */
    snprintf(filler, sizeof(filler), "%s/filler_%ld", KVP_SHM_DIR, (long)getpid());
    int fd = open(filler, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || posix_fallocate(fd, 0, (off_t)(24 * MIB)) != 0) {
        fprintf(stderr, "child: cannot fill %s\n", filler);
        return 22;
    }
    close(fd);

    int rc = expect_enospc(name, size);
    if (rc)
        return rc;

    /* With the space back, the same creation succeeds: it was only the space. */
    unlink(filler);
    struct kvp_segment seg = KVP_SEGMENT_INIT;
    if (kvp_segment_create_shared(&seg, name, size, 0600, log, sizeof(log)) != 0) {
        fprintf(stderr, "child: create after freeing space failed: %s\n", log);
        return 23;
    }
    kvp_segment_destroy(&seg);
    return 0;
}

static void test_enospc_filled_after_gate(void **state)
{
    struct ctx *c = *state;
    int code = in_small_dev_shm("size=32m", child_filled_after_gate, c->name);
    assert_int_equal(code, 0);
}

/*
 * /dev/shm fills up after the first part was reserved: the rest fails with ENOSPC, and the part
 * reserved so far stays whole and writable (the daemon serves with it).
 */
static int child_filled_during_warmup(const char *name)
{
    struct kvp_segment seg = KVP_SEGMENT_INIT;
    char why[256] = "";
    const uint64_t size = 2 * KVP_RESERVE_STEP + KVP_SEG_HEADER;

    bool final = true;

    kvp_log_threshold = KVP_LOG_ERROR;
    if (kvp_segment_create_shared(&seg, name, size, 0600, why, sizeof(why)) != 0) {
        fprintf(stderr, "child: create: %s\n", why);
        return 30;
    }
    /* The header tells workers what they may pre-fault: the first part, more to come. */
    if (kvp_seg_header_reserved(seg.base, &final) != KVP_RESERVE_FIRST || final) {
        fprintf(stderr, "child: the header does not say that the first part is reserved\n");
        return 33;
    }
    int rc = kvp_segment_reserve_rest(&seg, NULL, NULL, why, sizeof(why));
    if (rc != -ENOSPC || !strstr(why, "reserve")) {
        fprintf(stderr, "child: reserve_rest = %d (%s), expected -ENOSPC\n", rc, why);
        return 31;
    }
    if (seg.reserved != KVP_RESERVE_FIRST) {
        fprintf(stderr, "child: %llu bytes reserved, expected %llu\n",
                (unsigned long long)seg.reserved, (unsigned long long)KVP_RESERVE_FIRST);
        return 32;
    }
    /* ...and now that this is all there will be. */
    if (kvp_seg_header_reserved(seg.base, &final) != KVP_RESERVE_FIRST || !final) {
        fprintf(stderr, "child: the header does not say that the reservation ended\n");
        return 34;
    }
    /* A fault here would kill the child: the test sees a signal, not an exit code. */
    memset(seg.base + KVP_SEG_HEADER, 0xa5, seg.reserved - KVP_SEG_HEADER);
    kvp_segment_destroy(&seg);
    return 0;
}

static void test_enospc_during_warmup(void **state)
{
    struct ctx *c = *state;
    int code = in_small_dev_shm("size=300m", child_filled_during_warmup, c->name);
    assert_int_equal(code, 0);
}

/* ---- kvp_segment_sweep: crash leftovers ---- */

/* Creates dir/name of size bytes, with the segment magic when header is set. Returns the fd. */
static int make_leftover(const char *dir, const char *name, uint64_t size, bool header)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_rc(ftruncate(fd, (off_t)size), 0);
    if (header) {
        uint8_t h[48] = {0};
        memcpy(h, KVP_SEG_MAGIC, 8);
        h[40] = 0x39; /* owner pid 12345 */
        h[41] = 0x30;
        assert_rc(pwrite(fd, h, sizeof(h), 0), (ssize_t)sizeof(h));
    }
    return fd;
}

static bool exists_in(const char *dir, const char *name)
{
    char path[256];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return lstat(path, &st) == 0;
}

static void test_sweep_leftovers(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvpt-sweep-XXXXXX", cmd[128];
    assert_non_null(mkdtemp(dir));
    kvp_log_threshold = KVP_LOG_ERROR;

    /* Dead (nobody holds the lock), with a header: removed. */
    close(make_leftover(dir, "kvpool_l1_pool_101", 3 * MIB, true));
    /* Held by a live owner: another open file description holds the flock. */
    int live = make_leftover(dir, "kvpool_l1_pool_102", MIB, true);
    assert_rc(flock(live, LOCK_EX | LOCK_NB), 0);
    /* Of another uid (only root can make one here). */
    int other = make_leftover(dir, "kvpool_l1_pool_103", MIB, true);
    bool root = geteuid() == 0;
    if (root)
        assert_rc(fchown(other, 65534, 65534), 0);
    close(other);
    /* No header yet and young: perhaps a daemon between creating and locking it. */
    close(make_leftover(dir, "kvpool_l1_pool_104", MIB, false));
    /* Not a default (pid) name: left to the daemon configured with it... */
    close(make_leftover(dir, "kvpool_l1_pool_named", 2 * MIB, true));
    /* ...which removes it as its own name. */
    close(make_leftover(dir, "kvpool_l1_pool_mine", 5 * MIB, true));
    /* A dead one with a default name of this version (pid and random part): removed. */
    close(make_leftover(dir, "kvpool_l1_pool_106_0123456789abcdef", MIB, true));
    /* Not a segment at all. */
    close(make_leftover(dir, "something_else_1", MIB, true));
    char target[256], link[256];
    snprintf(target, sizeof(target), "%s/something_else_1", dir);
    snprintf(link, sizeof(link), "%s/kvpool_l1_pool_105", dir);
    assert_rc(symlink(target, link), 0);

    uint64_t freed = kvp_segment_sweep(dir, "kvpool_l1_pool_mine", KVP_SWEEP_MIN_AGE_S);
    assert_int_equal(freed, 9 * MIB);
    assert_false(exists_in(dir, "kvpool_l1_pool_101"));
    assert_false(exists_in(dir, "kvpool_l1_pool_106_0123456789abcdef"));
    assert_false(exists_in(dir, "kvpool_l1_pool_mine"));
    assert_true(exists_in(dir, "kvpool_l1_pool_102"));
    if (root)
        assert_true(exists_in(dir, "kvpool_l1_pool_103"));
    assert_true(exists_in(dir, "kvpool_l1_pool_104"));
    assert_true(exists_in(dir, "kvpool_l1_pool_named"));
    assert_true(exists_in(dir, "something_else_1"));
    assert_true(exists_in(dir, "kvpool_l1_pool_105"));

    /* The live owner still holds its lock, and its file was not touched. */
    assert_rc(flock(live, LOCK_EX | LOCK_NB), 0);

    /* A headerless leftover past the minimum age goes too (age 0 stands for "old"). */
    uint64_t again = kvp_segment_sweep(dir, NULL, 0);
    assert_int_equal(again, root ? MIB : 2 * MIB);
    assert_false(exists_in(dir, "kvpool_l1_pool_104"));
    assert_true(exists_in(dir, "kvpool_l1_pool_102"));
    if (root)
        assert_true(exists_in(dir, "kvpool_l1_pool_103"));

    /* Once its owner is gone, the held one is a leftover as well. */
    close(live);
    assert_int_equal(kvp_segment_sweep(dir, NULL, KVP_SWEEP_MIN_AGE_S), MIB);
    assert_false(exists_in(dir, "kvpool_l1_pool_102"));

    /* A missing directory is not an error. */
    assert_int_equal(kvp_segment_sweep("/nonexistent-kvpool-dir", NULL, 0), 0);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    assert_rc(system(cmd), 0);
}

/* Reservation callback of test_reserve_progress: records every step. */
struct steps {
    uint64_t seen[8];
    int n;
};

static void record_step(void *arg, uint64_t reserved)
{
    struct steps *st = arg;
    if (st->n < 8)
        st->seen[st->n] = reserved;
    st->n++;
}

/*
 * Creation reserves the first part only; kvp_segment_reserve_rest() the rest, step by step,
 * with a callback after each step and progress lines at the interval set by the control call.
 */
static void test_reserve_progress(void **state)
{
    (void)state;
    struct kvp_segment seg = KVP_SEGMENT_INIT;
    struct steps st = {0};
    int p[2], saved = dup(STDERR_FILENO);
    char text[8192], why[256];
    const uint64_t size = 5 * KVP_RESERVE_STEP / 2;
    assert_rc(pipe2(p, O_CLOEXEC), 0);
    kvp_log_threshold = KVP_LOG_INFO;
    kvp_segment_set_reserve_control(0, NULL);
    assert_rc(dup2(p[1], STDERR_FILENO), STDERR_FILENO);
    close(p[1]);
    int rc = kvp_segment_create_private(&seg, size);
    uint64_t first = seg.reserved;
    int rest = rc ? rc : kvp_segment_reserve_rest(&seg, record_step, &st, why, sizeof(why));
    assert_rc(dup2(saved, STDERR_FILENO), STDERR_FILENO);
    close(saved);
    ssize_t n = read(p[0], text, sizeof(text) - 1);
    close(p[0]);
    kvp_segment_set_reserve_control(KVP_RESERVE_PROGRESS_MS, NULL);
    kvp_log_threshold = KVP_LOG_ERROR;
    assert_rc(rc, 0);
    assert_rc(rest, 0);
    assert_int_equal(first, KVP_RESERVE_FIRST);
    assert_int_equal(seg.reserved, size);
    /* Whole pages of every reserved step are usable: write the last byte of each. */
    for (int i = 0; i < st.n && i < 8; i++)
        seg.base[st.seen[i] - 1] = 1;
    kvp_segment_destroy(&seg);
    assert_int_equal(st.n, 2);
    assert_int_equal(st.seen[0], 2 * KVP_RESERVE_STEP);
    assert_int_equal(st.seen[1], size);
    assert_true(n > 0);
    text[n] = '\0';
    char want[3][160];
    snprintf(want[0], sizeof(want[0]),
             "Reserving %llu of %llu bytes for the pool (private memory) before serving",
             (unsigned long long)KVP_RESERVE_FIRST, (unsigned long long)size);
    snprintf(want[1], sizeof(want[1]),
             "Reserving %llu of %llu bytes for the pool (private memory) in the background",
             (unsigned long long)(size - KVP_RESERVE_FIRST), (unsigned long long)size);
    snprintf(want[2], sizeof(want[2]), "Reserving the pool: %llu of %llu bytes (80%%)",
             (unsigned long long)(2 * KVP_RESERVE_STEP), (unsigned long long)size);
    for (int i = 0; i < 3; i++)
        if (!strstr(text, want[i]))
            fail_msg("no \"%s\" in:\n%s", want[i], text);
    if (!strstr(text, "GB/s, about ") || !strstr(text, "INFO  Reserved "))
        fail_msg("no progress lines in:\n%s", text);
}

/* A stop request between two steps ends the reservation, leaving nothing behind. */
static void test_reserve_cancel(void **state)
{
    struct ctx *c = *state;
    struct kvp_segment seg = KVP_SEGMENT_INIT;
    atomic_bool stop = true;
    char why[256];
    kvp_segment_set_reserve_control(KVP_RESERVE_PROGRESS_MS, &stop);
    int rc = kvp_segment_create_shared(&seg, c->name, 2 * KVP_RESERVE_STEP, 0600, why, sizeof(why));
    int prc = kvp_segment_create_private(&seg, KVP_RESERVE_STEP);
    kvp_segment_set_reserve_control(KVP_RESERVE_PROGRESS_MS, NULL);
    assert_rc(rc, -ECANCELED);
    assert_rc(prc, -ECANCELED);
    assert_false(exists_in(KVP_SHM_DIR, c->name));
}

/*
 * The default name: one that exists already, even held by a live owner, is never touched; the
 * segment gets another random name.
 */
static void test_default_name_taken(void **state)
{
    struct ctx *c = *state;
    struct kvp_segment seg = KVP_SEGMENT_INIT;
    char why[256], shm[112];

    snprintf(shm, sizeof(shm), "/%s", c->name);
    int planted = shm_open(shm, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    assert_true(planted >= 0);
    assert_rc(flock(planted, LOCK_EX | LOCK_NB), 0);
    int rc = kvp_segment_create_shared_default(&seg, c->name, KVP_SEG_HEADER + MIB, 0600, why,
                                               sizeof(why));
    if (rc != 0)
        fail_msg("create: %d %s", rc, why);
    assert_true(seg.shared);
    assert_string_not_equal(seg.name, c->name);
    assert_true(kvp_shm_name_is_default(seg.name));
    assert_true(exists_in(KVP_SHM_DIR, seg.name));
    /* The planted file is as it was: still there, still empty, its lock still held. */
    struct stat st;
    assert_rc(stat(c->path, &st), 0);
    assert_int_equal(st.st_size, 0);
    int probe = open(c->path, O_RDONLY | O_CLOEXEC);
    assert_true(probe >= 0);
    assert_rc(flock(probe, LOCK_EX | LOCK_NB), -1);
    close(probe);
    close(planted);
    char name[sizeof(seg.name)];
    snprintf(name, sizeof(name), "%s", seg.name);
    kvp_segment_destroy(&seg);
    assert_false(exists_in(KVP_SHM_DIR, name));
}

/* A name the operator gave, held by another uid's file: a clear error, and the file stays. */
static void test_given_name_of_other_uid(void **state)
{
    struct ctx *c = *state;
    struct kvp_segment seg = KVP_SEGMENT_INIT;
    char why[512] = "", shm[112];

    if (geteuid() != 0)
        skip(); /* only root can make a file of another uid */
    snprintf(shm, sizeof(shm), "/%s", c->name);
    int planted = shm_open(shm, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    assert_true(planted >= 0);
    assert_rc(fchown(planted, 65534, 65534), 0);
    close(planted);
    assert_rc(kvp_segment_create_shared(&seg, c->name, KVP_SEG_HEADER + MIB, 0600, why,
                                        sizeof(why)),
              -EPERM);
    if (!strstr(why, "belongs to uid 65534"))
        fail_msg("why \"%s\" does not name the file's owner", why);
    assert_false(seg.shared);
    assert_true(exists_in(KVP_SHM_DIR, c->name));
}

/* ---- adoption (warm restart) ---- */

#define DEAD_PID 424242u

/*
 * What a dead daemon leaves: the segment name of size bytes, its first reserved bytes allocated,
 * a header (old nonce, pid DEAD_PID, that reserved part, not final) and a pattern in the pool's
 * first page; nobody holds its lock. mode: the file's bits. Returns the old nonce in nonce.
 */
static void leave_dead_segment(const char *name, uint64_t size, uint64_t reserved,
                               uint8_t nonce[KVP_SEG_NONCE_SIZE])
{
    char shm[112];
    snprintf(shm, sizeof(shm), "/%s", name);
    int fd = shm_open(shm, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_rc(ftruncate(fd, (off_t)size), 0);
    assert_rc(posix_fallocate(fd, 0, (off_t)reserved), 0);
    uint8_t *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(p != MAP_FAILED);
    for (int i = 0; i < KVP_SEG_NONCE_SIZE; i++)
        nonce[i] = (uint8_t)(0x30 + i);
    kvp_seg_header_write(p, nonce, size, DEAD_PID);
    kvp_seg_header_publish_reserved(p, reserved, false);
    memset(p + KVP_SEG_HEADER, 0x5a, 4096);
    munmap(p, size);
    close(fd);
}

static uint8_t pool_byte(const char *path, uint64_t off)
{
    uint8_t b = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
    close(fd);
    return b;
}

/* A dead daemon's segment is adopted: its reserved part kept (and continued), its pool's bytes
 * untouched, a new nonce and this pid in its header, its lock held, the configured mode. */
static void test_adopt_dead(void **state)
{
    struct ctx *c = *state;
    struct kvp_segment seg = KVP_SEGMENT_INIT;
    const uint64_t size = KVP_SEG_HEADER + 2 * MIB, reserved = KVP_SEG_HEADER + MIB;
    uint8_t old_nonce[KVP_SEG_NONCE_SIZE], h[64];
    char why[256] = "unset";
    struct stat st;

    leave_dead_segment(c->name, size, reserved, old_nonce);
    assert_rc(kvp_segment_adopt(&seg, c->name, size, 0660, why, sizeof(why)), 0);
    assert_string_equal(why, "");
    assert_true(seg.shared);
    assert_false(seg.memfd);
    assert_string_equal(seg.name, c->name);
    assert_int_equal(seg.size, size);
    assert_int_equal(seg.reserved, reserved);
    assert_memory_not_equal(seg.nonce, old_nonce, sizeof(old_nonce));
    read_file_header(c->path, h);
    check_header(h, seg.nonce, size, getpid());
    bool final = true;
    assert_int_equal(kvp_seg_header_reserved(seg.base, &final), reserved);
    assert_false(final);
    /* Nothing of the pool was read or written. */
    assert_int_equal(pool_byte(c->path, KVP_SEG_HEADER), 0x5a);
    assert_int_equal(seg.base[KVP_SEG_HEADER + 4095], 0x5a);
    assert_int_equal(stat(c->path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0660);
    /* The liveness lock is ours now. */
    int fd = open(c->path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), -1);
    assert_int_equal(errno, EWOULDBLOCK);
    close(fd);

    /* The background reservation goes on from the adopted part, sparing what it holds. */
    assert_rc(kvp_segment_reserve_rest(&seg, NULL, NULL, why, sizeof(why)), 0);
    assert_int_equal(seg.reserved, size);
    assert_int_equal(kvp_seg_header_reserved(seg.base, &final), size);
    assert_true(final);
    assert_int_equal(seg.base[KVP_SEG_HEADER], 0x5a);
    assert_int_equal(stat(c->path, &st), 0);
    assert_true((uint64_t)st.st_blocks * 512 >= size);

    /* Left for a successor: the file stays, with its header, and the lock is free. */
    kvp_segment_leave(&seg);
    assert_null(seg.base);
    assert_false(seg.shared);
    assert_true(exists_in(KVP_SHM_DIR, c->name));
    fd = open(c->path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
    close(fd);
    assert_int_equal(pool_byte(c->path, KVP_SEG_HEADER), 0x5a);
}

/* A live daemon's segment (its lock held) is never adopted, nor touched. */
static void test_adopt_refuses_live_owner(void **state)
{
    struct ctx *c = *state;
    struct kvp_segment live = KVP_SEGMENT_INIT, seg = KVP_SEGMENT_INIT;
    const uint64_t size = KVP_SEG_HEADER + MIB;
    char why[256] = "", pid[32];
    uint8_t h[64];

    assert_rc(kvp_segment_create_shared(&live, c->name, size, 0600, why, sizeof(why)), 0);
    live.base[KVP_SEG_HEADER] = 0x77;
    assert_rc(kvp_segment_adopt(&seg, c->name, size, 0600, why, sizeof(why)), -EBUSY);
    snprintf(pid, sizeof(pid), "pid %ld", (long)getpid());
    if (!strstr(why, "running kvpoold") || !strstr(why, pid))
        fail_msg("why \"%s\" does not name the running daemon (%s)", why, pid);
    assert_false(seg.shared);
    assert_null(seg.base);
    assert_int_equal(seg.fd, -1);
    read_file_header(c->path, h);
    check_header(h, live.nonce, size, getpid());
    assert_int_equal(pool_byte(c->path, KVP_SEG_HEADER), 0x77);

    /* From another process, the same. */
    fflush(NULL);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        struct kvp_segment b = KVP_SEGMENT_INIT;
        _exit(kvp_segment_adopt(&b, c->name, size, 0600, why, sizeof(why)) == -EBUSY ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    kvp_segment_destroy(&live);
}

/* Another size, a header that is not a kvpool header (or of another layout, or that does not
 * say what was reserved), no such name, not a name: refused, and the file is unchanged. */
static void test_adopt_refusals(void **state)
{
    struct ctx *c = *state;
    struct kvp_segment seg = KVP_SEGMENT_INIT;
    const uint64_t size = KVP_SEG_HEADER + MIB;
    uint8_t nonce[KVP_SEG_NONCE_SIZE], h[64];
    char why[256] = "", shm[112];

    snprintf(shm, sizeof(shm), "/%s", c->name);
    assert_rc(kvp_segment_adopt(&seg, c->name, size, 0600, why, sizeof(why)), -ENOENT);
    assert_rc(kvp_segment_adopt(&seg, "a/b", size, 0600, why, sizeof(why)), -EINVAL);
    assert_rc(kvp_segment_adopt(&seg, "", size, 0600, why, sizeof(why)), -EINVAL);

    leave_dead_segment(c->name, size, size, nonce);
    assert_rc(kvp_segment_adopt(&seg, c->name, size + 4096, 0600, why, sizeof(why)), -ESTALE);
    if (!strstr(why, "bytes"))
        fail_msg("why \"%s\" does not give the sizes", why);
    assert_false(seg.shared);

    /* Each field of the header that must hold, broken in turn (through a mapping). */
    static const struct {
        size_t off, len;
        uint8_t byte;
        const char *why;
    } breaks[] = {
        {0, 8, 0, "no kvpool header"}, /* magic */
        {8, 1, 9, "header version"},   /* version */
        {12, 1, 0x10, "-byte header"}, /* header size */
        {32, 1, 0x11, "says it is"},   /* size */
        {48, 8, 0, "reserved"},        /* reserved_bytes 0: an earlier version */
    };
    int fd = shm_open(shm, O_RDWR | O_CLOEXEC, 0);
    assert_true(fd >= 0);
    uint8_t *p = mmap(NULL, KVP_SEG_HEADER, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(p != MAP_FAILED);
    for (size_t i = 0; i < sizeof(breaks) / sizeof(breaks[0]); i++) {
        uint8_t keep[8];
        memcpy(keep, p + breaks[i].off, breaks[i].len);
        memset(p + breaks[i].off, breaks[i].byte, breaks[i].len);
        assert_rc(kvp_segment_adopt(&seg, c->name, size, 0600, why, sizeof(why)), -EPROTO);
        if (!strstr(why, breaks[i].why))
            fail_msg("break %zu: why \"%s\" does not say \"%s\"", i, why, breaks[i].why);
        assert_false(seg.shared);
        memcpy(p + breaks[i].off, keep, breaks[i].len);
    }
    /* Nothing was changed by the refusals: the dead daemon's header and lock as they were. */
    read_file_header(c->path, h);
    check_header(h, nonce, size, DEAD_PID);
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
    munmap(p, KVP_SEG_HEADER);
    close(fd);

    /* Restored, it is adoptable. */
    assert_rc(kvp_segment_adopt(&seg, c->name, size, 0600, why, sizeof(why)), 0);
    kvp_segment_destroy(&seg);
    expect_no_file(c->path);
}

/* Another user's segment: refused, untouched. */
static void test_adopt_refuses_other_uid(void **state)
{
    struct ctx *c = *state;
    struct kvp_segment seg = KVP_SEGMENT_INIT;
    const uint64_t size = KVP_SEG_HEADER + MIB;
    uint8_t nonce[KVP_SEG_NONCE_SIZE], h[64];
    char why[256] = "";

    if (geteuid() != 0)
        skip(); /* only root can make a file of another uid */
    leave_dead_segment(c->name, size, size, nonce);
    assert_rc(chown(c->path, 65534, 65534), 0);
    assert_rc(kvp_segment_adopt(&seg, c->name, size, 0600, why, sizeof(why)), -EPERM);
    if (!strstr(why, "belongs to uid 65534"))
        fail_msg("why \"%s\" does not name the file's owner", why);
    read_file_header(c->path, h);
    check_header(h, nonce, size, DEAD_PID);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_create_shared),
        T(test_two_segments_have_different_nonces),
        T(test_busy_same_process),
        T(test_busy_other_process),
        T(test_stale_after_owner_killed),
        T(test_stale_unlocked_file),
        T(test_invalid_name),
        T(test_default_name_taken),
        T(test_given_name_of_other_uid),
        T(test_private),
        T(test_destroy_null_and_init),
        T(test_destroy_zeroed_keeps_fd0),
        T(test_enospc_small_tmpfs),
        T(test_enospc_filled_after_gate),
        T(test_enospc_during_warmup),
        cmocka_unit_test(test_sweep_leftovers),
        cmocka_unit_test(test_reserve_progress),
        T(test_reserve_cancel),
        T(test_adopt_dead),
        T(test_adopt_refuses_live_owner),
        T(test_adopt_refusals),
        T(test_adopt_refuses_other_uid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
