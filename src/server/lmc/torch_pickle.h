/*
 * torch_pickle.h - LMCache's pickle transport without unpickling: a recogniser for the list of
 * tensors a worker sends (pickle.dumps(list_of_tensors)) and an encoder for the list a worker
 * loads back (pickle.loads), both written against torch's byte format, never against an object
 * model.
 *
 * What travels (docs/LMCACHE.md, "The pickle transport"): a protocol 4 or 5 pickle of a list
 * whose items are REDUCE(torch._utils._rebuild_tensor_v2 | _v3, (storage, 0, shape, stride,
 * False, OrderedDict() [, dtype])), each storage being REDUCE(torch.storage._load_from_bytes,
 * (blob,)) with blob in torch's legacy torch.save format: five protocol 2 pickles then the raw
 * element bytes; or, in kvpoold's replies, Tensor.view(Tensor.view(asarray(bytearray), dtype),
 * shape). The decoder accepts exactly those shapes for one registered dtype and chunk
 * shape and reports where each tensor's element bytes lie inside the caller's buffer; it resolves
 * no callable, allocates nothing and runs in time linear in the input.
 *
 * Protocol-neutral: no ZeroMQ, no msgpack, nothing of the daemon's state.
 */
#ifndef KVP_LMC_TORCH_PICKLE_H
#define KVP_LMC_TORCH_PICKLE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* Highest tensor rank accepted (LMCache chunks are [2, L, T, H] or, for MLA, [L, T, H]). */
#define KVP_TPICKLE_MAX_DIMS 8

/*
 * Bytes a payload may spend per tensor beyond its element bytes (opcodes, names, the legacy
 * torch.save header, frame headers). A real one spends about 300; the bound sizes the largest
 * payload kvp_tpickle_decode() looks at (kvp_tpickle_max_payload()).
 */
#define KVP_TPICKLE_TENSOR_OVERHEAD 1024
/* Bytes a payload may spend around its list (protocol, frame, list, mark, stop). */
#define KVP_TPICKLE_STREAM_OVERHEAD 64

/*
 * The dtype and shape of every tensor of a payload: one chunk of a registration. LMCache's chunk
 * tensors are [2, layers, chunk tokens, heads * head size], or [layers, chunk tokens, ...] for
 * MLA and fused K/V: common/layout.h's kvp_chunk_layout() shape.
 */
struct kvp_tpickle_layout {
    const char *dtype; /* kvpool's dtype name (common/layout.h), which is torch's */
    uint32_t ndim;     /* 1..KVP_TPICKLE_MAX_DIMS */
    uint64_t shape[KVP_TPICKLE_MAX_DIMS]; /* every dimension >= 1 */
};

/* What kvp_tpickle_decode() accepts: tensors of one layout, between min and max of them. */
struct kvp_tpickle_expect {
    struct kvp_tpickle_layout layout;
    uint32_t min_tensors;
    uint32_t max_tensors;
};

/* One decoded tensor: its element bytes, row-major, inside the decoded buffer. */
struct kvp_tpickle_tensor {
    const uint8_t *data; /* points into the buffer given to kvp_tpickle_decode() */
    uint64_t len;        /* always the layout's chunk bytes */
};

/*
 * Checks a layout (known dtype with a torch pickle form, 1..KVP_TPICKLE_MAX_DIMS dimensions, none
 * zero, element count and bytes within int64) and stores its bytes per tensor in *bytes (may be
 * NULL). Returns 0, or -EINVAL with a one-line reason in why (why_size bytes; why may be NULL).
 */
int kvp_tpickle_layout_check(const struct kvp_tpickle_layout *l, uint64_t *bytes, char *why,
                             size_t why_size);

/*
 * The largest payload kvp_tpickle_decode() accepts for exp: stream overhead plus max_tensors
 * times (chunk bytes + KVP_TPICKLE_TENSOR_OVERHEAD). A front end can refuse a bigger frame before
 * reading it. Returns 0, -EINVAL (bad layout) or -EOVERFLOW.
 */
