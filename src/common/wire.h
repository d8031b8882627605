/*
 * wire.h - frame header and bounds-checked little-endian buffer codec of the kvpool protocol.
 *
 * Every message is a 32-byte header followed by a control body (body_len bytes, at most
 * KVP_MAX_BODY) and, for bulk transfers, a payload (payload_len bytes of raw chunk data). See
 * docs/PROTOCOL.md. All integers are little-endian and fixed width.
 */
#ifndef KVP_WIRE_H
#define KVP_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/limits.h"

#define KVP_MAGIC 0x3150564bu /* "KVP1" read as little-endian bytes */
#define KVP_PROTO_VERSION 1   /* frame header version and HELLO major: must match */
#define KVP_PROTO_MINOR 2     /* HELLO minor: additions an older peer may ignore */
/* The minor that brought each addition (docs/PROTOCOL.md, "Versions"): a client sends it only
 * to a daemon whose HELLO says at least that much. */
#define KVP_MINOR_ADMIN 1    /* STATUS, METRICS, CLEAR */
#define KVP_MINOR_PIPELINE 2 /* request flags: NOREPLY commits, the CPU hint */
#define KVP_HEADER_SIZE 32
#define KVP_REPLY_FLAG 0x8000u

/* Limits on everything a peer controls: those of every protocol (limits.h), and the frame's. */
#define KVP_MAX_BODY (8u << 20) /* control body bytes */
#define KVP_MAX_STATS 128u      /* statistics in one reply */

/* Text of a STATUS or METRICS reply: the whole body but its u32 length. */
#define KVP_MAX_TEXT (KVP_MAX_BODY - 4u)

#define KVP_OPCODE_MAP(XX)   \
    XX(HELLO, 1)             \
    XX(PING, 2)              \
    XX(STATS, 3)             \
    XX(REGISTER, 4)          \
    XX(UNREGISTER, 5)        \
    XX(LOOKUP, 6)            \
    XX(PREPARE_STORE, 7)     \
    XX(COMMIT_STORE, 8)      \
    XX(ABORT_STORE, 9)       \
    XX(STORE_INLINE, 10)     \
    XX(PREPARE_RETRIEVE, 11) \
    XX(COMMIT_RETRIEVE, 12)  \
    XX(RETRIEVE_INLINE, 13)  \
    XX(MAP_SEGMENT, 14)      \
    XX(STATUS, 15)           \
    XX(METRICS, 16)          \
    XX(CLEAR, 17)

enum kvp_opcode {
#define KVP_OPCODE_ENUM(name, val) KVP_OP_##name = (val),
    KVP_OPCODE_MAP(KVP_OPCODE_ENUM)
#undef KVP_OPCODE_ENUM
        KVP_OP_MAX_
};

/* Name of an opcode ("?" when unknown). Reply flag ignored. */
const char *kvp_opcode_name(uint16_t opcode);

/* Decoded frame header. */
struct kvp_header {
    uint32_t magic;
    uint16_t version;
    uint16_t opcode;     /* request opcode; replies set KVP_REPLY_FLAG */
    uint64_t request_id; /* echoed in the reply */
    uint32_t body_len;
    union {
        int32_t status; /* replies: 0 or -errno */
        uint32_t flags; /* requests: KVP_REQ_* (0 before protocol minor 2) */
    };
    uint64_t payload_len;
};

/*
 * Request flags (protocol minor 2; a daemon of minor 1 ignores them, so a client sets
 * KVP_REQ_NOREPLY only after HELLO said minor >= 2).
 *   KVP_REQ_NOREPLY   COMMIT_STORE and COMMIT_RETRIEVE only (on any other opcode the frame is a
 *                     protocol error): the daemon sends no reply. A failure is kept and answers
 *                     the next request that expects a reply and carries no payload, which is
 *                     then not performed (status KVP_EPIPELINED, see docs/PROTOCOL.md).
 *   bits 16-31        the sender's CPU + 1, 0 when unknown: a hint that lets the daemon run the
 *                     connection's thread on the worker's CPU (placement.c).
 */
