/*
 * layout.h - dtype table and chunk shape derivation, shared by the daemon (validation of a
 * registration) and the client library (views over slots).
 */
#ifndef KVP_LAYOUT_H
#define KVP_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

struct kvp_dtype {
    const char *name;
    uint32_t size; /* bytes per element */
};

/* The dtype called name, or NULL when kvpool does not know it. */
const struct kvp_dtype *kvp_dtype_find(const char *name);

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

#endif /* KVP_LAYOUT_H */
