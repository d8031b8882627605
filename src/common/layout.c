/*
 * layout.c - the dtype table (with torch's names for each dtype), the chunk shape rule and the
 * chunk-range rule.
 *
 * A chunk holds chunk_tokens tokens of every layer: [2 (K and V), layers, tokens, hidden], or,
 * for MLA models whose single latent vector is shared by all tensor-parallel ranks,
 * [layers, tokens, hidden]. The byte size is computed with overflow checks because every factor
 * comes from a worker.
 *
 * The chunk-range rule (which tokens of a sequence a keyed request covers) lives here too, so
 * the library and the daemon apply the same one; the Python binding relies on the library's.
 */
#include "common/layout.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

static const struct kvp_dtype dtypes[] = {
    {"float16", 2, "half", "HalfStorage"},   {"bfloat16", 2, NULL, "BFloat16Storage"},
    {"float32", 4, "float", "FloatStorage"}, {"float64", 8, "double", "DoubleStorage"},
    {"int8", 1, NULL, "CharStorage"},        {"uint8", 1, NULL, "ByteStorage"},
    {"float8_e4m3fn", 1, NULL, NULL},        {"float8_e5m2", 1, NULL, NULL},
};
#define NDTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

const struct kvp_dtype *kvp_dtype_find(const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < NDTYPES; i++)
        if (strcmp(dtypes[i].name, name) == 0)
            return &dtypes[i];
    return NULL;
}

const struct kvp_dtype *kvp_dtype_find_torch(const char *name)
{
    const struct kvp_dtype *d = kvp_dtype_find(name);
    for (size_t i = 0; !d && name && i < NDTYPES; i++)
        if (dtypes[i].torch_alias && strcmp(dtypes[i].torch_alias, name) == 0)
            d = &dtypes[i];
    return d;
}

const struct kvp_dtype *kvp_dtype_at(size_t i)
{
    return i < NDTYPES ? &dtypes[i] : NULL;
}

const char *kvp_dtype_names(void)
{
    return "float16, bfloat16, float32, float64, int8, uint8, float8_e4m3fn, float8_e5m2";
}

/* *acc *= f, returning false on 64-bit overflow. */
static bool mul_ok(uint64_t *acc, uint64_t f)
{
    if (f != 0 && *acc > UINT64_MAX / f)
        return false;
    *acc *= f;
    return true;
}

int kvp_chunk_layout(uint32_t num_layers, uint32_t chunk_tokens, uint32_t hidden_dim,
                     uint32_t dtype_size, bool use_mla, uint64_t max_bytes,
                     struct kvp_chunk_layout *out)
{
    if (!num_layers || !chunk_tokens || !hidden_dim || !dtype_size)
        return -EINVAL;

    *out = (struct kvp_chunk_layout){0};
    uint64_t bytes = use_mla ? 1 : 2;
    if (!mul_ok(&bytes, num_layers) || !mul_ok(&bytes, chunk_tokens) ||
        !mul_ok(&bytes, hidden_dim) || !mul_ok(&bytes, dtype_size))
        return -EOVERFLOW;
    if (max_bytes && bytes > max_bytes)
        return -EOVERFLOW;

    if (use_mla) {
        out->ndim = 3;
        out->shape[0] = num_layers;
        out->shape[1] = chunk_tokens;
        out->shape[2] = hidden_dim;
    } else {
        out->ndim = 4;
        out->shape[0] = 2;
        out->shape[1] = num_layers;
        out->shape[2] = chunk_tokens;
        out->shape[3] = hidden_dim;
    }
    out->bytes = bytes;
    return 0;
}

int kvp_chunk_range(uint32_t start, uint32_t end, uint32_t ntokens, uint32_t chunk_tokens,
                    uint32_t max_chunks, uint32_t *first, uint32_t *n, char *why, size_t why_size)
{
    int rc = 0;

    if (why && why_size)
        why[0] = '\0';
    if (chunk_tokens == 0)
        rc = -EINVAL;
    else if (start % chunk_tokens)
        rc = -EINVAL;
    else if (end > ntokens)
        rc = -EINVAL;
    else if (end < start)
        rc = -EINVAL;
    if (rc == 0) {
        /* start is aligned and <= end, so the rounded-down end is >= start. */
        *first = start / chunk_tokens;
        *n = end / chunk_tokens - *first;
        if (max_chunks == 0 || *n <= max_chunks)
            return 0;
        rc = -E2BIG;
    }
    if (!why || !why_size)
        return rc;
    if (chunk_tokens == 0)
        snprintf(why, why_size, "the chunk size is 0 tokens");
    else if (rc == -E2BIG)
        snprintf(why, why_size, "range of %" PRIu32 " chunks exceeds the limit of %" PRIu32, *n,
                 max_chunks);
    else if (start % chunk_tokens)
        snprintf(why, why_size,
                 "start (%" PRIu32 ") is not a multiple of the chunk size (%" PRIu32 " tokens)",
                 start, chunk_tokens);
    else if (end > ntokens)
        snprintf(why, why_size, "end (%" PRIu32 ") is beyond the sequence's %" PRIu32 " tokens",
                 end, ntokens);
    else
        snprintf(why, why_size, "end (%" PRIu32 ") is before start (%" PRIu32 ")", end, start);
    return rc;
}
