/*
 * segment.c - creation and teardown of the pool's memory.
 *
 * Shared case, in order:
 *   1. shm_open(O_CREAT|O_EXCL, 0600). The default name has a random part (shm_name.h) that no
 *      other user can predict; should it exist anyway, whoever made it, another one is drawn:
 *      another user's file is never a reason to refuse or to lose shared memory. A name the
 *      operator gave is judged instead: another uid's file is an error that says so (-EPERM);
 *      otherwise the file is opened and a non-blocking exclusive flock tried: if that fails a
 *      live daemon holds it and we refuse to start (-EBUSY); if it succeeds the owner is dead
 *      (flocks die with their process), so the stale segment is unlinked and creation is
 *      retried once. Liveness, not the name, decides.
 *   2. flock(LOCK_EX) on our new segment, held until exit: this is what step 1 of the next
 *      daemon tests.
 *   3. ftruncate to the whole size (sparse) and mmap(MAP_SHARED) of it, then, in steps of
 *      KVP_RESERVE_STEP bytes: posix_fallocate the step (EINTR retried) and populate and touch
 *      its pages. On tmpfs this allocates every page, so a reserved page can never hit
 *      ENOSPC/SIGBUS on a later write; failure (ENOSPC because /dev/shm was filled after the
 *      capacity gate) of the first part unlinks the segment and the daemon goes inline. Only
 *      the first KVP_RESERVE_FIRST bytes are reserved here, so that the daemon serves within a
 *      second whatever the pool's size; kvp_segment_reserve_rest() does the rest on a thread of
 *      its own (warmup.c) and reports each step, and the pool (pool.c) hands out only reserved
 *      pages. A later failure leaves the pool at the part reserved so far. Steps make the
 *      reservation observable (an INFO progress line every few seconds: bytes done, GB/s, time
 *      left) and interruptible (a stop request between steps ends it with -ECANCELED).
 *   4. The header page gets a magic and a random nonce that HELLO also returns: a worker proves
 *      it mapped this daemon's segment and not a namesake in another IPC namespace. The magic
 *      is written last, after the lock: a segment with a valid header whose lock is free was
 *      left by a dead daemon. The header also says how much is reserved, after every step, and
 *      when the reservation has ended: a worker pre-faults only that part, since touching a
 *      page that nobody allocated on a full /dev/shm is SIGBUS.
 *
 * memfd case: the same reservation and pre-faulting on an anonymous memfd, sized and then
 * sealed against shrinking and growing before the reservation (which stays within the size); it has
 * no name to collide with, nothing to unlink, and no /dev/shm size limit (the capacity gate checks
 * available memory instead).
 *
 * Adoption (kvp_segment_adopt(), warm restart): the named segment a dead daemon left is opened
 * without O_CREAT and judged before anything is written: this euid's regular file of exactly
 * the configured size, its liveness lock free (then taken, and held for the daemon's lifetime),
 * a sound header that records its reserved part. Then its header gets a new nonce and this pid
 * (magic cleared first, written last), and the background reservation continues from the
 * reserved part. The pool's bytes are neither read nor written: adopting 12 GiB takes the time
 * of an open, a lock and a mapping. kvp_segment_leave() is the other end: the file stays for a
 * successor, only the mapping and the lock go.
 *
 * Attach-only processes (workers) never unlink; only the owner does, in kvp_segment_destroy().
 *
 * Crash leftovers (kvp_segment_sweep): a SIGKILLed or OOM-killed daemon leaves its whole pool
 * in /dev/shm, and under a default name (kvpool_l1_pool_<pid>_<random>, or kvpool_l1_pool_<pid>
 * of earlier versions) nobody would ever reuse it. At
 * start-up, before the capacity gate, the daemon removes such segments: those of its euid whose
 * liveness lock is free and that either carry a valid header or are older than
 * KVP_SWEEP_MIN_AGE_S (a segment without a header that young may belong to a daemon that has
 * just created it and not yet locked it).
 *
 * Threads: creation, sweep and destruction run on the main thread at start-up and shutdown;
 * kvp_segment_reserve_rest() on the reservation thread, which shutdown joins before destroying.
 */
