/*
 * segment.h - the memory that holds the pool: a POSIX shared-memory segment (shm transport) or
 * private anonymous memory (inline only). Either way a page is reserved and pre-faulted before
 * the pool hands it out, so no access to the pool can fault: the creation functions reserve the
 * first KVP_RESERVE_FIRST bytes (enough to serve at once), kvp_segment_reserve_rest() the rest,
 * on a thread of the daemon's (warmup.c) while it already serves.
 *
 * Layout: one KVP_SEG_HEADER-byte header page (src/common/seg_header.h, shared with the workers
 * that check it), then the pool.
 */
#ifndef KVP_SEGMENT_H
#define KVP_SEGMENT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/seg_header.h"

#define KVP_RESERVE_STEP (256ull << 20)    /* bytes reserved and touched per step */
#define KVP_RESERVE_FIRST KVP_RESERVE_STEP /* reserved before creation returns */
#define KVP_RESERVE_PROGRESS_MS 5000       /* default interval of the progress lines */
#define KVP_SWEEP_MIN_AGE_S 10             /* a headerless leftover younger than this stays */
#define KVP_SHM_NAME_ATTEMPTS 8            /* random default names tried before giving up */

struct kvp_segment {
    uint8_t *base; /* mapping of the whole segment */
    uint64_t size; /* header + pool */
    /* Bytes [0, reserved) are allocated and pre-faulted. Written by the creating thread, then
     * only by the one thread that runs kvp_segment_reserve_rest(). */
    uint64_t reserved;
    int fd;         /* shared segment fd (holds our flock), -1 otherwise */
    bool shared;    /* workers can map it (posix or memfd) */
    bool memfd;     /* anonymous memfd: no name, handed out by fd passing */
    char name[128]; /* posix: without '/'; "" otherwise */
    uint8_t nonce[KVP_SEG_NONCE_SIZE];
};

#define KVP_SEGMENT_INIT \
    {                    \
        .fd = -1         \
    }

/*
 * Creates the named segment of size bytes: O_CREAT|O_EXCL, mode 0600, an exclusive flock held
 * for the daemon's lifetime, ftruncate to size (sparse), mapping, posix_fallocate and first touch
 * of the first part (KVP_RESERVE_FIRST, see kvp_segment_set_reserve_control), header.
 * A namesake left by a dead daemon (no lock held) is logged and replaced.
 * Returns 0; -EBUSY when a live daemon holds the name (fatal: never share a pool); -EPERM when
 * a file of another uid holds it (fatal: why says so; see kvp_segment_create_shared_default()
 * for a name nobody can plant); -ECANCELED
 * when a stop was requested during the reservation (the name is unlinked); any other
 * negative errno when the segment cannot be made (why says what happened, the name is unlinked,
 * the caller falls back to private memory).
 */
int kvp_segment_create_shared(struct kvp_segment *seg, const char *name, uint64_t size,
                              uint32_t mode, char *why, size_t why_size);

/*
 * Like kvp_segment_create_shared() for the daemon's default name (one of
 * kvp_shm_name_random(); "" draws one): a name that exists already, whoever made it, is never
 * touched; another random name is drawn, up to KVP_SHM_NAME_ATTEMPTS times. seg->name is the
 * name used. Returns 0, -ECANCELED, -EEXIST (every name drawn was taken), or another negative
 * errno as above (the caller falls back to private memory).
 */
int kvp_segment_create_shared_default(struct kvp_segment *seg, const char *name, uint64_t size,
                                      uint32_t mode, char *why, size_t why_size);

/*
 * Creates an anonymous memfd segment of size bytes: memfd_create with sealing allowed, ftruncate
 * to size, seals against shrinking and growing (so a worker holding the fd can never truncate
 * the pool under the daemon), mapping, posix_fallocate and first touch of the first part,
 * header. Nothing appears in
 * /dev/shm and the memory goes away with the last process holding the fd. Returns 0 or a
 * negative errno with why filled (the caller falls back to private memory).
 */
int kvp_segment_create_memfd(struct kvp_segment *seg, uint64_t size, char *why, size_t why_size);

/* Creates private memory of size bytes, its first part pre-faulted. Returns 0, the negative errno
 * of mmap
 * (-ENOMEM when the memory is not available) or -ECANCELED (see
 * kvp_segment_set_reserve_control). */
