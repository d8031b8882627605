/*
 * inband.c - LMCache's in-band transports: chunks inside the messages, a torch pickle up to
 * LMCache 0.5.6, a tensor envelope from 0.5.7 on (see inband.h; docs/LMCACHE.md, "The pickle
 * transport", "LMCache 0.5.7").
 *
 * An instance is on an in-band transport when it was offered no segment (its registration's
 * transport is pickle or envelope), or when its worker, offered the segment, sent chunks in a
 * commit anyway (transfers.c moves it off shared memory then). Its registration gives each form
 * a template once (lmc_in_band_setup()): what a commit must carry (dtype, shape, one tensor per
 * chunk) and the fixed pieces of a reply.
 *
 * A commit is decoded and checked against the instance's chunk, exactly one tensor per chunk of
 * the range, before anything is reserved: a reservation may evict, and a payload that does not
 * match must cost the cache nothing. Then the range is reserved, each reserved chunk copied once
 * from the received frame into its slot, and the reservation published. A retrieve pins the
 * whole range (or is a miss) and hands the pinned chunks to the handler, which encodes them
 * straight into the reply; lmc_retrieve_in_band_end() unpins them once the reply is built.
 *
 * Thread: the listener's only. The decoded tensors and the pinned chunks are the state's
 * scratch, valid for the request being served.
 */
#include "lmc/inband.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "common/layout.h"
#include "core/daemon.h"
#include "core/stats.h"

/* The largest in-band commit is bounded by one value for both forms (lmc_max_value_frame()). */
_Static_assert(KVP_ENVELOPE_TENSOR_OVERHEAD <= KVP_TPICKLE_TENSOR_OVERHEAD &&
                   KVP_ENVELOPE_STREAM_OVERHEAD <= KVP_TPICKLE_STREAM_OVERHEAD,
               "an envelope's overheads exceed the pickle's that bound a frame");

uint64_t lmc_max_value_frame(uint64_t l1_size)
{
    /* n chunks of b bytes fit the pool (n * b <= l1_size) and n <= KVP_MAX_CHUNKS, so any
     * registration's kvp_tpickle_max_payload() is at most this, and so is its
     * kvp_envelope_max_payload() (smaller overheads, asserted above); 5: a bin32 header. */
    return 5 + KVP_TPICKLE_STREAM_OVERHEAD + l1_size +
           (uint64_t)KVP_MAX_CHUNKS * KVP_TPICKLE_TENSOR_OVERHEAD;
}

void lmc_in_band_setup(struct lmc_front *f, struct lmc_inst *in, uint64_t chunk_bytes)
{
    struct kvp_tpickle_layout *l = &in->exp.layout;
    struct kvp_envelope_layout *el = &in->eexp.layout;
    char why[160];
    l->dtype = el->dtype = in->shape.dtype;
    l->ndim = el->ndim = in->shape.ndim;
    for (uint32_t i = 0; i < l->ndim; i++)
        l->shape[i] = el->shape[i] = in->shape.shape[i];
    uint64_t fit = chunk_bytes ? f->srv->cfg.l1_size / chunk_bytes : 0;
    in->max_chunks = fit < KVP_MAX_CHUNKS ? (uint32_t)fit : KVP_MAX_CHUNKS;
    in->tpl_ok = kvp_tpickle_template_init(&in->tpl, l, why, sizeof(why)) == 0;
    if (!in->tpl_ok)
        log_warn("LMCache instance %" PRIu64 ": its chunks have no pickle form (%s); pickle "
                 "commits will be refused",
                 in->iid, why);
    in->etpl_ok = kvp_envelope_template_init(&in->etpl, el, why, sizeof(why)) == 0;
    if (!in->etpl_ok)
        log_warn("LMCache instance %" PRIu64 ": its chunks have no tensor envelope form (%s); "
                 "envelope commits will be refused",
                 in->iid, why);
}