#define KVP_REQ_NOREPLY 0x1u
#define KVP_REQ_KNOWN 0x1u /* flag bits below 16 that mean something */
#define KVP_REQ_CPU_SHIFT 16
#define KVP_REQ_CPU_MAX 0xfffeu /* highest CPU number a hint can carry */

void kvp_header_encode(const struct kvp_header *h, uint8_t out[KVP_HEADER_SIZE]);

/*
 * Encodes the header of the reply to request req: its opcode with KVP_REPLY_FLAG, its request
 * id, this protocol's magic and version, and the given status and lengths. An opcode outside the
 * protocol (a frame refused before its header could be trusted) is answered as opcode 0.
 */
void kvp_reply_header_encode(const struct kvp_header *req, int32_t status, uint32_t body_len,
                             uint64_t payload_len, uint8_t out[KVP_HEADER_SIZE]);

/*
 * Decodes and validates a header: magic, version, known opcode, body_len <= KVP_MAX_BODY.
 * Returns 0, -EPROTO (bad magic or opcode, oversized body) or -EPROTONOSUPPORT (version).
 */
int kvp_header_decode(const uint8_t in[KVP_HEADER_SIZE], struct kvp_header *h);

/* Growable write buffer. Allocation failure is sticky: check wbuf.err once at the end. */
struct kvp_wbuf {
    uint8_t *data;
    size_t len;
    size_t cap;
    int err; /* 0 or -ENOMEM */
};

void kvp_wbuf_init(struct kvp_wbuf *w);
void kvp_wbuf_free(struct kvp_wbuf *w);
void kvp_wbuf_reset(struct kvp_wbuf *w);
void kvp_put_u8(struct kvp_wbuf *w, uint8_t v);
void kvp_put_u16(struct kvp_wbuf *w, uint16_t v);
void kvp_put_u32(struct kvp_wbuf *w, uint32_t v);
/* n u32 values, each little-endian (one growth, one copy on a little-endian host). */
void kvp_put_u32_array(struct kvp_wbuf *w, const uint32_t *v, size_t n);
void kvp_put_u64(struct kvp_wbuf *w, uint64_t v);
void kvp_put_bytes(struct kvp_wbuf *w, const void *p, size_t n);
/* A string: u16 length then the bytes, no NUL. NULL is written as "". */
void kvp_put_str(struct kvp_wbuf *w, const char *s);
/* A byte string: u16 length then the bytes. */
void kvp_put_blob(struct kvp_wbuf *w, const void *p, uint16_t n);

/* Bounds-checked reader. Any overrun sets err (sticky) and further reads return zeros. */
struct kvp_rbuf {
    const uint8_t *p;
    size_t len;
    size_t off;
    int err; /* 0 or -EPROTO */
};

void kvp_rbuf_init(struct kvp_rbuf *r, const void *p, size_t len);
uint8_t kvp_get_u8(struct kvp_rbuf *r);
uint16_t kvp_get_u16(struct kvp_rbuf *r);
uint32_t kvp_get_u32(struct kvp_rbuf *r);
uint64_t kvp_get_u64(struct kvp_rbuf *r);
/* Returns a pointer to n bytes inside the buffer, or NULL (and err) on overrun. */
const void *kvp_get_bytes(struct kvp_rbuf *r, size_t n);
/*
 * Reads a string into out (NUL-terminated). Fails (err = -EPROTO) if it is longer than max, if
 * max >= size, or if it contains a NUL byte.
 */
void kvp_get_str(struct kvp_rbuf *r, char *out, size_t size, size_t max);
/* Reads a byte string of at most max bytes; returns a pointer into the buffer. */
const void *kvp_get_blob(struct kvp_rbuf *r, uint16_t *len, size_t max);
/* 0 if the whole buffer was consumed without error, else -EPROTO. */
int kvp_rbuf_finish(const struct kvp_rbuf *r);

#endif /* KVP_WIRE_H */
