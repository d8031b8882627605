/*
 * warm_restart.c - warm restart's life cycle (see warm_restart.h): find a predecessor's pool
 * and adopt it or set it aside, scan its index into the store, make a fresh index beside a new
 * pool, reserve index pages with the pool's, and leave or remove both files at shutdown.
 *
 * Two files in /dev/shm, both of the daemon's euid, mode 0600 for the index:
 *   - the pool segment (segment.c): header page, then the pool; workers map it;
 *   - the index (warm_index.h), named after the socket path (kvp_warm_index_name()), so that
 *     the next daemon on the same socket finds it; its header names the pool segment, whatever
 *     random name that got. One 64-byte record per pool page, sealed for each committed chunk.
 * Each file is held by an exclusive flock while a daemon uses it: a live owner's files are never
 * judged stale (segment.c's sweep, kvp_warm_sweep() here, kvp_segment_adopt()).
 *
 * Crash safety: what is written when, and why a death between any two writes is safe. The
 * invariant is that every record of the index that validates (warm_index.c: a seal over its
 * fields, the page and the index's random generation) names an object that was committed with
 * exactly those key, length and checksum, whose pages no other object has been given since.
 * Bytes are not covered by the invariant: a worker may write them at any time, so each adopted
 * chunk is checked against its checksum at its first read (ops.c) and dropped if it differs.
 *   1. A new pool: the segment is created, locked and given its header (magic last); then the
 *      index is created (a sparse file, unlinked first if a damaged one of ours was there),
 *      locked, its header page allocated, formatted (magic last) with a new generation and the
 *      segment's name, and its record pages reserved for the pool's reserved part. A death
 *      before the index's magic leaves a pool without an index: the next daemon starts cold and
 *      its sweep removes the pool. A new generation means that nothing an earlier index of the
 *      same name held can validate.
 *   2. A commit: the worker writes the bytes; then it asks to commit; the daemon hashes the
 *      bytes of the reserved slots outside the lock (ops.c); under the store lock the objects
 *      are published, then each record is sealed by a plan of 8-byte stores: seal = 0, key,
 *      length, checksum, seq, seal. A death inside a plan leaves seal 0 (no record) or the whole
 *      record; the bytes it describes were complete before the plan began.
 *   3. A free (eviction, a clear, a dropped chunk): under the store lock the record is cleared
 *      (one store of seal = 0) before the object's pages go back to the pool or into an eviction
 *      window (store.c, do_release_keep()), so no validating record ever names pages another
 *      object was given. A use stores the seq only, which no seal covers.
 *   4. Adoption: the segment's header gets a new nonce and pid (magic cleared first, written
 *      last); the index is scanned (read only), then its rejects are cleared (scrub), then the
 *      objects are adopted into the store, oldest use first, a record the store refuses cleared
 *      before anything could be placed on its pages; then KVP_WIDX_CLEAN is cleared and this
 *      daemon recorded as the owner. Adoption writes nothing into a record it keeps and reads
 *      nothing of the pool, so a death at any point leaves a subset of the valid records, each
 *      still true (a death between the header's magic and its rewrite leaves a segment without
 *      a header, which the next daemon refuses: the pool is lost, never misread).
 *   5. Stores in progress: a reservation marks its first page's record (length, then seq =
 *      KVP_WIDX_RESERVED; the seal stays 0) when it is made, and the mark ends (seq = 0) before
 *      its pages are freed, or is overwritten by its seal. A successor holds the marked pages
 *      back for --reserve-timeout (kvp_store_hold_back()): the store's worker, which knows
 *      nothing of the restart until its next call, may still be writing them, and a new chunk
 *      there would be scribbled over. A mark is outside every seal: a torn one holds back pages
 *      nobody would have read, no more.
 *   6. Shutdown: a planned restart (SIGUSR2) sets KVP_WIDX_CLEAN after every writer of the
 *      store has stopped (the reservations its clients are dropped with keep their marks) and
 *      leaves both files; a plain stop unlinks the index first, then the
 *      segment, so a death between leaves a pool without an index, which the sweep removes.
 * Index pages are written only where they were reserved (kvp_widx_reserve(), kvp_warm_cover()):
 * a seal beyond the reserved records is refused (the chunk is then not recorded), since a write
 * into a hole of a full tmpfs is SIGBUS. The capacity gate counts the index's full size.
 *
 * Threads: start-up and shutdown on the main thread; kvp_warm_cover() on the warm-up thread; the
 * hook (seal, clear, touch) on any thread, under the store lock, which makes the store the
 * index's one writer.
 */
