/*
 * test_lmc_codec.c - the LMCache front end's msgpack codec and messages (src/server/lmc/codec.h,
 * messages.h).
 *
 * Integers of every width and sign, the bounds of every reader, skipping of nested and ext
 * values, and the message decoders and encoders against frames recorded between a real LMCache
 * 0.5.6 worker and `lmcache server` (tests/lmcache/frames/): the encoders must produce those
 * replies byte for byte for the same values. LMCache 0.5.7's forms: keys with token_bytes,
 * skipped_chunks, extra_ranges, group_layouts, the register reply with null_block_id and the
 * disabled KV event batch, each with hostile variants (wrong lengths, huge counts, wrong types).
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

/*
 * LMCache 0.5.7: the key with token_bytes, prepare_store's skipped_chunks, free_lookup_locks's
 * extra_ranges, registration with group_layouts and its reply, the disabled KV event batch.
 */

/* A key map of 7 fields whose tokens are written by put_tokens (one field: name and value). */
static void put_key(struct lmc_mp_writer *w, uint32_t nfields,
                    void (*put_tokens)(struct lmc_mp_writer *, const void *), const void *arg)
{
    lmc_mp_put_map(w, nfields);
    lmc_mp_put_cstr(w, "model_name");
    lmc_mp_put_cstr(w, "m");
    lmc_mp_put_cstr(w, "world_size");
    lmc_mp_put_uint(w, 1);
    lmc_mp_put_cstr(w, "worker_id");
    lmc_mp_put_uint(w, 0);
    put_tokens(w, arg);
    lmc_mp_put_cstr(w, "start");
    lmc_mp_put_uint(w, 0);
    lmc_mp_put_cstr(w, "end");
    lmc_mp_put_uint(w, 4);
    lmc_mp_put_cstr(w, "request_id");
    lmc_mp_put_cstr(w, "r");
}

struct bin_arg {
    const void *b;
    size_t len;
};

static void put_token_bytes(struct lmc_mp_writer *w, const void *arg)
{
    const struct bin_arg *a = arg;
    lmc_mp_put_cstr(w, "token_bytes");
    lmc_mp_put_bin(w, a->b, a->len);
}

static void put_token_ids(struct lmc_mp_writer *w, const void *arg)
{
    const uint32_t *ids = arg;
    lmc_mp_put_cstr(w, "token_ids");
    lmc_mp_put_array(w, 4);
    for (int i = 0; i < 4; i++)
        lmc_mp_put_uint(w, ids[i]);
}

/* Both forms in one key. */
static void put_both(struct lmc_mp_writer *w, const void *arg)
{
    put_token_bytes(w, arg);
    static const uint32_t ids[4] = {1, 2, 3, 4};
    put_token_ids(w, ids);
}

/* token_bytes as a str, not a bin. */
static void put_token_str(struct lmc_mp_writer *w, const void *arg)
{
    (void)arg;
    lmc_mp_put_cstr(w, "token_bytes");
    lmc_mp_put_cstr(w, "abcd");
}

static int decode_built(struct lmc_mp_writer *w, struct lmc_key *k, char *why)
{
    assert_false(w->failed);
    return lmc_decode_key(w->buf, w->len, k, tokens, why, 160);
}

