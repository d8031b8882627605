/*
 * snapshot.c - one copy of everything the daemon reports (see snapshot.h).
 *
 * Design. Reports are rendered from a copy, never from live structures, so that no lock is held
 * while text is formatted and a slow reader (an HTTP client, a `kvpool stats`) can never delay a
 * worker. Each owner is asked in turn, under its own lock, for a copy: the store for its gauges
 * (kvp_store_get_gauges), the registry for its instances and their transfer counts and for their
 * count by front end and transport, the owner list (owner.c) for the clients of every front end
 * and their count by front end, of which the kvpool protocol's is its connection count (the one
 * number --max-clients bounds). Instances and clients come from the registry and the owner list
 * only, never from a front end's own list of connections, so an instance registered through any
 * front end is reported the same way, with its front end's name. The locks
 * are leaf locks and are taken one after the other, so the snapshot is a set of consistent parts
 * rather than one instant: an instance may be counted in "instances" and have disconnected by the
 * time the client list is copied. Counters and the histograms of every registered family
 * (stats.h) are relaxed atomic loads, no lock at all: the snapshot copies what a family
 * declares (its series and their label values) without knowing whose operations they are.
 *
 * Memory: the lists are allocated before any lock is taken, at their bound (KVP_MAX_INSTANCES
 * instances; the owners counted just before, and a few more), so a copy never allocates under
 * a lock.
 *
 * Threads: any thread, once the server has started (the store and the registry exist).
 */
#include "core/snapshot.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/daemon.h"
#include "core/owner.h"
#include "l2/l2.h"

/* Copies the series of every registered family into out (at most cap); returns how many. */
static uint32_t copy_hists(struct kvp_snap_hist *out, uint32_t cap)
{
    const struct kvp_hist_family *fams[KVP_HIST_FAMILIES];
    uint32_t nfams = kvp_hist_families(fams, KVP_HIST_FAMILIES), n = 0;

    for (uint32_t k = 0; k < nfams; k++) {
        const struct kvp_hist_family *f = fams[k];
        for (uint32_t i = 0; i < f->nseries && n < cap; i++) {
            if (f->label && !f->values[i])
                continue;
            kvp_hist_read(&f->series[i], f->bounds, &out[n].h);
            if (!f->always && out[n].h.count == 0)
                continue;
            out[n].family = f;
            out[n].value = f->label ? f->values[i] : NULL;
            n++;
        }
    }
    return n;
}

/* The gauge of the instances on a transport; NULL for a transport without one. */
static uint64_t *instances_gauge(uint64_t *v, uint8_t transport)
{
    switch (transport) {
    case KVP_REG_SHM:
        return &v[KVP_GAUGE_instances_shm];
    case KVP_REG_INLINE:
        return &v[KVP_GAUGE_instances_inline];
    case KVP_REG_PICKLE:
        return &v[KVP_GAUGE_instances_pickle];
    case KVP_REG_ENVELOPE:
        return &v[KVP_GAUGE_instances_envelope];
    default:
        return NULL;
    }
}

int kvp_snapshot_take(struct kvp_server *s, unsigned flags, struct kvp_snapshot *snap)
{
    struct kvp_store_gauges g;
    uint32_t ninst;

    *snap = (struct kvp_snapshot){.taken_ms = kvp_wall_ms(), .started_ms = s->started_wall_ms};
    if (flags & KVP_SNAP_LISTS) {
        /* Owners that arrive between the count and the copy may be left out; a few more
         * entries make that rare, and the copy never allocates under the lock. */
        uint32_t max_clients = kvp_owners_count(&s->owners) + 16;
        snap->instances = malloc(sizeof(*snap->instances) * KVP_MAX_INSTANCES);
        snap->clients = malloc(sizeof(*snap->clients) * max_clients);
        if (!snap->instances || !snap->clients) {
            kvp_snapshot_free(snap);
            return -ENOMEM;
        }
        snap->ninstances = kvp_registry_list(&s->registry, snap->instances, KVP_MAX_INSTANCES);
        snap->nclients = kvp_owners_list(&s->owners, snap->clients, max_clients);
    }

    kvp_counters_read(snap->counters);
    snap->nhists = copy_hists(snap->hists, KVP_SNAP_HISTS);

    kvp_store_get_gauges(&s->store, &g);
    snap->ninstance_groups = kvp_registry_count_groups(&s->registry, snap->instance_groups,
                                                       KVP_SNAP_GROUPS, &ninst);
    snap->nclient_groups = kvp_owners_count_groups(&s->owners, snap->client_groups,
                                                   KVP_SNAP_GROUPS);
    /* The connections of the daemon's own protocol (what --max-clients bounds) are the owners
     * of its front end: counted with the others, never read from the front end's own list. */
    uint32_t nconns = 0;
    for (uint32_t i = 0; i < snap->nclient_groups; i++)
        if (strcmp(snap->client_groups[i].frontend, KVP_OWN_FRONTEND) == 0)
            nconns = snap->client_groups[i].count;

    /* Every gauge of KVP_GAUGE_MAP gets its value here: a new one must be added below. */
    _Static_assert(KVP_NGAUGES == 22, "a gauge of KVP_GAUGE_MAP has no value in the snapshot");
    uint64_t *v = snap->gauges;
    /* The instances by transport, summed over the front ends (a transport without a gauge of
     * its own is still in kvpool_instances{front_end,transport} and in "instances"). */
    for (uint32_t i = 0; i < snap->ninstance_groups; i++) {
        uint64_t *by = instances_gauge(v, snap->instance_groups[i].transport);
        if (by)
            *by += snap->instance_groups[i].count;
    }
    v[KVP_GAUGE_pool_size] = g.pool_size;
    v[KVP_GAUGE_pool_reserved] = g.pool_reserved;
    v[KVP_GAUGE_pool_used] = g.pool_used;
    v[KVP_GAUGE_pool_largest_free] = g.largest_free;
    v[KVP_GAUGE_objects_committed] = g.committed;
    v[KVP_GAUGE_objects_reserved] = g.reserved;
    v[KVP_GAUGE_objects_expired] = g.expired;
    v[KVP_GAUGE_objects_pinned] = g.pinned;
    v[KVP_GAUGE_instances] = ninst;
    v[KVP_GAUGE_connections] = nconns;
    v[KVP_GAUGE_max_clients] = s->cfg.max_clients;
    v[KVP_GAUGE_shm_enabled] = s->seg.shared;
    v[KVP_GAUGE_chunk_tokens] = s->cfg.chunk_tokens;
    v[KVP_GAUGE_uptime_seconds] = (kvp_mono_ms() - s->started_mono_ms) / 1000;
    v[KVP_GAUGE_warm_restart_unverified_chunks] = g.unverified;
    /* Written by the main thread before start-up published the server (serving). */
    snap->warm = s->warm.report;
    struct kvp_l2_gauges l2;
    kvp_l2_get_gauges(s->l2, &l2);
    v[KVP_GAUGE_l2_up] = l2.up;
    v[KVP_GAUGE_l2_backlog_chunks] = l2.backlog_chunks;
    v[KVP_GAUGE_l2_backlog_bytes] = l2.backlog_bytes;
    return 0;
}

void kvp_snapshot_free(struct kvp_snapshot *snap)
{
    free(snap->instances);
    free(snap->clients);
    snap->instances = NULL;
    snap->clients = NULL;
    snap->ninstances = snap->nclients = 0;
}
