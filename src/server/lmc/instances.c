/*
 * instances.c - LMCache's instances and their liveness, over the core's owners and operations
 * (see instances.h; docs/LMCACHE.md, "Instances", "Liveness", "Restarts", "Shared memory lost").
 *
 * Instances. A registration makes an instance: one core owner (frontend "lmcache") and one
 * core registration of its layout (instance id "lmcache-<id>", logged by the registry as
 * "Instance <id> ...", the number as the worker sent it and LMCache logs it), through
 * kvp_op_register(), which validates it, chooses the transport and logs it. LMCache workers
 * open the segment by name: a registration asks for shared memory when there is a named POSIX
 * segment in use, else for the in-band transport of its worker's version (a pickle up to 0.5.6,
 * a tensor envelope for a 0.5.7 registration, which has group_layouts; inband.h). A refused
 * registration is remembered (so that its requests get the negative answers at once and the
 * refusal is logged once) but holds nothing.
 *
 * What the registry decided is the registry's: the instance keeps only its registration's
 * handle, the chunk's shape (fixed for the registration's life) and its transport as the
 * registry last gave it to this thread (struct lmc_inst.transport says why that one is kept).
 *
 * Liveness. Registration, pings with the instance's id and every prepare and commit refresh an
 * instance; a ping also marks it as pinging. lmc_state_tick() reaps an instance silent longer
 * than --lmcache-reap-timeout (pinged) or --lmcache-registration-grace (never pinged), at
 * lmc_front.now_ms: the owner's release frees everything it held, at once, and it is logged.
 * next_reap_ms is the earliest time any instance can be due (each refresh may bring it
 * forward), so the tick looks at the table only then, and reaps to the millisecond. The first
 * ping of a reaped id is answered false, the next true: vLLM's adapter re-registers on that
 * unhealthy-to-healthy edge, so a worker that was only paused gets its cache back. An id this
 * kvpoold never registered is told false once too (a worker of an earlier kvpoold).
 *
 * Events. The core tells an owner of daemon-wide events through its callbacks (core/owner.h),
 * on the thread that found the event, under the owners' lock: each callback here only sets the
 * event's bit on the instance and the state's events_pending flag (atomics), and this thread
 * acts on them at the next request, ping or tick (react()). The segment lost: an LMCache worker
 * cannot be told to change its transport, so an instance on shared memory is dropped
 * (everything it held released) and its next ping answered false; its heartbeat registers it
 * again, and the registration gives it its in-band transport. The daemon ending the owner:
 * dropped the same way.
 *
 * Threads: the listener's, except the callbacks (any thread, atomics only; they run while the
 * owner is listed, so its instance is alive: the instance is freed only after
 * kvp_owner_destroy() has taken its owner off the list under the same lock).
 */
#include "lmc/instances.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "common/layout.h"
#include "core/daemon.h"
#include "core/seg_guard.h"
#include "core/stats.h"
#include "lmc/inband.h"
#include "lmc/jobs.h"

/* ---- the table and the ids gone ---- */

/* Removes instance in from the table and frees it; its owner's release ends everything it
 * held (reservations, pins, registration). */
static void drop_inst(struct lmc_state *st, struct lmc_inst *in)
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

static struct lmc_gone *gone_find(struct lmc_state *st, uint64_t iid)
{
    for (uint32_t i = 0; i < LMC_MAX_REAPED; i++)
        if (st->gone[i].iid == iid && iid != 0)
            return &st->gone[i];
    return NULL;
}

/* Remembers that instance iid is gone (the oldest memory is forgotten when the ring is full). */
static void remember_gone(struct lmc_state *st, uint64_t iid, enum lmc_gone_kind kind)
{
    struct lmc_gone *g = gone_find(st, iid);
    if (!g) {
        g = &st->gone[st->gone_next];
        st->gone_next = (st->gone_next + 1) % LMC_MAX_REAPED;
    }
    *g = (struct lmc_gone){.iid = iid, .kind = (uint8_t)kind};
}