int kvp_segment_create_private(struct kvp_segment *seg, uint64_t size);

/* Pool bytes within the first seg_bytes bytes of a segment (the pool starts after the header). */
static inline uint64_t kvp_segment_pool_bytes(uint64_t seg_bytes)
{
    return seg_bytes > KVP_SEG_HEADER ? seg_bytes - KVP_SEG_HEADER : 0;
}

/* Hears that bytes [0, reserved) of the segment are reserved now. */
typedef void (*kvp_reserve_cb)(void *arg, uint64_t reserved);

/*
 * Reserves and pre-faults the rest of a created segment, step by step, calling on_step after
 * each. Progress lines as for the creation; INFO lines at the start and the end. Returns 0 when
 * the whole segment is reserved, -ECANCELED on a stop request, or the negative errno of the
 * allocation with why filled (ENOSPC: something filled /dev/shm after the capacity gate); the
 * part reserved so far stays usable either way.
 */
int kvp_segment_reserve_rest(struct kvp_segment *seg, kvp_reserve_cb on_step, void *arg, char *why,
                             size_t why_size);

/*
 * Sets how the reservation of every create function reports and stops: an INFO progress line
 * (bytes done, GB/s, time left) at most every interval_ms (0: after every step), and when
 * cancel is non-NULL and becomes true, the creation stops between two steps and returns
 * -ECANCELED. Call before creating; the default is KVP_RESERVE_PROGRESS_MS and no cancel.
 */
void kvp_segment_set_reserve_control(uint32_t interval_ms, const atomic_bool *cancel);

/*
 * Removes the segments in dir (KVP_SHM_DIR) left by dead daemons: files with a default name
 * (kvp_shm_name_is_default(): kvpool_l1_pool_<pid>_<random>, or kvpool_l1_pool_<pid> of earlier
 * versions) or own_name (may be NULL), owned by
 * this euid, whose liveness lock is free, and that have a valid header or were last changed at
 * least min_age_s seconds ago. Logs each removal (name, size) at WARN. A segment whose lock is
 * held or of another uid is never touched. Returns the bytes freed (file sizes).
 */
uint64_t kvp_segment_sweep(const char *dir, const char *own_name, uint32_t min_age_s);

/*
 * Removes the one segment dir/name as kvp_segment_sweep() would remove a leftover (this euid, a
 * regular file, its lock free, a header or min_age_s old), whatever its name: the pool of a
 * predecessor set aside by a warm restart (warm_restart.c). Returns its size, or 0 when it
 * stays (logged as the sweep logs).
 */
uint64_t kvp_segment_reap(const char *dir, const char *name, uint32_t min_age_s);

/*
 * Adopts the POSIX segment name (without '/') that a dead kvpoold left, for a warm restart: opens
 * it without creating it; checks that it is a regular file of this euid of exactly size bytes;
 * takes its liveness lock without waiting (held: a live kvpoold owns it, and nothing is touched,
 * -EBUSY); checks its header (magic, layout version, header size, size) and the part its owner
 * reserved (reserved_bytes, recorded after its posix_fallocate: those pages are still
 * allocated, and are not allocated again); sets mode; maps it; and writes a new nonce and
 * this pid into the header (its magic cleared first and written last: a worker that still maps
 * the segment sees a nonce other than the one its daemon announced). The pool's bytes are
 * neither read nor written. seg->reserved is the reserved part: kvp_segment_reserve_rest()
 * continues from there. Returns 0, or -EINVAL (not a segment name), -ENOENT (no such segment),
 * -EPERM (another uid's, or not a regular file), -EBUSY (a live kvpoold holds it), -ESTALE
 * (another size), -EPROTO (no sound header, or no reserved part recorded), or another negative
 * errno; why says which. On failure nothing is kept open and the file is unchanged.
 */
int kvp_segment_adopt(struct kvp_segment *seg, const char *name, uint64_t size, uint32_t mode,
                      char *why, size_t why_size);

/* Unmaps, unlinks the name if we own it, closes. Safe on a half-built or zeroed segment. */
void kvp_segment_destroy(struct kvp_segment *seg);

/* Unmaps and closes, releasing the liveness lock, but leaves the file in /dev/shm for a
 * successor (a planned restart). Safe on a half-built or zeroed segment. */
void kvp_segment_leave(struct kvp_segment *seg);

#endif /* KVP_SEGMENT_H */