static void test_key_token_bytes(void **state)
{
    (void)state;
    struct lmc_mp_writer w;
    struct lmc_key k;
    char why[160];
    static const uint32_t ids[4] = {1, 256, 65536, 0xfffffffeu};
    /* The same tokens packed as 0.5.7's token_codec does: big-endian uint32 words. */
    static const uint8_t be[16] = {0, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 0xff, 0xff, 0xff, 0xfe};
    struct bin_arg a = {be, sizeof(be)};
    uint8_t from_ids[16];

    lmc_mp_writer_init(&w);
    put_key(&w, 7, put_token_ids, ids);
    assert_rc(decode_built(&w, &k, why), 0);
    assert_int_equal(k.token_form, LMC_TOKENS_IDS);
    memcpy(from_ids, tokens, sizeof(from_ids));

    lmc_mp_writer_reset(&w);
    put_key(&w, 7, put_token_bytes, &a);
    memset(tokens, 0xaa, 16);
    assert_rc(decode_built(&w, &k, why), 0);
    assert_int_equal(k.token_form, LMC_TOKENS_BYTES);
    assert_int_equal(k.ntokens, 4);
    /* The array the key chain hashes is the same for both forms. */
    assert_memory_equal(tokens, from_ids, 16);
    assert_int_equal(tokens[4], 0x00);
    assert_int_equal(tokens[5], 0x01); /* 256 little-endian */
    assert_int_equal(tokens[12], 0xfe);
    assert_int_equal(tokens[15], 0xff);

    /* No tokens at all: an empty bin is a key of 0 tokens. */
    a.len = 0;
    lmc_mp_writer_reset(&w);
    put_key(&w, 7, put_token_bytes, &a);
    assert_rc(decode_built(&w, &k, why), 0);
    assert_int_equal(k.ntokens, 0);

    /* Not a whole number of tokens. */
    for (size_t len = 1; len < 16; len++) {
        if (len % 4 == 0)
            continue;
        a.len = len;
        lmc_mp_writer_reset(&w);
        put_key(&w, 7, put_token_bytes, &a);
        assert_rc(decode_built(&w, &k, why), -EINVAL);
        assert_non_null(strstr(why, "token_bytes"));
    }
    /* A str is not a bin; both forms in one key; a key with neither. */
    lmc_mp_writer_reset(&w);
    put_key(&w, 7, put_token_str, NULL);
    assert_rc(decode_built(&w, &k, why), -EINVAL);
    assert_non_null(strstr(why, "token_bytes"));
    a.len = 16;
    lmc_mp_writer_reset(&w);
    put_key(&w, 8, put_both, &a);
    assert_rc(decode_built(&w, &k, why), -EINVAL);
    assert_non_null(strstr(why, "second token_ids or token_bytes"));
    lmc_mp_writer_reset(&w);
    put_key(&w, 8, put_token_bytes, &a);
    lmc_mp_put_cstr(&w, "token_bytes"); /* the same field twice */
    lmc_mp_put_bin(&w, be, 4);
    assert_rc(decode_built(&w, &k, why), -EINVAL);
    uint8_t no_tokens[64];
    size_t n = unhex("86aa6d6f64656c5f6e616d65a16daa776f726c645f73697a6501a9776f726b65725f696400"
                     "a5737461727400a3656e6400aa726571756573745f6964a0",
                     no_tokens, sizeof(no_tokens));
    assert_rc(lmc_decode_key(no_tokens, n, &k, tokens, why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "token_bytes"));

    /* More than KVP_MAX_TOKENS tokens, and a bin32 claiming more bytes than the frame has. */
    size_t big_len = (size_t)KVP_MAX_TOKENS * 4 + 4;
    uint8_t *big = calloc(1, big_len);
    assert_non_null(big);
    a.b = big;
    a.len = big_len;
    lmc_mp_writer_reset(&w);
    put_key(&w, 7, put_token_bytes, &a);
    assert_rc(decode_built(&w, &k, why), -E2BIG);
    a.len = big_len - 4; /* exactly the limit */
    lmc_mp_writer_reset(&w);
    put_key(&w, 7, put_token_bytes, &a);
    assert_rc(decode_built(&w, &k, why), 0);
    assert_int_equal(k.ntokens, KVP_MAX_TOKENS);
    free(big);
    lmc_mp_writer_reset(&w);
    a.b = be;
    a.len = 16;
    put_key(&w, 7, put_token_bytes, &a);
    /* Find the bin8 header (c4 10) and make it a bin32 of 2^32 - 1 bytes in place. */
    uint8_t *at = memchr(w.buf, 0xc4, w.len);
    assert_non_null(at);
    uint8_t hostile[256];
    size_t pre = (size_t)(at - w.buf);
    memcpy(hostile, w.buf, pre);
    memcpy(hostile + pre, "\xc6\xff\xff\xff\xff", 5);
    memcpy(hostile + pre + 5, at + 2, w.len - pre - 2);
    assert_rc(lmc_decode_key(hostile, w.len + 3, &k, tokens, why, sizeof(why)), -EPROTO);
    lmc_mp_writer_free(&w);
}

