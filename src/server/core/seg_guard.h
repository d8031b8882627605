/*
 * seg_guard.h - the daemon outlives a POSIX segment that shrinks under it (seg_guard.c).
 *
 * Any process that can open the posix segment read-write (a worker of the daemon's user, or of
 * its group with --shm-mode 0660) can ftruncate it. Every page beyond the new end then faults:
 * a read or write of the daemon's own is SIGBUS, a copy the kernel makes for it (a socket send
 * or receive straight from or into the pool) is EFAULT. Once armed, the guard turns that into
 * the end of shared memory: the daemon's mapping of the segment is replaced by private
 * anonymous memory at the same address (so that no access can fault again), and the daemon
 * serves every worker inline from then on (server.c). The memfd backend is sealed against
 * shrinking and needs no guard.
 */
#ifndef KVP_SEG_GUARD_H
#define KVP_SEG_GUARD_H

#include <stdbool.h>
#include <stdint.h>

/*
 * Arms the guard over a posix segment (segment.h): its mapping [base, base + size) and its
 * descriptor fd. Installs a SIGBUS handler that trips the guard for a fault inside the mapping
 * and passes any other SIGBUS on to the handler it replaces. Call once, on the main thread,
 * after the segment exists and before any worker can reach it (not for memfd or private
 * memory). Returns 0 or a negative errno (sigaction).
 */
int kvp_seg_guard_arm(uint8_t *base, uint64_t size, int fd);

/* Disarms the guard and puts the previous SIGBUS handler back; before the segment goes. */
void kvp_seg_guard_disarm(void);

/*
 * Trips the guard if the segment file is smaller now than the mapping (fstat): call it after an
 * EFAULT on a copy to or from the pool, and from time to time. Returns whether the guard has
 * tripped (now or earlier). Any thread; lock-free.
 */
bool kvp_seg_guard_check(void);

/* Whether the guard has tripped: the pool is private memory, shared memory is no longer used. */
bool kvp_seg_guard_tripped(void);

/* 0 until the guard trips, then 1: work queued before the trip can tell it happened since. */
uint32_t kvp_seg_guard_epoch(void);

/*
 * True exactly once, for the first caller after the guard tripped: that caller reports it and
 * stops the use of shared memory (server.c). *size_now receives the size the file had when the
 * trip was seen (-1 if unknown).
 */
bool kvp_seg_guard_take_report(int64_t *size_now);

/* Why shared memory is no longer offered, for registrations after the trip. */
const char *kvp_seg_guard_reason(void);

#endif /* KVP_SEG_GUARD_H */