/* Ends instance in (moving the last instance of the table into its place): the lookup read
 * locks it holds forgotten, its id remembered as kind, its owner released. */
static void end_inst(struct lmc_state *st, struct lmc_inst *in, enum lmc_gone_kind kind)
{
    lmc_jobs_release_inst(st, in->iid);
    remember_gone(st, in->iid, kind);
    drop_inst(st, in);
}

/* ---- liveness ---- */

/* How long in may be silent before it is reaped. */
static uint64_t silence_limit_ms(const struct kvp_config *cfg, const struct lmc_inst *in)
{
    return (uint64_t)(in->pinged ? cfg->lmcache_reap_s : cfg->lmcache_grace_s) * 1000;
}

/* in was heard from at the request's time: the reaper must look at it again when that
 * silence has lasted longer than its limit. */
static void touch(struct lmc_front *f, struct lmc_inst *in)
{
    struct lmc_state *st = f->st;
    in->last_seen_ms = f->now_ms;
    uint64_t due = in->last_seen_ms + silence_limit_ms(&f->srv->cfg, in) + 1;
    if (due < st->next_reap_ms)
        st->next_reap_ms = due;
}

/* ---- events from other threads ---- */

/* Why the segment is lost, or NULL: the registry's word once it has it, the guard's before
 * (the guard trips first; the registry hears of it within a second, core/expiry.c). */
static const char *shm_lost_reason(const struct kvp_server *s)
{
    if (atomic_load_explicit(&s->registry.shm_lost, memory_order_acquire))
        return s->registry.lost_reason;
    return kvp_seg_guard_tripped() ? kvp_seg_guard_reason() : NULL;
}

/* Marks the instance whose owner is o with event ev (any thread, under the owners' lock). */
static void mark(struct kvp_owner *o, unsigned ev)
{
    struct lmc_inst *in = (struct lmc_inst *)(void *)((char *)o - offsetof(struct lmc_inst, owner));
    atomic_fetch_or_explicit(&in->events, ev, memory_order_relaxed);
    /* Release: the listener's thread, which takes events_pending with acquire, then sees the
     * instance's bit. in->st was written before the owner got these callbacks. */
    atomic_store_explicit(&in->st->events_pending, true, memory_order_release);
}

static void on_shm_lost(struct kvp_owner *o)
{
    mark(o, LMC_EV_SHM_LOST);
}

static void on_drop(struct kvp_owner *o)
{
    mark(o, LMC_EV_DROP);
}

static const struct kvp_owner_ops inst_ops = {
    .shm_lost = on_shm_lost,
    .drop = on_drop,
};

/* Acts on the events other threads marked instances with: each instance marked is dropped
 * (everything it held released) and its next ping answered false, so that its worker
 * registers again. */
static void react(struct lmc_front *f)
{
    struct lmc_state *st = f->st;
    if (!atomic_exchange_explicit(&st->events_pending, false, memory_order_acquire))
        return;
    const char *lost = shm_lost_reason(f->srv);
    for (uint32_t i = 0; i < st->ninst;) {
        struct lmc_inst *in = st->inst[i];
        unsigned ev = atomic_exchange_explicit(&in->events, 0, memory_order_relaxed);
        /* An instance already in band (its worker fell back) lost nothing. */
        if ((ev & LMC_EV_SHM_LOST) && in->registered && in->transport == KVP_REG_SHM) {
            log_warn("LMCache instance %" PRIu64 " lost its shared memory (%s): dropped, and its "
                     "next ping is answered false so that its worker registers again, on its "
                     "%s transport",
                     in->iid, lost ? lost : kvp_seg_guard_reason(),
                     in->asked.has_group_layouts ? "envelope" : "pickle");
        } else if (ev & LMC_EV_DROP) {
            log_info("LMCache instance %" PRIu64 " dropped by kvpoold: everything it held is "
                     "released, and its next ping is answered false",
                     in->iid);
        } else {
            i++;
            continue;
        }
        end_inst(st, in, LMC_GONE_REAPED); /* moves the last instance into slot i */
    }
}

