/*
 * metrics.c - the Prometheus text exposition format 0.0.4 (GET /metrics), from a snapshot.
 *
 * Design. Every metric comes from the maps of stats.h (kvp_counter_desc, kvp_gauge_desc), the
 * same rows the STATS reply and the status JSON render, so the three reports cannot drift: a
 * counter added to the map appears everywhere. A family is written once, HELP and TYPE first,
 * then one sample per row of the family (rows of a family are adjacent in the map and differ by
 * their label's value). Counters get the "_total" suffix; rows without a family (totals that are
 * a sum of a labelled family) are left to sum() on the Prometheus side.
 *
 * Histograms have one renderer, write_hists(), for every family registered with the core
 * (stats.h): the request latencies of each front end, declared in its own folder (kvp/ by
 * opcode, lmc/ by LMCache operation), and the store lock's hold time with its maximum beside it.
 * It knows a family only by what the family declares (name, help, label, label values, bucket
 * bounds, a maximum gauge), so this layer includes no front end. Buckets are cumulative, as
 * the format wants: each "le" bucket counts every value at most that long. The stored buckets
 * are not cumulative (one increment per value), and _count is their sum, so the +Inf bucket
 * always equals _count.
 *
 * Labels carry only the daemon's own values (transport, cause, op, version, front_end): no
 * worker-supplied string ever becomes a label, so the series count is bounded. The instances and
 * the clients are counted by front end (owner.h: "kvpool", "lmcache") from the snapshot's groups,
 * which come from the registry and the owner list, whichever front end made them:
 * kvpool_instances{front_end,transport} and kvpool_connected_clients{front_end} (and its
 * former name kvpool_clients{front_end}, the same numbers, for one release). The daemon's own
 * protocol is always served, so its series are always there (0 when it has none), as they were
 * before other front ends existed; another front end's appear with its first instance or client. A
 * transport is named by kvp_reg_transport_name(), so a new one is a new label value, not a
 * miscount. Front-end names are escaped as label values all the same (they never need it).
 *
 * LMCache's own names (lmcache_mp_l1_write_chunks_total, lmcache_mp_lookup_hit_tokens_total,
 * ...: what `lmcache server` exports through OpenTelemetry and what LMCache's dashboards and
 * tests read) are written too, as aliases computed from kvpool's counters (lmc_aliases[]):
 * LMCache counts lookups in tokens where kvpool counts chunks, so those are the chunk counts
 * times --chunk-size (docs/HTTP.md has the table).
 *
 * How this daemon started (snap->warm, core/warm_restart.h) is a handful of gauges of its own,
 * fixed at start-up: kvpool_warm_restart_info{kind,planned} 1 (kind "adopted" when it adopted
 * the pool a previous kvpoold left, "cold" otherwise), what it adopted, what it dropped by
 * reason (the three reasons always, 0 on a cold start) and how long that took. The chunks still
 * to verify and those found corrupt change while it serves: they are rows of stats.h's maps.
 *
 * Threads: any thread, once the server has started; no lock is held while formatting.
 */
#include "report/metrics.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/daemon.h"
#include "core/snapshot.h"
#include "core/stats.h"
#include "core/warm_restart.h"

/* Writes the rows of one map; counter adds the "_total" suffix and the counter TYPE. */
static void write_map(FILE *f, const struct kvp_stat_desc *desc, const uint64_t *v, uint32_t n,
                      bool counter)
{
    const char *prev = NULL;
    const char *suffix = counter ? "_total" : "";

    for (uint32_t i = 0; i < n; i++) {
        const struct kvp_stat_desc *d = &desc[i];
        if (!d->family)
            continue;
        if (!prev || strcmp(prev, d->family) != 0) {
            fprintf(f, "# HELP kvpool_%s%s %s\n", d->family, suffix, d->help);
            fprintf(f, "# TYPE kvpool_%s%s %s\n", d->family, suffix, counter ? "counter" : "gauge");
            prev = d->family;
        }
        if (d->label[0])
            fprintf(f, "kvpool_%s%s{%s=\"%s\"} %" PRIu64 "\n", d->family, suffix, d->label,
                    d->value, v[i]);
        else
            fprintf(f, "kvpool_%s%s %" PRIu64 "\n", d->family, suffix, v[i]);
    }
}

