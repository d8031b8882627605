/*
 * instances.h - what LMCache's protocol has and kvpool's own does not, over the core's
 * operations (core/ops.h): LMCache instances and their liveness, the pending prepare/commit
 * pairs of each, lookup read locks held for a request's readers, prefetch jobs whose result is
 * delivered exactly once, and sessions (docs/LMCACHE.md, "Semantics").
 *
 * Each LMCache instance (one worker rank, named by its 63-bit instance id) is an owner of the
 * core (core/owner.h) with one registration; its requests act as that owner, so reaping it is
 * the core's owner release: its reservations aborted, its pins (its retrieves' and the lookup
 * read locks it was chosen to hold) dropped, its registration gone. Keys are the core's, derived
 * from the registration with the rank each request names (the key's worker_id).
 *
 * Everything is bounded: LMC_MAX_INSTANCES instances, LMC_MAX_PENDING pending pairs each,
 * LMC_MAX_JOBS prefetch jobs (the oldest is dropped, its locks released, when a lookup finds
 * the table full), LMC_MAX_REAPED remembered reaped ids. Called from the listener's thread only.
 */
#ifndef KVP_LMC_INSTANCES_H
#define KVP_LMC_INSTANCES_H

#include <stdbool.h>
#include <stdint.h>

#include "lmc/envelope.h"
#include "lmc/front.h"
#include "lmc/messages.h"
#include "lmc/torch_pickle.h"

#define LMC_MAX_INSTANCES 1024u
#define LMC_MAX_PENDING 64u
#define LMC_MAX_JOBS 4096u
#define LMC_MAX_REAPED 256u
/* Unclaimed lookup read locks are dropped after LMCache's read TTL. */
#define LMC_READ_TTL_MS (300u * 1000u)

int lmc_state_init(struct lmc_front *f);
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

/* Slots of a prepare. */
struct lmc_slots {
    uint32_t n;
    struct lmc_slot *slots; /* LMC state scratch: valid until the next request */
    uint32_t *chunk_indices;
    struct lmc_slot_shape shape;
    bool no_buffers; /* prepare_store: answer {} (an in-band instance) */
    /* prepare_retrieve of an in-band instance: the chunks to encode (n of them, pinned until
     * lmc_retrieve_in_band_end()) in a tensor envelope (envelope: etpl) or a pickle (tpl). */
    bool in_band;
    bool envelope;
    const uint8_t *const *chunks;
    const struct kvp_tpickle_template *tpl;
    const struct kvp_envelope_template *etpl;
};

void lmc_prepare_store(struct lmc_front *f, uint64_t iid, const struct lmc_key *k,
                       struct lmc_slots *out);
/* A commit: data_len 0 publishes the pending prepare's slots; otherwise data carries the range's
 * chunks, a tensor envelope (LMCache 0.5.7, envelope.h) or a pickle (older workers; never
 * unpickled: torch_pickle.h recognises it), decoded, then copied into fresh slots. */
bool lmc_commit_store(struct lmc_front *f, uint64_t iid, const struct lmc_key *k,
                      const uint8_t *data, uint64_t data_len);
bool lmc_prepare_retrieve(struct lmc_front *f, uint64_t iid, const struct lmc_key *k,
                          struct lmc_slots *out);
/* Ends an in-band prepare_retrieve's pins once its reply is built (sent: counted as
 * retrieved). */
void lmc_retrieve_in_band_end(struct lmc_front *f, bool sent);
bool lmc_commit_retrieve(struct lmc_front *f, uint64_t iid, const struct lmc_key *k);

void lmc_lookup(struct lmc_front *f, const struct lmc_key *k);
/* The job's hit count, once; 0 for an unknown or consumed request id. */
int64_t lmc_query(struct lmc_front *f, const char *request_id);
void lmc_free_lookup_locks(struct lmc_front *f, const struct lmc_key *k);
void lmc_end_session(struct lmc_front *f, const char *request_id);
void lmc_clear(struct lmc_front *f);

/* Reaps silent instances and expires unclaimed lookup locks; returns ms until the next run. */
uint64_t lmc_state_tick(struct lmc_front *f);

#endif /* KVP_LMC_INSTANCES_H */