/* ---- registration ---- */

/* Whether LMCache workers can be offered the segment: a named POSIX one, not lost. */
static bool shm_offered(const struct kvp_server *s)
{
    return s->seg.shared && !s->seg.memfd && !shm_lost_reason(s);
}

/* torch's names and aliases onto kvpool's dtype names (common/layout.h's table); an unknown
 * name is left for the registry to refuse. */
static const char *canonical_dtype(const char *d)
{
    const struct kvp_dtype *t = kvp_dtype_find_torch(d);
    return t ? t->name : d;
}

static bool same_layout(const struct lmc_register *a, const struct lmc_register *b)
{
    return strcmp(a->model_name, b->model_name) == 0 && a->world_size == b->world_size &&
           a->block_size == b->block_size && a->num_layers == b->num_layers &&
           a->hidden_dim == b->hidden_dim && strcmp(a->dtype, b->dtype) == 0 &&
           a->use_mla == b->use_mla && a->num_physical_slots == b->num_physical_slots;
}

/* Reads in's transport from the registry again (it is unchanged unless this front end moved
 * it: see struct lmc_inst.transport). */
static void read_transport(struct lmc_front *f, struct lmc_inst *in)
{
    struct kvp_registration reg;
    if (in->registered &&
        kvp_op_instance(&in->owner, in->handle, &reg, f->st->msg, sizeof(f->st->msg)) == 0)
        in->transport = reg.transport;
}

static void answer_offer(struct lmc_front *f, const struct lmc_inst *in, struct lmc_reg_answer *a)
{
    const struct kvp_server *s = f->srv;
    /* A refused instance still gets the segment: a worker that ignores `error` then runs
     * uncached with empty slot lists instead of gathering and pickling every chunk. */
    bool shm = shm_offered(s) && (in->refused || in->transport == KVP_REG_SHM);
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
        const struct lmc_inst *o = f->st->inst[i];
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

/* Registers in (its asked fields set) in the core: its owner, with this front end's callbacks,
 * and its registration. Returns 0, or a negative errno with the registry's reason in st->msg. */
static int core_register(struct lmc_front *f, struct lmc_inst *in)
{
    const struct lmc_register *m = &in->asked;
    struct lmc_state *st = f->st;
    struct kvp_reg_spec spec;
    struct kvp_registration reg;
    bool existing;

    memset(&spec, 0, sizeof(spec));
    snprintf(spec.instance_id, sizeof(spec.instance_id), "lmcache-%" PRIu64, m->instance_id);
    /* Its log lines name it as LMCache does, by the number its worker sent; the registry's id
     * keeps the prefix, so that no kvpool worker's id can be an LMCache instance's. */
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
        /* The chunks then travel inside the messages, as the worker's version sends them: a
         * 0.5.7 registration (it has group_layouts) in a tensor envelope. */
        spec.transport = m->has_group_layouts ? KVP_REG_ENVELOPE : KVP_REG_PICKLE;
        const char *lost = shm_lost_reason(f->srv);
        snprintf(spec.reason, sizeof(spec.reason), "%s",
                 f->srv->seg.memfd ? "--shm-backend memfd: LMCache workers open the segment by name"
                 : lost            ? lost
                                   : f->srv->shm_reason);
    }
    kvp_owner_init(&in->owner, f->srv, "lmcache", -1, 0);
    kvp_owner_set_ops(&in->owner, &inst_ops);
    /* No evidence either way: LMCache's protocol carries no peer credentials (and TCP has
     * none), so the worker's use of the segment is taken as upstream takes it; the segment's
     * mode still decides who can map it (docs/SECURITY.md, "LMCache's protocol"). */
    int rc = kvp_op_register(&in->owner, &spec, NULL, &reg, &existing, st->msg, sizeof(st->msg));
    if (rc) {
        kvp_owner_destroy(&in->owner);
        return rc;
    }
    in->registered = true;
    in->handle = reg.handle;
    in->transport = reg.transport;
    in->shape.ndim = reg.layout.ndim;
    memcpy(in->shape.shape, reg.layout.shape, sizeof(in->shape.shape));
    in->shape.dtype = canonical_dtype(in->asked.dtype); /* the registry's name, kept in in */
    lmc_in_band_setup(f, in, reg.layout.bytes);
    return 0;
}

