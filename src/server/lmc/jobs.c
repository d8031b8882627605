/*
 * jobs.c - LMCache's prefetch jobs and lookup read locks (see jobs.h; docs/LMCACHE.md,
 * "Lookups").
 *
 * Lookups. The scheduler's lookup names no worker: a chunk is a hit only if every rank of the
 * world size has it (every key names its rank, a single-plane layout too: LMCache's MLA workers
 * name one rank for their replicas themselves), and the hit count is the leading run of hits.
 * For each rank the lookup runs as an instance that serves that rank (the one whose requests
 * named it, else any instance of the model and world size: tensor-parallel ranks share a
 * layout) with KVP_LOOKUP_PIN, so the chunks found stay pinned for the request's readers:
 * LMCache's lookup read locks. They are held by that instance's owner, so reaping it drops them
 * too (lmc_jobs_release_inst() forgets them first). A rank's locks end when num_kv_readers
 * retrieves of that rank have claimed them (each retrieve pins what it reads by itself first),
 * or on free_lookup_locks, end_session, a new lookup of the same request, or after LMCache's read
 * TTL.
 *
 * Jobs. L1 lookups finish at once, L2 ones are waited for inside the lookup operation, so a job
 * is always done when query or wait see it: they return its hit count (a chunk count) once and 0
 * afterwards, and for unknown ids. Jobs are found by request id in a hash table and kept in an
 * age list, oldest first, which the read TTL walks from its head (lmc_jobs_expire(), at each
 * tick, against lmc_front.now_ms).
 *
 * Thread: the listener's only.
 */
#include "lmc/jobs.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/clock.h"
#include "base/log.h"

static uint64_t rid_hash(const char *rid)
{
    return XXH3_64bits(rid, strlen(rid));
}

static struct lmc_job *job_find(struct lmc_state *st, const char *rid)
{
    uint64_t h = rid_hash(rid);
    for (struct lmc_job *j = st->buckets[h % LMC_JOB_BUCKETS]; j; j = j->hnext)
        if (j->hash == h && strcmp(j->rid, rid) == 0)
            return j;
    return NULL;
}

/* Ends one rank's pins, if its instance still holds them. */
static void job_pin_release(struct lmc_state *st, struct lmc_job_pin *p)
{
    if (!p->hold)
        return;
    struct lmc_inst *in = lmc_inst_find(st, p->iid);
    if (in && in->registered && in->handle == p->handle)
        kvp_op_commit_retrieve(&in->owner, in->handle, p->hold, st->msg, sizeof(st->msg));
    p->hold = 0;
}

static void job_release_pins(struct lmc_state *st, struct lmc_job *j)
{
    for (uint32_t i = 0; i < j->npins; i++)
        job_pin_release(st, &j->pins[i]);
}

static void job_free(struct lmc_state *st, struct lmc_job *j)
{
    job_release_pins(st, j);
    struct lmc_job **pp = &st->buckets[j->hash % LMC_JOB_BUCKETS];
    while (*pp != j)
        pp = &(*pp)->hnext;
    *pp = j->hnext;
    j->older->newer = j->newer;
    j->newer->older = j->older;
    st->njobs--;
    free(j->pins);
    free(j);
}

void lmc_jobs_claim(struct lmc_state *st, const char *request_id, uint32_t rank)
{
    struct lmc_job *j = job_find(st, request_id);
    if (!j)
        return;
    for (uint32_t i = 0; i < j->npins; i++) {
        struct lmc_job_pin *p = &j->pins[i];
        if ((p->rank == rank || j->npins == 1) && p->readers_left > 0) {
            if (--p->readers_left == 0)
                job_pin_release(st, p);
            return;
        }
    }
}

void lmc_jobs_release_inst(struct lmc_state *st, uint64_t iid)
{
    for (struct lmc_job *j = st->jobs.newer; j != &st->jobs; j = j->newer)
        for (uint32_t i = 0; i < j->npins; i++)
            if (j->pins[i].iid == iid)
                job_pin_release(st, &j->pins[i]);
}

uint64_t lmc_jobs_expire(struct lmc_state *st, uint64_t now)
{
    /* Lookup read locks nobody claimed, after LMCache's read TTL. */
    while (st->jobs.newer != &st->jobs &&
           kvp_ms_since(now, st->jobs.newer->created_ms) > LMC_READ_TTL_MS)
        job_free(st, st->jobs.newer);
    if (st->jobs.newer == &st->jobs)
        return UINT64_MAX;
    return st->jobs.newer->created_ms + LMC_READ_TTL_MS + 1 - now;
}

void lmc_jobs_free_all(struct lmc_state *st)
{
    while (st->jobs.newer != &st->jobs)
        job_free(st, st->jobs.newer);
}

/* The instance a lookup of rank r acts as: one whose requests named r, else any instance of the
 * model and world size. */
static struct lmc_inst *rank_inst(struct lmc_state *st, const struct lmc_key *k, uint32_t r)
{
    struct lmc_inst *any = NULL;
    for (uint32_t i = 0; i < st->ninst; i++) {
        struct lmc_inst *in = st->inst[i];
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
    struct lmc_job *j = job_find(st, k->request_id);

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
    j->hnext = st->buckets[j->hash % LMC_JOB_BUCKETS];
    st->buckets[j->hash % LMC_JOB_BUCKETS] = j;
    j->newer = &st->jobs;
    j->older = st->jobs.older;
    st->jobs.older->newer = j;
    st->jobs.older = j;
    st->njobs++;

    struct lmc_inst *first = rank_inst(st, k, 0);
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
        struct lmc_inst *in = rank_inst(st, k, r);
        struct kvp_op_slots res;
        struct kvp_key_src src;
        lmc_key_src(f, k, r, true, &src);
        if (!in || kvp_op_lookup(&in->owner, in->handle, &src, KVP_LOOKUP_PIN, &res, st->msg,
                                 sizeof(st->msg))) {
            hits = 0;
            break;
        }
        j->pins[j->npins++] = (struct lmc_job_pin){.iid = in->iid,
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
    struct lmc_job *j = job_find(f->st, request_id);
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
    struct lmc_job *j = job_find(f->st, k->request_id);
    if (!j)
        return;
    job_release_pins(f->st, j);
    j->consumed = true;
}

void lmc_end_session(struct lmc_front *f, const char *request_id)
{
    struct lmc_job *j = job_find(f->st, request_id);
    if (j)
        job_free(f->st, j);
}
