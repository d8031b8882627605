/*
 * envelope.h - LMCache 0.5.7's inline transport: the typed msgpack TensorEnvelope a worker
 * without shared memory sends its chunks in (commit_store's data) and reads them back from
 * (prepare_retrieve's data), decoded and written without building an object of it.
 *
 * What travels (transfer_context/tensor_wire.py, msgspec structs that forbid unknown fields):
 *
 *     TensorEnvelope = {"version": 1, "tensors": [TensorFrame, ...]}
 *     TensorFrame    = {"dtype": str, "shape": [int >= 0, ...], "data": bin}
 *
 * with LMCache's limits: at most 65536 tensors, rank at most 16, 2 GiB per tensor, 16 GiB in all,
 * and a payload of at most 16 GiB plus 1 KiB per tensor. A hybrid model's GroupedTensorEnvelope
 * ({"version": 1, "groups": [{"chunk_indices", "tensors"}, ...]}) is refused: kvpool serves one
 * KV cache group. Up to LMCache 0.5.6 the same bytes were a torch pickle (torch_pickle.h); the
 * first byte tells them apart (kvp_envelope_sniff()).
 *
 * The decoder checks every tensor against one registered layout (dtype, shape, bytes) and a
 * tensor count, and returns where each tensor's bytes lie in the caller's buffer: nothing is
 * allocated, nothing is copied. The encoder writes the same form for a retrieve straight into a
 * caller's buffer of the size kvp_envelope_encoded_size() gives: one copy of each chunk.
 *
 * Protocol-neutral: no ZeroMQ, nothing of the daemon's state; lmc/codec.h reads the msgpack.
 */
#ifndef KVP_LMC_ENVELOPE_H
#define KVP_LMC_ENVELOPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* LMCache 0.5.7's limits (tensor_wire.py). */
#define KVP_ENVELOPE_MAX_TENSORS 65536u
#define KVP_ENVELOPE_MAX_RANK 16u
#define KVP_ENVELOPE_MAX_TENSOR_BYTES (2ull << 30)
#define KVP_ENVELOPE_MAX_TOTAL_BYTES (16ull << 30)
/* Bytes a payload may spend per tensor beyond its data (LMCache's allowance). A tensor of
 * rank 4 spends about 40 (its map, its field names, its dtype, shape and bin header). */
#define KVP_ENVELOPE_TENSOR_OVERHEAD 1024u
/* Bytes around the tensor list ({"version": 1, "tensors": [...]}: 23 at most). */
#define KVP_ENVELOPE_STREAM_OVERHEAD 64u

/* The dtype and shape of every tensor of an envelope: one chunk of a registration. */
struct kvp_envelope_layout {
    const char *dtype; /* kvpool's dtype name (common/layout.h), which is torch's */
    uint32_t ndim;     /* 1..KVP_ENVELOPE_MAX_RANK */
    uint64_t shape[KVP_ENVELOPE_MAX_RANK]; /* every dimension >= 1 */
};

/* What kvp_envelope_decode() accepts: tensors of one layout, between min and max of them. */
struct kvp_envelope_expect {
    struct kvp_envelope_layout layout;
    uint32_t min_tensors;
    uint32_t max_tensors; /* at most KVP_ENVELOPE_MAX_TENSORS */
};

/* One decoded tensor: its bytes, row-major, inside the decoded buffer. */
struct kvp_envelope_tensor {
    const uint8_t *data; /* points into the buffer given to kvp_envelope_decode() */
    uint64_t len;        /* always the layout's chunk bytes */
};

/*
 * True when buf starts like an envelope (a msgpack map header of 1 to 15 entries, or map16 or
 * map32), false otherwise: a torch pickle starts with PROTO (0x80, which is also an empty
 * fixmap, never a valid envelope). It only routes a payload to one decoder or the other.
 */
bool kvp_envelope_sniff(const uint8_t *buf, size_t len);