/* Decodes an in-band commit's data (a pickle, or an envelope when envelope) against the
 * instance's chunk, exactly nchunks tensors, into st->src. Returns 0, or a negative errno with
 * the reason in why. */
static int in_band_decode(struct lmc_state *st, const struct lmc_inst *in, bool envelope,
                          const uint8_t *data, uint64_t len, uint32_t nchunks, char *why,
                          size_t why_size)
{
    uint32_t n = 0;
    int rc;
    if (envelope) {
        struct kvp_envelope_expect exp = in->eexp;
        exp.min_tensors = exp.max_tensors = nchunks;
        rc = kvp_envelope_decode(data, (size_t)len, &exp, st->etens, KVP_MAX_CHUNKS, &n, why,
                                 why_size);
        for (uint32_t i = 0; rc == 0 && i < n; i++)
            st->src[i] = st->etens[i].data;
    } else {
        struct kvp_tpickle_expect exp = in->exp;
        exp.min_tensors = exp.max_tensors = nchunks;
        rc = kvp_tpickle_decode(data, (size_t)len, &exp, st->tens, KVP_MAX_CHUNKS, &n, why,
                                why_size);
        for (uint32_t i = 0; rc == 0 && i < n; i++)
            st->src[i] = st->tens[i].data;
    }
    if (rc == 0 && n != nchunks) {
        /* The decoders hold min_tensors = max_tensors: never reached. */
        snprintf(why, why_size, "%u tensors for %u chunks", n, nchunks);
        rc = -EPROTO;
    }
    return rc;
}

bool lmc_in_band_commit(struct lmc_front *f, struct lmc_inst *in, const struct lmc_key *k,
                        bool envelope, const uint8_t *data, uint64_t len)
{
    struct lmc_state *st = f->st;
    struct kvp_op_slots res, io;
    struct kvp_key_src src;
    char why[200];
    const char *form = envelope ? "tensor envelope" : "pickle";

    if (envelope ? !in->etpl_ok : !in->tpl_ok) {
        log_warn_rl("LMCache instance %" PRIu64 ": a %s commit refused (its dtype has no %s "
                    "form)",
                    in->iid, form, form);
        return false;
    }
    /* Decoded and checked before anything is reserved: a reservation may evict, and a
     * payload that does not match must cost the cache nothing. */
    uint32_t first, nchunks = 0;
    int rc = kvp_chunk_range(k->start, k->end, k->ntokens, f->srv->cfg.chunk_tokens, KVP_MAX_CHUNKS,
                             &first, &nchunks, why, sizeof(why));
    if (rc) {
        /* why says what is wrong with the range */
    } else if (nchunks > in->max_chunks) {
        snprintf(why, sizeof(why), "%u chunks, more than the pool holds (%u)", nchunks,
                 in->max_chunks);
        rc = -E2BIG;
    } else if (nchunks == 0) {
        snprintf(why, sizeof(why), "the range [%u, %u) has no full chunk", k->start, k->end);
        rc = -EINVAL;
    } else {
        rc = in_band_decode(st, in, envelope, data, len, nchunks, why, sizeof(why));
    }
    if (rc) {
        KVP_COUNT(lmcache_malformed, 1);
        log_warn_rl("LMCache instance %" PRIu64 ": a %s commit of %" PRIu64
                    " bytes refused, nothing stored: %s",
                    in->iid, form, len, why);
        return false;
    }
    lmc_key_src(f, k, k->worker_id, false, &src);
    rc = kvp_op_prepare_store(&in->owner, in->handle, &src, &res, st->msg, sizeof(st->msg));
    if (rc) {
        log_warn_rl("LMCache commit_store of instance %" PRIu64 " failed: %s", in->iid, st->msg);
        return false;
    }
    if (res.nchunks != nchunks) {
        /* The core counts the range as kvp_chunk_range() does: never reached. */
        if (res.id)
            kvp_op_abort_store(&in->owner, in->handle, res.id, KVP_DROP_ABORT, st->msg,
                               sizeof(st->msg));
        log_warn_rl("LMCache instance %" PRIu64 ": a %s commit of %u chunks found %u", in->iid,
                    form, nchunks, res.nchunks);
        return false;
    }
    if (res.no_space)
        log_warn_rl("LMCache instance %" PRIu64 ": %u chunk%s not stored for lack of "
                    "evictable space in the pool",
                    in->iid, res.no_space, res.no_space == 1 ? "" : "s");
    lmc_outcome(f, "%s: %u of %u chunks to store (%u cached, %u being stored, %u without room)",
                form, res.nslots, res.nchunks, res.cached, res.busy, res.no_space);
    if (res.nslots == 0)
        return res.no_space == 0; /* cached, or being stored by another worker */
    /* The reservation's chunk indices, before the next operation reuses the scratch. */
    uint32_t nslots = res.nslots;
    for (uint32_t j = 0; j < nslots; j++)
        st->idx[j] = res.idx ? res.idx[j] : j;
    rc = kvp_op_store_inline_begin(&in->owner, in->handle, res.id,
                                   (uint64_t)nslots * res.chunk_bytes, &io, st->msg,
                                   sizeof(st->msg));
    if (rc) {
        log_warn_rl("LMCache instance %" PRIu64 ": a %s commit failed: %s", in->iid, form, st->msg);
        return false;
    }
    /* One copy, from the received frame into the reserved slots. */
    for (uint32_t j = 0; j < nslots; j++)
        memcpy(io.iov[j].iov_base, st->src[st->idx[j]], io.iov[j].iov_len);
    rc = kvp_op_commit_store(&in->owner, in->handle, res.id, KVP_VIA_INLINE, st->msg,
                             sizeof(st->msg));
    if (rc < 0)
        log_warn_rl("LMCache instance %" PRIu64 ": a %s commit failed: %s", in->iid, form, st->msg);
    return rc >= 0 && (uint32_t)rc == nslots && res.no_space == 0;
}

