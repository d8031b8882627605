/*
 * test_chunk_hash.c - object keys (chunk_hash.c): the definition in chunk_hash.h, the chain
 * property, and that every namespace field separates keys.
 */
#include <errno.h>
#include <string.h>

#include "common/chunk_hash.h"
#include "common/kvp_assert.h"

#define CT 4 /* tokens per chunk in these tests */
#define NCHUNK 4
#define NTOK (CT * NCHUNK)

static const uint32_t shape4[4] = {2, 4, CT, 64};

static struct kvp_key_ns base_ns(void)
{
    return (struct kvp_key_ns){
        .model_name = "m",
        .world_size = 2,
        .rank = 1,
        .dtype = "float16",
        .ndim = 4,
        .shape = shape4,
        .salt = NULL,
        .salt_len = 0,
    };
}

static void to_le(const uint32_t *tok, uint32_t n, uint8_t *out)
{
    for (uint32_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++)
            out[i * 4 + b] = (uint8_t)(tok[i] >> (8 * b));
}

/* Keys of the chunks of tok[0..NTOK) under ns. */
static void keys_of(const struct kvp_key_ns *ns, const uint32_t *tok,
                    uint8_t keys[NCHUNK][KVP_KEY_SIZE])
{
    uint8_t seed[KVP_KEY_SIZE], le[NTOK * 4];

    assert_rc(kvp_key_seed(ns, seed), 0);
    to_le(tok, NTOK, le);
    kvp_key_chain(seed, le, CT, NCHUNK, &keys[0][0]);
}

static void sample_tokens(uint32_t *tok)
{
    for (uint32_t i = 0; i < NTOK; i++)
        tok[i] = 1000 + i * 31;
}

/* Fails unless every key differs between a and b. */
static void assert_all_differ(uint8_t a[NCHUNK][KVP_KEY_SIZE], uint8_t b[NCHUNK][KVP_KEY_SIZE],
                              const char *what)
{
    for (int i = 0; i < NCHUNK; i++)
        if (memcmp(a[i], b[i], KVP_KEY_SIZE) == 0)
            fail_msg("%s: key %d did not change", what, i);
}

/*
 * Known answer, computed independently (Python hashlib.blake2b, digest_size=32) from the
 * definition in chunk_hash.h: length-prefixed seed fields, little-endian u32 everywhere.
 */
static void test_known_answer(void **state)
{
    (void)state;
    static const uint8_t want_seed[KVP_KEY_SIZE] = {0xa0, 0x55, 0x99, 0x19, 0x94, 0x53, 0x79, 0x05,
                                                    0x58, 0x03, 0xa3, 0xd4, 0x6c, 0x84, 0xda, 0xa5,
                                                    0x35, 0x03, 0x9a, 0xd4, 0xaa, 0x4b, 0x85, 0xf0,
                                                    0xfb, 0x13, 0x16, 0x3b, 0xa1, 0x6c, 0xfa, 0x14};
    static const uint8_t want_k0[KVP_KEY_SIZE] = {0x87, 0x40, 0xac, 0xa4, 0x61, 0xfe, 0x4f, 0xeb,
                                                  0x3f, 0xe8, 0xb7, 0x17, 0x2d, 0x57, 0xdd, 0x42,
                                                  0x2e, 0xcd, 0x52, 0x14, 0x31, 0xf8, 0x9e, 0x34,
                                                  0x99, 0x9f, 0xc8, 0x2a, 0xf2, 0x11, 0x84, 0xba};
    static const uint8_t want_k1[KVP_KEY_SIZE] = {0x0a, 0xeb, 0x2e, 0x63, 0x7c, 0x85, 0x0c, 0x6d,
                                                  0x30, 0x23, 0x2a, 0x6d, 0xfa, 0x4f, 0x7b, 0x1b,
                                                  0x94, 0x0c, 0x32, 0x8c, 0x3c, 0x87, 0xe5, 0xc6,
                                                  0xae, 0xec, 0xb0, 0x39, 0x90, 0x13, 0x0e, 0x14};
    struct kvp_key_ns ns = base_ns();
    uint8_t seed[KVP_KEY_SIZE], keys[2][KVP_KEY_SIZE], le[8 * 4];
    uint32_t tok[8];

    for (uint32_t i = 0; i < 8; i++)
        tok[i] = 100 + i;
    to_le(tok, 8, le);
    assert_rc(kvp_key_seed(&ns, seed), 0);
    assert_memory_equal(seed, want_seed, KVP_KEY_SIZE);
    kvp_key_chain(seed, le, CT, 2, &keys[0][0]);
    assert_memory_equal(keys[0], want_k0, KVP_KEY_SIZE);
    assert_memory_equal(keys[1], want_k1, KVP_KEY_SIZE);
}

static void test_deterministic(void **state)
{
    (void)state;
    struct kvp_key_ns ns = base_ns();
    uint8_t a[NCHUNK][KVP_KEY_SIZE], b[NCHUNK][KVP_KEY_SIZE];
    uint32_t tok[NTOK];

    sample_tokens(tok);
    keys_of(&ns, tok, a);
    keys_of(&ns, tok, b);
    assert_memory_equal(a, b, sizeof(a));
    /* Distinct chunks get distinct keys. */
    for (int i = 1; i < NCHUNK; i++)
        assert_memory_not_equal(a[i - 1], a[i], KVP_KEY_SIZE);
}

