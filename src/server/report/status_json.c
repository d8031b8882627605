/*
 * status_json.c - the status JSON document (GET /api/status), built with jansson from a snapshot.
 *
 * Design. Everything comes from one snapshot (snapshot.c), taken before any text is made, and
 * from what start-up fixed and never changes afterwards (configuration, the segment, the SHM
 * decision and what the capacity gate measured). So no lock is held here, and a reader that is
 * slow to take the document delays nobody.
 *
 * Field names are an interface (probes, dashboards, the `kvpool` command line): docs/HTTP.md
 * lists each one. Fields are added, never renamed. Byte counts and counters are JSON integers;
 * times are RFC 3339 strings in UTC; a value that does not apply is null rather than absent, so
 * that a reader can tell "none" from "this daemon does not report it".
 *
 * Every instance and every client is reported with the front end that registered or serves it
 * ("front_end": "kvpool", "lmcache"; owner.h), and every transport by its own name
 * (kvp_reg_transport_name(): "shm", "inline", "pickle", "envelope", ...), never folded into
 * another.
 *
 * "warm_restart" says how this daemon started (core/warm_restart.h, copied into the snapshot
 * as snap->warm): "adopted" with what it found in the pool a previous kvpoold left (after a
 * crash or a planned restart, SIGUSR2) and what it dropped, or "cold" with the reason a pool it
 * found was refused. The chunks adopted but not read yet, and those found corrupt on their
 * first read, are the gauge and counter of stats.h beside it (warm_restart_unverified_chunks,
 * warm_restart_corrupt_chunks): this object is the start's, those change while it serves.
 *
 * Strings that come from workers (instance ids, model names, reasons) are not guaranteed to be
 * UTF-8, which JSON requires: such a string is reported with every non-ASCII byte replaced by
 * '?', rather than dropped.
 *
 * Threads: any thread, once the server has started.
 */
#include "report/status_json.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/seg_header.h"
#include "common/units.h"
#include "core/daemon.h"
#include "core/seg_guard.h"
#include "core/snapshot.h"
#include "core/stats.h"
#include "core/warm_restart.h"
#include "l2/l2.h"

/* Building state: the first allocation failure makes the whole document fail. */
struct doc {
    bool bad;
};

/* Adds v to object o under key. Either may be NULL after a failed allocation: jansson then
 * fails, and frees v. */
static void put(struct doc *d, json_t *o, const char *key, json_t *v)
{
    if (json_object_set_new(o, key, v) != 0)
        d->bad = true;
}

static void append(struct doc *d, json_t *a, json_t *v)
{
    if (json_array_append_new(a, v) != 0)
        d->bad = true;
}

/* Counts never reach 2^63; clamping keeps a corrupt value from turning negative. */
static json_t *jint(uint64_t v)
{
    return json_integer(v > INT64_MAX ? INT64_MAX : (json_int_t)v);
}

/* A string, with the non-ASCII bytes of one that is not valid UTF-8 replaced by '?'. */
static json_t *jstr(const char *s)
{
    json_t *v = json_string(s);
    if (v)
        return v;
    char *copy = strdup(s);
    if (!copy)
        return NULL;
    for (char *p = copy; *p; p++)
        if ((unsigned char)*p >= 0x80)
            *p = '?';
    v = json_string(copy);
    free(copy);
    return v;
}

/* A string, or null when it is empty. */
static json_t *jstr_or_null(const char *s)
{
    return s && s[0] ? jstr(s) : json_null();
}

/* RFC 3339 in UTC with milliseconds: 2026-12-02T12:31:15.714Z. */
static json_t *jtime(int64_t ms)
{
    char buf[40];
    struct tm tm;
    time_t t = (time_t)(ms / 1000);
    if (!gmtime_r(&t, &tm))
        return json_null();
    size_t n = strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, sizeof(buf) - n, ".%03dZ", (int)(ms % 1000));
    return json_string(buf);
}

