/*
 * keyhash.c - the daemon's key hash of one chunk, timed alone, and faster keyed hashes from
 * Debian's packages timed in its place (the "rtt" section's hash rows).
 *
 * A one-chunk lookup costs the daemon what a ping costs plus the chunk's key: one link of the
 * hash chain (src/common/chunk_hash.h), BLAKE2b-256 over the previous key and the chunk's token
 * ids. The rows here time exactly that call (kvp_key_chain, the daemon's own code) and the same
 * link computed by two keyed hashes that Debian also ships: SipHash-2-4 with a 128-bit output
 * (libsodium's crypto_shorthash_siphashx24, a PRF keyed with the namespace) and XXH3-128 keyed
 * with a secret derived from the namespace (libxxhash; fast, not a cryptographic hash). The
 * report subtracts BLAKE2b from the lookup's p50 and adds each of them, to show what the lookup
 * would cost with it.
 *
 * Every sample is the mean of KVPB_HASH_BATCH links computed back to back (each chained onto
 * the one before, so none can be skipped), which keeps the clock's own cost out of a sample of
 * about a microsecond. Runs in the bench's own process: no daemon, no socket.
 */
#include <errno.h>
#include <sodium.h>
#include <stdint.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_generateSecret, XXH3_SECRET_DEFAULT_SIZE */
#include <xxhash.h>

#include "bench.h"
#include "common/chunk_hash.h"

/* Links per sample. */
#define KVPB_HASH_BATCH 16u
/* The longest chunk timed: token ids of one link, after the previous key. */
#define KVPB_HASH_MAX_TOKENS 4096u

static uint8_t link_buf[KVP_KEY_SIZE + KVPB_HASH_MAX_TOKENS * 4];

static uint8_t secret[XXH3_SECRET_DEFAULT_SIZE];
static uint8_t sip_key[crypto_shorthash_siphashx24_KEYBYTES];

/* One link of the chain: buf holds the previous key and then the tokens; the new key replaces
 * the previous one at the start of buf. */
static void one_link(int op, uint8_t *buf, size_t tokens_len)
{
    uint8_t *tokens = buf + KVP_KEY_SIZE;
    switch (op) {
    case KVPB_OP_HASH_BLAKE2B: {
        uint8_t out[KVP_KEY_SIZE];
        kvp_key_chain(buf, tokens, (uint32_t)(tokens_len / 4), 1, out);
        memcpy(buf, out, sizeof(out));
        break;
    }
    case KVPB_OP_HASH_SIPHASH:
        crypto_shorthash_siphashx24(buf + KVP_KEY_SIZE - crypto_shorthash_siphashx24_BYTES,
                                    buf + KVP_KEY_SIZE - crypto_shorthash_siphashx24_BYTES,
                                    crypto_shorthash_siphashx24_BYTES + tokens_len, sip_key);
        break;
    default: {
        size_t at = KVP_KEY_SIZE - sizeof(XXH128_canonical_t);
        XXH128_hash_t h = XXH3_128bits_withSecret(buf + at, sizeof(XXH128_canonical_t) + tokens_len,
                                                  secret, sizeof(secret));
        XXH128_canonicalFromHash((XXH128_canonical_t *)(buf + at), h);
        break;
    }
    }
}

int kvpb_time_key_hash(int op, uint32_t chunk_tokens, uint32_t n, double *samples)
{
    static int ready;
    size_t len = (size_t)chunk_tokens * 4;

    if (chunk_tokens == 0 || chunk_tokens > KVPB_HASH_MAX_TOKENS)
        return -EINVAL;
    if (!ready) {
        if (sodium_init() < 0)
            return -ENOMEM;
        /* Keys derived from a namespace, as the daemon's seed is. */
        crypto_generichash(sip_key, sizeof(sip_key), (const uint8_t *)"kvpool-bench", 12, NULL, 0);
        if (XXH3_generateSecret(secret, sizeof(secret), sip_key, sizeof(sip_key)) != XXH_OK)
            return -EINVAL;
        for (size_t i = 0; i < sizeof(link_buf); i++)
            link_buf[i] = (uint8_t)(i * 2654435761u >> 13);
        ready = 1;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint64_t t0 = kvpb_now_ns();
        for (uint32_t k = 0; k < KVPB_HASH_BATCH; k++)
            one_link(op, link_buf, len);
        samples[i] = (double)(kvpb_now_ns() - t0) / 1e3 / KVPB_HASH_BATCH;
    }
    return 0;
}
