/*
 * transport.h - the daemon-wide transport decision: whether the pool lives in shared memory
 * (workers may use the zero-copy transport) or in private memory (every worker is inline).
 * Each worker's own choice, made at registration, is in registry.c and src/client/shm_map.c.
 */
#ifndef KVP_TRANSPORT_H
#define KVP_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "base/config.h"
#include "core/segment.h"
#include "core/shm_gate.h"

/* What the capacity gate measured at start-up, kept for the status report (status.c), so that
 * it shows the numbers the decision was made on instead of probing again. */
struct kvp_gate_seen {
    bool probed;                 /* false when the configuration disabled SHM: no gate ran */
    bool memory;                 /* memfd backend: the probe is of memory, not of /dev/shm */
    struct kvp_gate_probe probe; /* free bytes, or the errno of the probe */
};

/*
 * Creates the pool memory in seg: a shared segment (posix or memfd, per cfg) when the
 * configuration and the capacity gate allow it and its reservation succeeds, else private
 * memory. reason (reason_size bytes) receives why SHM is off, or "" when it is on; each step
 * logs what it decided (the gate's WARN lines); seen receives what the gate measured. Returns 0,
 * -ECANCELED when a stop signal ended the reservation, -EBUSY (a live daemon holds the segment
 * name; logged as the start-up ERROR), or another negative errno when not even private memory could
 * be had (logged).
 */
int kvp_transport_setup(const struct kvp_config *cfg, struct kvp_segment *seg, char *reason,
                        size_t reason_size, struct kvp_gate_seen *seen);

#endif /* KVP_TRANSPORT_H */