#include "core/segment.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/notify.h"
#include "common/errors.h"
#include "common/fence.h"
#include "common/populate.h"
#include "common/shm_name.h"
#include "common/why.h"
#include "core/seg_guard.h"

static uint32_t progress_interval_ms = KVP_RESERVE_PROGRESS_MS;
static const atomic_bool *reserve_cancel;

void kvp_segment_set_reserve_control(uint32_t interval_ms, const atomic_bool *cancel)
{
    progress_interval_ms = interval_ms;
    reserve_cancel = cancel;
}

/* The header, with the part reserved by now (the first part, when creating). */
static void write_header(struct kvp_segment *seg)
{
    kvp_seg_header_write(seg->base, seg->nonce, seg->size, (uint32_t)getpid());
    kvp_seg_header_publish_reserved(seg->base, seg->reserved, seg->reserved >= seg->size);
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

static double seconds_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

/*
 * Reserves and pre-faults base[from, to) in steps: for a file-backed mapping (fd >= 0) each step
 * is first allocated with posix_fallocate. After each step seg->reserved moves on and on_step
 * (when not NULL) hears of it. Logs progress at INFO every progress_interval_ms. Returns 0,
 * -ECANCELED when a stop was requested, or the negative errno of posix_fallocate (why filled).
 */
static int reserve_steps(struct kvp_segment *seg, uint8_t *base, int fd, uint64_t from, uint64_t to,
                         const char *what, kvp_reserve_cb on_step, void *arg, char *why,
                         size_t why_size)
{
    struct timespec t0;
    double last = 0;
    bool reported = false;
    char status[320];

    clock_gettime(CLOCK_MONOTONIC, &t0);
    log_info("Reserving %" PRIu64 " of %" PRIu64 " bytes for the pool (%s) %s", to - from,
             seg->size, what, on_step ? "in the background" : "before serving");
    for (uint64_t off = from; off < to;) {
        uint64_t n = to - off < KVP_RESERVE_STEP ? to - off : KVP_RESERVE_STEP;
        if (reserve_cancel && atomic_load(reserve_cancel)) {
            snprintf(why, why_size, "stopped while reserving %s", what);
            return -ECANCELED;
        }
        /* A segment the daemon stopped using (seg_guard.h) is private memory now: allocating
         * in its file would only grow what somebody else truncated. */
        if (fd >= 0 && !kvp_seg_guard_tripped()) {
            int rc;
            do {
                rc = posix_fallocate(fd, (off_t)off, (off_t)n);
            } while (rc == EINTR);
            if (rc != 0) {
                snprintf(why, why_size, "cannot reserve %" PRIu64 " bytes for %s: %s", to - off,
                         what, kvp_strerror(-rc));
                return -rc;
            }
        }
        /* Best effort (EINVAL before Linux 5.14): touch_pages faults the pages in anyway. */
        (void)madvise(base + off, n, MADV_POPULATE_WRITE);
        touch_pages(base + off, n);
        off += n;
        seg->reserved = off;
        /* Workers pre-fault only what the header says is reserved (src/client/shm_map.c). */
        if (seg->base)
            kvp_seg_header_publish_reserved(seg->base, off, off >= seg->size);
        if (on_step)
            on_step(arg, off);

        double t = seconds_since(&t0);
        if (off < to && (t - last) * 1000 >= progress_interval_ms) {
            double rate = t > 0 ? (double)(off - from) / t : 0;
            snprintf(status, sizeof(status),
                     "Reserving the pool: %" PRIu64 " of %" PRIu64 " bytes (%d%%), %.2f GB/s, "
                     "about %.0f s left",
                     off, seg->size, (int)(off * 100 / seg->size), rate / 1e9,
                     rate > 0 ? (double)(to - off) / rate : 0.0);
            log_info("%s", status);
            /* Before serving, also what keeps a service manager's start-up timeout from
             * killing us; afterwards just the status. */
            if (on_step)
                kvp_notify_status(status);
            else
                kvp_notify_progress(status);
            last = t;
            reported = true;
        }
    }
    double t = seconds_since(&t0);
    kvp_log(reported || on_step ? KVP_LOG_INFO : KVP_LOG_DEBUG,
            "Reserved %" PRIu64 " bytes for the pool in %.1f s (%.2f GB/s)", to - from, t,
            t > 0 ? (double)(to - from) / t / 1e9 : 0.0);
    return 0;
}

/* The part of a size-byte segment reserved before the creation functions return. */
static uint64_t first_part(uint64_t size)
{
    return size < KVP_RESERVE_FIRST ? size : KVP_RESERVE_FIRST;
}

/*
 * Sizes fd to size bytes (sparse: nothing is allocated yet), maps it whole, reserves and
 * pre-faults its first part and writes the header. On success seg owns fd and the mapping; on
 * failure neither is touched.
 */
static int reserve_and_map(struct kvp_segment *seg, int fd, uint64_t size, const char *what,
                           char *why, size_t why_size)
{
    if (ftruncate(fd, (off_t)size) != 0) {
        int rc = -errno;
        snprintf(why, why_size, "cannot size %s: %s", what, kvp_strerror(rc));
        return rc;
    }
    /* Only reserved pages are ever accessed: the pool hands out no slot beyond them. */
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int rc = -errno;
        snprintf(why, why_size, "cannot map %s: %s", what, kvp_strerror(-errno));
        return rc;
    }
    seg->size = size;
    int rc = reserve_steps(seg, p, fd, 0, first_part(size), what, NULL, NULL, why, why_size);
    if (rc) {
        munmap(p, size);
        seg->size = seg->reserved = 0;
        return rc;
    }
    seg->base = p;
    seg->fd = fd;
    seg->shared = true;
    randombytes_buf(seg->nonce, sizeof(seg->nonce));
    write_header(seg);
    return 0;
}

