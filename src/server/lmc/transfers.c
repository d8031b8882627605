/*
 * transfers.c - a worker's stores and retrieves (see transfers.h; docs/LMCACHE.md, "Stores",
 * "Retrieves", "Shared memory", "Connections").
 *
 * Shared memory. prepare_store reserves the range's chunks that are neither stored nor being
 * stored and answers their slots; the worker writes them through its mapping and commit_store
 * publishes them. prepare_retrieve pins the whole range (all or nothing, as upstream: the
 * worker scatters every chunk) and answers the slots; commit_retrieve unpins. Each prepare
 * leaves a pending pair (pending.h), bound to the connection that made it: a commit from
 * another connection is refused and ends nothing, so no peer can publish another worker's
 * unwritten reservation or drop its pins.
 *
 * In band. An instance on the pickle or envelope transport gets {} from prepare_store (nothing
 * is reserved until the commit brings the chunks) and its chunks in the reply of
 * prepare_retrieve (inband.h). Only a commit shows what a worker really does: a commit that
 * carries chunks from an instance offered the segment means its worker could not map it, and
 * moves the instance to the in-band transport of the commit's form for good (lmc_inst_leave_shm(),
 * instances.h), but only on the connection that registered it.
 *
 * Every retrieve that pinned what it reads claims one reader of its request's lookup read
 * locks (jobs.h). Thread: the listener's only.
 */
#include "lmc/transfers.h"

#include <inttypes.h>
#include <string.h>

#include "base/log.h"
#include "core/daemon.h"
#include "core/stats.h"
#include "lmc/inband.h"
#include "lmc/instances.h"
#include "lmc/jobs.h"
#include "lmc/pending.h"

static void fill_slots(struct lmc_state *st, const struct lmc_inst *in,
                       const struct kvp_op_slots *res, struct lmc_slots *out)
{
    for (uint32_t j = 0; j < res->nslots; j++) {
        st->slots[j].offset = res->objs[j]->offset;
        st->slots[j].length = res->chunk_bytes;
        st->idx[j] = res->idx ? res->idx[j] : j;
    }
    out->n = res->nslots;
    out->slots = st->slots;
    out->chunk_indices = st->idx;
    out->shape = in->shape;
}

void lmc_prepare_store(struct lmc_front *f, uint64_t iid, const struct lmc_key *k,
                       struct lmc_slots *out)
{
    struct lmc_state *st = f->st;
    struct kvp_op_slots res;
    struct kvp_key_src src;
    uint8_t d[16];

    memset(out, 0, sizeof(*out));
    struct lmc_inst *in = lmc_inst_worker(f, iid, k, "prepare_store");
    if (!in)
        return;
    if (in->transport != KVP_REG_SHM) {
        /* Its commit carries the chunks and reserves then, as upstream's in-band strategies. */
        out->no_buffers = true;
        lmc_outcome(f, "in band: the commit carries the chunks");
        return;
    }
    lmc_key_src(f, k, k->worker_id, false, &src);
    int rc = kvp_op_prepare_store(&in->owner, in->handle, &src, &res, st->msg, sizeof(st->msg));
    if (rc) {
        log_warn_rl("LMCache prepare_store of instance %" PRIu64 " failed: %s", iid, st->msg);
        return;
    }
    if (res.no_space)
        log_warn_rl("LMCache instance %" PRIu64 ": %u chunk%s not stored for lack of "
                    "evictable space in the pool",
                    iid, res.no_space, res.no_space == 1 ? "" : "s");
    lmc_outcome(f, "%u of %u chunks to write (%u cached, %u being stored, %u without room)",
                res.nslots, res.nchunks, res.cached, res.busy, res.no_space);
    if (res.nslots == 0)
        return; /* everything cached or being stored: the worker sends no commit */
    lmc_key_digest(f, k, d);
    lmc_pending_add(st, in, d, false, res.id, f->peer);
    fill_slots(st, in, &res, out);
}

