/*
 * shm_map.c - attach to the daemon's shared-memory pool and check every slot against it.
 *
 * Design. The daemon creates, sizes, pre-faults and unlinks the segment; a client only attaches
 * (shm_open O_RDWR, never O_CREAT, never shm_unlink), so a client can neither leak a segment nor
 * remove the daemon's. Attaching by name is not proof of identity: another IPC namespace or a
 * stale namesake may answer to the same name. The header page therefore has to carry the magic
 * and the random nonce that this daemon sent in HELLO before the mapping is used.
 *
 * The file must be at least as large as announced before it is mapped: touching a mapping past
 * the end of a shorter file is SIGBUS, which a library must never cause.
 *
 * Every failure produces a one-line reason ("cannot open /dev/shm/NAME: Permission denied"); the
 * client sends it to the daemon as the inline fallback reason, so the daemon's log says why this
 * worker is not on shm.
 *
 * Pre-faulting: the first write through a fresh mapping costs a fault per page (measured here:
 * 1.6 GB/s against 11 GB/s afterwards), so the pool's pages are mapped ahead of use, but never
 * on the caller's path: a registration must not cost time proportional to the pool. After the
 * checks a thread of the library's own (all signals blocked) walks the mapping in
 * KVP_PREFAULT_STEP steps with MADV_POPULATE_WRITE (a write fault per page taken in the kernel,
 * bytes unchanged, even while other workers write them; where the kernel lacks it, before Linux
 * 5.14, an atomic add of zero per page) and exits; unmapping stops it and waits for it first (it
 * is detached, so a process that exits without closing its client leaves no unjoined thread). A
 * copy that reaches a page before the thread does just takes the fault itself.
 *
 * Only pages the daemon has reserved are pre-faulted, on every kernel: the header page says how
 * many bytes are (seg_header.h), and the thread follows it while the daemon reserves the rest in
 * the background, until the header says the reservation has ended. A page beyond it may never
 * be allocated (/dev/shm filled up during the reservation), and touching it would be SIGBUS; a
 * daemon that does not say (an earlier version) gets populating only, which fails instead.
 * KVPOOL_PREFAULT=0 skips it, KVPOOL_PREFAULT=touch uses the touch even where
 * MADV_POPULATE_WRITE exists (the path of older kernels, for tests). A child process after
 * fork() never joins its parent's thread.
 *
 * Slots: offsets and lengths come from another process and are checked (header page excluded,
 * exact chunk length, no wrap-around) before any pointer is formed.
 *
 * Detaching: after a reconnect a plan of the old connection may still be written through
 * (reconnect.c). kvp_shm_map_detach() swaps the segment's pages for private anonymous ones at
 * the same addresses, so such a late access neither faults nor reaches any segment.
 */
#include "shm_map.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/populate.h"
#include "kvpool.h"

#define KVP_PREFAULT_STEP (64ull << 20)

/*
 * The thread is detached, so that a process that exits without closing its client leaves no
 * unjoined thread behind; stopping it waits for `done` instead of joining.
 */
struct kvp_prefault {
    pthread_mutex_t lock;
    pthread_cond_t cv; /* done (to the stopper), stop (to the thread waiting for the daemon) */
    bool done;         /* under lock: the thread no longer touches the mapping or this struct */
    atomic_bool stop;
    bool touch_only; /* KVPOOL_PREFAULT=touch: the fallback of kernels before 5.14 */
    uint8_t *base;
    uint64_t size;
    pid_t pid; /* the process whose thread it is */
};

/* How long the thread waits before it reads the header again while the daemon reserves. */
#define KVP_PREFAULT_WAIT_MS 50

/* Not instrumented by TSan: the writers it races with are other processes, which TSan cannot
 * see, and shadow memory for the whole pool would add seconds per GiB to a sanitized client. */
__attribute__((no_sanitize_thread)) static void touch(uint8_t *p, uint64_t n)
{
    for (uint64_t off = 0; off < n; off += 4096)
        __atomic_fetch_add(p + off, 0, __ATOMIC_RELAXED);
}

/* Waits up to KVP_PREFAULT_WAIT_MS, or until stopped. */
static void prefault_wait_daemon(struct kvp_prefault *pf)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += KVP_PREFAULT_WAIT_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&pf->lock);
    if (!atomic_load(&pf->stop))
        pthread_cond_timedwait(&pf->cv, &pf->lock, &ts);
    pthread_mutex_unlock(&pf->lock);
}