int kvp_segment_reserve_rest(struct kvp_segment *seg, kvp_reserve_cb on_step, void *arg, char *why,
                             size_t why_size)
{
    char what[160];
    why[0] = '\0';
    if (seg->memfd)
        snprintf(what, sizeof(what), "the memfd segment");
    else if (seg->shared)
        snprintf(what, sizeof(what), "/dev/shm/%s", seg->name);
    else
        snprintf(what, sizeof(what), "private memory");
    if (seg->reserved >= seg->size)
        return 0;
    int rc = reserve_steps(seg, seg->base, seg->shared ? seg->fd : -1, seg->reserved, seg->size,
                           what, on_step, arg, why, why_size);
    /* Stopped short (full, or a stop request): what is reserved now is all there will be. */
    kvp_seg_header_publish_reserved(seg->base, seg->reserved, true);
    return rc;
}

/* Reads the owner pid recorded in an existing segment's header, 0 if unreadable. */
static uint32_t header_pid(int fd)
{
    struct kvp_seg_header h;
    ssize_t n = pread(fd, &h, sizeof(h), 0);
    return n > 0 ? kvp_seg_header_pid(&h, (size_t)n) : 0;
}

/*
 * Handles an existing name given by the operator: -EPERM if another uid's file holds it (never
 * ours to judge, let alone remove), -EBUSY if a live daemon holds it, 0 once a stale one is
 * removed.
 */
static int replace_stale(const char *path, char *why, size_t why_size)
{
    char dev_path[160];
    struct stat st;
    snprintf(dev_path, sizeof(dev_path), "/dev/shm%s", path);
    if (lstat(dev_path, &st) == 0 && st.st_uid != geteuid()) {
        snprintf(why, why_size,
                 "segment %s (--shm-name) belongs to uid %u, not to this kvpoold's uid %u: "
                 "another user created it, maybe to keep this daemon from starting; remove it, "
                 "or leave --shm-name unset to get a name nobody can predict",
                 dev_path, (unsigned)st.st_uid, (unsigned)geteuid());
        return -EPERM;
    }
    int fd = shm_open(path, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        int err = errno;
        /* It vanished meanwhile: fine, retry the creation. */
        if (err == ENOENT)
            return 0;
        snprintf(why, why_size, "cannot inspect existing segment /dev/shm%s: %s", path,
                 kvp_strerror(-err));
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
        snprintf(why, why_size, "cannot lock /dev/shm%s: %s", path, kvp_strerror(-err));
        return -err;
    }
    log_warn("Replacing stale segment /dev/shm%s left by a dead kvpoold (pid %u)", path,
             header_pid(fd));
    shm_unlink(path);
    close(fd);
    return 0;
}

