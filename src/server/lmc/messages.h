/*
 * messages.h - LMCache's multiprocess messages as C structs: the operation table, one strict
 * decoder per request payload and one encoder per reply (docs/LMCACHE.md is the contract).
 *
 * Structs travel as msgpack maps keyed by field name (msgspec's encoding of dataclasses and
 * msgspec.Struct): decoders accept any key order, skip unknown keys (newer clients add fields),
 * default missing optional keys and refuse a payload that lacks a required one. Every length
 * is bounded before anything is copied; strings land in fixed buffers, token ids in the
 * caller's buffer as little-endian uint32 (the form the key chain hashes).
 *
 * Decoders return 0, or a negative errno with a one-line reason in why (why_size bytes):
 * -EPROTO (not msgpack), -EINVAL (a wrong type, a missing field, a forbidden value), -ERANGE (an
 * integer out of range), -E2BIG (a string or array over its bound).
 */
#ifndef KVP_LMC_MESSAGES_H
#define KVP_LMC_MESSAGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/limits.h"
#include "lmc/codec.h"

/* Bounds of what a client may send (docs/LMCACHE.md, "Limits"). */
#define LMC_MAX_REQUEST_ID 255u   /* bytes of a request id */
#define LMC_MAX_SALT_CHARS 128u   /* characters of a cache salt, as LMCache checks */
#define LMC_MAX_SALT_BYTES 512u   /* the same in UTF-8 bytes, at most */
#define LMC_MAX_PAYLOADS 8u       /* payload frames after uid and operation */
#define LMC_MAX_RECORDS 4096u     /* records in one report_block_allocation */
#define LMC_MAX_GROUPS 64u        /* KV cache groups in group_layouts and skipped_chunks */
#define LMC_MAX_EXTRA_RANGES 256u /* (start, end) pairs in one free_lookup_locks */

/* The operations, by their frozen integer ids (LMCache's LEGACY_OPERATION_IDS). Operations
 * outside the table travel as their name and get ids from 100 on here. */
#define LMC_OPS(X)                                                               \
    X(REGISTER_KV_CACHE, 1, "register_kv_cache")                                 \
    X(UNREGISTER_KV_CACHE, 2, "unregister_kv_cache")                             \
    X(REGISTER_Q_CACHE, 3, "register_q_cache")                                   \
    X(UNREGISTER_Q_CACHE, 4, "unregister_q_cache")                               \
    X(STORE_Q, 5, "store_q")                                                     \
    X(STORE, 6, "store")                                                         \
    X(RETRIEVE, 7, "retrieve")                                                   \
    X(LOOKUP, 8, "lookup")                                                       \
    X(QUERY_PREFETCH_STATUS, 9, "query_prefetch_status")                         \
    X(WAIT_PREFETCH_STATUS, 10, "wait_prefetch_status")                          \
    X(QUERY_PREFETCH_LOOKUP_HITS, 11, "query_prefetch_lookup_hits")              \
    X(FREE_LOOKUP_LOCKS, 12, "free_lookup_locks")                                \
    X(END_SESSION, 13, "end_session")                                            \
    X(REGISTER_ENGINE_DRIVEN, 14, "register_kv_cache_engine_driven_context")     \
    X(UNREGISTER_ENGINE_DRIVEN, 15, "unregister_kv_cache_engine_driven_context") \
    X(PREPARE_STORE, 16, "prepare_store")                                        \
    X(COMMIT_STORE, 17, "commit_store")                                          \
    X(PREPARE_RETRIEVE, 18, "prepare_retrieve")                                  \
    X(COMMIT_RETRIEVE, 19, "commit_retrieve")                                    \
    X(CLEAR, 20, "clear")                                                        \
    X(GET_CHUNK_SIZE, 21, "get_chunk_size")                                      \
    X(PING, 22, "ping")                                                          \
    X(REPORT_BLOCK_ALLOCATION, 23, "report_block_allocation")                    \
    X(NOOP, 24, "noop")                                                          \
    X(CB_REGISTER_ROPE, 25, "cb_register_rope")                                  \
    X(CB_UNREGISTER_ROPE, 26, "cb_unregister_rope")                              \
    X(CB_RETRIEVE_PRE_COMPUTED, 27, "cb_retrieve_pre_computed")                  \
    X(CB_UNIFIED_LOOKUP, 28, "cb_unified_lookup")                                \
    X(P2P_LOOKUP_AND_LOCK, 29, "p2p_lookup_and_lock")                            \
    X(P2P_QUERY_LOOKUP_RESULTS, 30, "p2p_query_lookup_results")                  \
    X(P2P_UNLOCK_OBJECTS, 31, "p2p_unlock_objects")                              \
    X(GET_EXPERIMENTAL, 32, "get_experimental")                                  \
    X(CB_PROTOCOL_HANDSHAKE, 33, "cb_protocol_handshake")                        \
    X(CB_REORDER_PLAN, 100, "cb_reorder_plan")                                   \
    X(SUBSCRIBE_KV_EVENTS, 101, "subscribe_kv_events")                           \
    X(SERVER_MODULE_CALL, 102, "server_module_call")                             \
    X(POLL_KV_EVENTS, 103, "poll_kv_events")                                     \
    X(NEGOTIATE_CHUNK_SIZE, 104, "negotiate_chunk_size")                         \
    X(SERVER_MODULE_AFFINITY_CALL, 105, "server_module_affinity_call")