#include "core/warm_restart.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/clock.h"
#include "base/log.h"
#include "common/errors.h"
#include "common/why.h"
#include "core/pool.h"
#include "core/seg_guard.h"
#include "core/shm_gate.h"

/* Tries at taking an index's lock, and the pause between them: another daemon's sweep holds it
 * only while it judges the file. */
#define LOCK_TRIES 20
#define LOCK_PAUSE_NS 5000000L

/* ---- names, identity, size ---- */

int kvp_warm_index_name(const char *socket_path, char *out, size_t size)
{
    uint64_t h = XXH3_64bits(socket_path, strlen(socket_path));
    int n = snprintf(out, size, "/" KVP_WARM_INDEX_PREFIX "%u_%016" PRIx64, (unsigned)geteuid(), h);
    return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

/*
 * Chunk keys already carry the model, the layout, the rank and the salt, and the identity
 * records the pool's size, the page size and --chunk-size on its own; what else decides where
 * and under which key a chunk lies is a format: of the segment (its header page), of the keys
 * (chunk_hash.h's "kvpool-key-v1"), of this feature. A daemon with another of these would
 * misread the pool, so they are hashed here.
 */
uint64_t kvp_warm_settings_hash(void)
{
    char buf[128];
    int n = snprintf(buf, sizeof(buf), "kvpool-warm-1 kvpool-key-v1 seg %u/%u page %u key %u",
                     KVP_SEG_VERSION, KVP_SEG_HEADER, KVP_POOL_PAGE, (unsigned)KVP_KEY_SIZE);
    return XXH3_64bits(buf, (size_t)n);
}

static bool wanted(const struct kvp_config *cfg)
{
    return cfg->warm_restart && cfg->shm_enabled && cfg->shm_backend == KVP_SHM_POSIX;
}

uint64_t kvp_warm_index_bytes(const struct kvp_config *cfg)
{
    return wanted(cfg) ? kvp_widx_bytes(cfg->l1_size / KVP_POOL_PAGE) : 0;
}

void kvp_warm_init(struct kvp_warm *w, const struct kvp_config *cfg)
{
    *w = (struct kvp_warm){.fd = -1};
    atomic_init(&w->covered, 0);
    atomic_init(&w->cover_failed, false);
    w->id = (struct kvp_widx_identity){
        .pool_size = cfg->l1_size,
        .page_size = KVP_POOL_PAGE,
        .chunk_tokens = cfg->chunk_tokens,
        .settings_hash = kvp_warm_settings_hash(),
    };
    w->configured = wanted(cfg);
    w->wanted = w->configured &&
                kvp_warm_index_name(cfg->socket_path, w->name, sizeof(w->name)) == 0;
    w->hold_ms = (uint64_t)cfg->reserve_timeout_s * 1000;
}

/* ---- the index file: lock, identity, removal ---- */

static void pause_briefly(void)
{
    struct timespec ts = {0, LOCK_PAUSE_NS};
    nanosleep(&ts, NULL);
}

/* Takes fd's exclusive lock. Returns 0, -EBUSY (held: a live daemon's) or a negative errno. */
static int lock_index(int fd)
{
    for (int i = 0; i < LOCK_TRIES; i++) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            return 0;
        if (errno != EWOULDBLOCK)
            return -errno;
        pause_briefly();
    }
    return -EBUSY;
}

/* True while /dev/shm<name> is still the file fd: not unlinked or replaced meanwhile. */
static bool still_named(int fd, const char *name)
{
    char path[sizeof(KVP_SHM_DIR) + KVP_WARM_NAME_MAX];
    struct stat a, b;
    snprintf(path, sizeof(path), "%s%s", KVP_SHM_DIR, name);
    return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino &&
           a.st_dev == b.st_dev;
}

/* Unmaps and closes the index, unlinking its name first when told to (and it is still ours). */
static void drop_index(struct kvp_warm *w, bool unlink_name)
{
    if (!w->has_index)
        return;
    if (unlink_name && still_named(w->fd, w->name))
        (void)kvp_widx_unlink(w->name);
    kvp_widx_close(w->fd, w->base, w->len);
    w->has_index = false;
    w->fd = -1;
    w->base = NULL;
    w->len = 0;
}

void kvp_warm_close(struct kvp_warm *w)
{
    drop_index(w, false);
}

/* ---- find: adopt or set aside ---- */