/*
 * Creates path exclusively and takes its liveness lock: *fdp is the new file's descriptor. A
 * name that exists already is, for a name the operator gave (given), a stale segment to replace
 * (or an error: replace_stale()); for a default name, -EEXIST: whatever holds it, a fresh
 * random name is the answer. Returns 0, -EEXIST (only when !given), -EBUSY when a live daemon
 * holds the name or won it at the same instant, -EPERM (another uid's file), or another negative
 * errno, with why filled.
 */
static int create_locked(const char *path, bool given, int *fdp, char *why, size_t why_size)
{
    int fd = -1, rc;
    for (int attempt = 0;; attempt++) {
        fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0)
            break;
        rc = -errno;
        if (rc == -EEXIST && !given)
            return rc;
        if (rc != -EEXIST || attempt > 0) {
            snprintf(why, why_size, "cannot create /dev/shm%s: %s", path, kvp_strerror(rc));
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
     * race and leave the name to the winner.
     */
    struct stat ours, named;
    char dev_path[160];
    snprintf(dev_path, sizeof(dev_path), "/dev/shm%s", path);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0 || fstat(fd, &ours) != 0 || stat(dev_path, &named) != 0 ||
        ours.st_ino != named.st_ino || ours.st_dev != named.st_dev) {
        close(fd);
        if (!given)
            return -EEXIST;
        snprintf(why, why_size,
                 "segment /dev/shm%s was claimed by another kvpoold starting at the same time; "
                 "choose another --shm-name",
                 path);
        return -EBUSY;
    }
    *fdp = fd;
    return 0;
}

/* Creates the segment under name, or (retry) under a fresh random name as long as the name is
 * taken. */
static int create_shared(struct kvp_segment *seg, const char *name, bool retry, uint64_t size,
                         uint32_t mode, char *why, size_t why_size)
{
    char cur[sizeof(seg->name)], path[sizeof(cur) + 2];
    int fd = -1, rc = -EEXIST;

    *seg = (struct kvp_segment)KVP_SEGMENT_INIT;
    why[0] = '\0';
    snprintf(cur, sizeof(cur), "%s", name);
    for (int attempt = 0; rc == -EEXIST && attempt < KVP_SHM_NAME_ATTEMPTS; attempt++) {
        if (attempt > 0 || !cur[0]) {
            log_debug("Segment name %s is taken; drawing another", cur);
            rc = kvp_shm_name_random((long)getpid(), cur, sizeof(cur));
            if (rc) {
                snprintf(why, why_size, "cannot draw a segment name: %s", kvp_strerror(rc));
                return rc;
            }
        }
        snprintf(path, sizeof(path), "/%s", cur);
        rc = create_locked(path, !retry, &fd, why, why_size);
    }
    if (rc == -EEXIST)
        snprintf(why, why_size, "%d random segment names in a row were taken in /dev/shm",
                 KVP_SHM_NAME_ATTEMPTS);
    if (rc)
        return rc;

    /* shm_open's mode is filtered by the umask; set the configured bits exactly. */
    if (fchmod(fd, mode) != 0) {
        rc = -errno;
        snprintf(why, why_size, "cannot set mode %o on /dev/shm%s: %s", mode, path,
                 kvp_strerror(-errno));
        goto out_unlink;
    }
    char what[160];
    snprintf(what, sizeof(what), "/dev/shm%s", path);
    rc = reserve_and_map(seg, fd, size, what, why, why_size);
    if (rc)
        goto out_unlink;
    snprintf(seg->name, sizeof(seg->name), "%s", cur);
    return 0;

out_unlink:
    shm_unlink(path);
    close(fd);
    return rc;
}