static const char *backend_name(const struct kvp_config *cfg)
{
    if (!cfg->shm_enabled || cfg->shm_backend == KVP_SHM_NONE)
        return "none";
    return cfg->shm_backend == KVP_SHM_MEMFD ? "memfd" : "posix";
}

/* "shm": the daemon-wide decision, made once at start-up (transport.c). */
static json_t *shm_object(struct doc *d, const struct kvp_server *s)
{
    json_t *o = json_object();
    const struct kvp_gate_seen *g = &s->gate;
    bool probed_ok = g->probed && g->probe.err == 0;

    put(d, o, "enabled", json_boolean(s->seg.shared));
    put(d, o, "backend", json_string(backend_name(&s->cfg)));
    put(d, o, "name", jstr_or_null(s->seg.shared && !s->seg.memfd ? s->seg.name : ""));
    put(d, o, "pool_size", jint(s->cfg.l1_size));
    put(d, o, "segment_size", s->seg.shared ? jint(s->seg.size) : json_null());
    put(d, o, "disabled_reason", jstr_or_null(s->seg.shared ? "" : s->shm_reason));
    put(d, o, "dev_shm_free_bytes",
        probed_ok && !g->memory ? jint(g->probe.free_bytes) : json_null());
    put(d, o, "memory_available_bytes",
        probed_ok && g->memory ? jint(g->probe.free_bytes) : json_null());
    return o;
}

/*
 * "l2": the L2 tier (l2.h), null with --l2 off. Its URL is the masked one (no password). up,
 * state and reason come from one reading of the tier, so that they agree.
 */
static json_t *l2_object(struct doc *d, const struct kvp_server *s, const struct kvp_snapshot *snap)
{
    struct kvp_l2_gauges g;
    if (!s->l2)
        return json_null();
    kvp_l2_get_gauges(s->l2, &g);
    json_t *o = json_object();
    put(d, o, "url", jstr(kvp_l2_name(s->l2)));
    put(d, o, "up", json_boolean(g.up));
    put(d, o, "state", json_string(kvp_l2_state_name(g.state)));
    put(d, o, "reason", jstr_or_null(g.up ? "" : g.reason));
    put(d, o, "backlog_chunks", jint(snap->gauges[KVP_GAUGE_l2_backlog_chunks]));
    put(d, o, "backlog_bytes", jint(snap->gauges[KVP_GAUGE_l2_backlog_bytes]));
    put(d, o, "queue_bytes", jint(s->cfg.l2_queue_bytes));
    put(d, o, "connections", jint(s->cfg.l2_connections));
    put(d, o, "ttl_s", jint(s->cfg.l2_ttl_s));
    put(d, o, "timeout_ms", jint(s->cfg.l2_timeout_ms));
    return o;
}

static json_t *pool_object(struct doc *d, const struct kvp_snapshot *snap)
{
    json_t *o = json_object();
    const uint64_t *v = snap->gauges;
    put(d, o, "capacity_bytes", jint(v[KVP_GAUGE_pool_size]));
    put(d, o, "reserved_bytes", jint(v[KVP_GAUGE_pool_reserved]));
    put(d, o, "warming", json_boolean(v[KVP_GAUGE_pool_reserved] < v[KVP_GAUGE_pool_size]));
    put(d, o, "used_bytes", jint(v[KVP_GAUGE_pool_used]));
    put(d, o, "largest_free_bytes", jint(v[KVP_GAUGE_pool_largest_free]));
    put(d, o, "objects", jint(v[KVP_GAUGE_objects_committed]));
    put(d, o, "reserved_objects", jint(v[KVP_GAUGE_objects_reserved]));
    put(d, o, "expired_objects", jint(v[KVP_GAUGE_objects_expired]));
    put(d, o, "pinned_objects", jint(v[KVP_GAUGE_objects_pinned]));
    return o;
}

/*
 * "warm_restart": what this start did with the pool a previous kvpoold left (snap->warm):
 * kind "adopted" or "cold"; previous_pid and reason null when they do not apply (no pool was
 * found, or it was adopted).
 */
