/*
 * instances.c - LMCache's instances, liveness, lookup read locks, prefetch jobs and sessions,
 * over the core's operations (see instances.h; docs/LMCACHE.md, "Semantics").
 *
 * Instances. A registration makes an instance: one core owner (frontend "lmcache") and one
 * core registration of its layout (instance id "lmcache-<id>", logged by the registry as
 * "Instance <id> ...", the number as the worker sent it and LMCache logs it), through
 * kvp_op_register(), which validates it, chooses the transport and logs it. LMCache's
 * registration has no rank: the rank comes with each request (the key's worker_id), and every
 * keyed operation asks the core for the keys of that rank (struct kvp_key_src.other_rank). A
 * refused registration is remembered (so that its requests get the negative answers at once
 * and the refusal is logged once) but holds nothing.
 *
 * Pending pairs. A prepare_store that reserved something, and a prepare_retrieve that pinned,
 * leave a pending entry under the instance and the key's identity (a 128-bit digest of the
 * fields LMCache compares: model, world size, worker, tokens, range, salt); the matching commit
 * pops it and ends the core's hold. A second prepare of the same key replaces the first (whose
 * hold is ended: aborted or unpinned), as upstream overwrites its pending map.
 *
 * Lookups. The scheduler's lookup names no worker: a chunk is a hit only if every rank of the
 * world size has it (every key names its rank, a single-plane layout too: LMCache's MLA workers
 * name one rank for their replicas themselves), and the hit count
 * is the leading run of hits. For each rank the lookup runs as an instance that serves that rank
 * (the one whose requests named it, else any instance of the model and world size: tensor-
 * parallel ranks share a layout) with KVP_LOOKUP_PIN, so the chunks found stay pinned for the
 * request's readers: LMCache's lookup read locks. They are held by that instance's owner, so
 * reaping it drops them too. A rank's locks end when num_kv_readers retrieves of that rank
 * have claimed them (each retrieve pins what it reads by itself first), or on
 * free_lookup_locks, end_session, a new lookup of the same request, or after LMCache's read TTL.
 *
 * Prefetch jobs. L1 lookups finish at once, L2 ones are waited for inside the lookup operation,
 * so a job is always done when query or wait see it: they return its hit count (a chunk
 * count) once and 0 afterwards, and for unknown ids.
 *
 * Transports. An instance is offered the shared segment when there is a named one; otherwise its
 * chunks travel inside the messages ("in band"), in the form of its worker's version: a torch
 * pickle up to LMCache 0.5.6 (torch_pickle.h), a tensor envelope from 0.5.7 on (envelope.h; a
 * registration with group_layouts is a 0.5.7 one). Only a commit shows what the worker really
 * does: a commit that carries chunks from an instance offered the segment means its worker
 * could not map it, and moves the instance to the in-band transport of the commit's form for
 * good. Each in-band commit is decoded by its own first byte (kvp_envelope_sniff()), and each
 * in-band retrieve answers in the form the key shows the worker reads: a 0.5.7 key carries
 * token_bytes, an older one token_ids. So the version is decided per message, and workers of
 * every version share one daemon, and their chunks (the keys do not depend on the form).
 *
 * Liveness. Registration, pings with the instance's id and every prepare and commit refresh an
 * instance; a ping also marks it as pinging. lmc_state_tick() reaps an instance silent longer
 * than --lmcache-reap-timeout (pinged) or --lmcache-registration-grace (never pinged): the
 * owner's release frees everything it held, at once, and it is logged. The first ping of a
 * reaped id is answered false, the next true: vLLM's adapter re-registers on that
 * unhealthy-to-healthy edge, so a worker that was only paused gets its cache back.
 *
 * Thread: the listener's only; no lock here (the core takes its own).
 */
#include "lmc/instances.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/log.h"
#include "common/layout.h"
#include "core/daemon.h"
#include "core/ops.h"
#include "core/owner.h"
#include "core/seg_guard.h"
#include "core/stats.h"
#include "lmc/envelope.h"

/* The largest in-band commit is bounded by one value for both forms (lmc_max_value_frame()). */
_Static_assert(KVP_ENVELOPE_TENSOR_OVERHEAD <= KVP_TPICKLE_TENSOR_OVERHEAD &&
                   KVP_ENVELOPE_STREAM_OVERHEAD <= KVP_TPICKLE_STREAM_OVERHEAD,
               "an envelope's overheads exceed the pickle's that bound a frame");

#define JOB_BUCKETS 1024u

struct pending {
    uint64_t hold;      /* the core's reservation or pin-set id */
    uint8_t digest[16]; /* the key's identity */
    uint64_t peer;      /* the connection that prepared it: only it commits (lmc_front.peer) */
    bool read;          /* a prepare_retrieve's pins, else a prepare_store's reservation */
};

struct inst {
    uint64_t iid;
    bool registered; /* owner and core registration exist */
    bool refused;
    char refusal[640];
    struct kvp_owner owner;
    uint32_t handle;
    struct kvp_registration reg;
    struct lmc_register asked; /* what the worker sent, to compare a re-registration */
    bool shm;                  /* the segment was offered */
    bool in_band;              /* its chunks travel in the messages: no segment, or fell back */
    bool tpl_ok;               /* tpl and exp describe its chunk */
    bool etpl_ok;              /* etpl and eexp too */
    uint32_t max_chunks;       /* chunks one in-band commit may carry (what the pool holds) */
    struct kvp_tpickle_expect exp;
    struct kvp_tpickle_template tpl;
    struct kvp_envelope_expect eexp;
    struct kvp_envelope_template etpl;
    int32_t rank;  /* the worker_id of its requests, -1 before the first */
    uint64_t peer; /* the connection that registered it last (--max-instances-per-client) */
    uint64_t last_seen_ms;
    bool pinged;
    struct pending pend[LMC_MAX_PENDING];
    uint32_t npend;
};

/* One rank's lookup read locks of a job. */
struct job_pin {
    uint64_t iid;    /* the instance whose owner holds them */
    uint32_t handle; /* its registration then (a new one has another handle) */
    uint64_t hold;   /* the pin set; 0 when the lookup found nothing in L1 */
    uint32_t rank;
    uint32_t readers_left;
};

struct job {
    char rid[LMC_MAX_REQUEST_ID + 1];
    uint64_t hash;
    uint32_t hits;
    bool consumed;
    uint64_t created_ms;
    uint32_t npins;
    struct job_pin *pins;
    struct job *hnext;         /* bucket chain */
    struct job *older, *newer; /* age list (sentinel: lmc_state.jobs) */
};

/* What the front end remembers of an instance id it no longer has, for the id's pings. */
enum gone_kind {
    GONE_REAPED,       /* reaped or dropped by kvpoold: its next ping is answered false ... */
    GONE_TOLD,         /* ... and the ones after that true */
    GONE_UNREGISTERED, /* unregistered by its worker: its pings are answered true */
};

