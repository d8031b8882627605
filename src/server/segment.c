/*
 * segment.c - creation and teardown of the pool's memory.
 *
 * Shared case, in order:
 *   1. shm_open(O_CREAT|O_EXCL, 0600). If the name exists, open it and try a non-blocking
 *      exclusive flock: if that fails a live daemon holds it and we refuse to start (-EBUSY); if
 *      it succeeds the owner is dead (flocks die with their process), so the stale segment is
 *      unlinked and creation is retried once. Liveness, not the name, decides.
 *   2. flock(LOCK_EX) on our new segment, held until exit: this is what step 1 of the next
 *      daemon tests.
 *   3. posix_fallocate the whole size (EINTR retried). On tmpfs this allocates every page, so
 *      success means no later write can hit ENOSPC/SIGBUS; failure (ENOSPC because /dev/shm was
 *      filled after the capacity gate) unlinks the segment and the daemon goes inline.
 *   4. mmap(MAP_SHARED|MAP_POPULATE): the pages are already allocated and are now mapped, so the
 *      first worker request does not pay the first-touch cost.
 *   5. The header page gets a magic and a random nonce that HELLO also returns: a worker proves
 *      it mapped this daemon's segment and not a namesake in another IPC namespace.
 *
 * memfd case: the same reservation and pre-faulting on an anonymous memfd, sealed against
 * shrinking and growing; it has no name to collide with, nothing to unlink, and no /dev/shm size
 * limit (the capacity gate checks available memory instead).
 *
 * Attach-only processes (workers) never unlink; only the owner does, in kvp_segment_destroy().
 */
#include "segment.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"

static void write_header(struct kvp_segment *seg)
{
    uint8_t *h = seg->base;
    uint32_t version = 1, hsize = KVP_SEG_HEADER, pid = (uint32_t)getpid();

    memset(h, 0, KVP_SEG_HEADER);
    memcpy(h, KVP_SEG_MAGIC, 8);
    for (int i = 0; i < 4; i++) {
        h[8 + i] = (uint8_t)(version >> (8 * i));
        h[12 + i] = (uint8_t)(hsize >> (8 * i));
        h[40 + i] = (uint8_t)(pid >> (8 * i));
    }
    memcpy(h + 16, seg->nonce, sizeof(seg->nonce));
    for (int i = 0; i < 8; i++)
        h[32 + i] = (uint8_t)(seg->size >> (8 * i));
}

/*
 * Writes one byte of every page. MAP_POPULATE maps the pages, but on virtual machines the first
 * write through a mapping still costs a fault-sized exit per page (measured: 0.4-0.9 GB/s for a
 * first pass against 20-30 GB/s afterwards). The pool is all zeroes here, so writing zero is
 * harmless, and the cost moves from the first requests to start-up. Not instrumented by TSan:
 * a single-threaded first touch has nothing to check, and its shadow memory would add seconds
 * per GiB to a sanitized daemon's start-up.
 */