static json_t *warm_object(struct doc *d, const struct kvp_snapshot *snap)
{
    const struct kvp_warm_report *w = &snap->warm;
    json_t *o = json_object();
    json_t *dropped = json_object();

    put(d, o, "enabled", json_boolean(w->enabled));
    put(d, o, "kind", json_string(w->adopted ? "adopted" : "cold"));
    put(d, o, "planned", json_boolean(w->adopted && w->planned));
    put(d, o, "previous_pid", w->previous_pid ? jint(w->previous_pid) : json_null());
    put(d, o, "reason", jstr_or_null(w->reason));
    put(d, o, "adopted_chunks", jint(w->adopted_chunks));
    put(d, o, "adopted_bytes", jint(w->adopted_bytes));
    put(d, o, "dropped_chunks", jint(w->dropped_chunks));
    put(d, dropped, "bad_seal", jint(w->dropped_bad_seal));
    put(d, dropped, "out_of_range", jint(w->dropped_out_of_range));
    put(d, dropped, "overlap", jint(w->dropped_overlap));
    put(d, o, "dropped", dropped);
    put(d, o, "duration_ms", jint(w->duration_ms));
    return o;
}

/* The chunk's shape in words: "K and V, 32 layers, 256 tokens, 1024 values per token", or "one
 * plane (MLA, or K and V fused), ..." for a single-plane layout, which LMCache calls use_mla
 * whichever it is (vLLM's CPU cache of a GQA model is one). */
static json_t *layout_words(const struct kvp_registration *r)
{
    char buf[160];
    const uint32_t *sh = r->layout.shape;
    if (r->layout.ndim == 4)
        snprintf(buf, sizeof(buf), "K and V, %u layers, %u tokens, %u values per token", sh[1],
                 sh[2], sh[3]);
    else if (r->layout.ndim == 3)
        snprintf(buf, sizeof(buf),
                 "one plane (MLA, or K and V fused), %u layers, %u tokens, %u values per token",
                 sh[0], sh[1], sh[2]);
    else
        snprintf(buf, sizeof(buf), "%u dimensions", r->layout.ndim);
    return json_string(buf);
}

static json_t *instance_object(struct doc *d, const struct kvp_instance_view *iv)
{
    const struct kvp_registration *r = &iv->reg;
    bool shm = r->transport == KVP_REG_SHM;
    json_t *o = json_object();
    json_t *shape = json_array();

    for (uint32_t i = 0; i < r->layout.ndim && i < 4; i++)
        append(d, shape, jint(r->layout.shape[i]));
    put(d, o, "instance_id", jstr(r->spec.instance_id));
    put(d, o, "model_name", jstr(r->spec.model_name));
    put(d, o, "world_size", jint(r->spec.world_size));
    put(d, o, "worker_rank", jint(r->spec.worker_rank));
    put(d, o, "dtype", jstr(r->spec.dtype));
    put(d, o, "use_mla", json_boolean(r->spec.use_mla));
    put(d, o, "chunk_shape", shape);
    put(d, o, "layout", layout_words(r));
    put(d, o, "chunk_bytes", jint(r->layout.bytes));
    put(d, o, "transport", json_string(kvp_reg_transport_name(r->transport)));
    put(d, o, "fallback_reason", jstr_or_null(shm ? "" : r->reason));
    put(d, o, "front_end", jstr_or_null(r->frontend));
    put(d, o, "pid", r->owner_pid > 0 ? json_integer(r->owner_pid) : json_null());
    put(d, o, "client_id", jint(r->owner));
    put(d, o, "connected_since", jtime(r->connected_since_ms));
    put(d, o, "stored_chunks", jint(iv->stored_chunks));
    put(d, o, "stored_bytes", jint(iv->stored_bytes));
    put(d, o, "retrieved_chunks", jint(iv->retrieved_chunks));
    put(d, o, "retrieved_bytes", jint(iv->retrieved_bytes));
    return o;
}