struct gone {
    uint64_t iid;
    uint8_t kind; /* enum gone_kind */
};

struct lmc_state {
    struct inst *inst[LMC_MAX_INSTANCES];
    uint32_t ninst;
    struct job *buckets[JOB_BUCKETS];
    struct job jobs; /* age list sentinel: jobs.newer is the oldest */
    uint32_t njobs;
    struct gone gone[LMC_MAX_REAPED];
    uint32_t gone_next;
    uint32_t seg_epoch; /* kvp_seg_guard_epoch() when the instances were last checked */
    struct lmc_slot slots[KVP_MAX_CHUNKS];
    uint32_t idx[KVP_MAX_CHUNKS];
    struct kvp_tpickle_tensor tens[KVP_MAX_CHUNKS];   /* a pickle commit's chunks in its frame */
    struct kvp_envelope_tensor etens[KVP_MAX_CHUNKS]; /* an envelope commit's */
    const uint8_t *src[KVP_MAX_CHUNKS];               /* either, in range order */
    const uint8_t *chunks[KVP_MAX_CHUNKS];            /* an in-band retrieve's chunks in the pool */
    struct inst *rin;                                 /* whose in-band retrieve is pinned ... */
    struct kvp_op_slots rres;                         /* ... and what it pinned */
    uint64_t next_reap_ms;
    char msg[KVP_MAX_ERRMSG + 1];
};

/* ---- instances ---- */

static struct inst *find(struct lmc_state *st, uint64_t iid)
{
    for (uint32_t i = 0; i < st->ninst; i++)
        if (st->inst[i]->iid == iid)
            return st->inst[i];
    return NULL;
}

/* Ends every hold of a pending entry: a reservation is aborted, a pin set released. */
static void end_pending(struct inst *in, const struct pending *p, struct lmc_state *st)
{
    if (p->read)
        kvp_op_commit_retrieve(&in->owner, in->handle, p->hold, st->msg, sizeof(st->msg));
    else
        kvp_op_abort_store(&in->owner, in->handle, p->hold, KVP_DROP_ABORT, st->msg,
                           sizeof(st->msg));
}

/* Removes instance in from the table and frees it; its owner's release ends everything it
 * held (reservations, pins, registration). */
static void drop_inst(struct lmc_state *st, struct inst *in)
{
    for (uint32_t i = 0; i < st->ninst; i++) {
        if (st->inst[i] == in) {
            st->inst[i] = st->inst[--st->ninst];
            break;
        }
    }
    if (in->registered)
        kvp_owner_destroy(&in->owner);
    free(in);
}

static struct gone *gone_find(struct lmc_state *st, uint64_t iid)
{
    for (uint32_t i = 0; i < LMC_MAX_REAPED; i++)
        if (st->gone[i].iid == iid && iid != 0)
            return &st->gone[i];
    return NULL;
}

/* Remembers that instance iid is gone (the oldest memory is forgotten when the ring is full). */
static void remember_gone(struct lmc_state *st, uint64_t iid, enum gone_kind kind)
{
    struct gone *g = gone_find(st, iid);
    if (!g) {
        g = &st->gone[st->gone_next];
        st->gone_next = (st->gone_next + 1) % LMC_MAX_REAPED;
    }
    *g = (struct gone){.iid = iid, .kind = (uint8_t)kind};
}

/* Whether LMCache workers can be offered the segment: a named POSIX one, not lost. */
static bool shm_offered(const struct kvp_server *s)
{
    return s->seg.shared && !s->seg.memfd && !kvp_seg_guard_tripped();
}

/* torch's names and aliases onto kvpool's dtype names. */
static const char *canonical_dtype(const char *d)
{
    if (strcmp(d, "half") == 0)
        return "float16";
    if (strcmp(d, "float") == 0)
        return "float32";
    if (strcmp(d, "double") == 0)
        return "float64";
    return d;
}

static bool same_layout(const struct lmc_register *a, const struct lmc_register *b)
{
    return strcmp(a->model_name, b->model_name) == 0 && a->world_size == b->world_size &&
           a->block_size == b->block_size && a->num_layers == b->num_layers &&
           a->hidden_dim == b->hidden_dim && strcmp(a->dtype, b->dtype) == 0 &&
           a->use_mla == b->use_mla && a->num_physical_slots == b->num_physical_slots;
}

static void answer_offer(struct lmc_front *f, const struct inst *in, struct lmc_reg_answer *a)
{
    const struct kvp_server *s = f->srv;
    /* A refused instance still gets the segment: a worker that ignores `error` then runs
     * uncached with empty slot lists instead of gathering and pickling every chunk. */
    bool shm = shm_offered(s) && (in->refused || in->shm);
    snprintf(a->shm_name, sizeof(a->shm_name), "%s", shm ? s->seg.name : "");
    a->pool_size = shm ? s->seg.size : 0;
    snprintf(a->error, sizeof(a->error), "%s", in->refused ? in->refusal : "");
}

/* Why a registration cannot be served, or NULL. */
static const char *refusal(struct lmc_front *f, const struct lmc_register *m, char *buf,
                           size_t size)
{
    uint32_t C = f->srv->cfg.chunk_tokens;
    const char *dtype = canonical_dtype(m->dtype);
    if (m->unsupported[0]) {
        snprintf(buf, size, "%s", m->unsupported);
        return buf;
    }
    if (!kvp_dtype_find(dtype)) {
        snprintf(buf, size, "dtype '%s' is not one kvpool knows (%s)", m->dtype, kvp_dtype_names());
        return buf;
    }
    if (m->num_physical_slots && m->num_physical_slots != C) {
        snprintf(buf, size,
                 "a chunk of %u token slots, but kvpoold's chunk size is %u: start kvpoold "
                 "with --chunk-size %u (the connector's lmcache chunk size)",
                 m->num_physical_slots, C, m->num_physical_slots);
        return buf;
    }
    /* Lookups name a model and a world size only: one dtype per pair, or they could not
     * tell whose chunks to look for. */
    for (uint32_t i = 0; i < f->st->ninst; i++) {
        const struct inst *o = f->st->inst[i];
        if (o->registered && strcmp(o->asked.model_name, m->model_name) == 0 &&
            o->asked.world_size == m->world_size &&
            strcmp(canonical_dtype(o->asked.dtype), dtype) != 0) {
            snprintf(buf, size,
                     "model %s with world size %u is registered with dtype %s (instance %" PRIu64
                     "); one dtype per model and world size",
                     m->model_name, m->world_size, o->asked.dtype, o->iid);
            return buf;
        }
    }
    return NULL;
}

/* The in-band transports' view of an instance's chunk: what a commit must carry, how many
 * chunks at most (what the pool can hold, and KVP_MAX_CHUNKS), the replies' pieces, for the
 * pickle and for the envelope. */
