/*
 * warm_restart.h - warm restart: the next kvpoold started with the same configuration adopts
 * the pool segment a dead (SIGKILL, OOM kill, a fault) or stopped-for-restart (SIGUSR2) daemon
 * left in /dev/shm, and serves its committed chunks at once, each checked against its checksum
 * on its first read. This module owns the feature's life cycle over the on-pool index
 * (warm_index.h): its name, finding and judging a predecessor's pool at start-up (adopt it, or
 * set it aside with one WARN line saying why), the scan of its index into the store, a fresh
 * index beside a new pool, the index pages reserved with the pool's, what a stop leaves, and
 * the figures of this start (struct kvp_warm_report, for the reports).
 *
 * Where it runs in the daemon's life (server.c):
 *   kvp_warm_init()      kvp_server_init(): nothing acquired;
 *   kvp_warm_find()      start-up, after kvpool's socket lock, before the sweep of leftovers:
 *                        a predecessor's segment adopted into seg, for the transport decision;
 *   kvp_warm_sweep()     after the segment sweep: orphan indexes of this uid removed;
 *   kvp_warm_attach()    once the store exists: the adopted index scanned into it, or a fresh
 *                        index made for a new named segment; the store's hook set;
 *   kvp_warm_cover()     each step of the background reservation (warmup.c);
 *   kvp_warm_tick()      the housekeeping thread (expiry.c): the pages of the previous daemon's
 *                        stores in progress, held back at adoption, released in time;
 *   kvp_warm_stop()      shutdown, before the store goes: leave both files (planned restart),
 *                        or unlink the index (a plain stop; the segment goes next);
 *   kvp_warm_close()     last: the index unmapped and its lock released.
 *
 * Threads: everything on the main thread at start-up and shutdown, except kvp_warm_cover() (the
 * warm-up thread) and the store's hook (any thread, under the store lock).
 */
#ifndef KVP_WARM_RESTART_H
#define KVP_WARM_RESTART_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/config.h"
#include "common/limits.h"
#include "core/segment.h"
#include "core/store.h"
#include "core/warm_index.h"

/* The index's shm name: "/kvpool_widx_<euid>_<16 hex digits>", with its '/'. */
#define KVP_WARM_INDEX_PREFIX "kvpool_widx_"
#define KVP_WARM_NAME_MAX 64

/* What this start did with a predecessor's pool: copied into every snapshot (snap->warm) and
 * rendered by report/ (the status JSON's "warm_restart", the metrics, `kvpool status`). */
struct kvp_warm_report {
    bool enabled;                    /* --warm-restart on and a named segment */
    bool adopted;                    /* this start adopted a pool */
    bool planned;                    /* it was left on purpose (SIGUSR2), else after a crash */
    uint32_t previous_pid;           /* 0 when none */
    char reason[KVP_MAX_REASON + 1]; /* why a pool found was not adopted, else "" */
    uint64_t adopted_chunks, adopted_bytes, dropped_chunks, dropped_bad_seal, dropped_out_of_range,
        dropped_overlap, duration_ms;
};

struct kvp_warm {
    bool configured;              /* --warm-restart on, SHM on, posix backend */
    bool wanted;                  /* configured, and this daemon may have an index */
    char name[KVP_WARM_NAME_MAX]; /* the index's shm name */
    struct kvp_widx_identity id;  /* this daemon's settings, as the index records them */
    /* The index in use (has_index): its descriptor (holding its flock: a live owner's index
     * is never judged stale by another daemon's sweep) and its mapping. */
    bool has_index;
    int fd;
    void *base;
    size_t len;
    bool adopted;   /* seg is a predecessor's: kvp_warm_attach() scans the index */
    bool planned;   /* the predecessor left on purpose (KVP_WIDX_CLEAN) */
    uint64_t t0_ms; /* kvp_warm_find() began */
    /* Records [0, covered) are reserved (kvp_widx_reserve): a seal never writes beyond, where
     * a write into a hole of a full tmpfs would be SIGBUS. Stored by the main thread, then the
     * warm-up thread; loaded under the store lock. */
    _Atomic uint64_t covered;
    atomic_bool cover_failed; /* a reservation of index pages failed (logged once) */
    /* Pages of the previous daemon's stores in progress are held back until hold_until_ms
     * (kvp_mono_ms(); 0: none), hold_ms after the adoption (--reserve-timeout). Set at start-up,
     * then the housekeeping thread's (kvp_warm_tick()). */
    uint64_t hold_ms, hold_until_ms;
    struct kvp_store_index hook;
    struct kvp_warm_report report;
};