static json_t *clients_object(struct doc *d, const struct kvp_server *s,
                              const struct kvp_snapshot *snap)
{
    json_t *o = json_object();
    json_t *list = json_array();
    for (uint32_t i = 0; i < snap->nclients; i++) {
        const struct kvp_owner_view *c = &snap->clients[i];
        json_t *e = json_object();
        uint32_t ninst = 0;
        for (uint32_t k = 0; k < snap->ninstances; k++)
            ninst += snap->instances[k].reg.owner == c->id;
        put(d, e, "id", jint(c->id));
        put(d, e, "front_end", jstr_or_null(c->frontend));
        put(d, e, "pid", c->pid > 0 ? json_integer(c->pid) : json_null());
        put(d, e, "uid", jint(c->uid));
        put(d, e, "connected_since", jtime(c->connected_since_ms));
        put(d, e, "instances", jint(ninst));
        append(d, list, e);
    }
    /* One count per front end, from the owners (kvp_owners_count_groups()): kvpool's
     * connections (what --max-clients bounds; always there), each other front end's clients. */
    json_t *by = json_object();
    put(d, by, KVP_OWN_FRONTEND, jint(snap->gauges[KVP_GAUGE_connections]));
    for (uint32_t i = 0; i < snap->nclient_groups; i++)
        if (strcmp(snap->client_groups[i].frontend, KVP_OWN_FRONTEND) != 0)
            put(d, by, snap->client_groups[i].frontend, jint(snap->client_groups[i].count));
    put(d, o, "connected", jint(snap->gauges[KVP_GAUGE_connections]));
    put(d, o, "max", jint(s->cfg.max_clients));
    put(d, o, "by_front_end", by);
    put(d, o, "list", list);
    return o;
}

/* "lmcache": the LMCache front end (--lmcache), null when it is off: its address and what
 * it serves (its instances and clients from the snapshot's groups; its requests and refusals
 * are counters). */
static json_t *lmcache_object(struct doc *d, const struct kvp_server *s,
                              const struct kvp_snapshot *snap)
{
    if (!s->cfg.lmcache[0])
        return json_null();
    json_t *o = json_object();
    uint64_t instances = 0, clients = 0;
    for (uint32_t i = 0; i < snap->ninstance_groups; i++)
        if (strcmp(snap->instance_groups[i].frontend, "lmcache") == 0)
            instances += snap->instance_groups[i].count;
    for (uint32_t i = 0; i < snap->nclient_groups; i++)
        if (strcmp(snap->client_groups[i].frontend, "lmcache") == 0)
            clients += snap->client_groups[i].count;
    put(d, o, "address", jstr(s->cfg.lmcache));
    put(d, o, "instances", jint(instances));
    put(d, o, "clients", jint(clients));
    put(d, o, "requests", jint(snap->counters[KVP_CTR_lmcache_requests]));
    return o;
}

/* "counters" and "gauges": every row of the maps in stats.h, by its STATS name. */
static json_t *map_object(struct doc *d, const struct kvp_stat_desc *desc, const uint64_t *v,
                          uint32_t n)
{
    json_t *o = json_object();
    for (uint32_t i = 0; i < n; i++)
        put(d, o, desc[i].name, jint(v[i]));
    return o;
}

/* The histogram families that have a key in the status (stats.h; kvpool's protocol:
 * "requests"): under that key, per series (its label's value, as the metrics' op label), count
 * and total seconds. Whatever registered the family, this file knows it only by its key. */
static void put_hist_families(struct doc *d, json_t *root, const struct kvp_snapshot *snap)
{
    for (uint32_t i = 0; i < snap->nhists;) {
        const struct kvp_hist_family *fam = snap->hists[i].family;
        json_t *o = fam->status_key && fam->label ? json_object() : NULL;
        for (; i < snap->nhists && snap->hists[i].family == fam; i++) {
            if (!o)
                continue;
            const struct kvp_hist_copy *h = &snap->hists[i].h;
            json_t *e = json_object();
            put(d, e, "count", jint(h->count));
            put(d, e, "seconds_total", json_real((double)h->sum_ns / 1e9));
            put(d, o, snap->hists[i].value, e);
        }
        if (o)
            put(d, root, fam->status_key, o);
    }
}