static void in_band_setup(struct lmc_front *f, struct inst *in)
{
    struct kvp_tpickle_layout *l = &in->exp.layout;
    struct kvp_envelope_layout *el = &in->eexp.layout;
    char why[160];
    l->dtype = el->dtype = in->reg.spec.dtype;
    l->ndim = el->ndim = in->reg.layout.ndim;
    for (uint32_t i = 0; i < l->ndim; i++)
        l->shape[i] = el->shape[i] = in->reg.layout.shape[i];
    uint64_t fit = f->srv->cfg.l1_size / in->reg.layout.bytes;
    in->max_chunks = fit < KVP_MAX_CHUNKS ? (uint32_t)fit : KVP_MAX_CHUNKS;
    in->tpl_ok = kvp_tpickle_template_init(&in->tpl, l, why, sizeof(why)) == 0;
    if (!in->tpl_ok)
        log_warn("LMCache instance %" PRIu64 ": its chunks have no pickle form (%s); pickle "
                 "commits will be refused",
                 in->iid, why);
    in->etpl_ok = kvp_envelope_template_init(&in->etpl, el, why, sizeof(why)) == 0;
    if (!in->etpl_ok)
        log_warn("LMCache instance %" PRIu64 ": its chunks have no tensor envelope form (%s); "
                 "envelope commits will be refused",
                 in->iid, why);
}

uint64_t lmc_max_value_frame(uint64_t l1_size)
{
    /* n chunks of b bytes fit the pool (n * b <= l1_size) and n <= KVP_MAX_CHUNKS, so any
     * registration's kvp_tpickle_max_payload() is at most this, and so is its
     * kvp_envelope_max_payload() (smaller overheads, asserted above); 5: a bin32 header. */
    return 5 + KVP_TPICKLE_STREAM_OVERHEAD + l1_size +
           (uint64_t)KVP_MAX_CHUNKS * KVP_TPICKLE_TENSOR_OVERHEAD;
}

void lmc_inst_register(struct lmc_front *f, const struct lmc_register *m, struct lmc_reg_answer *a)
{
    struct lmc_state *st = f->st;
    struct inst *in = find(st, m->instance_id);
    char why[600];

    memset(a, 0, sizeof(*a));
    if (in && in->refused && !same_layout(&in->asked, m)) {
        /* Refused before, asking again with another layout: judged afresh. */
        drop_inst(st, in);
        in = NULL;
    }
    if (in) {
        in->last_seen_ms = f->now_ms;
        in->peer = f->peer; /* its worker may have reconnected */
        if (in->refused || same_layout(&in->asked, m)) {
            log_info("Instance %" PRIu64 " already registered (non-GPU); refreshing liveness",
                     m->instance_id);
        } else {
            /* The first layout stays: chunks were stored in it. */
            log_warn_rl("LMCache instance %" PRIu64
                        " registered again with another layout; keeping the first",
                        m->instance_id);
            answer_offer(f, in, a);
            snprintf(a->error, sizeof(a->error),
                     "instance %" PRIu64 " is already registered with another layout",
                     m->instance_id);
            return;
        }
        answer_offer(f, in, a);
        return;
    }
    /* One peer must not take the table from the others: at most --max-instances-per-client
     * instances (refused ones included: they take a place here too) per connection. */
    uint32_t mine = 0, cap = f->srv->cfg.max_instances_per_client;
    struct inst *oldest_refused = NULL;
    for (uint32_t i = 0; i < st->ninst; i++) {
        struct inst *o = st->inst[i];
        mine += o->peer == f->peer;
        if (o->refused && (!oldest_refused || o->last_seen_ms < oldest_refused->last_seen_ms))
            oldest_refused = o;
    }
    /* A refused registration is only remembered (it holds nothing in the core): the oldest
     * one makes room for a new registration rather than keep it out. */
    if (st->ninst == LMC_MAX_INSTANCES && mine < cap && oldest_refused)
        drop_inst(st, oldest_refused);
    if (st->ninst == LMC_MAX_INSTANCES || mine >= cap) {
        const struct kvp_server *s = f->srv;
        bool shm = shm_offered(s);
        snprintf(a->shm_name, sizeof(a->shm_name), "%s", shm ? s->seg.name : "");
        a->pool_size = shm ? s->seg.size : 0;
        if (mine >= cap)
            snprintf(a->error, sizeof(a->error),
                     "kvpoold refused the registration: this connection has %u LMCache "
                     "instances registered, the most --max-instances-per-client allows",
                     mine);
        else
            snprintf(a->error, sizeof(a->error),
                     "kvpoold refused the registration: %u LMCache instances are registered "
                     "already",
                     LMC_MAX_INSTANCES);
        KVP_COUNT(lmcache_instances_refused, 1);
        log_warn_rl("LMCache instance %" PRIu64 " refused: %s", m->instance_id, a->error);
        return;
    }
    in = calloc(1, sizeof(*in));
    if (!in) {
        snprintf(a->error, sizeof(a->error), "out of memory");
        return;
    }
    in->iid = m->instance_id;
    in->asked = *m;
    in->rank = -1;
    in->peer = f->peer;
    in->last_seen_ms = f->now_ms;
    st->inst[st->ninst++] = in;

    const char *no = refusal(f, m, why, sizeof(why));
    if (!no) {
        struct kvp_reg_spec spec;
        bool existing;
        memset(&spec, 0, sizeof(spec));
        snprintf(spec.instance_id, sizeof(spec.instance_id), "lmcache-%" PRIu64, m->instance_id);
        /* Its log lines name it as LMCache does, by the number its worker sent; the registry's
         * id keeps the prefix, so that no kvpool worker's id can be an LMCache instance's. */
        snprintf(spec.log_id, sizeof(spec.log_id), "%" PRIu64, m->instance_id);
        snprintf(spec.model_name, sizeof(spec.model_name), "%s", m->model_name);
        snprintf(spec.dtype, sizeof(spec.dtype), "%s", canonical_dtype(m->dtype));
        spec.world_size = m->world_size;
        spec.worker_rank = 0; /* each request names its rank */
        spec.block_size = m->block_size;
        spec.num_layers = m->num_layers;
        spec.hidden_dim = m->hidden_dim;
        spec.use_mla = m->use_mla;
        /* LMCache workers open the segment by name: a named POSIX segment or nothing. */
        if (shm_offered(f->srv)) {
            spec.transport = KVP_REG_SHM;
        } else {
            /* The chunks then travel inside the messages, as the worker's version sends them:
             * a 0.5.7 registration (it has group_layouts) in a tensor envelope. */
            spec.transport = m->has_group_layouts ? KVP_REG_ENVELOPE : KVP_REG_PICKLE;
            snprintf(spec.reason, sizeof(spec.reason), "%s",
                     f->srv->seg.memfd         ? "--shm-backend memfd: LMCache workers open the "
                                                 "segment by name"
                     : kvp_seg_guard_tripped() ? kvp_seg_guard_reason()
                                               : f->srv->shm_reason);
        }
        kvp_owner_init(&in->owner, f->srv, "lmcache", -1, 0);
        /* No evidence either way: LMCache's protocol carries no peer credentials (and TCP has
         * none), so the worker's use of the segment is taken as upstream takes it; the
         * segment's mode still decides who can map it (docs/SECURITY.md, "LMCache's
         * protocol"). */
        int rc = kvp_op_register(&in->owner, &spec, NULL, &in->reg, &existing, st->msg,
                                 sizeof(st->msg));
        if (rc == 0) {
            in->registered = true;
            in->handle = in->reg.handle;
            in->shm = in->reg.transport == KVP_REG_SHM && !f->srv->seg.memfd;
            in->in_band = kvp_reg_transport_in_band(in->reg.transport);
            in_band_setup(f, in);
        } else {
            kvp_owner_destroy(&in->owner);
            snprintf(why, sizeof(why), "%s", st->msg);
            no = why;
            if (rc == -EDQUOT)
                KVP_COUNT(lmcache_instances_refused, 1);
        }
    }
    if (no) {
        in->refused = true;
        snprintf(in->refusal, sizeof(in->refusal), "kvpoold refused the registration: %s", no);
        log_warn("LMCache instance %" PRIu64 " (model %s, world size %u) refused: %s",
                 m->instance_id, m->model_name, m->world_size, no);
        answer_offer(f, in, a);
        return;
    }
    answer_offer(f, in, a);
    log_info("Registered non-GPU context for instance %" PRIu64 " (model=%s, world_size=%u)",
             m->instance_id, m->model_name, m->world_size);
    /* The registry logged "Instance <id> non-GPU context using ... transport (...)";
     * this is the strategy line of `lmcache server` of the worker's version. */
    if (m->has_group_layouts)
        log_info("Using %s engine-driven transfer strategy",
                 a->shm_name[0] ? "shm" : "safe inline");
    else
        log_info("Using %s non-GPU transfer strategy", a->shm_name[0] ? "shm" : "pickle");
}