int kvp_segment_create_shared(struct kvp_segment *seg, const char *name, uint64_t size,
                              uint32_t mode, char *why, size_t why_size)
{
    return create_shared(seg, name, false, size, mode, why, why_size);
}

int kvp_segment_create_shared_default(struct kvp_segment *seg, const char *name, uint64_t size,
                                      uint32_t mode, char *why, size_t why_size)
{
    return create_shared(seg, name, true, size, mode, why, why_size);
}

int kvp_segment_create_memfd(struct kvp_segment *seg, uint64_t size, char *why, size_t why_size)
{
    *seg = (struct kvp_segment)KVP_SEGMENT_INIT;
    why[0] = '\0';
    int fd = memfd_create("kvpool_l1_pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        int err = errno;
        snprintf(why, why_size, "memfd_create: %s", kvp_strerror(-err));
        return -err;
    }
    /* Sized, then sealed before anything else: the reservation allocates within the size,
     * which the seals allow, and no worker holding the fd can resize it. */
    int rc = 0;
    if (ftruncate(fd, (off_t)size) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        rc = -errno;
        snprintf(why, why_size, "cannot size and seal the memfd segment: %s", kvp_strerror(rc));
    }
    if (rc == 0)
        rc = reserve_and_map(seg, fd, size, "the memfd segment", why, why_size);
    if (rc) {
        close(fd);
        return rc;
    }
    seg->memfd = true;
    return 0;
}

int kvp_segment_create_private(struct kvp_segment *seg, uint64_t size)
{
    char why[160];
    *seg = (struct kvp_segment)KVP_SEGMENT_INIT;
    int flags = MAP_PRIVATE | MAP_ANONYMOUS;
    /* cppcheck-suppress invalidFunctionArg ; an anonymous mapping takes fd -1 */
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED)
        return -errno;
    seg->size = size;
    int rc = reserve_steps(seg, p, -1, 0, first_part(size), "private memory", NULL, NULL, why,
                           sizeof(why));
    if (rc) {
        munmap(p, size);
        *seg = (struct kvp_segment)KVP_SEGMENT_INIT;
        return rc;
    }
    seg->base = p;
    randombytes_buf(seg->nonce, sizeof(seg->nonce));
    write_header(seg);
    return 0;
}

/* Unmaps and closes, and unlinks the name when told to. */
static void release(struct kvp_segment *seg, bool unlink_name)
{
    if (!seg)
        return;
    if (seg->base)
        munmap(seg->base, seg->size);
    if (unlink_name && seg->shared && !seg->memfd && seg->name[0]) {
        char path[130];
        snprintf(path, sizeof(path), "/%s", seg->name);
        shm_unlink(path);
    }
    /* Only a shared segment owns a descriptor; a zeroed struct's fd 0 is somebody else's. */
    if (seg->shared && seg->fd >= 0)
        close(seg->fd);
    *seg = (struct kvp_segment)KVP_SEGMENT_INIT;
}

void kvp_segment_destroy(struct kvp_segment *seg)
{
    release(seg, true);
}

void kvp_segment_leave(struct kvp_segment *seg)
{
    release(seg, false);
}

/* The checks of kvp_segment_adopt() on the open file fd of path, before anything is written:
 * owner, type, size, liveness lock (taken), name still this file, header. Returns 0 with
 * *reserved the part its owner reserved, or a negative errno with why. */
