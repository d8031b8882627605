/*
 * test_lmc_codec.c - the LMCache front end's msgpack codec and messages (src/server/lmc/codec.h,
 * messages.h).
 *
 * Integers of every width and sign, the bounds of every reader, skipping of nested and ext
 * values, and the message decoders and encoders against frames recorded between a real LMCache
 * 0.5.6 worker and `lmcache server` (tests/lmcache/frames/): the encoders must produce those
 * replies byte for byte for the same values.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_assert.h"
#include "lmc/codec.h"
#include "lmc/messages.h"

/* Decodes a hex string into buf; returns the length. */
static size_t unhex(const char *hex, uint8_t *buf, size_t cap)
{
    size_t n = strlen(hex) / 2;
    assert_true(n <= cap);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
        buf[i] = (uint8_t)v;
    }
    return n;
}

static void assert_bytes(const struct lmc_mp_writer *w, const char *hex)
{
    uint8_t want[1024];
    size_t n = unhex(hex, want, sizeof(want));
    assert_false(w->failed);
    if (w->len != n || memcmp(w->buf, want, n) != 0) {
        char got[2049] = "";
        for (size_t i = 0; i < w->len && i < 1024; i++)
            snprintf(got + 2 * i, 3, "%02x", w->buf[i]);
        fail_msg("encoded %s\n     want %s", got, hex);
    }
}

static int64_t int_of(const char *hex, int expect_rc)
{
    uint8_t b[16];
    size_t n = unhex(hex, b, sizeof(b));
    struct lmc_mp_reader r;
    int64_t v = 0;
    lmc_mp_reader_init(&r, b, n);
    assert_rc(lmc_mp_read_int(&r, INT64_MIN, INT64_MAX, &v), expect_rc);
    if (expect_rc == 0)
        assert_int_equal(lmc_mp_left(&r), 0);
    else
        assert_int_equal(lmc_mp_left(&r), n); /* a failed read does not move */
    return v;
}

static void test_int_widths(void **state)
{
    (void)state;
    assert_int_equal(int_of("00", 0), 0);
    assert_int_equal(int_of("7f", 0), 127);
    assert_int_equal(int_of("ff", 0), -1);
    assert_int_equal(int_of("e0", 0), -32);
    assert_int_equal(int_of("cc80", 0), 128);
    assert_int_equal(int_of("cd0100", 0), 256);
    assert_int_equal(int_of("ce00010000", 0), 65536);
    assert_int_equal(int_of("cf0d0f2544baf281c1", 0), 0x0d0f2544baf281c1LL);
    assert_int_equal(int_of("d080", 0), -128);
    assert_int_equal(int_of("d18000", 0), -32768);
    assert_int_equal(int_of("d280000000", 0), INT32_MIN);
    assert_true(int_of("d38000000000000000", 0) == INT64_MIN);
    /* A uint64 above INT64_MAX does not fit; the non-minimal forms of small values do. */
    int_of("cf8000000000000000", -ERANGE);
    assert_int_equal(int_of("cf0000000000000005", 0), 5);
    assert_int_equal(int_of("d3fffffffffffffffe", 0), -2);
    /* Truncated, wrong type, reserved byte. */
    int_of("cd01", -EPROTO);
    int_of("c3", -EINVAL);
    int_of("c1", -EPROTO);
    int_of("", -EPROTO);

    /* Unsigned and bounded reads. */
    uint8_t b[] = {0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    struct lmc_mp_reader r;
    uint64_t u;
    lmc_mp_reader_init(&r, b, sizeof(b));
    assert_rc(lmc_mp_read_uint(&r, UINT64_MAX, &u), 0);
    assert_true(u == UINT64_MAX);
    lmc_mp_reader_init(&r, b, sizeof(b));
    assert_rc(lmc_mp_read_uint(&r, INT64_MAX, &u), -ERANGE);
    uint8_t neg[] = {0xff};
    lmc_mp_reader_init(&r, neg, 1);
    assert_rc(lmc_mp_read_uint(&r, 10, &u), -ERANGE);
    int64_t v;
    uint8_t big[] = {0xcd, 0x01, 0x00};
    lmc_mp_reader_init(&r, big, sizeof(big));
    assert_rc(lmc_mp_read_int(&r, 0, 255, &v), -ERANGE);
}

static void test_int_roundtrip(void **state)
{
    (void)state;
    static const int64_t vals[] = {
        0,         1,         31, 32,  127, 128,  255,  256,    65535,  65536,     UINT32_MAX,
        1LL << 32, INT64_MAX, -1, -32, -33, -128, -129, -32768, -32769, INT32_MIN, INT32_MIN - 1LL,
        INT64_MIN};
    static const size_t sizes[] = {1, 1, 1, 1, 1, 2, 2, 3, 3, 5, 5, 9,
                                   9, 1, 1, 2, 2, 3, 3, 5, 5, 9, 9};
    struct lmc_mp_writer w;
    lmc_mp_writer_init(&w);
    for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
        lmc_mp_writer_reset(&w);
        lmc_mp_put_int(&w, vals[i]);
        assert_int_equal(w.len, sizes[i]);
        struct lmc_mp_reader r;
        int64_t back;
        lmc_mp_reader_init(&r, w.buf, w.len);
        assert_rc(lmc_mp_read_int(&r, INT64_MIN, INT64_MAX, &back), 0);
        assert_true(back == vals[i]);
    }
    lmc_mp_writer_free(&w);
}