/* One WARN line and the report's reason: the pool in /dev/shm/<label> is not adopted. */
static void set_aside(struct kvp_warm *w, const char *label, const char *reason)
{
    snprintf(w->report.reason, sizeof(w->report.reason), "%s", reason);
    const struct kvp_log_field f[] = {
        KVP_LOG_STR("warm_restart", "set_aside"),
        KVP_LOG_STR("shm_name", label),
        KVP_LOG_STR("reason", reason),
    };
    kvp_log_fields(KVP_LOG_WARN, f, "Not adopting the pool left in %s/%s: %s; starting empty",
                   KVP_SHM_DIR, label, reason);
}

/* A name the index may give its pool: a file name in /dev/shm, nothing else. */
static bool segment_name_ok(const char *name)
{
    return name[0] && !strchr(name, '/') && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

/*
 * The segment an index at base (len bytes) names, into out: from a sound header, or, from an
 * index of another format version that still has this one's magic, from where this version
 * keeps it (for the messages and for reaping it; adopting needs a sound header). Returns true
 * when the name is a valid one.
 */
static bool named_segment(const void *base, size_t len, char out[KVP_WIDX_SEGMENT_NAME])
{
    struct kvp_widx_header h;
    out[0] = '\0';
    if (kvp_widx_header_read(base, len, &h) == 0) {
        memcpy(out, h.segment, KVP_WIDX_SEGMENT_NAME);
    } else if (len >= sizeof(h) && memcmp(base, KVP_WIDX_MAGIC, sizeof(h.magic)) == 0) {
        memcpy(out, (const uint8_t *)base + offsetof(struct kvp_widx_header, segment),
               KVP_WIDX_SEGMENT_NAME);
        out[KVP_WIDX_SEGMENT_NAME - 1] = '\0';
    }
    return segment_name_ok(out);
}

/*
 * Whether the pool segment name may be judged at all: 0 when it is missing or a file of this
 * euid whose lock nobody holds; -EBUSY (a live daemon holds it) or -EPERM (another user's, or not
 * a regular file) with why. Takes the segment's lock only for the test, never changes it.
 */
static int segment_free(const char *name, char *why, size_t why_size)
{
    char path[sizeof(KVP_SHM_DIR) + KVP_WIDX_SEGMENT_NAME + 1];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", KVP_SHM_DIR, name);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return 0; /* gone (or unreadable: kvp_segment_adopt() says why) */
    int rc = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        rc = kvp_why(why, why_size, -EPERM, "%s is not a regular file", path);
    else if (st.st_uid != geteuid())
        rc = kvp_why(why, why_size, -EPERM, "%s belongs to uid %u, not to this kvpoold's uid %u",
                     path, (unsigned)st.st_uid, (unsigned)geteuid());
    else if (flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
        struct kvp_seg_header h;
        ssize_t n = pread(fd, &h, sizeof(h), 0);
        rc = kvp_why(why, why_size, -EBUSY, "a running kvpoold (pid %" PRIu32 ") uses it",
                     n > 0 ? kvp_seg_header_pid(&h, (size_t)n) : 0);
    }
    close(fd); /* releases the lock, if taken */
    return rc;
}

/* Judges the locked index w holds and the pool it names; adopts the pool into seg, or sets both
 * aside (removing them unless a live daemon or another user holds the pool). */
static void judge(struct kvp_warm *w, const struct kvp_config *cfg, struct kvp_segment *seg)
{
    char why[KVP_MAX_REASON + 1], label[KVP_WIDX_SEGMENT_NAME], named[KVP_WIDX_SEGMENT_NAME];
    struct kvp_widx_header h;

    /* Named after the index file until the index says which pool it describes. */
    snprintf(label, sizeof(label), "%s", w->name + 1);
    bool has_name = named_segment(w->base, w->len, named);
    if (has_name)
        snprintf(label, sizeof(label), "%s", named);
    /* A live daemon's pool, or another user's, is never touched, whatever else is wrong: nor
     * is the index that names it, which leaves this daemon without one this time. */
    int rc = has_name ? segment_free(named, why, sizeof(why)) : 0;
    if (rc) {
        set_aside(w, label, why);
        drop_index(w, false);
        w->wanted = false;
        return;
    }
    rc = kvp_widx_check(w->base, w->len, &w->id, why, sizeof(why));
    if (rc == 0 && kvp_widx_header_read(w->base, w->len, &h) != 0)
        rc = kvp_why(why, sizeof(why), -EPROTO, "its index is damaged");
    if (rc == 0 && !segment_name_ok(h.segment)) {
        rc = -EPROTO;
        snprintf(why, sizeof(why), "its index names no pool segment");
    }
    if (rc == 0 && cfg->shm_name_given && strcmp(h.segment, cfg->shm_name) != 0) {
        rc = -ESTALE;
        kvp_why(why, sizeof(why), rc, "it is named %.100s, --shm-name says %.100s", h.segment,
                cfg->shm_name);
    }
    if (rc == 0) {
        rc = kvp_segment_adopt(seg, h.segment, KVP_SEG_HEADER + cfg->l1_size, cfg->shm_mode, why,
                               sizeof(why));
        if (rc == 0) {
            w->adopted = true;
            w->planned = (h.flags & KVP_WIDX_CLEAN) != 0;
            w->report.previous_pid = h.pid;
            return;
        }
    }
    set_aside(w, label, why);
    if (rc == -EBUSY || rc == -EPERM) {
        /* Taken by a live daemon or another user since segment_free() looked: as above. */
        drop_index(w, false);
        w->wanted = false;
        return;
    }
    /* The index is ours (named after our socket, its lock ours): it goes, a fresh one will
     * take its place. The pool goes too, judged as the sweep would (kvp_segment_reap()). */
    drop_index(w, true);
    if (has_name)
        (void)kvp_segment_reap(KVP_SHM_DIR, named, KVP_SWEEP_MIN_AGE_S);
}

int kvp_warm_find(struct kvp_warm *w, const struct kvp_config *cfg, struct kvp_segment *seg)
{
    char why[KVP_MAX_REASON + 1];
    int fd;
    void *base;
    size_t len;

    w->t0_ms = kvp_mono_ms();
    if (!w->wanted)
        return 0;
    int rc = kvp_widx_open(w->name, false, 0, &fd, &base, &len, why, sizeof(why));
    if (rc == -ENOENT)
        return 0; /* nothing was left: a cold start */
    if (rc) {
        /* Another user's file, or one others could have written, is never touched; and this
         * daemon cannot have an index of that name this time. A damaged one of ours is
         * replaced when the fresh index is made. */
        set_aside(w, w->name + 1, why);
        if (rc == -EPERM)
            w->wanted = false;
        return 0;
    }
    rc = lock_index(fd);
    if (rc) {
        struct kvp_widx_header h;
        uint32_t pid = kvp_widx_header_read(base, len, &h) == 0 ? h.pid : 0;
        snprintf(why, sizeof(why), "a running kvpoold (pid %" PRIu32 ") uses its index %s%s", pid,
                 KVP_SHM_DIR, w->name);
        kvp_widx_close(fd, base, len);
        set_aside(w, w->name + 1, why);
        w->wanted = false;
        return 0;
    }
    if (!still_named(fd, w->name)) {
        /* Removed meanwhile by another daemon's sweep: its pool was gone. */
        kvp_widx_close(fd, base, len);
        return 0;
    }
    w->has_index = true;
    w->fd = fd;
    w->base = base;
    w->len = len;
    judge(w, cfg, seg);
    return 0;
}

/* ---- the sweep of orphan indexes ---- */

/* Removes dir/name if it is an index of this euid whose pool is gone (see kvp_warm_sweep()). */
static bool sweep_index(int dfd, const char *dir, const char *name, uint32_t min_age_s)
{
    struct stat st, named, seg;
    struct kvp_widx_header h;
    bool removed = false;
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return false;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        st.st_size < (off_t)KVP_WIDX_HEADER)
        goto out_close;
    /* Held: a live daemon's index. */
    if (flock(fd, LOCK_EX | LOCK_NB) != 0)
        goto out_close;
    void *base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED)
        goto out_close;
    bool sound = kvp_widx_header_read(base, (size_t)st.st_size, &h) == 0;
    munmap(base, (size_t)st.st_size);
    if (sound && segment_name_ok(h.segment) &&
        fstatat(dfd, h.segment, &seg, AT_SYMLINK_NOFOLLOW) == 0)
        goto out_close; /* its pool is there: its owner's successor may adopt it */
    if (!sound) {
        /* Possibly a daemon between creating and formatting it: never while it is young. */
        time_t newest = st.st_mtim.tv_sec > st.st_ctim.tv_sec ? st.st_mtim.tv_sec
                                                              : st.st_ctim.tv_sec;
        if (time(NULL) - newest < (time_t)min_age_s)
            goto out_close;
    }
    if (fstatat(dfd, name, &named, AT_SYMLINK_NOFOLLOW) != 0 || named.st_ino != st.st_ino ||
        named.st_dev != st.st_dev || unlinkat(dfd, name, 0) != 0)
        goto out_close;
    removed = true;
    log_warn("Removing the warm-restart index %s/%s (%" PRIu64 " bytes): %s", dir, name,
             (uint64_t)st.st_size,
             sound ? "the pool it describes is gone" : "it is damaged or was never completed");
