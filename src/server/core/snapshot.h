/*
 * snapshot.h - one copy of everything the daemon reports (counters, gauges, the histograms of
 * every registered family, the instances and the connected clients), taken with each lock held
 * only for copying, so that the renderers (the STATS reply in kvp/handlers.c,
 * report/status_json.c, report/metrics.c) format it without holding any lock. Every instance
 * and client is there, whichever front end registered it (owner.h, registry.h), each with its
 * front end's name.
 */
#ifndef KVP_SNAPSHOT_H
#define KVP_SNAPSHOT_H

#include <stdbool.h>
#include <stdint.h>

#include "core/owner.h"
#include "core/registry.h"
#include "core/stats.h"
#include "core/warm_restart.h"

struct kvp_server;

/* Groups (front end x transport, front end) a snapshot keeps: front ends and transports are
 * the daemon's own names, a few of each. */
#define KVP_SNAP_GROUPS 32

/* The front end that is always served: the daemon's own protocol (kvp/). Its owners are the
 * connections --max-clients bounds (the gauge "connections"), and the reports show its series
 * even when it has no instance or client. */
#define KVP_OWN_FRONTEND "kvpool"

/* Histograms a snapshot copies, over every registered family (stats.h): the native opcodes,
 * the LMCache operations served so far and the store lock come to fewer than half of it. */
#define KVP_SNAP_HISTS 96

/* One histogram of a snapshot: its family, its label's value (NULL in a family without a
 * label) and its copy. */
struct kvp_snap_hist {
    const struct kvp_hist_family *family;
    const char *value;
    struct kvp_hist_copy h;
};

struct kvp_snapshot {
    int64_t taken_ms;   /* wall clock of the snapshot, ms since the epoch */
    int64_t started_ms; /* wall clock of the daemon's start */
    uint64_t counters[KVP_NCOUNTERS];
    uint64_t gauges[KVP_NGAUGES];
    /* The series of every registered family, in registration order, a family's series
     * adjacent: all of those of an "always" family, the recorded ones of the others. */
    struct kvp_snap_hist hists[KVP_SNAP_HISTS];
    uint32_t nhists;

    /* The instances by front end and transport, the clients (owners) by front end: always
     * taken, for the labelled families of /metrics (kvpool_instances, kvpool_clients). */
    struct kvp_instance_group instance_groups[KVP_SNAP_GROUPS];
    uint32_t ninstance_groups;
    struct kvp_owner_group client_groups[KVP_SNAP_GROUPS];
    uint32_t nclient_groups;

    /* What this start did with the pool a previous kvpoold left (warm_restart.h): fixed at
     * start-up. */
    struct kvp_warm_report warm;

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
 * registry and owner-list locks one after the other (never two at once), each for a copy. Returns
 * 0, or -ENOMEM (nothing to free). Free with kvp_snapshot_free().
 */
int kvp_snapshot_take(struct kvp_server *s, unsigned flags, struct kvp_snapshot *snap);

/* Frees the lists of a snapshot. Safe on a zeroed one. */
void kvp_snapshot_free(struct kvp_snapshot *snap);

#endif /* KVP_SNAPSHOT_H */
