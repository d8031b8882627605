/*
 * transport.c - the daemon-wide transport decision (see transport.h).
 *
 * Design. The decision is made once, at start-up, and never revisited: a pool either lives in
 * shared memory whose every page was reserved before the first worker could map it, or in
 * private memory with the inline transport for everybody. The steps, each logged:
 *   1. --shm-name "" or --shm-backend none: "SHM disabled by configuration";
 *   2. the capacity gate (shm_gate.c): /dev/shm free space for a posix segment, the memory
 *      available to the daemon (MemAvailable, the cgroup's memory.max) for memfd;
 *   3. the segment itself (segment.c), reserved page by page (posix_fallocate), so that no
 *      access can fault later; a reservation that fails (something filled /dev/shm after the
 *      gate) falls back to private memory with the reason;
 *   4. private memory when any of the above said no.
 * Only a segment name held by a live daemon is fatal: every other failure degrades to the
 * inline transport with a reason that the start-up line, the registrations and the status
 * report repeat.
 *
 * Threads: the main thread, during start-up only.
 */
#include "core/transport.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "common/errors.h"
#include "core/shm_gate.h"

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
        if (gate_allows(kvp_shm_gate_decide(size, &probe, log_line, sizeof(log_line), reason,
                                            reason_size),
                        log_line)) {
            rc = kvp_segment_create_shared(seg, cfg->shm_name, size, cfg->shm_mode, why,
                                           sizeof(why));
            if (rc == -EBUSY) {
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