out_close:
    close(fd); /* releases our lock, if taken */
    return removed;
}

uint32_t kvp_warm_sweep(const struct kvp_warm *w, const char *dir, uint32_t min_age_s)
{
    char prefix[48];
    uint32_t n = 0;
    snprintf(prefix, sizeof(prefix), KVP_WARM_INDEX_PREFIX "%u_", (unsigned)geteuid());
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    /* cppcheck-suppress readdirCalled ; readdir_r is deprecated, and d is private to this call */
    for (struct dirent *e = readdir(d); e; e = readdir(d)) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
            continue;
        /* Our own index: ours to judge (kvp_warm_find()), never the sweep's. */
        if (w->name[0] && strcmp(e->d_name, w->name + 1) == 0)
            continue;
        n += sweep_index(dirfd(d), dir, e->d_name, min_age_s);
    }
    closedir(d);
    return n;
}

/* ---- the store's hook ---- */

static int hook_seal(void *arg, uint64_t page, const uint8_t key[KVP_KEY_SIZE], uint64_t length,
                     uint64_t sum, uint64_t seq)
{
    struct kvp_warm *w = arg;
    /* Acquire: pairs with kvp_warm_cover(), the records up to there are allocated. A pool lost
     * under the daemon (seg_guard.h) is private memory: its bytes are not in the file. */
    if (page >= atomic_load_explicit(&w->covered, memory_order_acquire) || kvp_seg_guard_tripped())
        return -ENOSPC;
    return kvp_widx_seal(w->base, page, key, length, sum, seq);
}

