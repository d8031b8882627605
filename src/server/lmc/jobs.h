/*
 * jobs.h - LMCache's prefetch jobs and lookup read locks (docs/LMCACHE.md, "Lookups").
 *
 * The scheduler's lookup makes a job under its request id: the hit count (the leading chunks
 * every rank of the world size has stored), delivered once by query or wait, and per rank the
 * lookup read locks (the chunks found, pinned by an instance serving that rank) that the
 * request's retrieves claim. A job's locks end when num_kv_readers retrieves of each rank have
 * claimed them, on free_lookup_locks, end_session, a new lookup of the same request, the end of
 * the instance holding them, or after LMC_READ_TTL_MS (read from lmc_front.now_ms). At most
 * LMC_MAX_JOBS jobs: the oldest is dropped, its locks released, when a lookup finds the table
 * full. Called from the listener's thread only.
 */
#ifndef KVP_LMC_JOBS_H
#define KVP_LMC_JOBS_H

#include <stdbool.h>
#include <stdint.h>

#include "lmc/state.h"

/* The scheduler's lookup of key k (no worker_id): a new job under k's request id, replacing the
 * request's previous one. */
void lmc_lookup(struct lmc_front *f, const struct lmc_key *k);

/* The job's hit count, once; 0 for an unknown or consumed request id. */
int64_t lmc_query(struct lmc_front *f, const char *request_id);

/* Releases the read locks of k's request when k's range is not empty (the job's count stays
 * consumed). */
void lmc_free_lookup_locks(struct lmc_front *f, const struct lmc_key *k);

/* Ends request_id's job and its locks. */
void lmc_end_session(struct lmc_front *f, const char *request_id);

/* A retrieve of rank of request_id pinned what it reads itself: one reader of that rank's read
 * locks is done (the last one releases them). Nothing when the request has no job. */
void lmc_jobs_claim(struct lmc_state *st, const char *request_id, uint32_t rank);

/* Releases every read lock instance iid holds (its owner is being released). */
void lmc_jobs_release_inst(struct lmc_state *st, uint64_t iid);

/* Ends the jobs older than LMC_READ_TTL_MS at now; returns the ms until the next one is due
 * (UINT64_MAX: no job). */
uint64_t lmc_jobs_expire(struct lmc_state *st, uint64_t now);

/* Ends every job (the front end is stopping). */
void lmc_jobs_free_all(struct lmc_state *st);

#endif /* KVP_LMC_JOBS_H */