static void release_job_pins_of(struct lmc_state *st, uint64_t iid);

/*
 * Once the shared segment is lost (seg_guard.h), no instance can be served through it, and an
 * LMCache worker cannot change its transport by itself: each instance on shared memory is
 * dropped (everything it held released) and its next ping answered false, so that the worker's
 * heartbeat registers it again, and the registration gives it its in-band transport (pickle, or
 * the envelope for a 0.5.7 worker).
 */
static void check_segment(struct lmc_front *f)
{
    struct lmc_state *st = f->st;
    uint32_t epoch = kvp_seg_guard_epoch();
    if (epoch == st->seg_epoch)
        return;
    st->seg_epoch = epoch;
    for (uint32_t i = 0; i < st->ninst;) {
        struct inst *in = st->inst[i];
        if (!in->registered || !in->shm || in->in_band) {
            i++;
            continue;
        }
        log_warn("LMCache instance %" PRIu64 " lost its shared memory (%s): dropped, and its "
                 "next ping is answered false so that its worker registers again, on its "
                 "%s transport",
                 in->iid, kvp_seg_guard_reason(),
                 in->asked.has_group_layouts ? "envelope" : "pickle");
        release_job_pins_of(st, in->iid);
        remember_gone(st, in->iid, GONE_REAPED);
        drop_inst(st, in); /* moves the last instance into slot i */
    }
}

void lmc_inst_unregister(struct lmc_front *f, uint64_t iid)
{
    struct lmc_state *st = f->st;
    struct inst *in = find(st, iid);
    if (!in) {
        log_warn_rl("No registered non-GPU context found for instance ID %" PRIu64, iid);
        return;
    }
    release_job_pins_of(st, iid);
    drop_inst(st, in);
    remember_gone(st, iid, GONE_UNREGISTERED);
    log_info("Unregistered non-CUDA context for instance ID %" PRIu64, iid);
}

bool lmc_inst_ping(struct lmc_front *f, bool has, uint64_t iid)
{
    struct lmc_state *st = f->st;
    if (!has)
        return true;
    check_segment(f);
    struct inst *in = find(st, iid);
    if (in) {
        in->last_seen_ms = f->now_ms;
        in->pinged = true;
        return true;
    }
    struct gone *g = gone_find(st, iid);
    if (g && g->kind == GONE_REAPED) {
        g->kind = GONE_TOLD;
        return false;
    }
    if (g)
        return true;
    /* An id this kvpoold never registered: a worker of the daemon that ran before (a crash,
     * an upgrade). Told false once, the worker's heartbeat registers it again on the next
     * true one; told true, it would go on with a context nobody here knows, and cache
     * nothing. */
    remember_gone(st, iid, GONE_TOLD);
    KVP_COUNT(lmcache_unknown_pings, 1);
    log_info_rl("LMCache ping of instance %" PRIu64 ", which this kvpoold has not registered (a "
                "worker of an earlier kvpoold?): answered false so that it registers again",
                iid);
    return false;
}

/* ---- keys and pending pairs ---- */

static void digest(const struct lmc_front *f, const struct lmc_key *k, uint8_t out[16])
{
    XXH3_state_t *s = XXH3_createState();
    uint32_t v[5] = {k->world_size, k->has_worker_id ? k->worker_id : UINT32_MAX, k->start, k->end,
                     k->ntokens};
    XXH128_hash_t h;
    if (!s) {
        memset(out, 0, 16);
        return;
    }
    XXH3_128bits_reset(s);
    XXH3_128bits_update(s, k->model_name, strlen(k->model_name) + 1);
    XXH3_128bits_update(s, v, sizeof(v));
    XXH3_128bits_update(s, k->salt, k->salt_len);
    XXH3_128bits_update(s, f->tokens, (size_t)k->ntokens * 4);
    h = XXH3_128bits_digest(s);
    XXH3_freeState(s);
    memcpy(out, &h.low64, 8);
    memcpy(out + 8, &h.high64, 8);
}

static void key_src(const struct lmc_front *f, const struct lmc_key *k, uint32_t rank, bool lookup,
                    struct kvp_key_src *src)
{
    memset(src, 0, sizeof(*src));
    src->tokens_le = f->tokens;
    /* A lookup hashes the tokens up to its end, as LMCache does. */
    src->ntokens = lookup && k->end < k->ntokens ? k->end : k->ntokens;
    src->start = k->start;
    src->end = k->end;
    src->salt = k->salt;
    src->salt_len = k->salt_len;
    src->other_rank = true;
    src->rank = rank;
}

/* The pending pair of the key with digest d that connection peer prepared. */
static struct pending *pending_find(struct inst *in, const uint8_t d[16], bool read, uint64_t peer)
{
    for (uint32_t i = 0; i < in->npend; i++)
        if (in->pend[i].read == read && in->pend[i].peer == peer &&
            memcmp(in->pend[i].digest, d, 16) == 0)
            return &in->pend[i];
    return NULL;
}

/* Whether another connection than peer prepared the key with digest d: a commit from peer
 * must not end it (LMCache's worker commits on the connection it prepared on). */
