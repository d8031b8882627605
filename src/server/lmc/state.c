/*
 * state.c - what every module of the LMCache front end's semantics needs of its state (see
 * state.h): finding an instance by id, and a request's key as the core's key source.
 *
 * LMCache's registration has no rank: every keyed request names its own (the key's worker_id),
 * and the core derives the keys of that rank of the registration's model and layout
 * (struct kvp_key_src.other_rank, core/ops.h).
 *
 * It also keeps the outcome of the request being served (lmc_outcome()), which every module
 * of the front end writes: here, below them all, so that no module calls back up into
 * handlers.c.
 *
 * Thread: the listener's only.
 */
#include "lmc/state.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"

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

void lmc_outcome(struct lmc_front *f, const char *fmt, ...)
{
    va_list ap;
    if (!KVP_LOG_ON(KVP_LOG_DEBUG))
        return;
    va_start(ap, fmt);
    vsnprintf(f->outcome, sizeof(f->outcome), fmt, ap);
    va_end(ap);
}