static void hook_clear(void *arg, uint64_t page)
{
    struct kvp_warm *w = arg;
    (void)kvp_widx_clear(w->base, page);
}

static void hook_touch(void *arg, uint64_t page, uint64_t seq)
{
    struct kvp_warm *w = arg;
    kvp_widx_touch(w->base, page, seq);
}

static int hook_mark(void *arg, uint64_t page, uint64_t length)
{
    struct kvp_warm *w = arg;
    /* As a seal: only into records whose pages are reserved. */
    if (page >= atomic_load_explicit(&w->covered, memory_order_acquire))
        return -ENOSPC;
    return kvp_widx_mark(w->base, page, length);
}

static void hook_unmark(void *arg, uint64_t page)
{
    struct kvp_warm *w = arg;
    (void)kvp_widx_unmark(w->base, page);
}

/* ---- attach: the scan, or a fresh index ---- */

void kvp_warm_cover(struct kvp_warm *w, uint64_t pool_bytes)
{
    if (!w->has_index || atomic_load_explicit(&w->cover_failed, memory_order_relaxed))
        return;
    uint64_t want = pool_bytes / KVP_POOL_PAGE, npages = kvp_widx_npages(&w->id);
    uint64_t have = atomic_load_explicit(&w->covered, memory_order_relaxed);
    if (want > npages)
        want = npages;
    if (want <= have)
        return;
    int rc = kvp_widx_reserve(w->fd, have, want - have);
    if (rc) {
        atomic_store_explicit(&w->cover_failed, true, memory_order_relaxed);
        log_warn("Cannot reserve the warm-restart index %s%s for pool pages %" PRIu64 " to %" PRIu64
                 " (%s): the chunks stored there will not be adopted by the "
                 "next kvpoold",
                 KVP_SHM_DIR, w->name, have, want, kvp_strerror(rc));
        return;
    }
    /* Release: a seal that sees the new value writes into allocated pages. */
    atomic_store_explicit(&w->covered, want, memory_order_release);
}

/* Formats the index w holds afresh for seg (a new generation: no earlier record validates),
 * its header page allocated first. Returns 0 or a negative errno with why. */
static int format_index(struct kvp_warm *w, const struct kvp_segment *seg, char *why,
                        size_t why_size)
{
    uint64_t generation;
    int rc;
    do
        rc = -posix_fallocate(w->fd, 0, KVP_WIDX_HEADER);
    while (rc == -EINTR);
    if (rc)
        return kvp_why(why, why_size, rc, "cannot allocate its header: %s", kvp_strerror(rc));
    randombytes_buf(&generation, sizeof(generation));
    rc = kvp_widx_format_named(w->base, w->len, &w->id, (uint32_t)getpid(), (uint32_t)geteuid(),
                               generation, seg->name);
    if (rc)
        return kvp_why(why, why_size, rc, "cannot format it: %s", kvp_strerror(rc));
    return 0;
}