/* Before start-up has finished there is no store to report on: who is starting, since when. */
static char *starting_json(struct kvp_server *s)
{
    struct doc d = {.bad = false};
    json_t *root = json_object();
    put(&d, root, "version", json_string(KVP_DAEMON_VERSION));
    put(&d, root, "state", json_string(atomic_load(&s->stopping) ? "stopping" : "starting"));
    put(&d, root, "reason", json_string("start-up has not finished (the pool is being reserved)"));
    put(&d, root, "pid", json_integer((json_int_t)getpid()));
    put(&d, root, "started_at", jtime(s->started_wall_ms));
    put(&d, root, "uptime_s", jint((kvp_mono_ms() - s->started_mono_ms) / 1000));
    put(&d, root, "chunk_tokens", jint(s->cfg.chunk_tokens));
    put(&d, root, "socket", jstr(s->cfg.socket_path));
    char *text = d.bad ? NULL : json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return text;
}

/* How long after a request of an unknown instance the daemon reports itself degraded. */
#define UNKNOWN_WINDOW_MS 60000u

/* Why shared memory is off although the configuration asked for it, in words that name the
 * remedy; "" when it is on or was turned off by the configuration. */
static void shm_health(const struct kvp_server *s, char *out, size_t size)
{
    const struct kvp_gate_seen *g = &s->gate;
    const char *reason = s->shm_reason;
    char have[32], need[32], fit[32];

    out[0] = '\0';
    if (kvp_seg_guard_tripped()) {
        snprintf(out, size,
                 "SHM disabled: the shared segment shrank under kvpoold (another process "
                 "truncated it); workers copy their chunks through the socket until kvpoold is "
                 "restarted");
        return;
    }
    if (s->seg.shared || !g->probed)
        return;
    if (strncmp(reason, "SHM disabled: ", 14) == 0)
        reason += 14;
    if (g->probe.err) {
        snprintf(out, size, "SHM disabled: %s; workers copy their chunks through the socket",
                 reason);
        return;
    }
    uint64_t want = s->cfg.l1_size + KVP_SEG_HEADER;
    uint64_t most = g->probe.free_bytes > KVP_SEG_HEADER ? g->probe.free_bytes - KVP_SEG_HEADER : 0;
    most = most / (1u << 20) * (1u << 20);
    kvp_human_bytes((double)g->probe.free_bytes, have, sizeof(have));
    kvp_human_bytes((double)want, need, sizeof(need));
    kvp_human_bytes((double)most, fit, sizeof(fit));
    if (g->memory)
        snprintf(out, size,
                 "SHM disabled: %s of memory available, the pool needs %s: set --l1-size to at "
                 "most %s, or give kvpoold more memory; workers copy their chunks through the "
                 "socket",
                 have, need, fit);
    else
        snprintf(out, size,
                 "SHM disabled: /dev/shm has %s free, the pool needs %s: give /dev/shm at least "
                 "%s (docker run --shm-size; in Kubernetes an emptyDir with medium Memory), or "
                 "set --l1-size to at most %s; workers copy their chunks through the socket",
                 have, need, need, fit);
}

