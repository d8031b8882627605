/*
 * pending.h - the pending prepare/commit pairs of an LMCache instance (docs/LMCACHE.md,
 * "Stores", "Retrieves", "Connections").
 *
 * A prepare_store that reserved something, and a prepare_retrieve that pinned, leave a pending
 * entry under the instance, the key's identity and the connection that prepared it; the
 * matching commit, from that connection, pops it and ends the core's hold. A second prepare of
 * the same key (and connection) replaces the first, whose hold is ended, as upstream overwrites
 * its pending map. At most LMC_MAX_PENDING per instance: the oldest is ended to make room.
 * Called from the listener's thread only.
 */
#ifndef KVP_LMC_PENDING_H
#define KVP_LMC_PENDING_H

#include <stdbool.h>
#include <stdint.h>

#include "lmc/state.h"

/* The identity of key k (its tokens in f->tokens): a 128-bit digest of the fields LMCache
 * compares (model, world size, worker, tokens, range, salt). */
void lmc_key_digest(const struct lmc_front *f, const struct lmc_key *k, uint8_t out[16]);

/* The pending pair of in with digest d, of a retrieve (read) or a store, that connection peer
 * prepared; NULL when there is none. */
struct lmc_pending *lmc_pending_find(struct lmc_inst *in, const uint8_t d[16], bool read,
                                     uint64_t peer);

/* Whether another connection than peer prepared the key with digest d: a commit from peer must
 * not end it (LMCache's worker commits on the connection it prepared on). */
bool lmc_pending_foreign(const struct lmc_inst *in, const uint8_t d[16], bool read, uint64_t peer);

/* Records the hold of a prepare by peer, replacing (and ending) one of the same key and, when
 * the table is full, ending the oldest. */
void lmc_pending_add(struct lmc_state *st, struct lmc_inst *in, const uint8_t d[16], bool read,
                     uint64_t hold, uint64_t peer);

/* Removes p from in's table without ending its hold (the caller ends or hands it on). */
void lmc_pending_remove(struct lmc_inst *in, struct lmc_pending *p);

/* Ends p's hold (a reservation aborted, a pin set released) and removes it. */
void lmc_pending_end(struct lmc_state *st, struct lmc_inst *in, struct lmc_pending *p);

#endif /* KVP_LMC_PENDING_H */