static int adoptable(int fd, const char *path, uint64_t size, uint64_t *reserved, char *why,
                     size_t why_size)
{
    char dev_path[160];
    struct stat st, named;
    struct kvp_seg_header h;

    snprintf(dev_path, sizeof(dev_path), "/dev/shm%s", path);
    int err;
    if (fstat(fd, &st) != 0) {
        err = errno;
        return kvp_why(why, why_size, -err, "cannot inspect %s: %s", dev_path, kvp_strerror(-err));
    }
    if (!S_ISREG(st.st_mode))
        return kvp_why(why, why_size, -EPERM, "%s is not a regular file", dev_path);
    if (st.st_uid != geteuid())
        return kvp_why(why, why_size, -EPERM, "%s belongs to uid %u, not to this kvpoold's uid %u",
                       dev_path, (unsigned)st.st_uid, (unsigned)geteuid());
    if ((uint64_t)st.st_size != size)
        return kvp_why(why, why_size, -ESTALE,
                       "%s is %" PRIu64 " bytes, this kvpoold's pool needs %" PRIu64, dev_path,
                       (uint64_t)st.st_size, size);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        err = errno;
        if (err == EWOULDBLOCK)
            return kvp_why(why, why_size, -EBUSY, "a running kvpoold (pid %" PRIu32 ") uses it",
                           header_pid(fd));
        return kvp_why(why, why_size, -err, "cannot lock %s: %s", dev_path, kvp_strerror(-err));
    }
    /* Replaced between the open and the lock: not the file judged. */
    if (stat(dev_path, &named) != 0 || named.st_ino != st.st_ino || named.st_dev != st.st_dev)
        return kvp_why(why, why_size, -EBUSY, "%s was replaced while it was inspected", dev_path);
    ssize_t n = pread(fd, &h, sizeof(h), 0);
    /* The header's own nonce: what is checked here is its layout, not whose it is. */
    int rc = kvp_seg_header_check(&h, n > 0 ? (size_t)n : 0, size, h.nonce, dev_path, why,
                                  why_size);
    if (rc)
        return rc;
    /* Only what its owner reserved may be touched: the daemons that recorded it wrote it
     * after every step. A daemon that did not (0) cannot be followed. */
    if (h.reserved_bytes < KVP_SEG_HEADER || h.reserved_bytes > size)
        return kvp_why(why, why_size, -EPROTO, "%s does not record which part of it was reserved",
                       dev_path);
    *reserved = h.reserved_bytes;
    return 0;
}

int kvp_segment_adopt(struct kvp_segment *seg, const char *name, uint64_t size, uint32_t mode,
                      char *why, size_t why_size)
{
    char path[sizeof(seg->name) + 2];
    uint64_t reserved = 0;
    int rc;

    *seg = (struct kvp_segment)KVP_SEGMENT_INIT;
    why[0] = '\0';
    if (!name[0] || strchr(name, '/') || strlen(name) >= sizeof(seg->name))
        return kvp_why(why, why_size, -EINVAL, "\"%.64s\" is not a segment name", name);
    snprintf(path, sizeof(path), "/%s", name);
    int fd = shm_open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd < 0) {
        rc = -errno;
        if (rc == -ENOENT)
            return kvp_why(why, why_size, rc, "it is gone");
        return kvp_why(why, why_size, rc, "cannot open /dev/shm%s: %s", path, kvp_strerror(rc));
    }
    rc = adoptable(fd, path, size, &reserved, why, why_size);
    if (rc)
        goto out_close;
    /* The reserved part is not allocated again: its owner recorded it after its own
     * posix_fallocate, and tmpfs keeps those pages while the file lives (doing it again costs
     * about 30 ms per GiB, a third of a second for 12 GiB, for pages that are there). A page
     * somebody punched out since is the seg guard's case, as a truncation is (seg_guard.h):
     * its SIGBUS moves the daemon to private memory instead of killing it. */
    if (fchmod(fd, mode) != 0) {
        rc = -errno;
        kvp_why(why, why_size, rc, "cannot set mode %o on /dev/shm%s: %s", mode, path,
                kvp_strerror(rc));
        goto out_close;
    }
    /* Only reserved pages are ever accessed: the pool hands out no slot beyond them. */
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        rc = -errno;
        kvp_why(why, why_size, rc, "cannot map /dev/shm%s: %s", path, kvp_strerror(rc));
        goto out_close;
    }
    seg->base = p;
    seg->size = size;
    seg->reserved = reserved;
    seg->fd = fd;
    seg->shared = true;
    snprintf(seg->name, sizeof(seg->name), "%s", name);
    randombytes_buf(seg->nonce, sizeof(seg->nonce));
    /* The old magic goes first, and the fence keeps the new fields after it: nobody sees the
     * old magic over a new nonce. kvp_seg_header_write() writes the new magic last. */
    memset(p, 0, sizeof(((struct kvp_seg_header *)0)->magic));
    kvp_shared_fence(memory_order_seq_cst);
    kvp_seg_header_write(p, seg->nonce, size, (uint32_t)getpid());
    kvp_seg_header_publish_reserved(p, reserved, reserved >= size);
    return 0;

