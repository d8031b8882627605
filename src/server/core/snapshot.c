/*
 * snapshot.c - one copy of everything the daemon reports (see snapshot.h).
 *
 * Design. Reports are rendered from a copy, never from live structures, so that no lock is held
 * while text is formatted and a slow reader (an HTTP client, a `kvpool stats`) can never delay a
 * worker. Each owner is asked in turn, under its own lock, for a copy: the store for its gauges
 * (kvp_store_get_gauges), the registry for its instances and their transfer counts and for their
 * count by front end and transport, the owner list (owner.c) for the clients of every front end
 * and their count by front end, the server for the kvpool protocol's connection count (the one
 * number --max-clients bounds). Instances and clients come from the registry and the owner list
 * only, never from a front end's own list of connections, so an instance registered through any
 * front end is reported the same way, with its front end's name. The locks
 * are leaf locks and are taken one after the other, so the snapshot is a set of consistent parts
 * rather than one instant: an instance may be counted in "instances" and have disconnected by the
 * time the client list is copied. Counters and the latency and lock-hold histograms are relaxed
 * atomic loads, no lock at all.
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

int kvp_snapshot_take(struct kvp_server *s, unsigned flags, struct kvp_snapshot *snap)
{
    struct kvp_store_gauges g;
    uint32_t ninst, nshm = 0, ninline = 0;

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
    kvp_latency_read(snap->latency);
    kvp_lock_hold_read(&snap->lock_hold);
    snap->nlmc_latency = kvp_lmc_latency_read(snap->lmc_latency, KVP_LMC_OP_REPORTED);

    kvp_store_get_gauges(&s->store, &g);
    snap->ninstance_groups = kvp_registry_count_groups(&s->registry, snap->instance_groups,
                                                       KVP_SNAP_GROUPS, &ninst);
    for (uint32_t i = 0; i < snap->ninstance_groups; i++) {
        nshm += snap->instance_groups[i].transport == KVP_REG_SHM ? snap->instance_groups[i].count
                                                                  : 0;
        ninline += snap->instance_groups[i].transport == KVP_REG_INLINE
                       ? snap->instance_groups[i].count
                       : 0;
    }
    snap->nclient_groups = kvp_owners_count_groups(&s->owners, snap->client_groups,
                                                   KVP_SNAP_GROUPS);
    pthread_mutex_lock(&s->conns_lock);
    uint32_t nconns = s->nconns;
    pthread_mutex_unlock(&s->conns_lock);

    /* Every gauge of KVP_GAUGE_MAP gets its value here: a new one must be added below. */
    _Static_assert(KVP_NGAUGES == 19, "a gauge of KVP_GAUGE_MAP has no value in the snapshot");
    uint64_t *v = snap->gauges;
    v[KVP_GAUGE_pool_size] = g.pool_size;
    v[KVP_GAUGE_pool_reserved] = g.pool_reserved;
    v[KVP_GAUGE_pool_used] = g.pool_used;
    v[KVP_GAUGE_pool_largest_free] = g.largest_free;
    v[KVP_GAUGE_objects_committed] = g.committed;
    v[KVP_GAUGE_objects_reserved] = g.reserved;
    v[KVP_GAUGE_objects_expired] = g.expired;
    v[KVP_GAUGE_objects_pinned] = g.pinned;
    v[KVP_GAUGE_instances] = ninst;
    v[KVP_GAUGE_instances_shm] = nshm;
    v[KVP_GAUGE_instances_inline] = ninline; /* a third transport counts in neither */
    v[KVP_GAUGE_connections] = nconns;
    v[KVP_GAUGE_max_clients] = s->cfg.max_clients;
    v[KVP_GAUGE_shm_enabled] = s->seg.shared;
    v[KVP_GAUGE_chunk_tokens] = s->cfg.chunk_tokens;
    v[KVP_GAUGE_uptime_seconds] = (kvp_mono_ms() - s->started_mono_ms) / 1000;
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