/* Makes a fresh index for the new segment seg. Returns 0 or a negative errno with why. */
static int create_index(struct kvp_warm *w, const struct kvp_segment *seg, char *why,
                        size_t why_size)
{
    uint64_t npages = kvp_widx_npages(&w->id);
    int fd = -1, rc = -EBUSY;
    void *base = NULL;
    size_t len = 0;

    for (int attempt = 0; attempt < 3 && rc; attempt++) {
        /* A damaged index of ours, if one was left: this daemon owns the socket, so no live
         * daemon uses the name (kvp_warm_find() said so when it could tell). */
        (void)kvp_widx_unlink(w->name);
        rc = kvp_widx_open(w->name, true, npages, &fd, &base, &len, why, why_size);
        if (rc)
            return rc;
        rc = lock_index(fd);
        if (rc == 0 && !still_named(fd, w->name))
            rc = -EAGAIN; /* another daemon's sweep took it for an orphan: again */
        if (rc)
            kvp_widx_close(fd, base, len);
    }
    if (rc)
        return kvp_why(why, why_size, rc, "cannot lock it: %s", kvp_strerror(rc));
    w->has_index = true;
    w->fd = fd;
    w->base = base;
    w->len = len;
    rc = format_index(w, seg, why, why_size);
    if (rc)
        drop_index(w, true);
    return rc;
}

/* What the scan found, to adopt oldest use first: a record's seq and page. */
struct cand {
    uint64_t seq, page;
};

struct cands {
    struct cand *v;
    size_t n, cap;
};

static int collect(void *arg, uint64_t page, const uint8_t key[KVP_KEY_SIZE], uint64_t length,
                   uint64_t data_sum, uint64_t seq)
{
    struct cands *c = arg;
    (void)key;
    (void)length;
    (void)data_sum;
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 1024;
        struct cand *v = realloc(c->v, cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        c->v = v;
        c->cap = cap;
    }
    c->v[c->n++] = (struct cand){seq, page};
    return 0;
}

static int by_seq(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->seq != y->seq)
        return x->seq < y->seq ? -1 : 1;
    return x->page < y->page ? -1 : x->page > y->page;
}

/* What the scan of reservation marks held back. */
struct held {
    struct kvp_store *st;
    uint64_t marks, pages;
};

static int hold_mark(void *arg, uint64_t page, uint64_t length)
{
    struct held *h = arg;
    int64_t n = kvp_store_hold_back(h->st, page, KVP_SEG_HEADER + page * KVP_POOL_PAGE, length);
    if (n < 0)
        return (int)n;
    h->marks++;
    h->pages += (uint64_t)n;
    return 0;
}

/*
 * The stores the previous daemon had in progress (reservation marks): their workers may still
 * be writing their slots, knowing nothing of the restart until their next call, so those pages
 * are held back from new chunks for --reserve-timeout (the longest a store may take), then
 * released by kvp_warm_tick() (the housekeeping thread).
 */
static void hold_back(struct kvp_warm *w, struct kvp_store *st)
{
    struct held h = {.st = st};
    uint64_t t0 = kvp_mono_ms();
    int64_t rc = kvp_widx_scan_marks(w->fd, w->base, w->len, hold_mark, &h);
    log_debug("Adoption: the index's reservation marks scanned in %" PRIu64 " ms",
              kvp_mono_ms() - t0);
    if (rc < 0)
        log_warn("Cannot hold back the pages of the stores the previous kvpoold had in "
                 "progress: %s",
                 kvp_strerror((int)rc));
    if (!h.pages)
        return;
    w->hold_until_ms = kvp_mono_ms() + w->hold_ms;
    log_info("Holding back %" PRIu64 " bytes of %" PRIu64 " stores the previous kvpoold had in "
             "progress for %" PRIu64 " s (--reserve-timeout): their workers may still write them",
             h.pages * KVP_POOL_PAGE, h.marks, w->hold_ms / 1000);
}

