/*
 * chunk_hash.h - object keys: a BLAKE2b hash chain over token-id prefixes (libsodium).
 *
 * seed     = BLAKE2b-256("kvpool-key-v1", model, world size, rank or MLA, chunk layout, salt)
 * key[0]   = BLAKE2b-256(seed     || tokens of chunk 0)
 * key[i]   = BLAKE2b-256(key[i-1] || tokens of chunk i)
 * Token ids are hashed as little-endian uint32, exactly as they travel on the wire. Chunk i's key
 * therefore covers the namespace, the salt and every token up to the end of chunk i.
 */
#ifndef KVP_CHUNK_HASH_H
#define KVP_CHUNK_HASH_H

#include <stdint.h>

#define KVP_KEY_SIZE 32

struct kvp_key_ns {
    const char *model_name;
    uint32_t world_size;
    uint32_t rank; /* KVP_RANK_SHARED for MLA layouts */
    const char *dtype;
    uint32_t ndim;
    const uint32_t *shape;
    const void *salt;
    uint32_t salt_len;
};

#define KVP_RANK_SHARED 0xffffffffu

/* Computes the chain seed of a namespace. Returns 0 or -ENOMEM (libsodium init failure). */
int kvp_key_seed(const struct kvp_key_ns *ns, uint8_t seed[KVP_KEY_SIZE]);

/*
 * Writes the keys of chunks [0, nchunks) into keys (nchunks * KVP_KEY_SIZE bytes). tokens_le
 * holds at least nchunks * chunk_tokens little-endian uint32 token ids.
 */
void kvp_key_chain(const uint8_t seed[KVP_KEY_SIZE], const uint8_t *tokens_le,
                   uint32_t chunk_tokens, uint32_t nchunks, uint8_t *keys);

/*
 * Writes the keys of n chunks named by opaque ids (a protocol's own chunk hashes, n x id_len
 * bytes) into keys: key[i] = BLAKE2b-256 keyed with seed over id i. Not chained (such ids
 * already cover their prefix); keyed, so no key of an id equals a key of the token chain.
 */
void kvp_key_ids(const uint8_t seed[KVP_KEY_SIZE], const uint8_t *ids, uint32_t id_len, uint32_t n,
                 uint8_t *keys);

#endif /* KVP_CHUNK_HASH_H */