static void test_strings_and_bounds(void **state)
{
    (void)state;
    struct lmc_mp_reader r;
    const char *s;
    uint32_t len;
    char buf[4];
    uint8_t str[] = {0xa3, 'a', 'b', 'c'};
    lmc_mp_reader_init(&r, str, sizeof(str));
    assert_rc(lmc_mp_read_str(&r, 2, &s, &len), -E2BIG);
    assert_rc(lmc_mp_read_cstr(&r, buf, 3), -E2BIG);
    assert_rc(lmc_mp_read_cstr(&r, buf, 4), 0);
    assert_string_equal(buf, "abc");
    uint8_t nul[] = {0xa2, 'a', 0};
    lmc_mp_reader_init(&r, nul, sizeof(nul));
    assert_rc(lmc_mp_read_cstr(&r, buf, 4), -EINVAL);
    assert_int_equal(lmc_mp_left(&r), sizeof(nul));
    /* A str8 announcing more bytes than the frame has. */
    uint8_t trunc[] = {0xd9, 0x10, 'a'};
    lmc_mp_reader_init(&r, trunc, sizeof(trunc));
    assert_rc(lmc_mp_read_str(&r, 100, &s, &len), -EPROTO);
    /* An array32 announcing 4 billion elements in 5 bytes. */
    uint8_t arr[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
    uint32_t n;
    lmc_mp_reader_init(&r, arr, sizeof(arr));
    assert_rc(lmc_mp_read_array(&r, UINT32_MAX, &n), -EPROTO);
    assert_rc(lmc_mp_skip(&r), -EPROTO);
    /* bin is not str, str is not bin. */
    uint8_t bin[] = {0xc4, 0x00};
    lmc_mp_reader_init(&r, bin, sizeof(bin));
    assert_rc(lmc_mp_read_str(&r, 10, &s, &len), -EINVAL);
    const uint8_t *b;
    uint64_t blen;
    assert_rc(lmc_mp_read_bin(&r, 10, &b, &blen), 0);
    assert_int_equal(blen, 0);
}

static void test_skip(void **state)
{
    (void)state;
    /* [{"a": [1, ext8(1, 2 bytes), nil]}, 1.5] and nothing after it. */
    uint8_t v[64];
    size_t n = unhex("9281a16193"
                     "01"
                     "c702014142"
                     "c0"
                     "cb3ff8000000000000",
                     v, sizeof(v));
    assert_rc(lmc_mp_check_one(v, n), 0);
    assert_rc(lmc_mp_check_one(v, n - 1), -EPROTO);
    uint8_t two[] = {0x01, 0x02};
    assert_rc(lmc_mp_check_one(two, 2), -EPROTO);
    /* Deep nesting is no problem for the iterative skipper. */
    static uint8_t deep[100001];
    memset(deep, 0x91, 100000);
    deep[100000] = 0xc0;
    assert_rc(lmc_mp_check_one(deep, sizeof(deep)), 0);
    assert_rc(lmc_mp_check_one(deep, sizeof(deep) - 1), -EPROTO);
    /* A float reader takes ints too. */
    struct lmc_mp_reader r;
    double d;
    uint8_t f32[] = {0xca, 0x40, 0x20, 0x00, 0x00};
    lmc_mp_reader_init(&r, f32, sizeof(f32));
    assert_rc(lmc_mp_read_float(&r, &d), 0);
    assert_true(d == 2.5);
    uint8_t i7[] = {0x07};
    lmc_mp_reader_init(&r, i7, 1);
    assert_rc(lmc_mp_read_float(&r, &d), 0);
    assert_true(d == 7.0);
}

static void test_ops(void **state)
{
    (void)state;
    char name[32];
    uint8_t b[32];
    size_t n = unhex("10", b, sizeof(b));
    assert_int_equal(lmc_op_decode(b, n, name, sizeof(name)), LMC_OP_PREPARE_STORE);
    assert_string_equal(name, "");
    /* The name form of a table operation, and one outside the table. */
    n = unhex("ad707265706172655f73746f7265", b, sizeof(b));
    assert_int_equal(lmc_op_decode(b, n, name, sizeof(name)), LMC_OP_PREPARE_STORE);
    n = unhex("ae636220726f6f5f706c616e5f7878", b, sizeof(b));
    assert_int_equal(lmc_op_decode(b, n, name, sizeof(name)), LMC_OP_UNKNOWN);
    assert_string_equal(name, "cb roo_plan_xx");
    n = unhex("cc64", b, sizeof(b)); /* 100: not on the wire */
    assert_int_equal(lmc_op_decode(b, n, name, sizeof(name)), LMC_OP_UNKNOWN);
    n = unhex("c0", b, sizeof(b));
    assert_int_equal(lmc_op_decode(b, n, name, sizeof(name)), LMC_OP_UNKNOWN);
    n = unhex("0a00", b, sizeof(b)); /* trailing bytes */
    assert_int_equal(lmc_op_decode(b, n, name, sizeof(name)), LMC_OP_UNKNOWN);
    assert_string_equal(lmc_op_name(LMC_OP_GET_CHUNK_SIZE), "get_chunk_size");
    assert_string_equal(lmc_op_name(LMC_OP_UNKNOWN), "?");
}

/* prepare_store's key of the 0.5.6 recording: 36 tokens 1..36, range [0, 32). */
static const char *rec_key =
    "8aaa6d6f64656c5f6e616d65a3726563aa776f726c645f73697a6501a9776f726b65725f696400a9746f6b656e"
    "5f696473dc00240102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20212223"
    "24a5737461727400a3656e6420aa726571756573745f6964a27231aa63616368655f73616c74a0af72657175"
    "6573745f636f6e66696773c0ae6e756d5f6b765f7265616465727301";

static uint8_t tokens[KVP_MAX_TOKENS * 4];

static void test_key(void **state)
{
    (void)state;
    uint8_t b[512];
    size_t n = unhex(rec_key, b, sizeof(b));
    struct lmc_key k;
    char why[160];
    assert_rc(lmc_decode_key(b, n, &k, tokens, why, sizeof(why)), 0);
    assert_string_equal(k.model_name, "rec");
    assert_int_equal(k.world_size, 1);
    assert_true(k.has_worker_id);
    assert_int_equal(k.worker_id, 0);
    assert_int_equal(k.ntokens, 36);
    assert_int_equal(tokens[0], 1);
    assert_int_equal(tokens[35 * 4], 36);
    assert_int_equal(k.start, 0);
    assert_int_equal(k.end, 32);
    assert_string_equal(k.request_id, "r1");
    assert_int_equal(k.salt_len, 0);
    assert_int_equal(k.num_kv_readers, 1);
    /* Truncated anywhere: refused with a reason. */
    for (size_t cut = 0; cut < n; cut += 7) {
        why[0] = '\0';
        assert_true(lmc_decode_key(b, cut, &k, tokens, why, sizeof(why)) < 0);
        assert_true(strlen(why) > 0);
    }
    /* A minimal key of an older client: no cache_salt, request_configs, num_kv_readers, in
     * another key order, plus an unknown field; worker_id nil. */
    n = unhex("88"
              "a3656e6410" /* end 16 */
              "a57374617274"
              "00"                                     /* start 0 */
              "aa726571756573745f6964a178"             /* request_id "x" */
              "a9776f726b65725f6964c0"                 /* worker_id nil */
              "a9746f6b656e5f69647392cd0100ce00010000" /* token_ids [256, 65536] */
              "aa776f726c645f73697a6502"               /* world_size 2 */
              "a57a7a7a7a7a"
              "93010203"                    /* zzzzz: [1, 2, 3] (unknown) */
              "aa6d6f64656c5f6e616d65a16d", /* model_name "m" */
              b, sizeof(b));
    assert_rc(lmc_decode_key(b, n, &k, tokens, why, sizeof(why)), 0);
    assert_false(k.has_worker_id);
    assert_int_equal(k.world_size, 2);
    assert_int_equal(k.ntokens, 2);
    assert_int_equal(tokens[4 + 2], 1); /* 65536 little-endian */
    assert_int_equal(k.num_kv_readers, 0);
    /* Missing required field: the same without model_name. */
    n = unhex("82a3656e6410a57374617274"
              "00",
              b, sizeof(b));
    assert_rc(lmc_decode_key(b, n, &k, tokens, why, sizeof(why)), -EINVAL);
    /* A forbidden salt, a negative token, worker_id beyond world_size. */
    n = unhex("87aa6d6f64656c5f6e616d65a16daa776f726c645f73697a6501a9776f726b65725f696400"
              "a9746f6b656e5f69647391ffa5737461727400a3656e6400aa726571756573745f6964a0",
              b, sizeof(b));
    assert_rc(lmc_decode_key(b, n, &k, tokens, why, sizeof(why)), -ERANGE);
    assert_non_null(strstr(why, "token_ids"));
    n = unhex("88aa6d6f64656c5f6e616d65a16daa776f726c645f73697a6501a9776f726b65725f696400"
              "a9746f6b656e5f69647390a5737461727400a3656e6400aa726571756573745f6964a0"
              "aa63616368655f73616c74a3612f62",
              b, sizeof(b));
    assert_rc(lmc_decode_key(b, n, &k, tokens, why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "cache_salt"));
    n = unhex("87aa6d6f64656c5f6e616d65a16daa776f726c645f73697a6501a9776f726b65725f696401"
              "a9746f6b656e5f69647390a5737461727400a3656e6400aa726571756573745f6964a0",
              b, sizeof(b));
    assert_rc(lmc_decode_key(b, n, &k, tokens, why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "worker_id"));
}

static void test_register(void **state)
{
    (void)state;
    uint8_t b[512];
    size_t n = unhex("89ab696e7374616e63655f6964cf0d0f2544baf281c1aa6d6f64656c5f6e616d65a3726563"
                     "aa776f726c645f73697a6501aa626c6f636b5f73697a6510aa6e756d5f6c617965727302af"
                     "68696464656e5f64696d5f73697a65cc80a964747970655f737472a7666c6f61743136a775"
                     "73655f6d6c61c2b26e756d5f706879736963616c5f736c6f747310",
                     b, sizeof(b));
    struct lmc_register m;
    char why[160];
    assert_rc(lmc_decode_register(b, n, &m, why, sizeof(why)), 0);
    assert_true(m.instance_id == 0x0d0f2544baf281c1ULL);
    assert_string_equal(m.model_name, "rec");
    assert_int_equal(m.world_size, 1);
    assert_int_equal(m.block_size, 16);
    assert_int_equal(m.num_layers, 2);
    assert_int_equal(m.hidden_dim, 128);
    assert_string_equal(m.dtype, "float16");
    assert_false(m.use_mla);
    assert_int_equal(m.num_physical_slots, 16);
    assert_string_equal(m.unsupported, "");
    /* num_physical_slots 0 is refused; nil means the server's chunk size. */
    b[n - 1] = 0x00;
    assert_rc(lmc_decode_register(b, n, &m, why, sizeof(why)), -EINVAL);
    b[n - 1] = 0xc0;
    assert_rc(lmc_decode_register(b, n, &m, why, sizeof(why)), 0);
    assert_int_equal(m.num_physical_slots, 0);
    /* Without use_mla (a required field). */
    n = unhex("81ab696e7374616e63655f696401", b, sizeof(b));
    assert_rc(lmc_decode_register(b, n, &m, why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "model_name"));
}

static void test_replies(void **state)
{
    (void)state;
    struct lmc_mp_writer w;
    struct lmc_slot slots[2] = {{0, 16384}, {16384, 16384}};
    uint32_t idx[2] = {0, 1};
    struct lmc_slot_shape sh = {.ndim = 4, .shape = {2, 2, 16, 128}, .dtype = "float16"};
    lmc_mp_writer_init(&w);

    lmc_encode_prepare_store_reply(&w, slots, idx, 2, &sh, false);
    assert_bytes(&w, "81a7636f6e7465787482a5736c6f74739284a66f666673657400a66c656e677468cd4000a573"
                     "6861706594020210cc80a56474797065a7666c6f6174313684a66f6666736574cd4000a66c65"
                     "6e677468cd4000a5736861706594020210cc80a56474797065a7666c6f61743136ad6368756e"
                     "6b5f696e6469636573920001");
    lmc_mp_writer_reset(&w);
    lmc_encode_prepare_store_reply(&w, NULL, NULL, 0, &sh, false);
    assert_bytes(&w, "81a7636f6e7465787482a5736c6f747390ad6368756e6b5f696e646963657390");
    lmc_mp_writer_reset(&w);
    lmc_encode_prepare_retrieve_reply(&w, true, slots, 2, &sh);
    assert_bytes(&w, "83a773756363657373c3a464617461c400a7636f6e7465787481a5736c6f74739284a66f6666"
                     "73657400a66c656e677468cd4000a5736861706594020210cc80a56474797065a7666c6f6174"
                     "313684a66f6666736574cd4000a66c656e677468cd4000a5736861706594020210cc80a56474"
                     "797065a7666c6f61743136");
    lmc_mp_writer_reset(&w);
    lmc_encode_prepare_retrieve_reply(&w, false, NULL, 0, NULL);
    assert_bytes(&w, "83a773756363657373c2a464617461c400a7636f6e7465787480");
    /* The register reply starts as upstream's (shm_name, pool_size) and adds three fields. */
    lmc_mp_writer_reset(&w);
    lmc_encode_register_reply(&w, "lmcache_l1_pool_rec15889", 268435456, NULL);
    assert_bytes(&w, "85a873686d5f6e616d65b86c6d63616368655f6c315f706f6f6c5f7265633135383839a9706f"
                     "6f6c5f73697a65ce10000000ae736372617463685f6f666673657400ac7363726174636"
                     "85f73697a6500a56572726f72c0");
    /* Negative replies: the GPU store pair, and None for lookup. */
    lmc_mp_writer_reset(&w);
    assert_true(lmc_encode_negative(&w, LMC_OP_STORE));
    assert_bytes(&w, "92c400c2");
    lmc_mp_writer_reset(&w);
    assert_false(lmc_encode_negative(&w, LMC_OP_LOOKUP));
    assert_int_equal(w.len, 0);
    lmc_mp_writer_reset(&w);
    assert_true(lmc_encode_negative(&w, LMC_OP_GET_EXPERIMENTAL));
    assert_bytes(&w, "90");
    lmc_mp_writer_free(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int_widths),
        cmocka_unit_test(test_int_roundtrip),
        cmocka_unit_test(test_strings_and_bounds),
        cmocka_unit_test(test_skip),
        cmocka_unit_test(test_ops),
        cmocka_unit_test(test_key),
        cmocka_unit_test(test_register),
        cmocka_unit_test(test_replies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