int kvp_tpickle_max_payload(const struct kvp_tpickle_expect *exp, uint64_t *max);

/*
 * Recognises buf[0..len) as a pickled list of exp->layout tensors and fills out[0..*n) with
 * where each tensor's element bytes lie in buf, in list order. Nothing is allocated and nothing
 * is called: the bytes are checked against torch's format opcode by opcode.
 *
 * Refused (anything else is): another opcode or global than the format's, a nested or second
 * object, a dtype, storage class, shape or element count other than the layout's, a stride that
 * is not row-major (dimensions of size 1 excepted), a storage offset other than 0, requires_grad,
 * backward hooks, a memo reference to anything but a name, a stack deeper than the format needs,
 * fewer than min or more than max tensors, truncated input or trailing bytes.
 *
 * cap must be >= exp->max_tensors. Returns 0 (*n set), -EINVAL (bad exp or cap), -EMSGSIZE (len
 * above kvp_tpickle_max_payload()) or -EPROTO (the payload is refused); on failure *n is 0 and
 * why (why_size bytes, may be NULL) holds a one-line reason naming the offset.
 */
int kvp_tpickle_decode(const uint8_t *buf, size_t len, const struct kvp_tpickle_expect *exp,
                       struct kvp_tpickle_tensor *out, uint32_t cap, uint32_t *n, char *why,
                       size_t why_size);

/*
 * Encoder: what a worker's pickle.loads turns into a list of tensors equal (dtype, shape, bytes)
 * to the chunks given, built from fixed pieces around each chunk's bytes so the caller can send
 * pool memory without staging it:
 *
 *     start, (pre, chunk[0], post), (pre, chunk[1], post), ..., end
 *
 * Each tensor is torch.Tensor.view(torch.Tensor.view(torch.asarray(bytearray), dtype), shape):
 * one copy on load, where torch's own form runs torch.load per blob. pre and post are the same
 * for every tensor of a layout. Protocol 5 (BYTEARRAY8; CPython 3.8+), no memo, no frames. The
 * decoder accepts this form as well.
 */
#define KVP_TPICKLE_PIECE_MAX 512

struct kvp_tpickle_template {
    uint64_t chunk_bytes;
    uint32_t start_len, pre_len, post_len, end_len;
    uint8_t start[8];
    uint8_t pre[KVP_TPICKLE_PIECE_MAX];
    uint8_t post[KVP_TPICKLE_PIECE_MAX];
    uint8_t end[8];
};

/* Builds the pieces for a layout. Returns 0 or -EINVAL (why as for kvp_tpickle_layout_check). */
int kvp_tpickle_template_init(struct kvp_tpickle_template *t, const struct kvp_tpickle_layout *l,
                              char *why, size_t why_size);

/* Bytes of the pickle of n tensors in *size. Returns 0 or -EOVERFLOW. */
int kvp_tpickle_encoded_size(const struct kvp_tpickle_template *t, uint32_t n, uint64_t *size);

/*
 * Fills iov[0..2 + 3n) with the pieces of t (which must outlive the iovecs) and chunks[i]
 * (chunk_bytes each, read only). Returns the number of entries, or -ENOSPC when iov_cap is
 * smaller than 2 + 3n.
 */
int kvp_tpickle_encode_iov(const struct kvp_tpickle_template *t, uint32_t n,
                           const uint8_t *const *chunks, struct iovec *iov, size_t iov_cap);

/*
 * Writes the pickle of n tensors (chunks[i], chunk_bytes each) into dst: one copy of each
 * chunk. Returns the bytes written (kvp_tpickle_encoded_size()), or -ENOSPC when dst_size is
 * smaller, or -EOVERFLOW.
 */
int64_t kvp_tpickle_encode(const struct kvp_tpickle_template *t, uint32_t n,
                           const uint8_t *const *chunks, uint8_t *dst, size_t dst_size);

#endif /* KVP_LMC_TORCH_PICKLE_H */
