/*
 * pending.c - the pending prepare/commit pairs of each LMCache instance (see pending.h).
 *
 * An entry names the core's hold (a reservation of prepare_store, a pin set of
 * prepare_retrieve), the key's identity and the connection that prepared it. The identity is a
 * 128-bit XXH3 digest of what LMCache compares to pair a commit with its prepare (model, world
 * size, worker, token ids, range, salt): the token ids themselves are not kept. The table is a
 * small array per instance (LMC_MAX_PENDING): a worker has a handful of requests in flight, so
 * a linear search is cheaper than any index.
 *
 * Ending an entry's hold goes through the core as its owner (the instance's): a reservation is
 * aborted (nothing published), a pin set released. Thread: the listener's only.
 */
#include "lmc/pending.h"

#include <inttypes.h>
#include <string.h>
#include <xxhash.h>

#include "base/log.h"

void lmc_key_digest(const struct lmc_front *f, const struct lmc_key *k, uint8_t out[16])
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

struct lmc_pending *lmc_pending_find(struct lmc_inst *in, const uint8_t d[16], bool read,
                                     uint64_t peer)
{
    for (uint32_t i = 0; i < in->npend; i++)
        if (in->pend[i].read == read && in->pend[i].peer == peer &&
            memcmp(in->pend[i].digest, d, 16) == 0)
            return &in->pend[i];
    return NULL;
}

bool lmc_pending_foreign(const struct lmc_inst *in, const uint8_t d[16], bool read, uint64_t peer)
{
    for (uint32_t i = 0; i < in->npend; i++)
        if (in->pend[i].read == read && in->pend[i].peer != peer &&
            memcmp(in->pend[i].digest, d, 16) == 0)
            return true;
    return false;
}

void lmc_pending_remove(struct lmc_inst *in, struct lmc_pending *p)
{
    *p = in->pend[--in->npend];
}

/* Ends the hold of p: a reservation is aborted, a pin set released. */
static void end_hold(struct lmc_state *st, struct lmc_inst *in, const struct lmc_pending *p)
{
    if (p->read)
        kvp_op_commit_retrieve(&in->owner, in->handle, p->hold, st->msg, sizeof(st->msg));
    else
        kvp_op_abort_store(&in->owner, in->handle, p->hold, KVP_DROP_ABORT, st->msg,
                           sizeof(st->msg));
}

void lmc_pending_end(struct lmc_state *st, struct lmc_inst *in, struct lmc_pending *p)
{
    end_hold(st, in, p);
    lmc_pending_remove(in, p);
}

void lmc_pending_add(struct lmc_state *st, struct lmc_inst *in, const uint8_t d[16], bool read,
                     uint64_t hold, uint64_t peer)
{
    struct lmc_pending *old = lmc_pending_find(in, d, read, peer);
    if (old)
        lmc_pending_end(st, in, old);
    if (in->npend == LMC_MAX_PENDING) {
        log_warn_rl("LMCache instance %" PRIu64 ": %u prepares without their commit; ending "
                    "the oldest",
                    in->iid, LMC_MAX_PENDING);
        end_hold(st, in, &in->pend[0]);
        memmove(&in->pend[0], &in->pend[1], (LMC_MAX_PENDING - 1) * sizeof(in->pend[0]));
        in->npend--;
    }
    struct lmc_pending *p = &in->pend[in->npend++];
    p->hold = hold;
    p->read = read;
    p->peer = peer;
    memcpy(p->digest, d, 16);
}
