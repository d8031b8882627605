/*
 * shm_gate.h - the /dev/shm capacity gate: may the pool be offered as shared memory?
 *
 * The decision is split from the probe so that tests can inject any statvfs outcome.
 */
#ifndef KVP_SHM_GATE_H
#define KVP_SHM_GATE_H

#include <stddef.h>
#include <stdint.h>

#define KVP_SHM_DIR "/dev/shm"

enum kvp_gate_verdict {
    KVP_GATE_OK,           /* enough free space: try to create the segment */
    KVP_GATE_INSUFFICIENT, /* free space smaller than the segment: inline only */
    KVP_GATE_UNVERIFIABLE, /* statvfs failed: inline only, conservatively */
    KVP_GATE_SKIPPED,      /* not Linux: no probe, try the segment */
};

/* What statvfs said: err is 0 and free_bytes valid, or err is the errno of the failure. */
struct kvp_gate_probe {
    int err;
    uint64_t free_bytes;
};

/* Runs statvfs on dir (f_bavail * f_frsize). */
void kvp_shm_gate_probe(const char *dir, struct kvp_gate_probe *probe);

/*
 * Decides for a segment of need bytes. Writes the WARN line to log (exactly the documented
 * text; "" when nothing is to be logged) and a short reason for the per-instance transport log
 * to reason ("" when OK).
 */
enum kvp_gate_verdict kvp_shm_gate_decide(uint64_t need, const struct kvp_gate_probe *probe,
                                          char *log, size_t log_size, char *reason,
                                          size_t reason_size);

/*
 * The memfd backend's gate: memory this process may still use, the smaller of MemAvailable
 * (/proc/meminfo) and the headroom of its cgroup v2 memory.max, when there is one.
 * err is set when neither can be read.
 */
void kvp_mem_gate_probe(struct kvp_gate_probe *probe);

/* Decides for a memfd segment of need bytes; same outputs as kvp_shm_gate_decide(). */
enum kvp_gate_verdict kvp_mem_gate_decide(uint64_t need, const struct kvp_gate_probe *probe,
                                          char *log, size_t log_size, char *reason,
                                          size_t reason_size);

/* Parses cgroup v2 files; exposed for tests. "max" means unlimited (UINT64_MAX). */
uint64_t kvp_cgroup_headroom(const char *memory_max, const char *memory_current);

#endif /* KVP_SHM_GATE_H */