/* A label value as the text format wants it: backslash, double quote and line feed escaped. */
static void write_label_value(FILE *f, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            fprintf(f, "\\%c", *v);
        else if (*v == '\n')
            fputs("\\n", f);
        else
            fputc(*v, f);
    }
}

/* The front end that is always there: kvpool's own protocol (kvp/). */
#define OWN_FRONTEND KVP_OWN_FRONTEND

/* One sample of kvpool_instances. */
static void write_instances_sample(FILE *f, const char *frontend, uint8_t transport, uint64_t n)
{
    fputs("kvpool_instances{front_end=\"", f);
    write_label_value(f, frontend);
    fprintf(f, "\",transport=\"%s\"} %" PRIu64 "\n", kvp_reg_transport_name(transport), n);
}

/* kvpool_instances{front_end,transport}: kvpool's shm and inline always, then every group of
 * the snapshot (groups are sorted; kvpool's two are written where they fall). */
static void write_instances(FILE *f, const struct kvp_snapshot *snap)
{
    static const uint8_t own[] = {KVP_REG_SHM, KVP_REG_INLINE};
    bool have[2] = {false, false};

    fprintf(f, "# HELP kvpool_instances registered instances, by the front end that registered "
               "them and the transport they use\n"
               "# TYPE kvpool_instances gauge\n");
    for (uint32_t i = 0; i < snap->ninstance_groups; i++) {
        const struct kvp_instance_group *g = &snap->instance_groups[i];
        for (int k = 0; k < 2; k++)
            have[k] |= strcmp(g->frontend, OWN_FRONTEND) == 0 && g->transport == own[k];
        write_instances_sample(f, g->frontend, g->transport, g->count);
    }
    for (int k = 0; k < 2; k++)
        if (!have[k])
            write_instances_sample(f, OWN_FRONTEND, own[k], 0);
}

/* The owners of each front end (a kvpool connection, an LMCache worker) as family name,
 * kvpool's always. */
static void write_clients(FILE *f, const struct kvp_snapshot *snap, const char *name,
                          const char *help)
{
    bool own = false;

    fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
    for (uint32_t i = 0; i < snap->nclient_groups; i++) {
        const struct kvp_owner_group *g = &snap->client_groups[i];
        own |= strcmp(g->frontend, OWN_FRONTEND) == 0;
        fprintf(f, "%s{front_end=\"", name);
        write_label_value(f, g->frontend);
        fprintf(f, "\"} %" PRIu32 "\n", g->count);
    }
    if (!own)
        fprintf(f, "%s{front_end=\"" OWN_FRONTEND "\"} 0\n", name);
}

/* The labels of a histogram sample: {op="x",le="0.001"}, {le="0.001"}, {op="x"} or nothing.
 * le is NULL for _sum and _count. */
static void write_hist_labels(FILE *f, const struct kvp_snap_hist *h, const char *le)
{
    const char *label = h->family->label;
    if (!label && !le)
        return;
    fputc('{', f);
    if (label) {
        fprintf(f, "%s=\"", label);
        write_label_value(f, h->value);
        fputc('"', f);
    }
    if (label && le)
        fputc(',', f);
    if (le)
        fprintf(f, "le=\"%s\"", le);
    fputc('}', f);
}

/* One series: cumulative buckets (the stored ones are not), +Inf, _sum and _count. */
static void write_hist_series(FILE *f, const struct kvp_snap_hist *h)
{
    const struct kvp_hist_family *fam = h->family;
    const struct kvp_hist_bounds *b = fam->bounds;
    uint64_t cum = 0;
    char le[32];

    for (uint32_t i = 0; i < b->n; i++) {
        cum += h->h.bucket[i];
        kvp_hist_le(b, i, le, sizeof(le));
        fprintf(f, "%s_bucket", fam->name);
        write_hist_labels(f, h, le);
        fprintf(f, " %" PRIu64 "\n", cum);
    }
    fprintf(f, "%s_bucket", fam->name);
    write_hist_labels(f, h, "+Inf");
    fprintf(f, " %" PRIu64 "\n%s_sum", h->h.count, fam->name);
    write_hist_labels(f, h, NULL);
    fprintf(f, " %.9f\n%s_count", (double)h->h.sum_ns / 1e9, fam->name);
    write_hist_labels(f, h, NULL);
    fprintf(f, " %" PRIu64 "\n", h->h.count);
}