/* The INFO line of an adoption, and its structured fields. */
static void log_adopted(const struct kvp_warm *w, const struct kvp_segment *seg)
{
    const struct kvp_warm_report *r = &w->report;
    char dropped[160] = "";
    if (r->dropped_chunks)
        snprintf(dropped, sizeof(dropped),
                 "; dropped %" PRIu64 ": %" PRIu64 " bad seal, %" PRIu64 " out of range, %" PRIu64
                 " overlap",
                 r->dropped_chunks, r->dropped_bad_seal, r->dropped_out_of_range,
                 r->dropped_overlap);
    const struct kvp_log_field f[] = {
        KVP_LOG_STR("warm_restart", "adopted"),
        KVP_LOG_NUM("adopted_chunks", r->adopted_chunks),
        KVP_LOG_NUM("adopted_bytes", r->adopted_bytes),
        KVP_LOG_NUM("dropped_chunks", r->dropped_chunks),
        KVP_LOG_NUM("duration_ms", r->duration_ms),
        KVP_LOG_NUM("previous_pid", r->previous_pid),
        KVP_LOG_NUM("planned", r->planned),
        KVP_LOG_STR("shm_name", seg->name),
    };
    kvp_log_fields(KVP_LOG_INFO, f,
                   "Adopted the pool of kvpoold pid %" PRIu32 " (%s): %" PRIu64 " chunks, %" PRIu64
                   " bytes in %" PRIu64 " ms%s",
                   r->previous_pid, r->planned ? "planned restart" : "after a crash",
                   r->adopted_chunks, r->adopted_bytes, r->duration_ms, dropped);
}

/*
 * The adopted index's records into the store, oldest use first: scan (read only), scrub (its
 * rejects cleared, so that every sealed record left is one adopted now), then each object
 * adopted, a record the store refuses cleared at once (its pages are free in the store: nothing
 * may validate there). Returns 0, or a negative errno before anything was adopted.
 */
static int adopt_records(struct kvp_warm *w, struct kvp_store *st)
{
    struct kvp_widx_scan_result scan, scrub;
    struct kvp_widx_header h;
    struct cands c = {0};
    struct kvp_warm_report *r = &w->report;

    uint64_t t0 = kvp_mono_ms();
    int rc = kvp_widx_header_read(w->base, w->len, &h);
    if (rc == 0)
        rc = kvp_widx_scan_fd(w->fd, w->base, w->len, collect, &c, &scan);
    uint64_t t1 = kvp_mono_ms();
    if (rc == 0)
        rc = kvp_widx_scrub(w->fd, w->base, w->len, &scrub);
    uint64_t t2 = kvp_mono_ms();
    if (rc) {
        free(c.v);
        return rc;
    }
    if (c.n) /* c.v is NULL when nothing was sealed: qsort() takes no NULL */
        qsort(c.v, c.n, sizeof(*c.v), by_seq);
    uint64_t refused_range = 0, refused_overlap = 0, lost = 0;
    for (size_t i = 0; i < c.n; i++) {
        struct kvp_widx_record rec;
        uint64_t page = c.v[i].page;
        /* The bytes the scan judged: nobody has written the index since (its writer is dead,
         * its lock is ours), and the seal is checked again all the same. */
        memcpy(&rec, (const uint8_t *)w->base + KVP_WIDX_HEADER + page * KVP_WIDX_RECORD,
               sizeof(rec));
        if (rec.seal == kvp_widx_seal_of(h.generation, page, rec.key, rec.length, rec.data_sum))
            rc = kvp_store_adopt(st, KVP_SEG_HEADER + page * KVP_POOL_PAGE, rec.key, rec.length,
                                 rec.data_sum);
        else
            rc = -EEXIST;
        if (rc == 0) {
            r->adopted_chunks++;
            r->adopted_bytes += rec.length;
            continue;
        }
        (void)kvp_widx_clear(w->base, page);
        if (rc == -ERANGE)
            refused_range++; /* beyond the part of the pool its owner had reserved */
        else if (rc == -EEXIST || rc == -EINVAL)
            refused_overlap++; /* a key twice */
        else
            lost++;
    }
    free(c.v);
    log_debug("Adoption: the index scanned in %" PRIu64 " ms (%" PRIu64 " records in %" PRIu64
              " extents), scrubbed in %" PRIu64 " ms, %" PRIu64 " chunks adopted in %" PRIu64 " ms",
              t1 - t0, scan.records, scan.extents, t2 - t1, r->adopted_chunks, kvp_mono_ms() - t2);
    if (lost)
        log_warn("Could not adopt %" PRIu64 " chunks of the pool: out of memory", lost);
    r->dropped_bad_seal = scan.bad_seal;
    r->dropped_out_of_range = scan.out_of_range + refused_range;
    r->dropped_overlap = scan.overlap + refused_overlap;
    r->dropped_chunks = r->dropped_bad_seal + r->dropped_out_of_range + r->dropped_overlap;
    /* In use again: a death from now on is a crash of this daemon's, not a planned stop. */
    kvp_widx_set_flags(w->base, kvp_widx_flags(w->base) & ~(uint64_t)KVP_WIDX_CLEAN);
    kvp_widx_set_owner(w->base, (uint32_t)getpid(), (uint32_t)geteuid());
    return 0;
}