__attribute__((no_sanitize_thread)) static void touch_pages(uint8_t *base, uint64_t size)
{
    for (uint64_t off = 0; off < size; off += 4096)
        ((volatile uint8_t *)base)[off] = 0;

    /*
     * Kernel writes into the pool (the socket receive of an inline store) pay their own first
     * touch per page on such machines; a read from /dev/zero over the (all-zero) pool takes
     * that cost now. Best effort: on failure the pool is just slower the first time.
     */
    int zfd = open("/dev/zero", O_RDONLY | O_CLOEXEC);
    for (uint64_t off = 0; zfd >= 0 && off < size;) {
        size_t n = size - off < (1u << 20) ? (size_t)(size - off) : (size_t)(1u << 20);
        /* The raw syscall keeps sanitizer interceptors from walking shadow memory of the
         * whole pool; the kernel's write is not theirs to check. */
        ssize_t r = syscall(SYS_read, zfd, base + off, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        off += (uint64_t)r;
    }
    if (zfd >= 0)
        close(zfd);
}

/*
 * Reserves every page of fd (posix_fallocate, EINTR retried), maps it pre-faulted and writes
 * the header. On success seg owns fd and the mapping; on failure neither is touched.
 */
static int reserve_and_map(struct kvp_segment *seg, int fd, uint64_t size, const char *what,
                           char *why, size_t why_size)
{
    int rc;
    do {
        rc = posix_fallocate(fd, 0, (off_t)size);
    } while (rc == EINTR);
    if (rc != 0) {
        snprintf(why, why_size, "cannot reserve %llu bytes for %s: %s", (unsigned long long)size,
                 what, strerror(rc));
        return -rc;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        rc = -errno;
        snprintf(why, why_size, "cannot map %s: %s", what, strerror(errno));
        return rc;
    }
    touch_pages(p, size);
    seg->base = p;
    seg->size = size;
    seg->fd = fd;
    seg->shared = true;
    randombytes_buf(seg->nonce, sizeof(seg->nonce));
    write_header(seg);
    return 0;
}

/* Reads the owner pid recorded in an existing segment's header, 0 if unreadable. */
static uint32_t header_pid(int fd)
{
    uint8_t h[48];
    if (pread(fd, h, sizeof(h), 0) != (ssize_t)sizeof(h) || memcmp(h, KVP_SEG_MAGIC, 8) != 0)
        return 0;
    return (uint32_t)h[40] | ((uint32_t)h[41] << 8) | ((uint32_t)h[42] << 16) |
           ((uint32_t)h[43] << 24);
}

/* Handles an existing name: -EBUSY if a live daemon holds it, 0 once a stale one is removed. */
static int replace_stale(const char *path, char *why, size_t why_size)
{
    int fd = shm_open(path, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        int err = errno;
        /* It vanished meanwhile: fine, retry the creation. */
        if (err == ENOENT)
            return 0;
        snprintf(why, why_size, "cannot inspect existing segment /dev/shm%s: %s", path,
                 strerror(err));
        return -err;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        uint32_t pid = header_pid(fd);
        close(fd);
        if (err == EWOULDBLOCK) {
            snprintf(why, why_size,
                     "segment /dev/shm%s is in use by a running kvpoold (pid %u); choose "
                     "another --shm-name",
                     path, pid);
            return -EBUSY;
        }
        snprintf(why, why_size, "cannot lock /dev/shm%s: %s", path, strerror(err));
        return -err;
    }
    log_warn("Replacing stale segment /dev/shm%s left by a dead kvpoold (pid %u)", path,
             header_pid(fd));
    shm_unlink(path);
    close(fd);
    return 0;
}

int kvp_segment_create_shared(struct kvp_segment *seg, const char *name, uint64_t size,
                              uint32_t mode, char *why, size_t why_size)
{
    char path[130];
    int fd = -1, rc;

    *seg = (struct kvp_segment)KVP_SEGMENT_INIT;
    why[0] = '\0';
    snprintf(path, sizeof(path), "/%s", name);

    for (int attempt = 0;; attempt++) {
        fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0)
            break;
        if (errno != EEXIST || attempt > 0) {
            rc = -errno;
            snprintf(why, why_size, "cannot create /dev/shm%s: %s", path, strerror(errno));
            return rc;
        }
        rc = replace_stale(path, why, why_size);
        if (rc)
            return rc;
    }
    /*
     * Between O_EXCL and this lock another daemon starting with the same name could see an
     * unlocked file, take it for stale and unlink it. So after locking, check that the name
     * still refers to our file; if it does not (or someone else holds the lock), we lost the
     * race and refuse, leaving the name to the winner.
     */
    struct stat ours, named;
    char dev_path[sizeof(path) + 8];
    snprintf(dev_path, sizeof(dev_path), "/dev/shm%s", path);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0 || fstat(fd, &ours) != 0 || stat(dev_path, &named) != 0 ||
        ours.st_ino != named.st_ino || ours.st_dev != named.st_dev) {
        close(fd);
        snprintf(why, why_size,
                 "segment /dev/shm%s was claimed by another kvpoold starting at the same time; "
                 "choose another --shm-name",
                 path);
        return -EBUSY;
    }

    /* shm_open's mode is filtered by the umask; set the configured bits exactly. */
    if (fchmod(fd, mode) != 0) {
        rc = -errno;
        snprintf(why, why_size, "cannot set mode %o on /dev/shm%s: %s", mode, path,
                 strerror(errno));
        goto out_unlink;
    }
    char what[160];
    snprintf(what, sizeof(what), "/dev/shm%s", path);
    rc = reserve_and_map(seg, fd, size, what, why, why_size);
    if (rc)
        goto out_unlink;
    snprintf(seg->name, sizeof(seg->name), "%s", name);
    return 0;

out_unlink:
    shm_unlink(path);
    close(fd);
    return rc;
}

int kvp_segment_create_memfd(struct kvp_segment *seg, uint64_t size, char *why, size_t why_size)
{
    *seg = (struct kvp_segment)KVP_SEGMENT_INIT;
    why[0] = '\0';
    int fd = memfd_create("kvpool_l1_pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        int err = errno;
        snprintf(why, why_size, "memfd_create: %s", strerror(err));
        return -err;
    }
    int rc = reserve_and_map(seg, fd, size, "the memfd segment", why, why_size);
    if (rc == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        rc = -errno;
        snprintf(why, why_size, "cannot seal the memfd segment: %s", strerror(errno));
        munmap(seg->base, size);
        *seg = (struct kvp_segment)KVP_SEGMENT_INIT;
    }
    if (rc) {
        close(fd);
        return rc;
    }
    seg->memfd = true;
    return 0;
}

int kvp_segment_create_private(struct kvp_segment *seg, uint64_t size)
{
    *seg = (struct kvp_segment)KVP_SEGMENT_INIT;
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE;
    /* cppcheck-suppress invalidFunctionArg ; an anonymous mapping takes fd -1 */
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED)
        return -errno;
    touch_pages(p, size);
    seg->base = p;
    seg->size = size;
    randombytes_buf(seg->nonce, sizeof(seg->nonce));
    write_header(seg);
    return 0;
}

void kvp_segment_destroy(struct kvp_segment *seg)
{
    if (!seg)
        return;
    if (seg->base)
        munmap(seg->base, seg->size);
    if (seg->shared && !seg->memfd && seg->name[0]) {
        char path[130];
        snprintf(path, sizeof(path), "/%s", seg->name);
        shm_unlink(path);
    }
    /* Only a shared segment owns a descriptor; a zeroed struct's fd 0 is somebody else's. */
    if (seg->shared && seg->fd >= 0)
        close(seg->fd);
    *seg = (struct kvp_segment)KVP_SEGMENT_INIT;
}