/* Nothing acquired: sets what cfg asks for (wanted, the index's name, the identity). A zeroed
 * struct is a valid "no warm restart". */
void kvp_warm_init(struct kvp_warm *w, const struct kvp_config *cfg);

/*
 * The index's shm name for a daemon of this euid on socket_path: "/kvpool_widx_<euid>_<16
 * lowercase hex digits of XXH3-64 of the path>". Returns 0 or -ENAMETOOLONG (size too small).
 */
int kvp_warm_index_name(const char *socket_path, char *out, size_t size);

/* The settings hash of the index's identity (warm_index.h): the formats that name and place
 * chunks, beyond the pool size, page size and chunk size that it records on their own. */
uint64_t kvp_warm_settings_hash(void);

/* Bytes of the index a pool of cfg needs in /dev/shm when warm restart is on (for the capacity
 * gate), else 0. */
uint64_t kvp_warm_index_bytes(const struct kvp_config *cfg);

/*
 * Start-up, before the sweep: when the index exists, judges it and the pool it names. A pool it
 * may adopt (same format, settings and size, files of this euid, its previous owner dead) is
 * adopted into seg (kvp_segment_adopt()); a pool it may not is set aside with one WARN line
 * naming the reason (report.reason): a live daemon's or another user's files are left alone,
 * the others removed (index, then segment) so that a fresh pool can take their place. Never
 * fatal: returns 0 whatever it found; seg->shared says whether a segment was adopted.
 */
int kvp_warm_find(struct kvp_warm *w, const struct kvp_config *cfg, struct kvp_segment *seg);

/*
 * Removes the indexes in dir whose pool is gone: files named KVP_WARM_INDEX_PREFIX<euid>_*, of
 * this euid, regular, other than w's own, nobody's lock held, and either naming a segment that
 * does not exist in dir or without a sound header and at least min_age_s seconds old. Returns
 * how many were removed (each logged at WARN).
 */
uint32_t kvp_warm_sweep(const struct kvp_warm *w, const char *dir, uint32_t min_age_s);

/*
 * Once the store st exists over seg: for an adopted segment, the index's records are scanned
 * into the store (kvp_widx_scan_fd(), oldest use first, kvp_store_adopt()), the rejects cleared
 * (kvp_widx_scrub()), the index marked in use (KVP_WIDX_CLEAN cleared, this owner) and the INFO
 * line logged; for a new named segment (seg->shared, not memfd), a fresh index is made beside
 * it. Then the store records into the index. Never fatal: a failure is logged (WARN) and the
 * daemon runs without an index (a fresh pool) or with an empty one (an adopted pool whose scan
 * failed: its index is formatted anew first, so nothing of the old records survives).
 */
void kvp_warm_attach(struct kvp_warm *w, const struct kvp_segment *seg, struct kvp_store *st);

/* The housekeeping thread, about once a second: releases the pages held back from the previous
 * daemon's stores in progress once their time is up (logged). */
void kvp_warm_tick(struct kvp_warm *w, struct kvp_store *st, uint64_t now_ms);

/* Reserves the index records of the first pool_bytes of the pool (the warm-up's progress): seals
 * beyond them are refused until then. A failure is logged once (WARN); objects beyond are then
 * simply not recorded. Called by one thread at a time. */
void kvp_warm_cover(struct kvp_warm *w, uint64_t pool_bytes);

/*
 * Shutdown, once nothing writes the store (every client, front end and thread stopped), before
 * the store is destroyed (st may be NULL: never built). planned (SIGUSR2, or a start-up that
 * failed after adopting a pool): the index is marked KVP_WIDX_CLEAN and both files stay for the
 * next kvpoold (INFO line); returns true, and the caller must leave the segment
 * (kvp_segment_leave()). Otherwise, or when there is nothing to leave (no index, a segment lost
 * under the daemon: WARN), the index is unlinked (the caller then destroys the segment, name
 * and all) and false returned.
 */
bool kvp_warm_stop(struct kvp_warm *w, const struct kvp_segment *seg, struct kvp_store *st,
                   bool planned);

/* Unmaps and closes the index (its lock goes with it). Safe on a zeroed struct. */
void kvp_warm_close(struct kvp_warm *w);

#endif /* KVP_WARM_RESTART_H */
