/*
 * shm_gate.c - the /dev/shm capacity gate.
 *
 * Before the daemon offers its pool as a shared segment it checks that /dev/shm has room for it.
 * A container's /dev/shm is 64 MiB by default; without this check a sparse segment would be
 * created anyway and the first write past the real capacity would SIGBUS. The check alone is
 * racy (another process may fill /dev/shm after it), so it is only the first gate: segment.c
 * then reserves every page with posix_fallocate, which is exact, and falls back to inline if that
 * fails. This file only decides; it never touches the segment.
 */
#include "shm_gate.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#ifdef __linux__
#include <sys/statvfs.h>
#endif

void kvp_shm_gate_probe(const char *dir, struct kvp_gate_probe *probe)
{
    *probe = (struct kvp_gate_probe){0};
#ifdef __linux__
    struct statvfs st;
    if (statvfs(dir, &st) != 0) {
        probe->err = errno;
        return;
    }
    probe->free_bytes = (uint64_t)st.f_bavail * (uint64_t)st.f_frsize;
#else
    (void)dir;
    probe->err = ENOSYS;
#endif
}

enum kvp_gate_verdict kvp_shm_gate_decide(uint64_t need, const struct kvp_gate_probe *probe,
                                          char *log, size_t log_size, char *reason,
                                          size_t reason_size)
{
    log[0] = '\0';
    reason[0] = '\0';
#ifndef __linux__
    (void)need;
    (void)probe;
    snprintf(log, log_size, "Skipping the /dev/shm capacity probe on this platform.");
    return KVP_GATE_SKIPPED;
#else
    if (probe->err) {
        snprintf(log, log_size,
                 "Cannot verify /dev/shm capacity required for SHM transport; disabling SHM "
                 "mode. (statvfs: %s)",
                 strerror(probe->err));
        snprintf(reason, reason_size, "SHM disabled: cannot verify /dev/shm capacity (%s)",
                 strerror(probe->err));
        return KVP_GATE_UNVERIFIABLE;
    }
    if (probe->free_bytes < need) {
        snprintf(log, log_size,
                 "Insufficient /dev/shm capacity: need %" PRIu64 " bytes, have %" PRIu64
                 " bytes. Disabling SHM transport.",
                 need, probe->free_bytes);
        snprintf(reason, reason_size,
                 "SHM disabled: insufficient /dev/shm capacity (need %" PRIu64
                 " bytes, have %" PRIu64 ")",
                 need, probe->free_bytes);
        return KVP_GATE_INSUFFICIENT;
    }
    return KVP_GATE_OK;
#endif
}
