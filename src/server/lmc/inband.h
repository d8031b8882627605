/*
 * inband.h - LMCache's in-band transports: an instance's chunks inside its messages, a torch
 * pickle up to LMCache 0.5.6 (torch_pickle.h), a tensor envelope from 0.5.7 on (envelope.h)
 * (docs/LMCACHE.md, "The pickle transport", "LMCache 0.5.7").
 *
 * Each in-band commit is decoded by its own first byte (kvp_envelope_sniff()), and each in-band
 * retrieve answers in the form its key shows the worker reads (token_bytes: an envelope,
 * token_ids: a pickle), so workers of every version share one daemon. Neither form is ever
 * unpickled or decoded into objects: the decoders only find where each chunk lies in the frame,
 * and the chunks are copied once, from the frame into the pool or from the pool into the reply.
 * Called from the listener's thread only.
 */
#ifndef KVP_LMC_INBAND_H
#define KVP_LMC_INBAND_H

#include <stdbool.h>
#include <stdint.h>

#include "lmc/state.h"

/* Prepares in's in-band forms for its chunk (in->shape, of chunk_bytes bytes): what a commit
 * must carry, how many chunks at most (what the pool holds, and KVP_MAX_CHUNKS), the replies'
 * templates. A form its chunk cannot have is logged, and its commits are refused. */
void lmc_in_band_setup(struct lmc_front *f, struct lmc_inst *in, uint64_t chunk_bytes);

/* An in-band commit of in: data (a tensor envelope when envelope, else a pickle) carries the
 * chunks of k's range, decoded and checked before anything is reserved, then reserved, copied
 * into their slots and published. True when every chunk is stored (or already was, or is being
 * stored by another worker). */
bool lmc_in_band_commit(struct lmc_front *f, struct lmc_inst *in, const struct lmc_key *k,
                        bool envelope, const uint8_t *data, uint64_t len);

/* An in-band prepare_retrieve of in: every chunk of src's range pinned (else a miss: false)
 * until lmc_retrieve_in_band_end(); out says which chunks to encode in which form. */
bool lmc_in_band_retrieve(struct lmc_front *f, struct lmc_inst *in, const struct lmc_key *k,
                          const struct kvp_key_src *src, struct lmc_slots *out);

/* Ends an in-band prepare_retrieve's pins once its reply is built (sent: counted as
 * retrieved). */
void lmc_retrieve_in_band_end(struct lmc_front *f, bool sent);

#endif /* KVP_LMC_INBAND_H */