bool lmc_commit_store(struct lmc_front *f, uint64_t iid, const struct lmc_key *k,
                      const uint8_t *data, uint64_t data_len)
{
    struct lmc_state *st = f->st;
    uint8_t d[16];
    struct lmc_inst *in = lmc_inst_worker(f, iid, k, "commit_store");
    if (!in)
        return false;
    lmc_key_digest(f, k, d);
    struct lmc_pending *p = lmc_pending_find(in, d, false, f->peer);
    if (!p && data_len == 0 && lmc_pending_foreign(in, d, false, f->peer)) {
        KVP_COUNT(lmcache_foreign_commits, 1);
        log_warn_rl("LMCache commit_store of instance %" PRIu64 " refused: another connection "
                    "prepared it (a worker commits on the connection it prepared on)",
                    iid);
        return false;
    }
    if (data_len > 0) {
        /* The chunks themselves: LMCache 0.5.7's tensor envelope (a msgpack map), or an older
         * worker's pickle. The slots a prepare reserved for it were never written. */
        bool envelope = kvp_envelope_sniff(data, (size_t)data_len);
        uint8_t form = envelope ? KVP_REG_ENVELOPE : KVP_REG_PICKLE;
        if (p)
            lmc_pending_end(st, in, p);
        bool in_band = kvp_reg_transport_in_band(in->transport);
        if (!in_band && f->peer != in->peer) {
            /* Only the worker itself moves its instance off shared memory: a commit of
             * another connection would leave the real worker storing into slots nobody
             * reads. */
            KVP_COUNT(lmcache_foreign_commits, 1);
            log_warn_rl("LMCache commit_store of instance %" PRIu64 " refused: its chunks came "
                        "in the message from another connection than the one that registered "
                        "it on shared memory",
                        iid);
            return false;
        }
        if (!in_band && !lmc_inst_leave_shm(f, in, form))
            return false;
        return lmc_in_band_commit(f, in, k, envelope, data, data_len);
    }
    if (!p)
        return false;
    uint64_t hold = p->hold;
    lmc_pending_remove(in, p);
    int rc = kvp_op_commit_store(&in->owner, in->handle, hold, KVP_VIA_SHM, st->msg,
                                 sizeof(st->msg));
    lmc_outcome(f, rc >= 0 ? "%d chunks published" : "refused (%d): the reservation expired", rc);
    return rc >= 0;
}

bool lmc_prepare_retrieve(struct lmc_front *f, uint64_t iid, const struct lmc_key *k,
                          struct lmc_slots *out)
{
    struct lmc_state *st = f->st;
    struct kvp_op_slots res;
    struct kvp_key_src src;
    uint8_t d[16];

    memset(out, 0, sizeof(*out));
    struct lmc_inst *in = lmc_inst_worker(f, iid, k, "prepare_retrieve");
    if (!in)
        return false;
    lmc_key_src(f, k, k->worker_id, false, &src);
    if (kvp_reg_transport_in_band(in->transport)) {
        if (!lmc_in_band_retrieve(f, in, k, &src, out))
            return false;
        /* This retrieve pinned what it reads: one reader of the lookup's locks is done. */
        lmc_jobs_claim(st, k->request_id, k->worker_id);
        return true;
    }
    if (in->transport != KVP_REG_SHM)
        return false;
    int rc = kvp_op_prepare_retrieve(&in->owner, in->handle, &src, &res, st->msg, sizeof(st->msg));
    if (rc) {
        log_warn_rl("LMCache prepare_retrieve of instance %" PRIu64 " failed: %s", iid, st->msg);
        return false;
    }
    /* All or nothing, as upstream: the worker scatters every chunk of the range. */
    if (res.nchunks == 0 || res.nslots < res.nchunks) {
        if (res.id)
            kvp_op_commit_retrieve(&in->owner, in->handle, res.id, st->msg, sizeof(st->msg));
        lmc_outcome(f, "a miss: %u of %u chunks stored", res.nslots, res.nchunks);
        return false;
    }
    lmc_outcome(f, "a hit: %u chunks to read", res.nslots);
    lmc_key_digest(f, k, d);
    lmc_pending_add(st, in, d, true, res.id, f->peer);
    fill_slots(st, in, &res, out);
    lmc_jobs_claim(st, k->request_id, k->worker_id);
    return true;
}

bool lmc_commit_retrieve(struct lmc_front *f, uint64_t iid, const struct lmc_key *k)
{
    struct lmc_state *st = f->st;
    uint8_t d[16];
    struct lmc_inst *in = lmc_inst_seen(f, iid);
    if (!in)
        return false;
    if (!in->registered)
        return true;
    lmc_key_digest(f, k, d);
    struct lmc_pending *p = lmc_pending_find(in, d, true, f->peer);
    if (!p && lmc_pending_foreign(in, d, true, f->peer)) {
        KVP_COUNT(lmcache_foreign_commits, 1);
        log_warn_rl("LMCache commit_retrieve of instance %" PRIu64 " refused: another "
                    "connection prepared it",
                    iid);
        return false;
    }
    if (p)
        lmc_pending_end(st, in, p);
    return true;
}
