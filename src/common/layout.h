/*
 * layout.h - dtype table and chunk shape derivation, shared by the daemon (validation of a
 * registration) and the client library (views over slots).
 */
#ifndef KVP_LAYOUT_H
#define KVP_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A dtype kvpool knows, with the names torch gives it (LMCache's workers send torch's names;
 * the pickle transport writes torch's storage classes). */
struct kvp_dtype {
    const char *name;          /* kvpool's name, torch's canonical one: "float16" */
    uint32_t size;             /* bytes per element */
    const char *torch_alias;   /* torch's other name for it ("half"), or NULL */
    const char *torch_storage; /* its legacy torch storage class ("HalfStorage"), or NULL for
                                * the dtypes torch pickles over an UntypedStorage */
};

/* The dtype called name, or NULL when kvpool does not know it. */
const struct kvp_dtype *kvp_dtype_find(const char *name);

/* The dtype called name or torch's alias name ("half", "float", "double"), or NULL. */
const struct kvp_dtype *kvp_dtype_find_torch(const char *name);

/* The i-th dtype of the table, NULL past its end (for callers that index it). */
const struct kvp_dtype *kvp_dtype_at(size_t i);

/* Comma-separated list of known dtype names (for error messages and --help). */
const char *kvp_dtype_names(void);

struct kvp_chunk_layout {
    uint32_t ndim;     /* 4, or 3 for MLA */
    uint32_t shape[4]; /* [2, layers, chunk, hidden] or [layers, chunk, hidden, 0] */
    uint64_t bytes;
};

/*
 * Derives the shape and size of one chunk. Returns 0, -EINVAL when a dimension is zero, or
 * -EOVERFLOW when the chunk would not fit in 64 bits (or exceeds max_bytes when max_bytes != 0).
 */
int kvp_chunk_layout(uint32_t num_layers, uint32_t chunk_tokens, uint32_t hidden_dim,
                     uint32_t dtype_size, bool use_mla, uint64_t max_bytes,
                     struct kvp_chunk_layout *out);

/*
 * The chunk-range rule of keyed requests (docs/PROTOCOL.md), applied by the library before it
 * sends a request and by the daemon to what it receives: tokens [start, end) of a sequence of
 * ntokens tokens, chunk_tokens (> 0) per chunk. start must be a multiple of chunk_tokens and
 * start <= end <= ntokens; end is rounded down to a chunk boundary. On success *first is the
 * index of the first chunk and *n the number of full chunks in the range (0 is fine). Returns 0,
 * -EINVAL, or -E2BIG when *n would exceed max_chunks (0: no limit); why (why_size bytes, may be
 * NULL) then says which rule was broken, with the values.
 */
int kvp_chunk_range(uint32_t start, uint32_t end, uint32_t ntokens, uint32_t chunk_tokens,
                    uint32_t max_chunks, uint32_t *first, uint32_t *n, char *why, size_t why_size);

#endif /* KVP_LAYOUT_H */