out_close:
    close(fd); /* releases the lock, if taken */
    return rc;
}

/* A name the sweep may consider: a default name (kvp_shm_name_is_default()), or the
 * configured name. */
static bool sweep_candidate(const char *name, const char *own_name)
{
    if (own_name && own_name[0] && strcmp(name, own_name) == 0)
        return true;
    return kvp_shm_name_is_default(name);
}

/* True when fd starts with the segment magic, which the owner writes after taking the lock. */
static bool has_header(int fd)
{
    struct kvp_seg_header h;
    ssize_t n = pread(fd, &h, sizeof(h), 0);
    return n > 0 && kvp_seg_header_has_magic(&h, (size_t)n);
}

/*
 * Removes one leftover if it is one: ours (euid), a regular file, its lock free, a header or
 * old enough, and the name still refers to the file we locked. Returns its size, or 0 when it
 * stays.
 */
static uint64_t sweep_one(int dfd, const char *dir, const char *name, bool own, uint32_t min_age_s)
{
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return 0;
    struct stat st, named;
    uint64_t freed = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid())
        goto out_close;
    if (!has_header(fd)) {
        time_t newest = st.st_mtim.tv_sec > st.st_ctim.tv_sec ? st.st_mtim.tv_sec
                                                              : st.st_ctim.tv_sec;
        /* Possibly a daemon between O_EXCL and its flock: never lock it, or that daemon would
         * take its own segment for a competitor's. */
        if (time(NULL) - newest < (time_t)min_age_s)
            goto out_close;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0)
        goto out_close; /* a live daemon holds it */
    if (fstatat(dfd, name, &named, AT_SYMLINK_NOFOLLOW) != 0 || named.st_ino != st.st_ino ||
        named.st_dev != st.st_dev)
        goto out_close; /* replaced meanwhile: not the file we judged */
    uint32_t pid = header_pid(fd);
    if (unlinkat(dfd, name, 0) != 0)
        goto out_close;
    freed = (uint64_t)st.st_size;
    if (pid)
        log_warn("%s stale segment %s/%s (%" PRIu64 " bytes) left by a dead kvpoold (pid %" PRIu32
                 ")",
                 own ? "Replacing" : "Removing", dir, name, freed, pid);
    else
        log_warn("%s stale segment %s/%s (%" PRIu64 " bytes) left by a kvpoold that died "
                 "while creating it",
                 own ? "Replacing" : "Removing", dir, name, freed);
out_close:
    close(fd); /* releases our lock, if taken */
    return freed;
}

uint64_t kvp_segment_reap(const char *dir, const char *name, uint32_t min_age_s)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return 0;
    uint64_t freed = sweep_one(dfd, dir, name, false, min_age_s);
    close(dfd);
    return freed;
}

uint64_t kvp_segment_sweep(const char *dir, const char *own_name, uint32_t min_age_s)
{
    DIR *d = opendir(dir);
    uint64_t freed = 0;
    if (!d) {
        log_debug("Cannot look for stale segments in %s: %s", dir, kvp_strerror(-errno));
        return 0;
    }
    /* cppcheck-suppress readdirCalled ; readdir_r is deprecated, and d is private to this call */
    for (struct dirent *e = readdir(d); e; e = readdir(d))
        if (sweep_candidate(e->d_name, own_name))
            freed += sweep_one(dirfd(d), dir, e->d_name,
                               own_name && strcmp(e->d_name, own_name) == 0, min_age_s);
    closedir(d);
    return freed;
}
