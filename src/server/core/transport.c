/*
 * transport.c - the daemon-wide transport decision (see transport.h).
 *
 * Design. The decision is made once, at start-up, and never revisited: a pool either lives in
 * shared memory whose every page was reserved before the first worker could map it, or in
 * private memory with the inline transport for everybody. The steps, each logged:
 *   0. a dead predecessor's segment adopted by a warm restart (warm_restart.c) is used as it
 *      is: it exists and its reserved part is allocated;
 *   1. --shm-name "" or --shm-backend none: "SHM disabled by configuration";
 *   2. the capacity gate (shm_gate.c): /dev/shm free space for a posix segment (and its
 *      warm-restart index, when that is on), the memory available to the daemon
 *      (MemAvailable, the cgroup's memory.max) for memfd;
 *   3. the segment itself (segment.c), reserved page by page (posix_fallocate), so that no
 *      access can fault later; a reservation that fails (something filled /dev/shm after the
 *      gate) falls back to private memory with the reason;
 *   4. private memory when any of the above said no.
 * Only a segment name the operator gave that a live daemon or another user holds is fatal: every
 * other failure degrades to the inline transport with a reason that the start-up line, the
 * registrations and the status report repeat. The default name is drawn at random, and drawn
 * again while taken, so that no other user can make the daemon refuse or lose shared memory.
 *
 * Evidence for a worker's claim (kvp_transport_peer_can_map). A worker reports the transport
 * it will use; believing "shm" from one that cannot map the segment would let it publish slots
 * it never wrote and read their previous contents back inline: another worker's KV. So the
 * claim stands only on evidence: the descriptor of a memfd segment passed to this connection,
 * or, for a posix segment, the peer's credentials (taken by the kernel at connect time) against
 * the file's owner, group and mode. The file is checked when the worker registers, so a mode or
 * group an operator changes after start-up counts.
 *
 * Threads: kvp_transport_setup() on the main thread, during start-up only;
 * kvp_transport_peer_can_map() on any connection thread (it only reads the segment).
 */
#include "core/transport.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "base/log.h"
#include "common/errors.h"
#include "core/seg_guard.h"
#include "core/shm_gate.h"
#include "core/warm_restart.h"

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59 /* Linux 4.13 */
#endif

/* Supplementary groups beyond this many are not read: the limit of a bounded stack buffer. */
#define KVP_PEER_GROUPS_MAX 256

/* Logs a gate verdict. Returns true when the segment may be attempted. */
static bool gate_allows(enum kvp_gate_verdict v, const char *log_line)
{
    if (v == KVP_GATE_SKIPPED)
        log_debug("%s", log_line);
    else if (v != KVP_GATE_OK)
        log_warn("%s", log_line);
    return v == KVP_GATE_OK || v == KVP_GATE_SKIPPED;
}

/* The order of the checks is the order of the README's "How the transport is chosen". */
int kvp_transport_setup(const struct kvp_config *cfg, struct kvp_segment *seg, char *reason,
                        size_t reason_size, struct kvp_gate_seen *seen)
{
    uint64_t size = KVP_SEG_HEADER + cfg->l1_size;
    char log_line[512], why[200];
    struct kvp_gate_probe probe;
    int rc = 0;

    *seen = (struct kvp_gate_seen){.probed = false};
    reason[0] = '\0';
    if (seg->shared) {
        /* A dead predecessor's pool, adopted (warm_restart.c): it exists, reserved as far as its
         * owner got, so there is nothing to admit. What /dev/shm has left is still shown. */
        kvp_shm_gate_probe(KVP_SHM_DIR, &probe);
        *seen = (struct kvp_gate_seen){.probed = true, .probe = probe};
        log_debug("Serving the adopted segment /dev/shm/%s", seg->name);
        return 0;
    }
    if (!cfg->shm_enabled || cfg->shm_backend == KVP_SHM_NONE) {
        snprintf(reason, reason_size, "SHM disabled by configuration");
    } else if (cfg->shm_backend == KVP_SHM_MEMFD) {
        kvp_mem_gate_probe(&probe);
        *seen = (struct kvp_gate_seen){.probed = true, .memory = true, .probe = probe};
        if (gate_allows(kvp_mem_gate_decide(size, &probe, log_line, sizeof(log_line), reason,
                                            reason_size),
                        log_line)) {
            rc = kvp_segment_create_memfd(seg, size, why, sizeof(why));
            if (rc == -ECANCELED)
                return rc;
            if (rc) {
                log_warn("Cannot create the memfd segment (%s). Disabling SHM transport.", why);
                snprintf(reason, reason_size, "SHM disabled: %s", why);
            }
        }
    } else {
        kvp_shm_gate_probe(KVP_SHM_DIR, &probe);
        *seen = (struct kvp_gate_seen){.probed = true, .probe = probe};
        /* With warm restart the pool's index (1/64 of it) lives in /dev/shm too: a pool whose
         * index could not fit is not admitted. */
        uint64_t need = size + kvp_warm_index_bytes(cfg);
        if (gate_allows(kvp_shm_gate_decide(need, &probe, log_line, sizeof(log_line), reason,
                                            reason_size),
                        log_line)) {
            rc = cfg->shm_name_given
                     ? kvp_segment_create_shared(seg, cfg->shm_name, size, cfg->shm_mode, why,
                                                 sizeof(why))
                     : kvp_segment_create_shared_default(seg, cfg->shm_name, size, cfg->shm_mode,
                                                         why, sizeof(why));
            if (rc == -EBUSY || rc == -EPERM) {
                log_error("Refusing to start: %s", why);
                return rc;
            }
            if (rc == -ECANCELED)
                return rc;
            if (rc) {
                log_warn("Cannot create the shared segment (%s). Disabling SHM transport.", why);
                snprintf(reason, reason_size, "SHM disabled: %s", why);
            }
        }
    }
    if (!seg->shared) {
        rc = kvp_segment_create_private(seg, size);
        if (rc == -ECANCELED)
            return rc;
        if (rc) {
            log_error("Cannot allocate the %" PRIu64 "-byte pool: %s", cfg->l1_size,
                      kvp_strerror(rc));
            return rc;
        }
    }
    return 0;
}

