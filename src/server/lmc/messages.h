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

#include "common/wire.h" /* KVP_MAX_NAME, KVP_MAX_TOKENS */
#include "lmc/codec.h"

/* Bounds of what a client may send (docs/LMCACHE.md, "Limits"). */
#define LMC_MAX_REQUEST_ID 255u /* bytes of a request id */
#define LMC_MAX_SALT_CHARS 128u /* characters of a cache salt, as LMCache checks */
#define LMC_MAX_SALT_BYTES 512u /* the same in UTF-8 bytes, at most */
#define LMC_MAX_PAYLOADS 8u     /* payload frames after uid and operation */
#define LMC_MAX_RECORDS 4096u   /* records in one report_block_allocation */

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
    X(POLL_KV_EVENTS, 103, "poll_kv_events")

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

/* IPCCacheServerKey. */
struct lmc_key {
    char model_name[KVP_MAX_NAME + 1];
    uint32_t world_size;
    bool has_worker_id; /* false: nil, a scheduler's key */
    uint32_t worker_id;
    uint32_t ntokens; /* token ids, written little-endian into the caller's buffer */
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
 * NUL), num_kv_readers 0..65535.
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