/*
 * Every histogram of the snapshot, whatever front end or part of the core registered its
 * family (stats.h): a family's series are adjacent in the snapshot, so each family is one
 * block, HELP and TYPE first, then its maximum as a gauge of its own when it has one. A family
 * without a series in the snapshot (nothing recorded yet) is left out.
 */
static void write_hists(FILE *f, const struct kvp_snapshot *snap)
{
    for (uint32_t i = 0; i < snap->nhists;) {
        const struct kvp_hist_family *fam = snap->hists[i].family;
        uint32_t end = i;
        while (end < snap->nhists && snap->hists[end].family == fam)
            end++;
        fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", fam->name, fam->help, fam->name);
        for (uint32_t k = i; k < end; k++)
            write_hist_series(f, &snap->hists[k]);
        if (fam->max_name) {
            fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", fam->max_name, fam->max_help,
                    fam->max_name);
            for (uint32_t k = i; k < end; k++) {
                fputs(fam->max_name, f);
                write_hist_labels(f, &snap->hists[k], NULL);
                fprintf(f, " %.9f\n", (double)snap->hists[k].h.max_ns / 1e9);
            }
        }
        i = end;
    }
}

/* The start's warm-restart figures (snap->warm): gauges, since they describe this start and
 * never grow. */
static void write_warm(FILE *f, const struct kvp_snapshot *snap)
{
    const struct kvp_warm_report *w = &snap->warm;

    fprintf(f,
            "# HELP kvpool_warm_restart_info How this kvpoold started: kind \"adopted\" (it "
            "adopted the pool a previous kvpoold left; planned \"true\" when that one left it on "
            "purpose, SIGUSR2) or \"cold\"; the value is 1\n"
            "# TYPE kvpool_warm_restart_info gauge\n"
            "kvpool_warm_restart_info{kind=\"%s\",planned=\"%s\"} 1\n",
            w->adopted ? "adopted" : "cold", w->adopted && w->planned ? "true" : "false");
    fprintf(f,
            "# HELP kvpool_warm_restart_adopted_chunks Chunks adopted at start-up from the pool "
            "a previous kvpoold left\n"
            "# TYPE kvpool_warm_restart_adopted_chunks gauge\n"
            "kvpool_warm_restart_adopted_chunks %" PRIu64 "\n",
            w->adopted_chunks);
    fprintf(f,
            "# HELP kvpool_warm_restart_adopted_bytes Bytes of the chunks adopted at start-up\n"
            "# TYPE kvpool_warm_restart_adopted_bytes gauge\n"
            "kvpool_warm_restart_adopted_bytes %" PRIu64 "\n",
            w->adopted_bytes);
    fprintf(f,
            "# HELP kvpool_warm_restart_dropped_chunks Records of the adopted pool's index "
            "dropped at start-up, by reason (bad_seal: damaged or half-written; out_of_range: "
            "past the pool; overlap: inside another chunk)\n"
            "# TYPE kvpool_warm_restart_dropped_chunks gauge\n"
            "kvpool_warm_restart_dropped_chunks{reason=\"bad_seal\"} %" PRIu64 "\n"
            "kvpool_warm_restart_dropped_chunks{reason=\"out_of_range\"} %" PRIu64 "\n"
            "kvpool_warm_restart_dropped_chunks{reason=\"overlap\"} %" PRIu64 "\n",
            w->dropped_bad_seal, w->dropped_out_of_range, w->dropped_overlap);
    fprintf(f,
            "# HELP kvpool_warm_restart_duration_seconds How long the adoption took at start-up "
            "(checking the index and taking its chunks)\n"
            "# TYPE kvpool_warm_restart_duration_seconds gauge\n"
            "kvpool_warm_restart_duration_seconds %.3f\n",
            (double)w->duration_ms / 1e3);
}

