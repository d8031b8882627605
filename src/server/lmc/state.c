/*
 * state.c - what every module of the LMCache front end's semantics needs of its state (see
 * state.h): finding an instance by id, and a request's key as the core's key source.
 *
 * LMCache's registration has no rank: every keyed request names its own (the key's worker_id),
 * and the core derives the keys of that rank of the registration's model and layout
 * (struct kvp_key_src.other_rank, core/ops.h).
 *
 * Thread: the listener's only.
 */
#include "lmc/state.h"

#include <string.h>

struct lmc_inst *lmc_inst_find(struct lmc_state *st, uint64_t iid)
{
    for (uint32_t i = 0; i < st->ninst; i++)
        if (st->inst[i]->iid == iid)
            return st->inst[i];
    return NULL;
}

void lmc_key_src(const struct lmc_front *f, const struct lmc_key *k, uint32_t rank, bool lookup,
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