enum lmc_op {
    LMC_OP_UNKNOWN = 0,
#define LMC_OP_ENUM(sym, id, name) LMC_OP_##sym = id,
    LMC_OPS(LMC_OP_ENUM)
#undef LMC_OP_ENUM
};

/* The operation an op frame names (a msgpack int of the frozen table, or a msgpack str with a
 * name); LMC_OP_UNKNOWN for anything else. When the frame is a str, its name is copied into
 * name (cap bytes, truncated) so that a log line can say what was asked; else name is "". */
enum lmc_op lmc_op_decode(const void *frame, size_t n, char *name, size_t cap);

/* The operation's name ("?" for LMC_OP_UNKNOWN). */
const char *lmc_op_name(enum lmc_op op);

/*
 * How a key carried its tokens: token_ids, an array of ints (LMCache 0.5.5 and 0.5.6), or
 * token_bytes, a bin of big-endian uint32 words (0.5.7, token_codec.py). Both decode to the same
 * little-endian array, so workers of either version find each other's chunks; the form tells
 * which version sent the request (a 0.5.7 worker without shared memory expects a tensor
 * envelope back, an older one a pickle).
 */
enum lmc_token_form {
    LMC_TOKENS_IDS = 0,
    LMC_TOKENS_BYTES,
};

/* IPCCacheServerKey. */
struct lmc_key {
    char model_name[KVP_MAX_NAME + 1];
    uint32_t world_size;
    bool has_worker_id; /* false: nil, a scheduler's key */
    uint32_t worker_id;
    uint32_t ntokens; /* token ids, written little-endian into the caller's buffer */
    enum lmc_token_form token_form;
    uint32_t start, end;
    char request_id[LMC_MAX_REQUEST_ID + 1];
    char salt[LMC_MAX_SALT_BYTES + 1];
    uint32_t salt_len;
    uint32_t num_kv_readers; /* 0: not sent */
};

/*
 * Decodes a key payload. tokens_le receives the token ids (KVP_MAX_TOKENS * 4 bytes). world
 * size 1..255 and worker id < world size (LMCache packs both into 8 bits of its rank), token ids
 * 0..2^32-1, start <= end, salt as LMCache checks it (at most 128 characters, none of @ / \ and
 * NUL), num_kv_readers 0..65535. The tokens come as token_ids or as token_bytes (a bin whose
 * length is a multiple of 4, at most KVP_MAX_TOKENS words), never both; k->token_form says which.
 */
int lmc_decode_key(const void *frame, size_t n, struct lmc_key *k, uint8_t *tokens_le, char *why,
                   size_t why_size);

/* RegisterEngineDrivenContextPayload (with the fields later versions add). */
struct lmc_register {
    uint64_t instance_id; /* 0..2^63-1 */
    char model_name[KVP_MAX_NAME + 1];
    uint32_t world_size, block_size, num_layers, hidden_dim;
    char dtype[KVP_MAX_NAME + 1];
    bool use_mla;
    uint32_t num_physical_slots; /* 0: nil, the server's chunk size */
    /* group_layouts (LMCache 0.5.7): present in every 0.5.7 payload, empty for a single-group
     * worker; has_group_layouts marks a 0.5.7 registration (its reply carries null_block_id). */
    bool has_group_layouts;
    uint32_t ngroup_layouts;
    /* Set when the payload asks for something kvpool does not serve (several KV groups, a
     * quantized layout): the registration is then refused with this reason. */
    char unsupported[160];
};

int lmc_decode_register(const void *frame, size_t n, struct lmc_register *m, char *why,
                        size_t why_size);

/* Scalar payloads. */
int lmc_decode_instance_id(const void *frame, size_t n, uint64_t *iid); /* int 0..2^63-1 */
/* An int 0..2^63-1, or nil (*has = false). */
int lmc_decode_opt_instance_id(const void *frame, size_t n, bool *has, uint64_t *iid);
int lmc_decode_request_id(const void *frame, size_t n, char *buf, size_t cap);
int lmc_decode_bool(const void *frame, size_t n, bool *v);
int lmc_decode_int(const void *frame, size_t n, int64_t min, int64_t max, int64_t *v);
int lmc_decode_float(const void *frame, size_t n, double *v);
/* The bin of commit_store: *data points into the frame. */
int lmc_decode_bin(const void *frame, size_t n, uint64_t max, const uint8_t **data, uint64_t *len);
/* Any one well-formed value (a payload that is accepted and ignored). */
int lmc_decode_any(const void *frame, size_t n);