static int skipped(const char *hex, struct lmc_skipped_chunks *s, char *why)
{
    uint8_t b[64];
    size_t n = unhex(hex, b, sizeof(b));
    why[0] = '\0';
    return lmc_decode_skipped_chunks(b, n, s, why, 160);
}

static void test_skipped_chunks(void **state)
{
    (void)state;
    struct lmc_skipped_chunks s;
    char why[160];
    assert_rc(skipped("90", &s, why), 0); /* a single-group worker: () */
    assert_int_equal(s.ngroups, 0);
    assert_int_equal(s.npositions, 0);
    assert_rc(skipped("9190", &s, why), 0); /* one group skipping nothing */
    assert_int_equal(s.ngroups, 1);
    assert_int_equal(s.npositions, 0);
    assert_rc(skipped("9292030591cd0fff", &s, why), 0);
    assert_int_equal(s.ngroups, 2);
    assert_int_equal(s.npositions, 3);
    /* Hostile: a position past the largest range, negative, not an int; a group that is not an
     * array; not an array; trailing bytes; truncated; a count beyond the frame. */
    assert_rc(skipped("9191cd1000", &s, why), -ERANGE);
    assert_non_null(strstr(why, "position"));
    assert_rc(skipped("9191ff", &s, why), -ERANGE);
    assert_rc(skipped("9191a131", &s, why), -EINVAL);
    assert_rc(skipped("9101", &s, why), -EINVAL);
    assert_non_null(strstr(why, "group 0"));
    assert_rc(skipped("c0", &s, why), -EINVAL);
    assert_rc(skipped("9000", &s, why), -EPROTO);
    assert_rc(skipped("9192", &s, why), -EPROTO);
    assert_rc(skipped("dd7fffffff", &s, why), -EPROTO); /* 2^31 - 1 groups in 5 bytes */
    assert_rc(skipped("dd00000010", &s, why), -EPROTO);
    assert_rc(skipped("", &s, why), -EPROTO);
    assert_true(strlen(why) > 0);
    /* 64 groups are accepted, 65 are too many. */
    uint8_t b[80];
    b[0] = 0xdc;
    b[1] = 0;
    for (unsigned g = 0; g < 65; g++)
        b[3 + g] = 0x90;
    b[2] = 64;
    assert_rc(lmc_decode_skipped_chunks(b, 3 + 64, &s, why, sizeof(why)), 0);
    assert_int_equal(s.ngroups, 64);
    b[2] = 65;
    assert_rc(lmc_decode_skipped_chunks(b, 3 + 65, &s, why, sizeof(why)), -E2BIG);
}

static int ranges(const char *hex, struct lmc_range *r, uint32_t cap, uint32_t *n, char *why)
{
    uint8_t b[64];
    size_t len = unhex(hex, b, sizeof(b));
    why[0] = '\0';
    return lmc_decode_extra_ranges(b, len, r, cap, n, why, 160);
}