/*
 * Pre-faults the pages the daemon has reserved, as the header page says, following it while
 * it reserves the rest. A daemon that does not say (an earlier version) gets MADV_POPULATE_WRITE
 * only, which fails on a page it cannot allocate instead of faulting: never the touch, which
 * would be SIGBUS there.
 */
static void *prefault_main(void *arg)
{
    struct kvp_prefault *pf = arg;
    bool populate = !pf->touch_only, final = false;

    for (uint64_t off = KVP_SHM_HEADER_SIZE; off < pf->size && !atomic_load(&pf->stop);) {
        uint64_t reserved = kvp_seg_header_reserved(pf->base, &final);
        uint64_t end = reserved == 0 || reserved > pf->size ? pf->size : reserved;
        if (off >= end) {
            if (final || reserved == 0)
                break; /* the rest is not reserved, and will not be */
            prefault_wait_daemon(pf);
            continue;
        }
        uint64_t n = end - off < KVP_PREFAULT_STEP ? end - off : KVP_PREFAULT_STEP;
        if (populate && madvise(pf->base + off, n, MADV_POPULATE_WRITE) != 0 && errno == EINVAL)
            populate = false; /* a kernel without it: retry this step by touching */
        if (!populate && reserved == 0)
            break;
        if (!populate)
            touch(pf->base + off, n);
        off += n;
    }
    pthread_mutex_lock(&pf->lock);
    pf->done = true;
    pthread_cond_broadcast(&pf->cv);
    pthread_mutex_unlock(&pf->lock);
    return NULL;
}

/* Starts the pre-fault thread of a checked mapping; without one, copies just fault. */
static struct kvp_prefault *prefault_start(uint8_t *base, uint64_t size)
{
    const char *env = getenv("KVPOOL_PREFAULT");
    sigset_t all, old;

    if (env && strcmp(env, "0") == 0)
        return NULL;
    struct kvp_prefault *pf = calloc(1, sizeof(*pf));
    if (!pf)
        return NULL;
    pf->base = base;
    pf->size = size;
    pf->pid = getpid();
    pf->touch_only = env && strcmp(env, "touch") == 0;
    atomic_init(&pf->stop, false);
    pthread_mutex_init(&pf->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&pf->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_attr_t attr;
    pthread_t t;
    int rc = pthread_attr_init(&attr);
    if (rc == 0) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        rc = pthread_create(&t, &attr, prefault_main, pf);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
    }
    if (rc) {
        pthread_cond_destroy(&pf->cv);
        pthread_mutex_destroy(&pf->lock);
        free(pf);
        return NULL;
    }
    return pf;
}

static void prefault_stop(struct kvp_shm_map *m)
{
    struct kvp_prefault *pf = m->prefault;
    if (!pf)
        return;
    m->prefault = NULL;
    /* After fork() the thread lives in the parent only: this copy is nobody's. */
    if (pf->pid != getpid()) {
        free(pf);
        return;
    }
    /* Under the lock: a thread about to wait for the daemon sees it, or is woken. */
    pthread_mutex_lock(&pf->lock);
    atomic_store(&pf->stop, true);
    pthread_cond_broadcast(&pf->cv);
    while (!pf->done)
        pthread_cond_wait(&pf->cv, &pf->lock);
    pthread_mutex_unlock(&pf->lock);
    pthread_cond_destroy(&pf->cv);
    pthread_mutex_destroy(&pf->lock);
    free(pf);
}

int kvp_shm_map_open(struct kvp_shm_map *m, const char *name, uint64_t size,
                     const uint8_t nonce[KVP_NONCE_SIZE], char *reason, size_t reason_size)
{
    char path[KVP_MAX_NAME + 2], label[KVP_MAX_NAME + 16];
    int fd, rc;

    *m = (struct kvp_shm_map){0};
    size_t len = strlen(name);
    if (len == 0 || len > KVP_MAX_NAME || strchr(name, '/')) {
        snprintf(reason, reason_size, "daemon announced an invalid segment name \"%.*s\"",
                 (int)(len > 64 ? 64 : len), name);
        return -EINVAL;
    }
    snprintf(path, sizeof(path), "/%s", name);

    fd = shm_open(path, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        rc = -errno;
        snprintf(reason, reason_size, "cannot open /dev/shm/%s: %s", name, kvp_strerror(rc));
        return rc;
    }
    snprintf(label, sizeof(label), "/dev/shm/%s", name);
    rc = kvp_shm_map_fd(m, fd, size, nonce, label, reason, reason_size);
    close(fd);
    if (rc == 0)
        memcpy(m->name, name, len + 1);
    return rc;
}