static bool pending_foreign(const struct inst *in, const uint8_t d[16], bool read, uint64_t peer)
{
    for (uint32_t i = 0; i < in->npend; i++)
        if (in->pend[i].read == read && in->pend[i].peer != peer &&
            memcmp(in->pend[i].digest, d, 16) == 0)
            return true;
    return false;
}

static void pending_remove(struct inst *in, struct pending *p)
{
    *p = in->pend[--in->npend];
}

/* Records a pending pair, replacing one of the same key (its hold is ended) and, when the
 * table is full, ending the oldest. */
static void pending_add(struct lmc_state *st, struct inst *in, const uint8_t d[16], bool read,
                        uint64_t hold, uint64_t peer)
{
    struct pending *old = pending_find(in, d, read, peer);
    if (old) {
        end_pending(in, old, st);
        pending_remove(in, old);
    }
    if (in->npend == LMC_MAX_PENDING) {
        log_warn_rl("LMCache instance %" PRIu64 ": %u prepares without their commit; ending "
                    "the oldest",
                    in->iid, LMC_MAX_PENDING);
        end_pending(in, &in->pend[0], st);
        memmove(&in->pend[0], &in->pend[1], (LMC_MAX_PENDING - 1) * sizeof(in->pend[0]));
        in->npend--;
    }
    struct pending *p = &in->pend[in->npend++];
    p->hold = hold;
    p->read = read;
    p->peer = peer;
    memcpy(p->digest, d, 16);
}

/* The instance a keyed worker request acts for, refreshed; NULL (logged) when it cannot. */
static struct inst *worker_inst(struct lmc_front *f, uint64_t iid, const struct lmc_key *k,
                                const char *op)
{
    check_segment(f);
    struct inst *in = find(f->st, iid);
    if (!in) {
        kvp_note_unknown_instance(f->srv);
        lmc_outcome(f, "instance %" PRIu64 " unknown: answered negatively", iid);
        log_warn_rl("LMCache %s of unknown instance %" PRIu64
                    " (never registered, unregistered or reaped): answered negatively",
                    op, iid);
        return NULL;
    }
    in->last_seen_ms = f->now_ms;
    if (in->refused)
        return NULL;
    if (!k->has_worker_id) {
        log_warn_rl("LMCache %s of instance %" PRIu64 " without a worker_id", op, iid);
        return NULL;
    }
    in->rank = (int32_t)k->worker_id;
    return in;
}

static void fill_slots(struct lmc_state *st, const struct inst *in, const struct kvp_op_slots *res,
                       struct lmc_slots *out)
{
    for (uint32_t j = 0; j < res->nslots; j++) {
        st->slots[j].offset = res->objs[j]->offset;
        st->slots[j].length = res->chunk_bytes;
        st->idx[j] = res->idx ? res->idx[j] : j;
    }
    out->n = res->nslots;
    out->slots = st->slots;
    out->chunk_indices = st->idx;
    out->shape.ndim = in->reg.layout.ndim;
    memcpy(out->shape.shape, in->reg.layout.shape, sizeof(out->shape.shape));
    out->shape.dtype = in->reg.spec.dtype;
}

void lmc_prepare_store(struct lmc_front *f, uint64_t iid, const struct lmc_key *k,
                       struct lmc_slots *out)
{
    struct lmc_state *st = f->st;
    struct kvp_op_slots res;
    struct kvp_key_src src;
    uint8_t d[16];

    memset(out, 0, sizeof(*out));
    struct inst *in = worker_inst(f, iid, k, "prepare_store");
    if (!in)
        return;
    if (in->in_band || !in->shm) {
        /* Its commit carries the chunks and reserves then, as upstream's in-band strategies. */
        out->no_buffers = true;
        lmc_outcome(f, "in band: the commit carries the chunks");
        return;
    }
    key_src(f, k, k->worker_id, false, &src);
    int rc = kvp_op_prepare_store(&in->owner, in->handle, &src, &res, st->msg, sizeof(st->msg));
    if (rc) {
        log_warn_rl("LMCache prepare_store of instance %" PRIu64 " failed: %s", iid, st->msg);
        return;
    }
    if (res.no_space)
        log_warn_rl("LMCache instance %" PRIu64 ": %u chunk%s not stored for lack of "
                    "evictable space in the pool",
                    iid, res.no_space, res.no_space == 1 ? "" : "s");
    lmc_outcome(f, "%u of %u chunks to write (%u cached, %u being stored, %u without room)",
                res.nslots, res.nchunks, res.cached, res.busy, res.no_space);
    if (res.nslots == 0)
        return; /* everything cached or being stored: the worker sends no commit */
    digest(f, k, d);
    pending_add(st, in, d, false, res.id, f->peer);
    fill_slots(st, in, &res, out);
}

/* Decodes an in-band commit's data (a pickle, or an envelope when envelope) against the
 * instance's chunk, exactly nchunks tensors, into st->src. Returns 0, or a negative errno with
 * the reason in why. */
static int in_band_decode(struct lmc_state *st, const struct inst *in, bool envelope,
                          const uint8_t *data, uint64_t len, uint32_t nchunks, char *why,
                          size_t why_size)
{
    uint32_t n = 0;
    int rc;
    if (envelope) {
        struct kvp_envelope_expect exp = in->eexp;
        exp.min_tensors = exp.max_tensors = nchunks;
        rc = kvp_envelope_decode(data, (size_t)len, &exp, st->etens, KVP_MAX_CHUNKS, &n, why,
                                 why_size);
        for (uint32_t i = 0; rc == 0 && i < n; i++)
            st->src[i] = st->etens[i].data;
    } else {
        struct kvp_tpickle_expect exp = in->exp;
        exp.min_tensors = exp.max_tensors = nchunks;
        rc = kvp_tpickle_decode(data, (size_t)len, &exp, st->tens, KVP_MAX_CHUNKS, &n, why,
                                why_size);
        for (uint32_t i = 0; rc == 0 && i < n; i++)
            st->src[i] = st->tens[i].data;
    }
    if (rc == 0 && n != nchunks) {
        /* The decoders hold min_tensors = max_tensors: never reached. */
        snprintf(why, why_size, "%u tensors for %u chunks", n, nchunks);
        rc = -EPROTO;
    }
    return rc;
}

/* An in-band commit of instance in (a pickle, or an envelope when envelope): the range's chunks
 * decoded from data, reserved, copied into their slots, published. True when every chunk is
 * stored (or already was, or is being stored by another worker). */
