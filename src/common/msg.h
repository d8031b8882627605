/*
 * msg.h - request and reply bodies of the kvpool protocol (docs/PROTOCOL.md), with one encoder
 * and one strict decoder per message. Decoders validate every length against the KVP_MAX_*
 * limits of wire.h and reject trailing bytes; semantic checks (ranges, instance existence) are
 * the daemon's.
 */
#ifndef KVP_MSG_H
#define KVP_MSG_H

#include "common/wire.h"

#define KVP_NONCE_SIZE 16 /* equals KVP_SEG_NONCE_SIZE (seg_header.h) */

/* Transport codes on the wire (same values as kvp_transport in kvpool.h). */
enum { KVP_WIRE_AUTO = 0, KVP_WIRE_SHM = 1, KVP_WIRE_INLINE = 2 };

/* Shared-memory backends in HELLO: none, a named POSIX segment, a memfd passed by MAP_SEGMENT. */
enum { KVP_WIRE_BACKEND_NONE = 0, KVP_WIRE_BACKEND_POSIX = 1, KVP_WIRE_BACKEND_MEMFD = 2 };

struct kvp_hello_reply {
    uint16_t major, minor;
    uint32_t pid;
    uint32_t chunk_tokens;
    uint32_t shm_backend;                /* KVP_WIRE_BACKEND_*: how a worker maps the pool */
    uint64_t segment_size;               /* bytes of the shared segment (0 if disabled) */
    uint8_t nonce[KVP_NONCE_SIZE];       /* also stored in the segment's header page */
    char shm_name[KVP_MAX_NAME + 1];     /* without leading '/' */
    char shm_reason[KVP_MAX_REASON + 1]; /* why SHM is disabled, else "" */
};

struct kvp_register_req {
    char instance_id[KVP_MAX_NAME + 1];
    char model_name[KVP_MAX_NAME + 1];
    char dtype[KVP_MAX_NAME + 1];
    uint32_t world_size, worker_rank, block_size, num_layers, hidden_dim;
    uint8_t use_mla;
    uint8_t transport;               /* what the worker will use: KVP_WIRE_* */
    char reason[KVP_MAX_REASON + 1]; /* why the worker chose inline, or "" */
};

struct kvp_register_reply {
    uint32_t handle;
    uint8_t transport; /* KVP_WIRE_SHM or KVP_WIRE_INLINE */
    uint8_t existing;
    uint8_t ndim;
    uint32_t chunk_tokens;
    uint32_t shape[4];
    uint64_t chunk_bytes;
    uint32_t dtype_size;
    char dtype[KVP_MAX_NAME + 1];
    char shm_name[KVP_MAX_NAME + 1];
    uint64_t segment_size;
    char reason[KVP_MAX_REASON + 1];
};

/* A key range: LOOKUP, PREPARE_STORE, PREPARE_RETRIEVE, RETRIEVE_INLINE. */
struct kvp_key_req {
    uint32_t handle;
    uint32_t start, end; /* token offsets */
    uint32_t ntokens;
    uint16_t salt_len;
    const uint8_t *salt;   /* points into the decoded body */
    const uint8_t *tokens; /* ntokens little-endian u32, into the body */
};

/* A handle plus a reservation or pin id: UNREGISTER (id 0), COMMIT/ABORT_STORE, STORE_INLINE,
 * COMMIT_RETRIEVE. */
struct kvp_ref_req {
    uint32_t handle;
    uint64_t id;
};

struct kvp_wire_slot {
    uint32_t chunk_index;
    uint64_t offset;
    uint64_t length;
};

struct kvp_lookup_reply {
    uint32_t nchunks;
    uint32_t cached;
};

/* PREPARE_STORE, PREPARE_RETRIEVE and RETRIEVE_INLINE replies. */
struct kvp_slots_reply {
    uint64_t id; /* reservation or pin id (0: none) */
    uint32_t nchunks;
    uint32_t cached, busy, no_space; /* store only */
    uint32_t nslots;
    struct kvp_wire_slot *slots; /* decode: caller-provided array of KVP_MAX_CHUNKS */
};

struct kvp_count_reply {
    uint32_t count;
};

struct kvp_stat_entry {
    char name[48];
    uint64_t value;
};

void kvp_encode_hello_reply(struct kvp_wbuf *w, const struct kvp_hello_reply *m);
int kvp_decode_hello_reply(const void *body, size_t len, struct kvp_hello_reply *m);

void kvp_encode_register_req(struct kvp_wbuf *w, const struct kvp_register_req *m);
int kvp_decode_register_req(const void *body, size_t len, struct kvp_register_req *m);
void kvp_encode_register_reply(struct kvp_wbuf *w, const struct kvp_register_reply *m);
int kvp_decode_register_reply(const void *body, size_t len, struct kvp_register_reply *m);

/* tokens: host-order array of ntokens ids. */
void kvp_encode_key_req(struct kvp_wbuf *w, uint32_t handle, uint32_t start, uint32_t end,
                        const uint32_t *tokens, uint32_t ntokens, const void *salt,
                        uint16_t salt_len);
int kvp_decode_key_req(const void *body, size_t len, struct kvp_key_req *m);
/* Token i of a decoded key request. */
uint32_t kvp_key_token(const struct kvp_key_req *m, uint32_t i);

void kvp_encode_ref_req(struct kvp_wbuf *w, const struct kvp_ref_req *m);
int kvp_decode_ref_req(const void *body, size_t len, struct kvp_ref_req *m);

void kvp_encode_lookup_reply(struct kvp_wbuf *w, const struct kvp_lookup_reply *m);
int kvp_decode_lookup_reply(const void *body, size_t len, struct kvp_lookup_reply *m);

void kvp_encode_slots_reply(struct kvp_wbuf *w, const struct kvp_slots_reply *m);
/* m->slots must point to room for KVP_MAX_CHUNKS slots. */
int kvp_decode_slots_reply(const void *body, size_t len, struct kvp_slots_reply *m);

void kvp_encode_count_reply(struct kvp_wbuf *w, uint32_t count);
int kvp_decode_count_reply(const void *body, size_t len, struct kvp_count_reply *m);

/* STATS reply: u32 n, then n x (str name, u64 value). */
void kvp_encode_stats_reply(struct kvp_wbuf *w, const struct kvp_stat_entry *e, uint32_t n);
/* Writes at most cap entries; returns the count the reply holds (<= KVP_MAX_STATS) or -EPROTO. */
int kvp_decode_stats_reply(const void *body, size_t len, struct kvp_stat_entry *e, size_t cap);

/*
 * STATUS and METRICS replies: u32 length, then that many bytes of text (no NUL, at most
 * KVP_MAX_TEXT). The encoder writes len bytes of text; the caller checks len <= KVP_MAX_TEXT.
 * The decoder points *text into the body (not NUL-terminated) and refuses a NUL byte in it, so
 * that a copy can be handed out as a C string.
 */
void kvp_encode_text_reply(struct kvp_wbuf *w, const char *text, uint32_t len);
int kvp_decode_text_reply(const void *body, size_t len, const char **text, uint32_t *text_len);

/* Error replies carry a message string. */
void kvp_encode_error(struct kvp_wbuf *w, const char *msg);
int kvp_decode_error(const void *body, size_t len, char *msg, size_t size);

#endif /* KVP_MSG_H */
