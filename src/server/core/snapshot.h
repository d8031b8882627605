/*
 * snapshot.h - one copy of everything the daemon reports (counters, gauges, the latency
 * histogram, the instances and the connected clients), taken with each lock held only for
 * copying, so that the renderers (the STATS reply in kvp/handlers.c, report/status_json.c,
 * report/metrics.c) format it without holding any lock. Every instance and client is there,
 * whichever front end registered it (owner.h, registry.h), each with its front end's name.
 */
#ifndef KVP_SNAPSHOT_H
#define KVP_SNAPSHOT_H

#include <stdbool.h>
#include <stdint.h>

#include "core/owner.h"
#include "core/registry.h"
#include "core/stats.h"

struct kvp_server;

/* Groups (front end x transport, front end) a snapshot keeps: front ends and transports are
 * the daemon's own names, a few of each. */
#define KVP_SNAP_GROUPS 32

struct kvp_snapshot {
    int64_t taken_ms;   /* wall clock of the snapshot, ms since the epoch */
    int64_t started_ms; /* wall clock of the daemon's start */
    uint64_t counters[KVP_NCOUNTERS];
    uint64_t gauges[KVP_NGAUGES];
    struct kvp_latency_copy latency[KVP_OP_MAX_];                 /* by opcode */
    struct kvp_hold_copy lock_hold;                               /* the store lock's hold times */
    struct kvp_lmc_latency_copy lmc_latency[KVP_LMC_OP_REPORTED]; /* LMCache operations seen */
    uint32_t nlmc_latency;

    /* The instances by front end and transport, the clients (owners) by front end: always
     * taken, for the labelled families of /metrics (kvpool_instances, kvpool_clients). */
    struct kvp_instance_group instance_groups[KVP_SNAP_GROUPS];
    uint32_t ninstance_groups;
    struct kvp_owner_group client_groups[KVP_SNAP_GROUPS];
    uint32_t nclient_groups;

    /* With KVP_SNAP_LISTS only (else NULL and 0). */
    struct kvp_instance_view *instances;
    uint32_t ninstances;
    struct kvp_owner_view *clients; /* the owners of every front end, newest first */
    uint32_t nclients;
};

/* Flags of kvp_snapshot_take(). */
#define KVP_SNAP_LISTS 1u /* also copy the instances and the clients (owners) */

/*
 * Takes a snapshot of s, which must have started (store and registry ready). Takes the store,
 * registry, owner-list and connection-list locks one after the other (never two at once), each for
 * a copy. Returns 0, or -ENOMEM (nothing to free). Free with kvp_snapshot_free().
 */
int kvp_snapshot_take(struct kvp_server *s, unsigned flags, struct kvp_snapshot *snap);

/* Frees the lists of a snapshot. Safe on a zeroed one. */
void kvp_snapshot_free(struct kvp_snapshot *snap);

#endif /* KVP_SNAPSHOT_H */