static bool in_band_commit(struct lmc_front *f, struct inst *in, const struct lmc_key *k,
                           bool envelope, const uint8_t *data, uint64_t len)
{
    struct lmc_state *st = f->st;
    struct kvp_op_slots res, io;
    struct kvp_key_src src;
    char why[200];
    const char *form = envelope ? "tensor envelope" : "pickle";

    if (envelope ? !in->etpl_ok : !in->tpl_ok) {
        log_warn_rl("LMCache instance %" PRIu64 ": a %s commit refused (its dtype has no %s "
                    "form)",
                    in->iid, form, form);
        return false;
    }
    /* Decoded and checked before anything is reserved: a reservation may evict, and a
     * payload that does not match must cost the cache nothing. */
    uint32_t first, nchunks = 0;
    int rc = kvp_chunk_range(k->start, k->end, k->ntokens, f->srv->cfg.chunk_tokens, KVP_MAX_CHUNKS,
                             &first, &nchunks, why, sizeof(why));
    if (rc) {
        /* why says what is wrong with the range */
    } else if (nchunks > in->max_chunks) {
        snprintf(why, sizeof(why), "%u chunks, more than the pool holds (%u)", nchunks,
                 in->max_chunks);
        rc = -E2BIG;
    } else if (nchunks == 0) {
        snprintf(why, sizeof(why), "the range [%u, %u) has no full chunk", k->start, k->end);
        rc = -EINVAL;
    } else {
        rc = in_band_decode(st, in, envelope, data, len, nchunks, why, sizeof(why));
    }
    if (rc) {
        KVP_COUNT(lmcache_malformed, 1);
        log_warn_rl("LMCache instance %" PRIu64 ": a %s commit of %" PRIu64
                    " bytes refused, nothing stored: %s",
                    in->iid, form, len, why);
        return false;
    }
    key_src(f, k, k->worker_id, false, &src);
    rc = kvp_op_prepare_store(&in->owner, in->handle, &src, &res, st->msg, sizeof(st->msg));
    if (rc) {
        log_warn_rl("LMCache commit_store of instance %" PRIu64 " failed: %s", in->iid, st->msg);
        return false;
    }
    if (res.nchunks != nchunks) {
        /* The core counts the range as kvp_chunk_range() does: never reached. */
        if (res.id)
            kvp_op_abort_store(&in->owner, in->handle, res.id, KVP_DROP_ABORT, st->msg,
                               sizeof(st->msg));
        log_warn_rl("LMCache instance %" PRIu64 ": a %s commit of %u chunks found %u", in->iid,
                    form, nchunks, res.nchunks);
        return false;
    }
    if (res.no_space)
        log_warn_rl("LMCache instance %" PRIu64 ": %u chunk%s not stored for lack of "
                    "evictable space in the pool",
                    in->iid, res.no_space, res.no_space == 1 ? "" : "s");
    lmc_outcome(f, "%s: %u of %u chunks to store (%u cached, %u being stored, %u without room)",
                form, res.nslots, res.nchunks, res.cached, res.busy, res.no_space);
    if (res.nslots == 0)
        return res.no_space == 0; /* cached, or being stored by another worker */
    /* The reservation's chunk indices, before the next operation reuses the scratch. */
    uint32_t nslots = res.nslots;
    for (uint32_t j = 0; j < nslots; j++)
        st->idx[j] = res.idx ? res.idx[j] : j;
    rc = kvp_op_store_inline_begin(&in->owner, in->handle, res.id,
                                   (uint64_t)nslots * res.chunk_bytes, &io, st->msg,
                                   sizeof(st->msg));
    if (rc) {
        log_warn_rl("LMCache instance %" PRIu64 ": a %s commit failed: %s", in->iid, form, st->msg);
        return false;
    }
    /* One copy, from the received frame into the reserved slots. */
    for (uint32_t j = 0; j < nslots; j++)
        memcpy(io.iov[j].iov_base, st->src[st->idx[j]], io.iov[j].iov_len);
    rc = kvp_op_commit_store(&in->owner, in->handle, res.id, KVP_VIA_INLINE, st->msg,
                             sizeof(st->msg));
    if (rc < 0)
        log_warn_rl("LMCache instance %" PRIu64 ": a %s commit failed: %s", in->iid, form, st->msg);
    return rc >= 0 && (uint32_t)rc == nslots && res.no_space == 0;
}

bool lmc_commit_store(struct lmc_front *f, uint64_t iid, const struct lmc_key *k,
                      const uint8_t *data, uint64_t data_len)
{
    struct lmc_state *st = f->st;
    uint8_t d[16];
    struct inst *in = worker_inst(f, iid, k, "commit_store");
    if (!in)
        return false;
    digest(f, k, d);
    struct pending *p = pending_find(in, d, false, f->peer);
    if (!p && data_len == 0 && pending_foreign(in, d, false, f->peer)) {
        KVP_COUNT(lmcache_foreign_commits, 1);
        log_warn_rl("LMCache commit_store of instance %" PRIu64 " refused: another connection "
                    "prepared it (a worker commits on the connection it prepared on)",
                    iid);
        return false;
    }
    if (data_len > 0) {
        /* The chunks themselves: LMCache 0.5.7's tensor envelope (a msgpack map), or an older
         * worker's pickle. The slots a prepare reserved for it were never written. */
        bool envelope = kvp_envelope_sniff(data, (size_t)data_len);
        uint8_t form = envelope ? KVP_REG_ENVELOPE : KVP_REG_PICKLE;
        if (p) {
            end_pending(in, p, st);
            pending_remove(in, p);
        }
        if (!in->in_band && f->peer != in->peer) {
            /* Only the worker itself moves its instance off shared memory: a commit of
             * another connection would leave the real worker storing into slots nobody
             * reads. */
            KVP_COUNT(lmcache_foreign_commits, 1);
            log_warn_rl("LMCache commit_store of instance %" PRIu64 " refused: its chunks came "
                        "in the message from another connection than the one that registered "
                        "it on shared memory",
                        iid);
            return false;
        }
        if (!in->in_band) {
            /* Offered the segment, it could not map it: in band from now on. */
            char why[KVP_MAX_REASON + 1];
            snprintf(why, sizeof(why), "could not map %s", f->srv->seg.name);
            log_warn("LMCache instance %" PRIu64 " fell back to the %s transport (could not "
                     "map %s: check its uid, --shm-mode and a shared /dev/shm)",
                     iid, kvp_reg_transport_name(form), f->srv->seg.name);
            kvp_op_leave_shm(&in->owner, in->handle, form, why, st->msg, sizeof(st->msg));
            in->in_band = true;
        }
        return in_band_commit(f, in, k, envelope, data, data_len);
    }
    if (!p)
        return false;
    uint64_t hold = p->hold;
    pending_remove(in, p);
    int rc = kvp_op_commit_store(&in->owner, in->handle, hold, KVP_VIA_SHM, st->msg,
                                 sizeof(st->msg));
    lmc_outcome(f, rc >= 0 ? "%d chunks published" : "refused (%d): the reservation expired", rc);
    return rc >= 0;
}

static struct job *job_find(struct lmc_state *st, const char *rid);
static void job_claim(struct lmc_state *st, struct job *j, uint32_t rank);

