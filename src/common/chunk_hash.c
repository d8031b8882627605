/*
 * chunk_hash.c - the key hash chain (see chunk_hash.h for the definition).
 *
 * Every variable-length field of the seed is length-prefixed so that two different namespaces
 * can never produce the same byte stream (("ab","c") versus ("a","bc")). libsodium's
 * crypto_generichash is BLAKE2b; sodium_init() is idempotent and thread-safe.
 */
#include "common/chunk_hash.h"

#include <errno.h>
#include <sodium.h>
#include <string.h>

static void upd_u32(crypto_generichash_state *st, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    crypto_generichash_update(st, b, sizeof(b));
}

static void upd_bytes(crypto_generichash_state *st, const void *p, uint32_t n)
{
    upd_u32(st, n);
    if (n)
        crypto_generichash_update(st, p, n);
}

int kvp_key_seed(const struct kvp_key_ns *ns, uint8_t seed[KVP_KEY_SIZE])
{
    static const char tag[] = "kvpool-key-v1";
    crypto_generichash_state st;

    if (sodium_init() < 0)
        return -ENOMEM;
    crypto_generichash_init(&st, NULL, 0, KVP_KEY_SIZE);
    upd_bytes(&st, tag, sizeof(tag) - 1);
    upd_bytes(&st, ns->model_name, (uint32_t)strlen(ns->model_name));
    upd_u32(&st, ns->world_size);
    upd_u32(&st, ns->rank);
    upd_bytes(&st, ns->dtype, (uint32_t)strlen(ns->dtype));
    upd_u32(&st, ns->ndim);
    for (uint32_t i = 0; i < ns->ndim; i++)
        upd_u32(&st, ns->shape[i]);
    upd_bytes(&st, ns->salt, ns->salt_len);
    crypto_generichash_final(&st, seed, KVP_KEY_SIZE);
    return 0;
}

void kvp_key_chain(const uint8_t seed[KVP_KEY_SIZE], const uint8_t *tokens_le,
                   uint32_t chunk_tokens, uint32_t nchunks, uint8_t *keys)
{
    const uint8_t *prev = seed;
    size_t chunk_len = (size_t)chunk_tokens * 4;

    for (uint32_t i = 0; i < nchunks; i++) {
        crypto_generichash_state st;
        uint8_t *out = keys + (size_t)i * KVP_KEY_SIZE;
        crypto_generichash_init(&st, NULL, 0, KVP_KEY_SIZE);
        crypto_generichash_update(&st, prev, KVP_KEY_SIZE);
        crypto_generichash_update(&st, tokens_le + i * chunk_len, chunk_len);
        crypto_generichash_final(&st, out, KVP_KEY_SIZE);
        prev = out;
    }
}

/* The seed is the BLAKE2b key: the namespace separates ids of different registrations and
 * salts, and a keyed hash never equals the unkeyed hash of the chain. */
void kvp_key_ids(const uint8_t seed[KVP_KEY_SIZE], const uint8_t *ids, uint32_t id_len, uint32_t n,
                 uint8_t *keys)
{
    for (uint32_t i = 0; i < n; i++)
        crypto_generichash(keys + (size_t)i * KVP_KEY_SIZE, KVP_KEY_SIZE, ids + (size_t)i * id_len,
                           id_len, seed, KVP_KEY_SIZE);
}