static void test_chain_property(void **state)
{
    (void)state;
    struct kvp_key_ns ns = base_ns();
    uint8_t a[NCHUNK][KVP_KEY_SIZE], b[NCHUNK][KVP_KEY_SIZE];
    uint32_t tok[NTOK];

    sample_tokens(tok);
    keys_of(&ns, tok, a);

    /* Token 0 is part of every prefix: every key changes. */
    tok[0] ^= 1;
    keys_of(&ns, tok, b);
    assert_all_differ(a, b, "token 0 changed");
    tok[0] ^= 1;

    /* A token of chunk 2 changes keys 2 and 3 only. */
    tok[2 * CT + 1] += 7;
    keys_of(&ns, tok, b);
    assert_memory_equal(a[0], b[0], KVP_KEY_SIZE);
    assert_memory_equal(a[1], b[1], KVP_KEY_SIZE);
    assert_memory_not_equal(a[2], b[2], KVP_KEY_SIZE);
    assert_memory_not_equal(a[3], b[3], KVP_KEY_SIZE);

    /* Same chunk content after a different prefix is a different key. */
    uint32_t tok2[NTOK];
    sample_tokens(tok2);
    /* cppcheck-suppress overlappingWriteFunction ; tokens [CT, 2 CT) from [0, CT): apart */
    memcpy(tok2 + CT, tok2, CT * sizeof(uint32_t)); /* chunk 1 = chunk 0 */
    keys_of(&ns, tok2, b);
    assert_memory_not_equal(b[0], b[1], KVP_KEY_SIZE);
}

static void test_namespace_fields(void **state)
{
    (void)state;
    uint8_t a[NCHUNK][KVP_KEY_SIZE], b[NCHUNK][KVP_KEY_SIZE];
    uint32_t tok[NTOK];
    struct kvp_key_ns ns;
    static const uint32_t shape_other[4] = {2, 4, CT, 128};
    static const uint32_t shape3[3] = {4, CT, 64};

    sample_tokens(tok);
    ns = base_ns();
    keys_of(&ns, tok, a);

    ns = base_ns();
    ns.salt = "tenant-a";
    ns.salt_len = 8;
    keys_of(&ns, tok, b);
    assert_all_differ(a, b, "salt");
    uint8_t c[NCHUNK][KVP_KEY_SIZE];
    ns.salt = "tenant-b";
    keys_of(&ns, tok, c);
    assert_all_differ(b, c, "other salt");

    ns = base_ns();
    ns.model_name = "m2";
    keys_of(&ns, tok, b);
    assert_all_differ(a, b, "model");

    ns = base_ns();
    ns.rank = 0;
    keys_of(&ns, tok, b);
    assert_all_differ(a, b, "rank");
    ns.rank = KVP_RANK_SHARED;
    keys_of(&ns, tok, b);
    assert_all_differ(a, b, "shared rank");

    ns = base_ns();
    ns.world_size = 4;
    keys_of(&ns, tok, b);
    assert_all_differ(a, b, "world size");

    ns = base_ns();
    ns.dtype = "bfloat16";
    keys_of(&ns, tok, b);
    assert_all_differ(a, b, "dtype");

    ns = base_ns();
    ns.shape = shape_other;
    keys_of(&ns, tok, b);
    assert_all_differ(a, b, "shape");

    ns = base_ns();
    ns.ndim = 3;
    ns.shape = shape3;
    keys_of(&ns, tok, b);
    assert_all_differ(a, b, "ndim");
}

/* Moving bytes between adjacent variable-length fields must change the keys. */
static void test_length_prefixes(void **state)
{
    (void)state;
    uint8_t a[NCHUNK][KVP_KEY_SIZE], b[NCHUNK][KVP_KEY_SIZE];
    uint32_t tok[NTOK];
    struct kvp_key_ns ns;

    sample_tokens(tok);

    /* ("ab", "c") versus ("a", "bc") over model and salt. */
    ns = base_ns();
    ns.model_name = "ab";
    ns.salt = "c";
    ns.salt_len = 1;
    keys_of(&ns, tok, a);
    ns.model_name = "a";
    ns.salt = "bc";
    ns.salt_len = 2;
    keys_of(&ns, tok, b);
    assert_all_differ(a, b, "model/salt split");

    /*
     * The same bytes with the model/dtype boundary moved: without length prefixes, model "ab"
     * + world 01 02 03 04 + rank 05 06 07 08 + "float16" and model "a" + world 'b' 01 02 03 +
     * rank 04 05 06 07 + "\x08float16" would hash the same stream.
     */
    ns = base_ns();
    ns.model_name = "ab";
    ns.world_size = 0x04030201;
    ns.rank = 0x08070605;
    ns.dtype = "float16";
    keys_of(&ns, tok, a);
    ns.model_name = "a";
    ns.world_size = 0x03020162;
    ns.rank = 0x07060504;
    ns.dtype = "\x08"
               "float16";
    keys_of(&ns, tok, b);
    assert_all_differ(a, b, "shifted field boundary");
}

/* Tokens past the last full chunk never influence the keys. */
static void test_partial_chunk_ignored(void **state)
{
    (void)state;
    struct kvp_key_ns ns = base_ns();
    uint8_t seed[KVP_KEY_SIZE], a[2][KVP_KEY_SIZE], b[2][KVP_KEY_SIZE], le[NTOK * 4];
    uint32_t tok[NTOK];

    sample_tokens(tok);
    assert_rc(kvp_key_seed(&ns, seed), 0);
    to_le(tok, NTOK, le);
    kvp_key_chain(seed, le, CT, 2, &a[0][0]);
    tok[2 * CT] += 1;
    to_le(tok, NTOK, le);
    kvp_key_chain(seed, le, CT, 2, &b[0][0]);
    assert_memory_equal(a, b, sizeof(a));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_answer),    cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_chain_property),  cmocka_unit_test(test_namespace_fields),
        cmocka_unit_test(test_length_prefixes), cmocka_unit_test(test_partial_chunk_ignored),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
