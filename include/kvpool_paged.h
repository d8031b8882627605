/*
 * kvpool_paged.h - gather and scatter between an inference engine's paged KV cache and the
 * chunk layout that kvpool stores.
 *
 * Engines keep the KV cache of each layer in pages ("blocks") of block_size tokens; a sequence
 * owns a list of block ids, its block table: entry i holds the sequence's tokens
 * [i * block_size, (i + 1) * block_size). kvpool stores a sequence as fixed-size chunks of
 * chunk_tokens tokens in the layout
 *
 *     [2, num_layers, chunk_tokens, hidden]   (K then V; hidden = heads * head_dim)
 *     [num_layers, chunk_tokens, latent]      (MLA: one latent vector per token)
 *
 * kvp_paged_gather() copies a token range from the paged cache into such a chunk buffer (a pool
 * slot from kvp_prepare_store() or any memory); kvp_paged_scatter() copies it back. Supported
 * per-layer buffer layouts (C-contiguous, element size elem_size):
 *
 *     KVP_PAGED_NHD  [num_blocks, 2, block_size, heads, head_dim]
 *     KVP_PAGED_HND  [num_blocks, 2, heads, block_size, head_dim]
 *     KVP_PAGED_MLA  [num_blocks, block_size, latent]        (heads = 1, head_dim = latent)
 *
 * With the flag KVP_PAGED_KV_FIRST the K/V dimension is outermost instead:
 * [2, num_blocks, block_size, heads, head_dim] (NHD) or [2, num_blocks, heads, block_size,
 * head_dim] (HND), as in vLLM's FlashAttention and CPU backends.
 *
 * Copies move contiguous runs with memcpy: a whole run of up to block_size tokens at a time for
 * NHD and MLA, head_dim elements at a time for HND (whose heads are interleaved differently in
 * the chunk). Every block id and size is validated before the first byte is written, so a
 * failing call leaves its destination untouched. The functions keep no state and are safe to
 * call from several threads on disjoint destinations. The caller owns every buffer; nothing is
 * retained after a call returns. Source and destination must not overlap.
 *
 * Conventions as in kvpool.h: 0 on success, a negative errno on failure.
 */
#ifndef KVPOOL_PAGED_H
#define KVPOOL_PAGED_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Layout of one layer's paged KV buffer. */
typedef enum {
    KVP_PAGED_NHD = 0, /* [num_blocks, 2, block_size, heads, head_dim] */
    KVP_PAGED_HND = 1, /* [num_blocks, 2, heads, block_size, head_dim] */
    KVP_PAGED_MLA = 2, /* [num_blocks, block_size, latent] */
} kvp_paged_layout;

/* Flags of kvp_paged_cache.flags. */
#define KVP_PAGED_KV_FIRST 0x1u /* NHD/HND: K/V dimension outermost, [2, num_blocks, ...] */

/*
 * Describes a paged KV cache: num_layers buffers of identical layout. The description borrows
 * the caller's pointers; the caller keeps the buffers and the layers array alive during a call.
 */
typedef struct kvp_paged_cache {
    uint32_t layout;      /* a kvp_paged_layout */
    uint32_t flags;       /* 0 or KVP_PAGED_KV_FIRST (not allowed with MLA) */
    uint32_t num_layers;  /* >= 1; entries of layers[] */
    uint32_t num_blocks;  /* >= 1; valid block ids are [0, num_blocks) */
    uint32_t block_size;  /* tokens per block, >= 1 */
    uint32_t heads;       /* KV heads, >= 1 (MLA: 1; heads * head_dim = latent) */
    uint32_t head_dim;    /* elements per head, >= 1 (MLA: the latent size) */
    uint32_t elem_size;   /* bytes per element: 1, 2, 4 or 8 */
    uint64_t layer_bytes; /* bytes addressable at each layers[l]; at least the size of the
                             layout above (extra bytes are ignored) */
    void *const *layers;  /* num_layers base pointers, one per layer, none NULL */
} kvp_paged_cache;

/*
 * Bytes of one chunk of chunk_tokens tokens for this cache:
 * 2 * num_layers * chunk_tokens * heads * head_dim * elem_size (no factor 2 for MLA).
 * Returns 0 and fills *bytes, -EINVAL when the description is invalid (a zero dimension, an
 * unknown layout or flag, a NULL layer, layer_bytes smaller than the layout), or -EOVERFLOW.
 */
KVP_EXPORT int kvp_paged_chunk_bytes(const kvp_paged_cache *cache, uint32_t chunk_tokens,
                                     uint64_t *bytes);

/*
 * Gathers the sequence's tokens [token_start, token_start + num_tokens) from every layer into
 * rows [0, num_tokens) of the chunk buffer `chunk` (chunk_bytes bytes, holding a chunk of
 * chunk_tokens tokens in the layout above). Rows [num_tokens, chunk_tokens) are not written.
 *
 * block_table: table_len block ids of the sequence (entry i: tokens [i*block_size, ...)).
 * Only the entries covering the range are read; each must be in [0, num_blocks).
 *
 * Returns 0, or -EINVAL (invalid cache description, num_tokens > chunk_tokens, chunk_tokens 0,
 * range beyond the block table, block id out of range, NULL pointer, chunk_bytes too small),
 * -EOVERFLOW (sizes beyond 64 bits or the token range beyond 32 bits). On error nothing has
 * been written. num_tokens == 0 is a valid no-op.
 */
KVP_EXPORT int kvp_paged_gather(const kvp_paged_cache *cache, const int32_t *block_table,
                                uint32_t table_len, uint32_t token_start, uint32_t num_tokens,
                                void *chunk, uint64_t chunk_bytes, uint32_t chunk_tokens);

/*
 * The reverse of kvp_paged_gather(): copies rows [skip_first_n, num_tokens) of the chunk buffer
 * into the sequence's tokens [token_start + skip_first_n, token_start + num_tokens) of every
 * layer. skip_first_n (<= num_tokens) leaves the first tokens alone, for example those already
 * present on the device. Only block table entries covering the copied tokens are read and
 * validated. Returns and errors as kvp_paged_gather() (also -EINVAL when skip_first_n >
 * num_tokens); on error no layer buffer has been written.
 */
KVP_EXPORT int kvp_paged_scatter(const kvp_paged_cache *cache, const int32_t *block_table,
                                 uint32_t table_len, uint32_t token_start, uint32_t num_tokens,
                                 uint32_t skip_first_n, const void *chunk, uint64_t chunk_bytes,
                                 uint32_t chunk_tokens);

#ifdef __cplusplus
}
#endif

#endif /* KVPOOL_PAGED_H */
