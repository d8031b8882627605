/*
 * transfers.h - a worker's stores and retrieves: LMCache's prepare_store, commit_store,
 * prepare_retrieve and commit_retrieve, over the core's operations, through the shared segment's
 * slots or in band (inband.h) (docs/LMCACHE.md, "Stores", "Retrieves", "Shared memory").
 *
 * Each acts as the instance iid names (refreshing its liveness), with the keys of the rank its
 * key names. A prepare that reserved or pinned leaves a pending pair (pending.h) that only its
 * commit, from the same connection, ends. Called from the listener's thread only.
 */
#ifndef KVP_LMC_TRANSFERS_H
#define KVP_LMC_TRANSFERS_H

#include <stdbool.h>
#include <stdint.h>

#include "lmc/state.h"

/* The slots to write for k's range (out->n 0: nothing to write), or out->no_buffers for an
 * in-band instance (its commit carries the chunks). */
void lmc_prepare_store(struct lmc_front *f, uint64_t iid, const struct lmc_key *k,
                       struct lmc_slots *out);

/* A commit: data_len 0 publishes the pending prepare's slots; otherwise data carries the range's
 * chunks, a tensor envelope (LMCache 0.5.7, envelope.h) or a pickle (older workers; never
 * unpickled: torch_pickle.h recognises it), decoded, then copied into fresh slots. */
bool lmc_commit_store(struct lmc_front *f, uint64_t iid, const struct lmc_key *k,
                      const uint8_t *data, uint64_t data_len);

/* Pins k's whole range (else a miss: false): its slots in out, or, for an in-band instance, its
 * chunks to encode (out->in_band; lmc_retrieve_in_band_end() after the reply is built). */
bool lmc_prepare_retrieve(struct lmc_front *f, uint64_t iid, const struct lmc_key *k,
                          struct lmc_slots *out);

/* Ends the pins of k's prepare_retrieve. False only for an unknown instance and for a commit of
 * another connection's prepare. */
bool lmc_commit_retrieve(struct lmc_front *f, uint64_t iid, const struct lmc_key *k);

#endif /* KVP_LMC_TRANSFERS_H */