void kvp_warm_attach(struct kvp_warm *w, const struct kvp_segment *seg, struct kvp_store *st)
{
    char why[KVP_MAX_REASON + 1] = "";
    bool named = seg->shared && !seg->memfd && seg->name[0];
    bool fresh = !w->adopted && w->wanted && named;

    /* As configured, whatever the index could be this time (report.reason says). */
    w->report.enabled = w->configured && named;
    if (!w->adopted && !fresh) {
        drop_index(w, false);
        return;
    }
    if (fresh && create_index(w, seg, why, sizeof(why)) != 0) {
        log_warn("Cannot create the warm-restart index %s%s (%s): the next kvpoold will start "
                 "empty",
                 KVP_SHM_DIR, w->name, why);
        snprintf(w->report.reason, sizeof(w->report.reason), "no index: %s", why);
        return;
    }
    /* The records of the pool's reserved part first: adoption touches them, seals go there. */
    kvp_warm_cover(w, kvp_segment_pool_bytes(seg->reserved));
    w->hook = (struct kvp_store_index){
        .seal = hook_seal,
        .clear = hook_clear,
        .touch = hook_touch,
        .mark = hook_mark,
        .unmark = hook_unmark,
        .arg = w,
    };
    kvp_store_set_index(st, &w->hook);
    if (!w->adopted)
        return;
    w->report.adopted = true;
    w->report.planned = w->planned;
    if (adopt_records(w, st) != 0) {
        /* Nothing was adopted: a new generation makes every old record invalid at once. */
        log_warn("Cannot scan the index of the pool in %s/%s: starting with it empty", KVP_SHM_DIR,
                 seg->name);
        if (format_index(w, seg, why, sizeof(why)) != 0) {
            log_warn("Cannot reset the warm-restart index %s%s (%s): the next kvpoold will start "
                     "empty",
                     KVP_SHM_DIR, w->name, why);
            kvp_store_set_index(st, NULL);
            drop_index(w, true);
        }
    }
    hold_back(w, st);
    w->report.duration_ms = kvp_mono_ms() - w->t0_ms;
    log_adopted(w, seg);
}

void kvp_warm_tick(struct kvp_warm *w, struct kvp_store *st, uint64_t now_ms)
{
    if (!w->hold_until_ms || now_ms < w->hold_until_ms)
        return;
    w->hold_until_ms = 0;
    uint64_t pages = kvp_store_release_held(st);
    log_info("Released the %" PRIu64 " bytes held back from the stores the previous kvpoold had "
             "in progress",
             pages * KVP_POOL_PAGE);
}

/* ---- shutdown ---- */

bool kvp_warm_stop(struct kvp_warm *w, const struct kvp_segment *seg, struct kvp_store *st,
                   bool planned)
{
    const char *why = !w->has_index             ? "it has no warm-restart index"
                      : kvp_seg_guard_tripped() ? "its segment was lost"
                                                : NULL;
    if (planned && why)
        log_warn("The pool cannot be left for the next kvpoold (%s): it is removed, as by a "
                 "plain stop",
                 why);
    if (!planned || why) {
        drop_index(w, true);
        return false;
    }
    /* Without a store (a start-up that failed after adopting the pool) nothing has changed
     * since the adoption. */
    struct kvp_store_gauges g = {.indexed = w->report.adopted_chunks,
                                 .indexed_bytes = w->report.adopted_bytes};
    if (st)
        kvp_store_get_gauges(st, &g);
    /* Release: every record written before is there for whoever sees the flag. */
    kvp_widx_set_flags(w->base, kvp_widx_flags(w->base) | KVP_WIDX_CLEAN);
    const struct kvp_log_field f[] = {
        KVP_LOG_STR("warm_restart", "left"),
        KVP_LOG_NUM("chunks", g.indexed),
        KVP_LOG_NUM("bytes", g.indexed_bytes),
        KVP_LOG_STR("shm_name", seg->name),
    };
    kvp_log_fields(KVP_LOG_INFO, f,
                   "Leaving the pool (%" PRIu64 " chunks, %" PRIu64
                   " bytes) in %s/%s for the next kvpoold",
                   g.indexed, g.indexed_bytes, KVP_SHM_DIR, seg->name);
    return true;
}