void lmc_inst_register(struct lmc_front *f, const struct lmc_register *m, struct lmc_reg_answer *a)
{
    struct lmc_state *st = f->st;
    char why[600];

    memset(a, 0, sizeof(*a));
    react(f);
    struct lmc_inst *in = lmc_inst_find(st, m->instance_id);
    if (in && in->refused && !same_layout(&in->asked, m)) {
        /* Refused before, asking again with another layout: judged afresh. */
        drop_inst(st, in);
        in = NULL;
    }
    if (in) {
        touch(f, in);
        in->peer = f->peer; /* its worker may have reconnected */
        read_transport(f, in);
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
    struct lmc_inst *oldest_refused = NULL;
    for (uint32_t i = 0; i < st->ninst; i++) {
        struct lmc_inst *o = st->inst[i];
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
    in->st = st;
    in->asked = *m;
    in->rank = -1;
    in->peer = f->peer;
    atomic_init(&in->events, 0);
    st->inst[st->ninst++] = in;
    touch(f, in);

    const char *no = refusal(f, m, why, sizeof(why));
    if (!no) {
        int rc = core_register(f, in);
        if (rc) {
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

void lmc_inst_unregister(struct lmc_front *f, uint64_t iid)
{
    struct lmc_state *st = f->st;
    struct lmc_inst *in = lmc_inst_find(st, iid);
    if (!in) {
        log_warn_rl("No registered non-GPU context found for instance ID %" PRIu64, iid);
        return;
    }
    end_inst(st, in, LMC_GONE_UNREGISTERED);
    log_info("Unregistered non-CUDA context for instance ID %" PRIu64, iid);
}

bool lmc_inst_ping(struct lmc_front *f, bool has, uint64_t iid)
{
    struct lmc_state *st = f->st;
    if (!has)
        return true;
    react(f);
    struct lmc_inst *in = lmc_inst_find(st, iid);
    if (in) {
        in->pinged = true;
        touch(f, in);
        return true;
    }
    struct lmc_gone *g = gone_find(st, iid);
    if (g && g->kind == LMC_GONE_REAPED) {
        g->kind = LMC_GONE_TOLD;
        return false;
    }
    if (g)
        return true;
    /* An id this kvpoold never registered: a worker of the daemon that ran before (a crash,
     * an upgrade). Told false once, the worker's heartbeat registers it again on the next
     * true one; told true, it would go on with a context nobody here knows, and cache
     * nothing. */
    remember_gone(st, iid, LMC_GONE_TOLD);
    KVP_COUNT(lmcache_unknown_pings, 1);
    log_info_rl("LMCache ping of instance %" PRIu64 ", which this kvpoold has not registered (a "
                "worker of an earlier kvpoold?): answered false so that it registers again",
                iid);
    return false;
}

/* ---- the instance of a request ---- */

struct lmc_inst *lmc_inst_seen(struct lmc_front *f, uint64_t iid)
{
    struct lmc_inst *in = lmc_inst_find(f->st, iid);
    if (!in) {
        kvp_note_unknown_instance(f->srv);
        return NULL;
    }
    touch(f, in);
    return in;
}

struct lmc_inst *lmc_inst_worker(struct lmc_front *f, uint64_t iid, const struct lmc_key *k,
                                 const char *op)
{
    react(f);
    struct lmc_inst *in = lmc_inst_seen(f, iid);
    if (!in) {
        lmc_outcome(f, "instance %" PRIu64 " unknown: answered negatively", iid);
        log_warn_rl("LMCache %s of unknown instance %" PRIu64
                    " (never registered, unregistered or reaped): answered negatively",
                    op, iid);
        return NULL;
    }
    if (in->refused)
        return NULL;
    if (!k->has_worker_id) {
        log_warn_rl("LMCache %s of instance %" PRIu64 " without a worker_id", op, iid);
        return NULL;
    }
    in->rank = (int32_t)k->worker_id;
    return in;
}

bool lmc_inst_leave_shm(struct lmc_front *f, struct lmc_inst *in, uint8_t form)
{
    struct lmc_state *st = f->st;
    char why[KVP_MAX_REASON + 1];
    /* Offered the segment, it could not map it: in band from now on. */
    snprintf(why, sizeof(why), "could not map %s", f->srv->seg.name);
    log_warn("LMCache instance %" PRIu64 " fell back to the %s transport (could not "
             "map %s: check its uid, --shm-mode and a shared /dev/shm)",
             in->iid, kvp_reg_transport_name(form), f->srv->seg.name);
    kvp_op_leave_shm(&in->owner, in->handle, form, why, st->msg, sizeof(st->msg));
    read_transport(f, in);
    return kvp_reg_transport_in_band(in->transport);
}

/* ---- the front end's state ---- */

void lmc_clear(struct lmc_front *f)
{
    struct kvp_owner admin;
    struct kvp_clear_result res;
    kvp_owner_init(&admin, f->srv, "lmcache", -1, 0);
    kvp_op_clear(&admin, &res);
    kvp_owner_destroy(&admin);
}

uint64_t lmc_state_tick(struct lmc_front *f)
{
    struct lmc_state *st = f->st;
    const struct kvp_config *cfg = &f->srv->cfg;
    uint64_t now = f->now_ms;
    /* At least once a second: the events other threads mark are acted on here when no request
     * comes. */
    uint64_t wait = 1000;

    react(f);
    uint64_t jobs = lmc_jobs_expire(st, now);
    if (jobs < wait)
        wait = jobs;
    if (cfg->lmcache_reap_s == 0)
        return wait;
    if (now >= st->next_reap_ms) {
        st->next_reap_ms = UINT64_MAX;
        for (uint32_t i = 0; i < st->ninst;) {
            struct lmc_inst *in = st->inst[i];
            uint64_t limit = silence_limit_ms(cfg, in);
            uint64_t silent = kvp_ms_since(now, in->last_seen_ms);
            if (silent <= limit) {
                uint64_t due = in->last_seen_ms + limit + 1;
                if (due < st->next_reap_ms)
                    st->next_reap_ms = due;
                i++;
                continue;
            }
            log_warn("Reaped non-GPU instance %" PRIu64 ": silent for %.1fs (pinged=%s); its "
                     "reservations, pins and registration are released",
                     in->iid, (double)silent / 1000.0, in->pinged ? "True" : "False");
            KVP_COUNT(lmcache_reaped, 1);
            end_inst(st, in, LMC_GONE_REAPED); /* moves the last instance into slot i */
        }
    }
    /* Every instance left is due after now. */
    if (st->next_reap_ms - now < wait)
        wait = st->next_reap_ms - now;
    return wait;
}

int lmc_state_init(struct lmc_front *f)
{
    struct lmc_state *st = calloc(1, sizeof(*st));
    if (!st)
        return -ENOMEM;
    st->jobs.newer = st->jobs.older = &st->jobs;
    atomic_init(&st->events_pending, false);
    f->st = st;
    return 0;
}

void lmc_state_destroy(struct lmc_front *f)
{
    struct lmc_state *st = f->st;
    if (!st)
        return;
    lmc_jobs_free_all(st);
    while (st->ninst)
        drop_inst(st, st->inst[st->ninst - 1]);
    free(st);
    f->st = NULL;
}