static void test_extra_ranges(void **state)
{
    (void)state;
    struct lmc_range r[4];
    uint32_t n = 99;
    char why[160];
    assert_rc(ranges("90", r, 4, &n, why), 0);
    assert_int_equal(n, 0);
    assert_rc(ranges("9292001092cd0100ce00100000", r, 4, &n, why), 0);
    assert_int_equal(n, 2);
    assert_int_equal(r[0].start, 0);
    assert_int_equal(r[0].end, 16);
    assert_int_equal(r[1].start, 256);
    assert_int_equal(r[1].end, KVP_MAX_TOKENS);
    /* start >= end is kept (it releases nothing, as upstream). */
    assert_rc(ranges("91921010", r, 4, &n, why), 0);
    assert_int_equal(n, 1);
    /* Hostile: past KVP_MAX_TOKENS, negative, three ints, one int, not a pair, not ints, more
     * pairs than the caller's room, trailing bytes, truncated. */
    assert_rc(ranges("919200ce00100001", r, 4, &n, why), -ERANGE);
    assert_int_equal(n, 0);
    assert_rc(ranges("9192ff10", r, 4, &n, why), -ERANGE);
    assert_rc(ranges("9193000102", r, 4, &n, why), -E2BIG);
    assert_rc(ranges("919100", r, 4, &n, why), -EINVAL);
    assert_non_null(strstr(why, "pair 0"));
    assert_rc(ranges("9110", r, 4, &n, why), -EINVAL);
    assert_rc(ranges("9192a130a131", r, 4, &n, why), -EINVAL);
    assert_rc(ranges("93920001920001920001", r, 2, &n, why), -E2BIG);
    assert_rc(ranges("dd7fffffff", r, 4, &n, why), -EPROTO);
    assert_rc(ranges("919200010a", r, 4, &n, why), -EPROTO);
    assert_rc(ranges("919200", r, 4, &n, why), -EPROTO);
    assert_rc(ranges("c0", r, 4, &n, why), -EINVAL);
    assert_int_equal(n, 0);
}

/* The recorded 0.5.6 registration (test_register) with group_layouts appended as @tail. */
static size_t reg057(uint8_t *b, size_t cap, const char *tail)
{
    size_t n = unhex("8aab696e7374616e63655f6964cf0d0f2544baf281c1aa6d6f64656c5f6e616d65a3726563"
                     "aa776f726c645f73697a6501aa626c6f636b5f73697a6510aa6e756d5f6c617965727302af"
                     "68696464656e5f64696d5f73697a65cc80a964747970655f737472a7666c6f61743136a775"
                     "73655f6d6c61c2b26e756d5f706879736963616c5f736c6f747310"
                     "ad67726f75705f6c61796f757473", /* "group_layouts" */
                     b, cap);
    return n + unhex(tail, b + n, cap - n);
}

static void test_register_057(void **state)
{
    (void)state;
    uint8_t b[512];
    struct lmc_register m;
    char why[160];
    /* A single-group 0.5.7 worker: group_layouts is there and empty. */
    size_t n = reg057(b, sizeof(b), "90");
    assert_rc(lmc_decode_register(b, n, &m, why, sizeof(why)), 0);
    assert_true(m.has_group_layouts);
    assert_int_equal(m.ngroup_layouts, 0);
    assert_string_equal(m.unsupported, "");
    /* A hybrid model: two GroupLayouts. Decoded, and refused by kvpool with a reason. */
    n = reg057(b, sizeof(b),
               "9284aa6e756d5f6c617965727301af68696464656e5f64696d5f73697a6540a964747970655f73"
               "7472a7666c6f61743136b0746f6b656e735f7065725f626c6f636b1080");
    assert_rc(lmc_decode_register(b, n, &m, why, sizeof(why)), 0);
    assert_true(m.has_group_layouts);
    assert_int_equal(m.ngroup_layouts, 2);
    assert_non_null(strstr(m.unsupported, "2 KV cache groups in group_layouts"));
    assert_non_null(strstr(m.unsupported, "--disable-hybrid-kv-cache-manager"));
    /* Hostile: not an array, an entry that is not a map, more than 64 groups, truncated. */
    n = reg057(b, sizeof(b), "c0");
    assert_rc(lmc_decode_register(b, n, &m, why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "group_layouts"));
    n = reg057(b, sizeof(b), "9101");
    assert_rc(lmc_decode_register(b, n, &m, why, sizeof(why)), -EINVAL);
    char many[3 * 2 + 65 * 2 + 1] = "dc0041";
    for (int i = 0; i < 65; i++)
        memcpy(many + 6 + 2 * i, "80", 3);
    n = reg057(b, sizeof(b), many);
    assert_rc(lmc_decode_register(b, n, &m, why, sizeof(why)), -E2BIG);
    n = reg057(b, sizeof(b), "dc0041");
    assert_rc(lmc_decode_register(b, n, &m, why, sizeof(why)), -EPROTO);
    n = reg057(b, sizeof(b), "9181");
    assert_rc(lmc_decode_register(b, n, &m, why, sizeof(why)), -EPROTO);
    /* An older payload has no group_layouts. */
    n = unhex("81ab696e7374616e63655f696401", b, sizeof(b));
    (void)lmc_decode_register(b, n, &m, why, sizeof(why));
    assert_false(m.has_group_layouts);
}