bool lmc_in_band_retrieve(struct lmc_front *f, struct lmc_inst *in, const struct lmc_key *k,
                          const struct kvp_key_src *src, struct lmc_slots *out)
{
    struct lmc_state *st = f->st;
    struct kvp_op_slots *res = &st->rres;
    bool envelope = k->token_form == LMC_TOKENS_BYTES;
    if (envelope ? !in->etpl_ok : !in->tpl_ok)
        return false;
    int rc = kvp_op_retrieve_inline_begin(&in->owner, in->handle, src, res, st->msg,
                                          sizeof(st->msg));
    if (rc) {
        log_warn_rl("LMCache prepare_retrieve of instance %" PRIu64 " failed: %s", in->iid,
                    st->msg);
        return false;
    }
    if (res->nchunks == 0 || res->nslots < res->nchunks) {
        kvp_op_retrieve_inline_end(&in->owner, in->handle, res, false);
        lmc_outcome(f, "a miss: %u of %u chunks stored", res->nslots, res->nchunks);
        return false;
    }
    lmc_outcome(f, "a hit: %u chunks sent in the reply", res->nslots);
    for (uint32_t j = 0; j < res->nslots; j++)
        st->chunks[j] = res->iov[j].iov_base;
    st->rin = in;
    out->n = res->nslots;
    out->in_band = true;
    out->envelope = envelope;
    out->chunks = st->chunks;
    out->tpl = &in->tpl;
    out->etpl = &in->etpl;
    return true;
}

void lmc_retrieve_in_band_end(struct lmc_front *f, bool sent)
{
    struct lmc_state *st = f->st;
    if (!st->rin)
        return;
    kvp_op_retrieve_inline_end(&st->rin->owner, st->rin->handle, &st->rres, sent);
    st->rin = NULL;
}