/* An in-band instance's prepare_retrieve: every chunk of the range pinned (or a miss) until
 * lmc_retrieve_in_band_end(), after the handler encoded them into its reply: a tensor envelope
 * for a 0.5.7 worker (its key has token_bytes), a pickle for an older one. */
static bool in_band_retrieve(struct lmc_front *f, struct inst *in, const struct lmc_key *k,
                             const struct kvp_key_src *src, struct lmc_slots *out)
{
    struct lmc_state *st = f->st;
    struct kvp_op_slots *res = &st->rres;
    bool envelope = k->token_form == LMC_TOKENS_BYTES;
    if (envelope ? !in->etpl_ok : !in->tpl_ok)
        return false;
    int rc = kvp_op_retrieve_inline_begin(&in->owner, in->handle, src, res, st->msg,
                                          sizeof(st->msg));
    if (rc) {
        log_warn_rl("LMCache prepare_retrieve of instance %" PRIu64 " failed: %s", in->iid,
                    st->msg);
        return false;
    }
    if (res->nchunks == 0 || res->nslots < res->nchunks) {
        kvp_op_retrieve_inline_end(&in->owner, in->handle, res, false);
        lmc_outcome(f, "a miss: %u of %u chunks stored", res->nslots, res->nchunks);
        return false;
    }
    lmc_outcome(f, "a hit: %u chunks sent in the reply", res->nslots);
    for (uint32_t j = 0; j < res->nslots; j++)
        st->chunks[j] = res->iov[j].iov_base;
    st->rin = in;
    out->n = res->nslots;
    out->in_band = true;
    out->envelope = envelope;
    out->chunks = st->chunks;
    out->tpl = &in->tpl;
    out->etpl = &in->etpl;
    struct job *j = job_find(st, k->request_id);
    if (j)
        job_claim(st, j, k->worker_id);
    return true;
}

void lmc_retrieve_in_band_end(struct lmc_front *f, bool sent)
{
    struct lmc_state *st = f->st;
    if (!st->rin)
        return;
    kvp_op_retrieve_inline_end(&st->rin->owner, st->rin->handle, &st->rres, sent);
    st->rin = NULL;
}

bool lmc_prepare_retrieve(struct lmc_front *f, uint64_t iid, const struct lmc_key *k,
                          struct lmc_slots *out)
{
    struct lmc_state *st = f->st;
    struct kvp_op_slots res;
    struct kvp_key_src src;
    uint8_t d[16];

    memset(out, 0, sizeof(*out));
    struct inst *in = worker_inst(f, iid, k, "prepare_retrieve");
    if (!in)
        return false;
    key_src(f, k, k->worker_id, false, &src);
    if (in->in_band)
        return in_band_retrieve(f, in, k, &src, out);
    if (!in->shm)
        return false;
    int rc = kvp_op_prepare_retrieve(&in->owner, in->handle, &src, &res, st->msg, sizeof(st->msg));
    if (rc) {
        log_warn_rl("LMCache prepare_retrieve of instance %" PRIu64 " failed: %s", iid, st->msg);
        return false;
    }
    /* All or nothing, as upstream: the worker scatters every chunk of the range. */
    if (res.nchunks == 0 || res.nslots < res.nchunks) {
        if (res.id)
            kvp_op_commit_retrieve(&in->owner, in->handle, res.id, st->msg, sizeof(st->msg));
        lmc_outcome(f, "a miss: %u of %u chunks stored", res.nslots, res.nchunks);
        return false;
    }
    lmc_outcome(f, "a hit: %u chunks to read", res.nslots);
    digest(f, k, d);
    pending_add(st, in, d, true, res.id, f->peer);
    fill_slots(st, in, &res, out);
    /* This retrieve pinned what it reads: one reader of the lookup's locks is done. */
    struct job *j = job_find(st, k->request_id);
    if (j)
        job_claim(st, j, k->worker_id);
    return true;
}

bool lmc_commit_retrieve(struct lmc_front *f, uint64_t iid, const struct lmc_key *k)
{
    struct lmc_state *st = f->st;
    uint8_t d[16];
    struct inst *in = find(st, iid);
    if (!in) {
        kvp_note_unknown_instance(f->srv);
        return false;
    }
    in->last_seen_ms = f->now_ms;
    if (!in->registered)
        return true;
    digest(f, k, d);
    struct pending *p = pending_find(in, d, true, f->peer);
    if (!p && pending_foreign(in, d, true, f->peer)) {
        KVP_COUNT(lmcache_foreign_commits, 1);
        log_warn_rl("LMCache commit_retrieve of instance %" PRIu64 " refused: another "
                    "connection prepared it",
                    iid);
        return false;
    }
    if (p) {
        uint64_t hold = p->hold;
        pending_remove(in, p);
        kvp_op_commit_retrieve(&in->owner, in->handle, hold, st->msg, sizeof(st->msg));
    }
    return true;
}

/* ---- prefetch jobs and lookup read locks ---- */

static uint64_t rid_hash(const char *rid)
{
    return XXH3_64bits(rid, strlen(rid));
}

static struct job *job_find(struct lmc_state *st, const char *rid)
{
    uint64_t h = rid_hash(rid);
    for (struct job *j = st->buckets[h % JOB_BUCKETS]; j; j = j->hnext)
        if (j->hash == h && strcmp(j->rid, rid) == 0)
            return j;
    return NULL;
}

/* Ends rank pin i of job j, if its instance still holds it. */
static void job_pin_release(struct lmc_state *st, struct job_pin *p)
{
    if (!p->hold)
        return;
    struct inst *in = find(st, p->iid);
    if (in && in->registered && in->handle == p->handle)
        kvp_op_commit_retrieve(&in->owner, in->handle, p->hold, st->msg, sizeof(st->msg));
    p->hold = 0;
}

static void job_release_pins(struct lmc_state *st, struct job *j)
{
    for (uint32_t i = 0; i < j->npins; i++)
        job_pin_release(st, &j->pins[i]);
}

static void job_free(struct lmc_state *st, struct job *j)
{
    job_release_pins(st, j);
    struct job **pp = &st->buckets[j->hash % JOB_BUCKETS];
    while (*pp != j)
        pp = &(*pp)->hnext;
    *pp = j->hnext;
    j->older->newer = j->newer;
    j->newer->older = j->older;
    st->njobs--;
    free(j->pins);
    free(j);
}

static void job_claim(struct lmc_state *st, struct job *j, uint32_t rank)
{
    for (uint32_t i = 0; i < j->npins; i++) {
        struct job_pin *p = &j->pins[i];
        if ((p->rank == rank || j->npins == 1) && p->readers_left > 0) {
            if (--p->readers_left == 0)
                job_pin_release(st, p);
            return;
        }
    }
}

/* Drops what the jobs remember of instance iid's pins (its owner is being released). */
static void release_job_pins_of(struct lmc_state *st, uint64_t iid)
{
    for (struct job *j = st->jobs.newer; j != &st->jobs; j = j->newer)
        for (uint32_t i = 0; i < j->npins; i++)
            if (j->pins[i].iid == iid)
                job_pin_release(st, &j->pins[i]);
}