bool kvp_mode_grants_rw(uint32_t file_uid, uint32_t file_gid, uint32_t mode, uint32_t uid,
                        uint32_t gid, const uint32_t *groups, uint32_t ngroups)
{
    if (uid == 0)
        return true;
    /* The first class that matches decides, even when a later one would grant more. */
    if (uid == file_uid)
        return (mode & (S_IRUSR | S_IWUSR)) == (S_IRUSR | S_IWUSR);
    bool member = gid == file_gid;
    for (uint32_t i = 0; i < ngroups && !member; i++)
        member = groups[i] == file_gid;
    if (member)
        return (mode & (S_IRGRP | S_IWGRP)) == (S_IRGRP | S_IWGRP);
    return (mode & (S_IROTH | S_IWOTH)) == (S_IROTH | S_IWOTH);
}

bool kvp_transport_peer_can_map(const struct kvp_segment *seg, int sock, bool got_fd, char *why,
                                size_t why_size)
{
    struct ucred cr;
    socklen_t len = sizeof(cr);
    gid_t groups[KVP_PEER_GROUPS_MAX];
    uint32_t g32[KVP_PEER_GROUPS_MAX], ngroups = 0;
    struct stat st;

    if (!seg->shared) {
        snprintf(why, why_size, "kvpoold has no shared segment");
        return false;
    }
    if (kvp_seg_guard_tripped()) {
        snprintf(why, why_size, "%s", kvp_seg_guard_reason());
        return false;
    }
    if (seg->memfd) {
        if (!got_fd)
            snprintf(why, why_size,
                     "the worker claimed shared memory, but the memfd segment was "
                     "never passed to its connection (MAP_SEGMENT)");
        return got_fd;
    }
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0) {
        snprintf(why, why_size,
                 "the worker claimed shared memory, but its credentials cannot be "
                 "read: %s",
                 kvp_strerror(-errno));
        return false;
    }
    /* Too many groups (ERANGE) or an old kernel: judged on the primary gid alone, which can
     * only refuse a worker that could map, never admit one that cannot. */
    len = sizeof(groups);
    if (getsockopt(sock, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0)
        ngroups = (uint32_t)(len / sizeof(gid_t));
    for (uint32_t i = 0; i < ngroups; i++)
        g32[i] = (uint32_t)groups[i];
    if (fstat(seg->fd, &st) != 0) {
        snprintf(why, why_size,
                 "the worker claimed shared memory, but /dev/shm/%s cannot be "
                 "inspected: %s",
                 seg->name, kvp_strerror(-errno));
        return false;
    }
    if (kvp_mode_grants_rw((uint32_t)st.st_uid, (uint32_t)st.st_gid, (uint32_t)st.st_mode,
                           (uint32_t)cr.uid, (uint32_t)cr.gid, g32, ngroups))
        return true;
    snprintf(why, why_size,
             "the worker claimed shared memory, but uid %u cannot open /dev/shm/%s (owner uid %u, "
             "group %u, mode %04o)",
             (unsigned)cr.uid, seg->name, (unsigned)st.st_uid, (unsigned)st.st_gid,
             (unsigned)(st.st_mode & 07777));
    return false;
}