/*
 * Checks a layout (a dtype kvpool knows, 1..KVP_ENVELOPE_MAX_RANK dimensions, none zero, at most
 * KVP_ENVELOPE_MAX_TENSOR_BYTES per tensor) and stores its bytes per tensor in *bytes (may be
 * NULL). Returns 0, or -EINVAL with a one-line reason in why (why_size bytes; why may be NULL).
 */
int kvp_envelope_layout_check(const struct kvp_envelope_layout *l, uint64_t *bytes, char *why,
                              size_t why_size);

/*
 * The largest payload kvp_envelope_decode() accepts for exp: stream overhead plus max_tensors
 * times (chunk bytes + KVP_ENVELOPE_TENSOR_OVERHEAD), and never more than LMCache's 16 GiB plus
 * 1 KiB per tensor. A front end can refuse a bigger frame before reading it. Returns 0 or -EINVAL
 * (bad exp).
 */
int kvp_envelope_max_payload(const struct kvp_envelope_expect *exp, uint64_t *max);

/*
 * Decodes buf[0..len) as a TensorEnvelope of exp->layout tensors and fills out[0..*n) with where
 * each tensor's bytes lie in buf, in list order. Keys may come in any order (msgspec's rule).
 *
 * Refused (-EPROTO): not msgpack; not a map; a version other than the int 1; a field other than
 * version and tensors (a grouped envelope's groups is named as such), or one of them twice or
 * missing; a tensor that is not a map of exactly dtype, shape and data; a dtype other than the
 * layout's; a shape of another rank (more than 16: LMCache's limit) or other dimensions (a
 * negative one included); data that is not a bin of exactly the chunk's bytes; fewer than
 * min_tensors or more than max_tensors tensors; more than 16 GiB of data in all; truncated input
 * or trailing bytes.
 *
 * cap must be >= exp->max_tensors. Returns 0 (*n set), -EINVAL (bad exp or cap), -EMSGSIZE (len
 * above kvp_envelope_max_payload()) or -EPROTO; on failure *n is 0 and why (why_size bytes, may
 * be NULL) holds a one-line reason, naming the tensor where there is one.
 */
int kvp_envelope_decode(const uint8_t *buf, size_t len, const struct kvp_envelope_expect *exp,
                        struct kvp_envelope_tensor *out, uint32_t cap, uint32_t *n, char *why,
                        size_t why_size);

/*
 * Encoder: the envelope of n chunks of one layout, byte for byte what LMCache's encode_tensors()
 * writes (msgspec: fields in definition order, smallest int, str and bin forms). Every tensor
 * starts with the same bytes ("pre": its map, dtype, shape and the bin header of its data), so
 * an envelope is head(n), (pre, chunk[0]), (pre, chunk[1]), ...
 */
#define KVP_ENVELOPE_PIECE_MAX 256

struct kvp_envelope_template {
    uint64_t chunk_bytes;
    uint32_t pre_len;
    uint8_t pre[KVP_ENVELOPE_PIECE_MAX];
};

/* Builds the pieces for a layout. Returns 0 or -EINVAL (why as for kvp_envelope_layout_check). */
int kvp_envelope_template_init(struct kvp_envelope_template *t, const struct kvp_envelope_layout *l,
                               char *why, size_t why_size);

/* Bytes of the envelope of n tensors in *size. Returns 0, or -E2BIG beyond LMCache's limits
 * (more than 65536 tensors, more than 16 GiB of data): the worker would refuse it. */
int kvp_envelope_encoded_size(const struct kvp_envelope_template *t, uint32_t n, uint64_t *size);

/*
 * Writes the envelope of n tensors (chunks[i], chunk_bytes each, read only) into dst: one copy of
 * each chunk. Returns the bytes written (kvp_envelope_encoded_size()), -ENOSPC when dst_size is
 * smaller, or -E2BIG.
 */
int64_t kvp_envelope_encode(const struct kvp_envelope_template *t, uint32_t n,
                            const uint8_t *const *chunks, uint8_t *dst, size_t dst_size);

#endif /* KVP_LMC_ENVELOPE_H */