/* The instance a lookup of rank r acts as: one whose requests named r, else any instance of
 * the model and world size. */
static struct inst *rank_inst(struct lmc_state *st, const struct lmc_key *k, uint32_t r)
{
    struct inst *any = NULL;
    for (uint32_t i = 0; i < st->ninst; i++) {
        struct inst *in = st->inst[i];
        if (!in->registered || strcmp(in->asked.model_name, k->model_name) != 0 ||
            in->asked.world_size != k->world_size)
            continue;
        if (in->rank == (int32_t)r)
            return in;
        if (!any)
            any = in;
    }
    return any;
}

void lmc_lookup(struct lmc_front *f, const struct lmc_key *k)
{
    struct lmc_state *st = f->st;
    struct job *j = job_find(st, k->request_id);

    if (j)
        job_free(st, j); /* a new lookup of the request replaces the old one */
    if (st->njobs == LMC_MAX_JOBS) {
        log_warn_rl("LMCache front end: %u prefetch jobs open; dropping the oldest (%s)",
                    LMC_MAX_JOBS, st->jobs.newer->rid);
        job_free(st, st->jobs.newer);
    }
    j = calloc(1, sizeof(*j));
    if (!j) {
        log_warn_rl("LMCache lookup of request %s: out of memory", k->request_id);
        return;
    }
    snprintf(j->rid, sizeof(j->rid), "%s", k->request_id);
    j->hash = rid_hash(j->rid);
    j->created_ms = f->now_ms;
    j->hnext = st->buckets[j->hash % JOB_BUCKETS];
    st->buckets[j->hash % JOB_BUCKETS] = j;
    j->newer = &st->jobs;
    j->older = st->jobs.older;
    st->jobs.older->newer = j;
    st->jobs.older = j;
    st->njobs++;

    struct inst *first = rank_inst(st, k, 0);
    if (!first) {
        log_warn_rl("No registered LMCache instance of model %s with world size %u during "
                    "lookup: 0 hits",
                    k->model_name, k->world_size);
        return;
    }
    /* Every rank of the world size, MLA or not: LMCache's MLA workers name one world rank for
     * their replicas (core/ops.h, kvp_key_src.other_rank). */
    uint32_t nranks = k->world_size;
    uint32_t readers = k->num_kv_readers ? k->num_kv_readers : 1;
    j->pins = calloc(nranks, sizeof(*j->pins));
    if (!j->pins)
        return;
    uint32_t hits = UINT32_MAX;
    for (uint32_t r = 0; r < nranks && hits > 0; r++) {
        struct inst *in = rank_inst(st, k, r);
        struct kvp_op_slots res;
        struct kvp_key_src src;
        key_src(f, k, r, true, &src);
        if (!in || kvp_op_lookup(&in->owner, in->handle, &src, KVP_LOOKUP_PIN, &res, st->msg,
                                 sizeof(st->msg))) {
            hits = 0;
            break;
        }
        j->pins[j->npins++] = (struct job_pin){.iid = in->iid,
                                               .handle = in->handle,
                                               .hold = res.id,
                                               .rank = r,
                                               .readers_left = readers};
        if (res.cached < hits)
            hits = res.cached;
    }
    j->hits = hits == UINT32_MAX ? 0 : hits;
    lmc_outcome(f, "%u chunks hit on every rank of %u (request %s)", j->hits, nranks,
                k->request_id);
    if (j->hits == 0)
        job_release_pins(st, j);
}

int64_t lmc_query(struct lmc_front *f, const char *request_id)
{
    struct job *j = job_find(f->st, request_id);
    if (!j || j->consumed) {
        log_debug("Prefetch job for request %s not found (already completed or invalid)",
                  request_id);
        return 0;
    }
    j->consumed = true;
    return j->hits;
}

void lmc_free_lookup_locks(struct lmc_front *f, const struct lmc_key *k)
{
    if (k->start >= k->end)
        return;
    struct job *j = job_find(f->st, k->request_id);
    if (!j)
        return;
    job_release_pins(f->st, j);
    j->consumed = true;
}

void lmc_end_session(struct lmc_front *f, const char *request_id)
{
    struct job *j = job_find(f->st, request_id);
    if (j)
        job_free(f->st, j);
}

void lmc_clear(struct lmc_front *f)
{
    struct kvp_owner admin;
    struct kvp_clear_result res;
    kvp_owner_init(&admin, f->srv, "lmcache", -1, 0);
    kvp_op_clear(&admin, &res);
    kvp_owner_destroy(&admin);
}

/* ---- liveness ---- */

uint64_t lmc_state_tick(struct lmc_front *f)
{
    struct lmc_state *st = f->st;
    const struct kvp_config *cfg = &f->srv->cfg;
    uint64_t now = f->now_ms;

    check_segment(f);
    /* Lookup read locks nobody claimed, after LMCache's read TTL. */
    while (st->jobs.newer != &st->jobs && now - st->jobs.newer->created_ms > LMC_READ_TTL_MS)
        job_free(st, st->jobs.newer);
    if (cfg->lmcache_reap_s == 0)
        return 1000;
    uint64_t period = (uint64_t)cfg->lmcache_reap_s * 1000 / 4;
    if (period < 100)
        period = 100;
    if (now < st->next_reap_ms)
        return st->next_reap_ms - now;
    st->next_reap_ms = now + period;
    for (uint32_t i = 0; i < st->ninst;) {
        struct inst *in = st->inst[i];
        uint64_t limit = (uint64_t)(in->pinged ? cfg->lmcache_reap_s : cfg->lmcache_grace_s) * 1000;
        uint64_t silent = kvp_ms_since(now, in->last_seen_ms);
        if (silent <= limit) {
            i++;
            continue;
        }
        log_warn("Reaped non-GPU instance %" PRIu64 ": silent for %.1fs (pinged=%s); its "
                 "reservations, pins and registration are released",
                 in->iid, (double)silent / 1000.0, in->pinged ? "True" : "False");
        KVP_COUNT(lmcache_reaped, 1);
        release_job_pins_of(st, in->iid);
        remember_gone(st, in->iid, GONE_REAPED);
        drop_inst(st, in); /* moves the last instance into slot i */
    }
    return period;
}

int lmc_state_init(struct lmc_front *f)
{
    struct lmc_state *st = calloc(1, sizeof(*st));
    if (!st)
        return -ENOMEM;
    st->jobs.newer = st->jobs.older = &st->jobs;
    f->st = st;
    return 0;
}

void lmc_state_destroy(struct lmc_front *f)
{
    struct lmc_state *st = f->st;
    if (!st)
        return;
    while (st->jobs.newer != &st->jobs)
        job_free(st, st->jobs.newer);
    while (st->ninst)
        drop_inst(st, st->inst[st->ninst - 1]);
    free(st);
    f->st = NULL;
}