int kvp_shm_map_fd(struct kvp_shm_map *m, int fd, uint64_t size,
                   const uint8_t nonce[KVP_NONCE_SIZE], const char *label, char *reason,
                   size_t reason_size)
{
    struct stat st;
    void *base;
    int rc;

    *m = (struct kvp_shm_map){0};
    if (size < KVP_SHM_HEADER_SIZE || size > SIZE_MAX) {
        snprintf(reason, reason_size, "daemon announced an invalid segment size %llu",
                 (unsigned long long)size);
        return -EINVAL;
    }
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        snprintf(reason, reason_size, "cannot stat %s: %s", label, kvp_strerror(rc));
        return rc;
    }
    if (st.st_size < 0 || (uint64_t)st.st_size < size) {
        snprintf(reason, reason_size, "segment %s is %lld bytes, daemon announced %llu", label,
                 (long long)st.st_size, (unsigned long long)size);
        return KVP_ENOSHM;
    }

    base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        rc = -errno;
        snprintf(reason, reason_size, "cannot map %s (%llu bytes): %s", label,
                 (unsigned long long)size, kvp_strerror(rc));
        return rc;
    }
    /* The caller closes fd: the mapping alone keeps the segment alive. The whole header is
     * checked (magic, layout version, header size, the size HELLO announced, the nonce): a
     * namesake of another daemon or another kvpool version is never used. */
    if (kvp_seg_header_check(base, KVP_SEG_HEADER, size, nonce, label, reason, reason_size)) {
        rc = KVP_ENOSHM;
        goto out_unmap;
    }

    m->base = base;
    m->size = size;
    m->prefault = prefault_start(base, size);
    if (reason_size)
        reason[0] = '\0';
    return 0;

out_unmap:
    munmap(base, (size_t)size);
    return rc;
}

void kvp_shm_map_prefault_wait(struct kvp_shm_map *m)
{
    struct kvp_prefault *pf = m->prefault;
    if (!pf || pf->pid != getpid())
        return;
    pthread_mutex_lock(&pf->lock);
    while (!pf->done)
        pthread_cond_wait(&pf->cv, &pf->lock);
    pthread_mutex_unlock(&pf->lock);
}

void kvp_shm_map_close(struct kvp_shm_map *m)
{
    prefault_stop(m);
    if (m->base)
        munmap(m->base, (size_t)m->size);
    *m = (struct kvp_shm_map){0};
}

/*
 * MAP_FIXED over the same range replaces the shared pages atomically: a thread writing into a
 * slot meanwhile writes either into the old segment or into the new anonymous page, never into
 * a hole. MAP_NORESERVE: pages cost memory only once written, so a retired mapping is address
 * space, not pool-sized memory.
 */
int kvp_shm_map_detach(struct kvp_shm_map *m)
{
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE;
    void *p;

    if (!m->base)
        return 0;
    prefault_stop(m);
    /* cppcheck-suppress invalidFunctionArg ; an anonymous mapping takes fd -1 */
    p = mmap(m->base, (size_t)m->size, PROT_READ | PROT_WRITE, flags, -1, 0);
    /* cppcheck-suppress memleak ; p is m->base again, which kvp_shm_map_close() unmaps */
    return p == MAP_FAILED ? -errno : 0;
}

uint8_t *kvp_shm_slot(const struct kvp_shm_map *m, uint64_t offset, uint64_t length,
                      uint64_t chunk_bytes)
{
    if (!m->base || length != chunk_bytes || length == 0)
        return NULL;
    /* Written as subtractions so that no sum can wrap around. */
    if (offset < KVP_SHM_HEADER_SIZE || offset > m->size || length > m->size - offset)
        return NULL;
    return m->base + offset;
}