/* The health check's reasons: each part of the daemon that does not do its whole job. */
static json_t *health_reasons(struct doc *d, struct kvp_server *s)
{
    json_t *reasons = json_array();
    char reason[KVP_L2_REASON_MAX + 512];

    if (s->l2) {
        struct kvp_l2_gauges g;
        kvp_l2_get_gauges(s->l2, &g);
        if (!g.up) {
            snprintf(reason, sizeof(reason), "l2 %s: %s", kvp_l2_state_name(g.state), g.reason);
            append(d, reasons, jstr(reason));
        }
    }
    shm_health(s, reason, sizeof(reason));
    if (reason[0])
        append(d, reasons, jstr(reason));
    uint64_t last = atomic_load_explicit(&s->unknown_instance_ms, memory_order_relaxed);
    uint64_t now = kvp_mono_ms();
    if (last && now - last < UNKNOWN_WINDOW_MS) {
        snprintf(reason, sizeof(reason),
                 "requests name instances this kvpoold has not registered (%" PRIu64
                 " so far, the last %" PRIu64 " s ago): workers of an earlier kvpoold that did "
                 "not register again; LMCache workers do on their next heartbeats, restart one "
                 "that does not",
                 atomic_load_explicit(&kvp_counters.unknown_instance_requests,
                                      memory_order_relaxed),
                 (now - last) / 1000);
        append(d, reasons, jstr(reason));
    }
    return reasons;
}

/* "health": what GET /api/healthcheck answers while the daemon serves. */
static json_t *health_object(struct doc *d, struct kvp_server *s)
{
    json_t *o = json_object();
    json_t *reasons = health_reasons(d, s);
    bool degraded = json_array_size(reasons) > 0;
    put(d, o, "status", json_string("healthy"));
    put(d, o, "degraded", json_boolean(degraded));
    put(d, o, "reasons", reasons);
    return o;
}

char *kvp_status_health_degraded(struct kvp_server *s)
{
    struct doc d = {.bad = false};
    json_t *health = health_object(&d, s);
    char *text = NULL;
    if (!d.bad && json_is_true(json_object_get(health, "degraded")))
        text = json_dumps(health, JSON_PRESERVE_ORDER);
    json_decref(health);
    return text;
}

char *kvp_status_json(struct kvp_server *s)
{
    struct kvp_snapshot snap;

    /* Acquire: pairs with the release in kvp_server_start(), after which the store, the
     * registry and the segment may be read. */
    if (!atomic_load_explicit(&s->serving, memory_order_acquire))
        return starting_json(s);
    if (kvp_snapshot_take(s, KVP_SNAP_LISTS, &snap))
        return NULL;
    char *text = kvp_status_json_render(s, &snap);
    kvp_snapshot_free(&snap);
    return text;
}

char *kvp_status_json_render(struct kvp_server *s, const struct kvp_snapshot *snap)
{
    struct doc d = {.bad = false};
    json_t *root = json_object();
    json_t *instances = json_array();
    for (uint32_t i = 0; i < snap->ninstances; i++)
        append(&d, instances, instance_object(&d, &snap->instances[i]));

    put(&d, root, "version", json_string(KVP_DAEMON_VERSION));
    put(&d, root, "state", json_string(atomic_load(&s->stopping) ? "stopping" : "serving"));
    put(&d, root, "pid", json_integer((json_int_t)getpid()));
    put(&d, root, "started_at", jtime(snap->started_ms));
    put(&d, root, "uptime_s", jint(snap->gauges[KVP_GAUGE_uptime_seconds]));
    put(&d, root, "chunk_tokens", jint(s->cfg.chunk_tokens));
    put(&d, root, "socket", jstr(s->cfg.socket_path));
    put(&d, root, "pool", pool_object(&d, snap));
    put(&d, root, "health", health_object(&d, s));
    put(&d, root, "shm", shm_object(&d, s));
    put(&d, root, "warm_restart", warm_object(&d, snap));
    put(&d, root, "l2", l2_object(&d, s, snap));
    put(&d, root, "instances", instances);
    put(&d, root, "clients", clients_object(&d, s, snap));
    put(&d, root, "lmcache", lmcache_object(&d, s, snap));
    put(&d, root, "counters", map_object(&d, kvp_counter_desc, snap->counters, KVP_NCOUNTERS));
    put(&d, root, "gauges", map_object(&d, kvp_gauge_desc, snap->gauges, KVP_NGAUGES));
    put_hist_families(&d, root, snap);

    char *text = d.bad ? NULL
                       : json_dumps(root,
                                    JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(root);
    return text;
}
