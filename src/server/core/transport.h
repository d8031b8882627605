/*
 * transport.h - the daemon-wide transport decision: whether the pool lives in shared memory
 * (workers may use the zero-copy transport) or in private memory (every worker is inline).
 * Each worker's own choice, made at registration, is in registry.c and src/client/shm_map.c.
 */
#ifndef KVP_TRANSPORT_H
#define KVP_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
 * Creates the pool memory in seg, unless seg already holds a segment adopted by a warm restart
 * (warm_restart.h), which is kept as it is (reason "", the gate only probed for the report): a
 * shared segment (posix or memfd, per cfg) when the
 * configuration and the capacity gate allow it and its reservation succeeds, else private
 * memory. reason (reason_size bytes) receives why SHM is off, or "" when it is on; each step
 * logs what it decided (the gate's WARN lines); seen receives what the gate measured. Returns 0,
 * -ECANCELED when a stop signal ended the reservation, -EBUSY or -EPERM (a live daemon or
 * another uid holds the segment name the operator gave; logged as the start-up ERROR), or another
 * negative errno when not even private memory could be had (logged).
 */
int kvp_transport_setup(const struct kvp_config *cfg, struct kvp_segment *seg, char *reason,
                        size_t reason_size, struct kvp_gate_seen *seen);

/*
 * Would a process of uid, primary gid and supplementary groups (ngroups of them) be let open a
 * file of file_uid:file_gid with permission bits mode for reading and writing? The kernel's
 * rule: uid 0 may; the owner class if uid is the owner, else the group class if any of its
 * groups is the file's, else the others class; the class must grant both read and write.
 * (POSIX ACLs and capabilities other than root's are not considered.)
 */
bool kvp_mode_grants_rw(uint32_t file_uid, uint32_t file_gid, uint32_t mode, uint32_t uid,
                        uint32_t gid, const uint32_t *groups, uint32_t ngroups);

/*
 * Evidence that the worker at the other end of socket sock can map seg, so that its claim to
 * use the shm transport may be believed (docs/SECURITY.md, "The trust model per transport").
 * memfd backend: got_fd, the descriptor was passed to this connection (MAP_SEGMENT). posix
 * backend: the peer's credentials at connect time (SO_PEERCRED, SO_PEERGROUPS) against the
 * segment file's owner, group and mode now (kvp_mode_grants_rw()). No segment, or one the
 * daemon stopped using (seg_guard.h): no. Returns true, or false with the reason, naming the
 * uid, in why.
 */
bool kvp_transport_peer_can_map(const struct kvp_segment *seg, int sock, bool got_fd, char *why,
                                size_t why_size);

#endif /* KVP_TRANSPORT_H */
