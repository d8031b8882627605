/*
 * instances.h - LMCache instances and their liveness, over the core's owners and operations
 * (core/owner.h, core/ops.h; docs/LMCACHE.md, "Instances", "Liveness", "Restarts", "Shared memory
 * lost"): registration, unregistration, pings, reaping, and what the daemon tells an instance
 * from other threads (the shared segment lost, the end of its client).
 *
 * Each LMCache instance (one worker rank, named by its 63-bit instance id) is an owner of the
 * core with one registration; its requests act as that owner, so ending it is the core's owner
 * release: its reservations aborted, its pins (its retrieves' and the lookup read locks it was
 * chosen to hold) dropped, its registration gone. Its owner carries this front end's callbacks
 * (struct kvp_owner_ops): another thread's event only marks the instance, and this front end's
 * thread ends it at its next request, ping or tick.
 *
 * Every time rule reads the time of the request being served, lmc_front.now_ms, never a clock
 * of its own: an instance silent longer than --lmcache-reap-timeout (pinged) or
 * --lmcache-registration-grace (never pinged) is reaped at the first tick after, not a
 * millisecond before. The ids of instances gone (reaped, dropped, told, unregistered: the last
 * LMC_MAX_REAPED) are remembered for their pings. At most LMC_MAX_INSTANCES instances. Called
 * from the listener's thread only.
 */
#ifndef KVP_LMC_INSTANCES_H
#define KVP_LMC_INSTANCES_H

#include <stdbool.h>
#include <stdint.h>

#include "lmc/state.h"

/* Sets up f->st. Returns 0 or -ENOMEM. */
int lmc_state_init(struct lmc_front *f);

/* Ends every job and instance (reservations aborted, pins dropped), then frees f->st. */
void lmc_state_destroy(struct lmc_front *f);

/* What a registration answers. */
struct lmc_reg_answer {
    char shm_name[128]; /* "" sends the worker to its pickle transport */
    uint64_t pool_size;
    char error[700]; /* "" when accepted */
};

void lmc_inst_register(struct lmc_front *f, const struct lmc_register *m, struct lmc_reg_answer *a);
void lmc_inst_unregister(struct lmc_front *f, uint64_t iid);

/* The answer to a ping of instance iid (has false: the scheduler's, without an id). */
bool lmc_inst_ping(struct lmc_front *f, bool has, uint64_t iid);

/* Frees every chunk nobody pins (LMCache's clear). */
void lmc_clear(struct lmc_front *f);

/* Reaps silent instances, ends those another thread marked, expires unclaimed lookup locks;
 * returns the ms until it wants to run again (at most 1000: marks are noticed here). */
uint64_t lmc_state_tick(struct lmc_front *f);

/* The instance a keyed worker request of operation op (for the logs) acts for, its liveness
 * refreshed and its rank taken from k; NULL (logged) when it cannot act: unknown (counted),
 * refused, or k has no worker_id. */
struct lmc_inst *lmc_inst_worker(struct lmc_front *f, uint64_t iid, const struct lmc_key *k,
                                 const char *op);

/* Instance iid with its liveness refreshed, or NULL (counted as an unknown instance). */
struct lmc_inst *lmc_inst_seen(struct lmc_front *f, uint64_t iid);

/* in's worker was offered the segment but sends its chunks in the messages, in form
 * (KVP_REG_PICKLE or KVP_REG_ENVELOPE): its registration moves to that in-band transport for
 * good (logged once). Returns whether in is in band now. */
bool lmc_inst_leave_shm(struct lmc_front *f, struct lmc_inst *in, uint8_t form);

#endif /* KVP_LMC_INSTANCES_H */