/*
 * prepare_store's third payload (LMCache 0.5.7), skipped_chunks: per KV cache group, the chunk
 * positions the worker will not store. A single-group worker sends an empty array; kvpool serves
 * one group, so the handler refuses npositions > 0 (LMCache's server refuses any non-empty one
 * of a single-group worker). At most LMC_MAX_GROUPS groups, positions 0..KVP_MAX_CHUNKS - 1.
 */
struct lmc_skipped_chunks {
    uint32_t ngroups;    /* groups sent */
    uint32_t npositions; /* positions in all groups */
};

int lmc_decode_skipped_chunks(const void *frame, size_t n, struct lmc_skipped_chunks *s, char *why,
                              size_t why_size);

/*
 * free_lookup_locks's third payload (LMCache 0.5.7), extra_ranges: (start, end) token pairs of
 * the request's earlier, abandoned lookups whose read locks are to be released too. Each pair
 * is an array of two ints in 0..KVP_MAX_TOKENS; a pair with start >= end releases nothing (as
 * upstream) but is kept. out receives at most cap pairs (more: -E2BIG), *nout their number.
 */
struct lmc_range {
    uint32_t start, end;
};

int lmc_decode_extra_ranges(const void *frame, size_t n, struct lmc_range *out, uint32_t cap,
                            uint32_t *nout, char *why, size_t why_size);

/* One SHM slot descriptor of a prepare reply. */
struct lmc_slot {
    uint64_t offset, length;
};

/* Chunk shape and dtype as every slot of an instance carries them. */
struct lmc_slot_shape {
    uint32_t ndim;
    uint32_t shape[4];
    const char *dtype;
};

/* RegisterEngineDrivenContextResponse: shm_name and pool_size (what 0.5.5 and 0.5.6 declare),
 * then scratch_offset, scratch_size and error (declared by later versions; older clients skip
 * unknown fields). error NULL: nil. */
void lmc_encode_register_reply(struct lmc_mp_writer *w, const char *shm_name, uint64_t pool_size,
                               const char *error);

/*
 * The reply to the registration m (NULL: one that did not decode), in the form its version
 * declares: for a 0.5.7 payload (m->has_group_layouts) 0.5.7's fields shm_name, pool_size and
 * null_block_id, then error (which 0.5.7's worker skips); otherwise lmc_encode_register_reply().
 * null_block_id is 0, vLLM's null block and `lmcache server`'s default (--null-block-id): 0.5.7's
 * worker uses it only to leave out all-null chunks of hybrid models, which kvpool refuses.
 */
void lmc_encode_register_reply_to(struct lmc_mp_writer *w, const struct lmc_register *m,
                                  const char *shm_name, uint64_t pool_size, const char *error);

/*
 * The one KVEventBatch of a server that records no KV events (LMCache 0.5.7's
 * subscribe_kv_events stream): {enabled: false, incarnation, next_cursor: 0, lost: false,
 * events: []}, as `lmcache server --kv-event-log-size 0` sends it. A 0.5.7 worker that reads it
 * falls back to publishing its own store events and does not subscribe again. incarnation: an
 * id of this run of the server (LMCache uses its start time in nanoseconds).
 */
void lmc_encode_kv_events_disabled(struct lmc_mp_writer *w, uint64_t incarnation);

/* PrepareStoreResponse {"context": {"slots": [...], "chunk_indices": [...]}}; n = 0 is the
 * "nothing to write" answer. no_buffers: {"context": {}} instead (the pickle transport). */
void lmc_encode_prepare_store_reply(struct lmc_mp_writer *w, const struct lmc_slot *slots,
                                    const uint32_t *chunk_indices, uint32_t n,
                                    const struct lmc_slot_shape *sh, bool no_buffers);

/* PrepareRetrieveResponse: a hit with n slots, or (success false) a miss. */
void lmc_encode_prepare_retrieve_reply(struct lmc_mp_writer *w, bool success,
                                       const struct lmc_slot *slots, uint32_t n,
                                       const struct lmc_slot_shape *sh);

/*
 * The negative reply of an operation kvpoold does not serve, or of a request it could not
 * decode, of the type the operation declares (docs/LMCACHE.md, "Operations"). Returns false when
 * that type is None: the reply is then the three frames [identity][uid][op] alone.
 */
bool lmc_encode_negative(struct lmc_mp_writer *w, enum lmc_op op);

#endif /* KVP_LMC_MESSAGES_H */
