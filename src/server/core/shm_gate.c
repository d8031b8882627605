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
#include "core/shm_gate.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __linux__
#include <sys/statvfs.h>
#endif

#include "common/errors.h"

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

/* The wording of one gate's messages. */
struct gate_words {
    const char *verify_log;   /* "Cannot verify <this>; disabling SHM mode." */
    const char *verify_short; /* "SHM disabled: cannot verify <this> (...)" */
    const char *capacity;     /* "Insufficient <this>: need N bytes, have M bytes." */
    const char *probe;        /* what failed, before the errno text */
};

static enum kvp_gate_verdict decide(uint64_t need, const struct kvp_gate_probe *probe,
                                    const struct gate_words *w, char *log, size_t log_size,
                                    char *reason, size_t reason_size)
{
    if (probe->err) {
        snprintf(log, log_size, "Cannot verify %s; disabling SHM mode. (%s%s)", w->verify_log,
                 w->probe, kvp_strerror(-probe->err));
        snprintf(reason, reason_size, "SHM disabled: cannot verify %s (%s)", w->verify_short,
                 kvp_strerror(-probe->err));
        return KVP_GATE_UNVERIFIABLE;
    }
    if (probe->free_bytes < need) {
        snprintf(log, log_size,
                 "Insufficient %s: need %" PRIu64 " bytes, have %" PRIu64
                 " bytes. Disabling SHM transport.",
                 w->capacity, need, probe->free_bytes);
        snprintf(reason, reason_size,
                 "SHM disabled: insufficient %s (need %" PRIu64 " bytes, have %" PRIu64 ")",
                 w->capacity, need, probe->free_bytes);
        return KVP_GATE_INSUFFICIENT;
    }
    return KVP_GATE_OK;
}

enum kvp_gate_verdict kvp_shm_gate_decide(uint64_t need, const struct kvp_gate_probe *probe,
                                          char *log, size_t log_size, char *reason,
                                          size_t reason_size)
{
    static const struct gate_words words = {
        .verify_log = "/dev/shm capacity required for SHM transport",
        .verify_short = "/dev/shm capacity",
        .capacity = "/dev/shm capacity",
        .probe = "statvfs: ",
    };
    log[0] = '\0';
    reason[0] = '\0';
#ifndef __linux__
    (void)need;
    (void)probe;
    (void)words;
    snprintf(log, log_size, "Skipping the /dev/shm capacity probe on this platform.");
    return KVP_GATE_SKIPPED;
#else
    return decide(need, probe, &words, log, log_size, reason, reason_size);
#endif
}

uint64_t kvp_cgroup_headroom(const char *memory_max, const char *memory_current)
{
    if (strncmp(memory_max, "max", 3) == 0)
        return UINT64_MAX;
    uint64_t max = strtoull(memory_max, NULL, 10);
    uint64_t cur = strtoull(memory_current, NULL, 10);
    return cur >= max ? 0 : max - cur;
}

/* Reads a small text file into buf. Returns 0 or -errno. */
static int read_small(const char *path, char *buf, size_t size)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -errno;
    size_t n = fread(buf, 1, size - 1, f);
    buf[n] = '\0';
    fclose(f);
    return 0;
}

void kvp_mem_gate_probe(struct kvp_gate_probe *probe)
{
    char buf[4096], path[512], max[64], cur[64];
    *probe = (struct kvp_gate_probe){.err = ENOENT, .free_bytes = UINT64_MAX};

    if (read_small("/proc/meminfo", buf, sizeof(buf)) == 0) {
        const char *p = strstr(buf, "MemAvailable:");
        if (p) {
            probe->free_bytes = strtoull(p + 13, NULL, 10) * 1024;
            probe->err = 0;
        }
    }
    /* cgroup v2: "0::/some/path" in /proc/self/cgroup. */
    if (read_small("/proc/self/cgroup", buf, sizeof(buf)) == 0 && strncmp(buf, "0::", 3) == 0) {
        buf[strcspn(buf, "\n")] = '\0';
        const char *rel = strcmp(buf + 3, "/") == 0 ? "" : buf + 3;
        snprintf(path, sizeof(path), "/sys/fs/cgroup%.400s/memory.max", rel);
        if (read_small(path, max, sizeof(max)) == 0) {
            snprintf(path, sizeof(path), "/sys/fs/cgroup%.400s/memory.current", rel);
            if (read_small(path, cur, sizeof(cur)) != 0)
                snprintf(cur, sizeof(cur), "0");
            uint64_t room = kvp_cgroup_headroom(max, cur);
            if (room < probe->free_bytes)
                probe->free_bytes = room;
            probe->err = 0;
        }
    }
}

enum kvp_gate_verdict kvp_mem_gate_decide(uint64_t need, const struct kvp_gate_probe *probe,
                                          char *log, size_t log_size, char *reason,
                                          size_t reason_size)
{
    static const struct gate_words words = {
        .verify_log = "available memory required for the memfd segment",
        .verify_short = "available memory",
        .capacity = "memory for the memfd segment",
        .probe = "",
    };
    log[0] = '\0';
    reason[0] = '\0';
    return decide(need, probe, &words, log, log_size, reason, reason_size);
}