static void test_replies_057(void **state)
{
    (void)state;
    struct lmc_mp_writer w;
    struct lmc_register m;
    lmc_mp_writer_init(&w);
    memset(&m, 0, sizeof(m));
    /* 0.5.7's RegisterEngineDrivenContextResponse: shm_name, pool_size, null_block_id; then
     * kvpool's error. */
    m.has_group_layouts = true;
    lmc_encode_register_reply_to(&w, &m, "kvpool_l1_pool_x", 268435456, NULL);
    assert_bytes(&w, "84a873686d5f6e616d65b06b76706f6f6c5f6c315f706f6f6c5f78a9706f6f6c5f73697a65"
                     "ce10000000ad6e756c6c5f626c6f636b5f696400a56572726f72c0");
    lmc_mp_writer_reset(&w);
    lmc_encode_register_reply_to(&w, &m, "", 0, "no");
    assert_bytes(&w, "84a873686d5f6e616d65a0a9706f6f6c5f73697a6500ad6e756c6c5f626c6f636b5f696400"
                     "a56572726f72a26e6f");
    /* An older registration, or none that decoded: the older form. */
    m.has_group_layouts = false;
    lmc_mp_writer_reset(&w);
    lmc_encode_register_reply_to(&w, &m, "s", 1, NULL);
    assert_bytes(&w, "85a873686d5f6e616d65a173a9706f6f6c5f73697a6501ae736372617463685f6f6666736574"
                     "00ac736372617463685f73697a6500a56572726f72c0");
    lmc_mp_writer_reset(&w);
    lmc_encode_register_reply_to(&w, NULL, "s", 1, NULL);
    assert_bytes(&w, "85a873686d5f6e616d65a173a9706f6f6c5f73697a6501ae736372617463685f6f6666736574"
                     "00ac736372617463685f73697a6500a56572726f72c0");
    /* KVEventBatch(enabled=False, incarnation, next_cursor=0, lost=False, events=[]). */
    lmc_mp_writer_reset(&w);
    lmc_encode_kv_events_disabled(&w, 0x17d4c0b1a2b3c4d5ULL);
    assert_bytes(&w, "85a7656e61626c6564c2ab696e6361726e6174696f6ecf17d4c0b1a2b3c4d5ab6e6578745f63"
                     "7572736f7200a46c6f7374c2a66576656e747390");
    /* The operations 0.5.7 sends by name. */
    char name[32];
    uint8_t b[40];
    size_t n = unhex("b46e65676f74696174655f6368756e6b5f73697a65", b, sizeof(b));
    assert_int_equal(lmc_op_decode(b, n, name, sizeof(name)), LMC_OP_NEGOTIATE_CHUNK_SIZE);
    n = unhex("b37375627363726962655f6b765f6576656e7473", b, sizeof(b));
    assert_int_equal(lmc_op_decode(b, n, name, sizeof(name)), LMC_OP_SUBSCRIBE_KV_EVENTS);
    assert_string_equal(lmc_op_name(LMC_OP_SERVER_MODULE_AFFINITY_CALL),
                        "server_module_affinity_call");
    lmc_mp_writer_reset(&w);
    assert_true(lmc_encode_negative(&w, LMC_OP_SERVER_MODULE_AFFINITY_CALL));
    assert_rc(lmc_mp_check_one(w.buf, w.len), 0);
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
        cmocka_unit_test(test_key_token_bytes),
        cmocka_unit_test(test_skipped_chunks),
        cmocka_unit_test(test_extra_ranges),
        cmocka_unit_test(test_register_057),
        cmocka_unit_test(test_replies_057),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