/* One LMCache metric as an alias of a kvpool counter, times the chunk size when LMCache counts
 * tokens. */
struct lmc_alias {
    const char *name; /* without "_total" */
    const char *help;
    enum kvp_counter_id ctr;
    bool tokens;
};

static const struct lmc_alias lmc_aliases[] = {
    {"lmcache_mp_l1_write_chunks",
     "Chunks written to L1 (alias of kvpool_store_chunks_total, summed over transports)",
     KVP_CTR_store_chunks_committed, false},
    {"lmcache_mp_l1_read_chunks",
     "Chunks read from L1 (alias of kvpool_retrieve_chunks_total, summed over transports)",
     KVP_CTR_retrieve_chunks, false},
    {"lmcache_mp_l1_evicted_chunks", "Chunks evicted from L1 (alias of kvpool_evictions_total)",
     KVP_CTR_evictions, false},
    {"lmcache_mp_l1_allocation_failure_chunks",
     "Chunks not stored for lack of evictable space in L1 (alias of "
     "kvpool_allocation_failures_total)",
     KVP_CTR_store_chunks_no_space, false},
    {"lmcache_mp_lookup_requested_tokens",
     "Tokens of full chunks submitted for lookup (kvpool_lookup_chunks_total x --chunk-size)",
     KVP_CTR_lookup_chunks, true},
    {"lmcache_mp_lookup_hit_tokens",
     "Tokens found by lookups, the leading run of hits (kvpool_lookup_hit_chunks_total x "
     "--chunk-size)",
     KVP_CTR_lookup_hit_chunks, true},
};

static void write_lmc_aliases(FILE *f, const struct kvp_snapshot *snap)
{
    uint64_t C = snap->gauges[KVP_GAUGE_chunk_tokens];
    for (size_t i = 0; i < sizeof(lmc_aliases) / sizeof(lmc_aliases[0]); i++) {
        const struct lmc_alias *a = &lmc_aliases[i];
        uint64_t v = snap->counters[a->ctr] * (a->tokens ? C : 1);
        fprintf(f, "# HELP %s_total %s\n# TYPE %s_total counter\n%s_total %" PRIu64 "\n", a->name,
                a->help, a->name, a->name, v);
    }
}

char *kvp_metrics_text(struct kvp_server *s, size_t *len)
{
    struct kvp_snapshot snap;

    if (kvp_snapshot_take(s, 0, &snap))
        return NULL;
    char *text = kvp_metrics_render(&snap, len);
    kvp_snapshot_free(&snap);
    return text;
}

char *kvp_metrics_render(const struct kvp_snapshot *snap, size_t *len)
{
    char *text = NULL;
    size_t size = 0;

    FILE *f = open_memstream(&text, &size);
    if (!f)
        return NULL;
    fprintf(f,
            "# HELP kvpool_build_info The version of kvpoold, as a label; the value is 1\n"
            "# TYPE kvpool_build_info gauge\n"
            "kvpool_build_info{version=\"%s\"} 1\n",
            KVP_DAEMON_VERSION);
    write_map(f, kvp_gauge_desc, snap->gauges, KVP_NGAUGES, false);
    write_instances(f, snap);
    write_clients(f, snap, "kvpool_connected_clients",
                  "clients being served, by front end: connections of kvpool's protocol (what "
                  "--max-clients bounds), LMCache workers");
    write_clients(f, snap, "kvpool_clients",
                  "the same as kvpool_connected_clients (kept for one release: use that)");
    write_warm(f, snap);
    write_map(f, kvp_counter_desc, snap->counters, KVP_NCOUNTERS, true);
    write_hists(f, snap);
    write_lmc_aliases(f, snap);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) {
        free(text);
        return NULL;
    }
    *len = size;
    return text;
}
