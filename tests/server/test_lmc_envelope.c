/*
 * test_lmc_envelope.c - LMCache 0.5.7's TensorEnvelope (src/server/lmc/envelope.h): the decoder
 * against the registered layout, and the encoder byte for byte against LMCache's own
 * encode_tensors() (the frames below are what 0.5.7rc2's msgspec wrote), then by round trip.
 *
 * Every refusal of the decoder is exercised on an envelope that is valid but for one thing:
 * the version, unknown, repeated and missing fields, a grouped envelope, the tensor count, each
 * tensor's dtype, shape and data, the limits LMCache declares (rank 16, 65536 tensors, 2 GiB per
 * tensor, 16 GiB in all), the payload's size, truncation at every byte, trailing bytes and
 * single-byte mutations. The real 0.5.7 worker's side is tests/server/envelope_lmcache.py.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_assert.h"
#include "lmc/codec.h"
#include "lmc/envelope.h"

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

/* LMCache 0.5.7rc2: encode_tensors([arange(8), arange(8, 16)]) of float32 [2, 1, 2, 2]. */
static const char *lmcache_two =
    "82a776657273696f6e01a774656e736f72739283a56474797065a7666c6f61743332a5736861706594020102"
    "02a464617461c420000000000000803f0000004000004040000080400000a0400000c0400000e04083a56474"
    "797065a7666c6f61743332a573686170659402010202a464617461c420000000410000104100002041000030"
    "4100004041000050410000604100007041";

static const struct kvp_envelope_layout small = {.dtype = "float32",
                                                 .ndim = 4,
                                                 .shape = {2, 1, 2, 2}}; /* 32 bytes */

#define CAP 8

static int decode(const uint8_t *b, size_t n, uint32_t min, uint32_t max,
                  struct kvp_envelope_tensor *out, uint32_t *got, char *why)
{
    struct kvp_envelope_expect e = {.layout = small, .min_tensors = min, .max_tensors = max};
    why[0] = '\0';
    int rc = kvp_envelope_decode(b, n, &e, out, CAP, got, why, 200);
    if (rc)
        assert_int_equal(*got, 0);
    return rc;
}

static void test_lmcache_bytes(void **state)
{
    (void)state;
    uint8_t b[512];
    size_t n = unhex(lmcache_two, b, sizeof(b));
    struct kvp_envelope_tensor out[CAP];
    uint32_t got = 99;
    char why[200];
    assert_true(kvp_envelope_sniff(b, n));
    assert_rc(decode(b, n, 2, 2, out, &got, why), 0);
    assert_string_equal(why, "");
    assert_int_equal(got, 2);
    for (uint32_t i = 0; i < 2; i++) {
        assert_int_equal(out[i].len, 32);
        assert_true(out[i].data > b && out[i].data + 32 <= b + n);
        float f[8];
        memcpy(f, out[i].data, sizeof(f));
        for (int k = 0; k < 8; k++)
            assert_true(f[k] == (float)(8 * i + (uint32_t)k));
    }
    /* The encoder writes the same bytes from the same chunks. */
    struct kvp_envelope_template t;
    assert_rc(kvp_envelope_template_init(&t, &small, why, sizeof(why)), 0);
    assert_int_equal(t.chunk_bytes, 32);
    uint64_t size;
    assert_rc(kvp_envelope_encoded_size(&t, 2, &size), 0);
    assert_int_equal(size, n);
    const uint8_t *chunks[2] = {out[0].data, out[1].data};
    uint8_t enc[512];
    assert_int_equal(kvp_envelope_encode(&t, 2, chunks, enc, sizeof(enc)), (int64_t)n);
    assert_memory_equal(enc, b, n);
    assert_int_equal(kvp_envelope_encode(&t, 2, chunks, enc, n - 1), -ENOSPC);
    /* Accepted count ranges: 1..2 and 2..8 take it, 3..8 and 0..1 do not. */
    assert_rc(decode(b, n, 1, 2, out, &got, why), 0);
    assert_rc(decode(b, n, 2, 8, out, &got, why), 0);
    assert_rc(decode(b, n, 3, 8, out, &got, why), -EPROTO);
    assert_non_null(strstr(why, "2 tensors, expected at least 3"));
    assert_rc(decode(b, n, 0, 1, out, &got, why), -EPROTO);
    assert_non_null(strstr(why, "more than 1 tensors"));
    /* Bigger than any envelope of at most 0 tensors: refused before it is read. */
    assert_rc(decode(b, n, 0, 0, out, &got, why), -EMSGSIZE);
}

/* What sets an envelope apart from a pickle: its first byte. */
static void test_sniff(void **state)
{
    (void)state;
    static const uint8_t pickle5[] = {0x80, 0x05, 0x95};
    static const uint8_t map16[] = {0xde, 0x00, 0x02};
    static const uint8_t arr[] = {0x92};
    assert_false(kvp_envelope_sniff(pickle5, sizeof(pickle5)));
    assert_true(kvp_envelope_sniff(map16, sizeof(map16)));
    assert_false(kvp_envelope_sniff(arr, sizeof(arr)));
    assert_false(kvp_envelope_sniff(arr, 0));
}

static void test_layout(void **state)
{
    (void)state;
    uint64_t bytes;
    char why[200];
    struct kvp_envelope_layout l = {.dtype = "bfloat16", .ndim = 3, .shape = {2, 16, 576}};
    assert_rc(kvp_envelope_layout_check(&l, &bytes, why, sizeof(why)), 0);
    assert_int_equal(bytes, 2 * 16 * 576 * 2);
    l.dtype = "complex64";
    assert_rc(kvp_envelope_layout_check(&l, &bytes, why, sizeof(why)), -EINVAL);
    l.dtype = "float8_e4m3fn";
    assert_rc(kvp_envelope_layout_check(&l, &bytes, why, sizeof(why)), 0);
    l.shape[1] = 0;
    assert_rc(kvp_envelope_layout_check(&l, &bytes, why, sizeof(why)), -EINVAL);
    l.shape[1] = 16;
    l.ndim = 17;
    assert_rc(kvp_envelope_layout_check(&l, &bytes, why, sizeof(why)), -EINVAL);
    l.ndim = 0;
    assert_rc(kvp_envelope_layout_check(&l, &bytes, why, sizeof(why)), -EINVAL);
    /* 2 GiB per tensor is LMCache's limit: exactly that is a chunk, one byte more is not. */
    struct kvp_envelope_layout big = {.dtype = "uint8", .ndim = 2, .shape = {2, 1u << 30}};
    assert_rc(kvp_envelope_layout_check(&big, &bytes, why, sizeof(why)), 0);
    big.dtype = "float16";
    assert_rc(kvp_envelope_layout_check(&big, &bytes, why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "2 GiB"));
    big.dtype = "uint8";
    big.shape[0] = 1ull << 40;
    assert_rc(kvp_envelope_layout_check(&big, &bytes, why, sizeof(why)), -EINVAL);
    /* The payload bound: our own below LMCache's, LMCache's above 16 GiB of chunks. */
    struct kvp_envelope_expect e = {.layout = small, .max_tensors = 10};
    uint64_t max;
    assert_rc(kvp_envelope_max_payload(&e, &max), 0);
    assert_int_equal(max, KVP_ENVELOPE_STREAM_OVERHEAD + 10 * (32 + KVP_ENVELOPE_TENSOR_OVERHEAD));
    e.layout = big;
    e.layout.shape[0] = 2;
    e.max_tensors = 9; /* 9 x 2 GiB */
    assert_rc(kvp_envelope_max_payload(&e, &max), 0);
    assert_int_equal(max, KVP_ENVELOPE_STREAM_OVERHEAD + KVP_ENVELOPE_MAX_TOTAL_BYTES +
                              9 * KVP_ENVELOPE_TENSOR_OVERHEAD);
    e.max_tensors = KVP_ENVELOPE_MAX_TENSORS + 1;
    assert_rc(kvp_envelope_max_payload(&e, &max), -EINVAL);
    /* Encoding beyond the limits the worker checks. */
    struct kvp_envelope_template t;
    assert_rc(kvp_envelope_template_init(&t, &e.layout, why, sizeof(why)), 0);
    assert_rc(kvp_envelope_encoded_size(&t, 8, &max), 0);
    assert_rc(kvp_envelope_encoded_size(&t, 9, &max), -E2BIG);
    assert_rc(kvp_envelope_template_init(&t, &small, why, sizeof(why)), 0);
    assert_rc(kvp_envelope_encoded_size(&t, KVP_ENVELOPE_MAX_TENSORS, &max), 0);
    assert_rc(kvp_envelope_encoded_size(&t, KVP_ENVELOPE_MAX_TENSORS + 1, &max), -E2BIG);
    assert_int_equal(kvp_envelope_encode(&t, KVP_ENVELOPE_MAX_TENSORS + 1, NULL, NULL, 0), -E2BIG);
    /* A bad expectation or too little room for the tensors is the caller's error. */
    struct kvp_envelope_tensor out[CAP];
    uint32_t got;
    uint8_t b[512];
    size_t n = unhex(lmcache_two, b, sizeof(b));
    e.layout = small;
    e.min_tensors = 0;
    e.max_tensors = CAP + 1;
    assert_rc(kvp_envelope_decode(b, n, &e, out, CAP, &got, why, sizeof(why)), -EINVAL);
    e.max_tensors = 2;
    e.min_tensors = 3;
    assert_rc(kvp_envelope_decode(b, n, &e, out, CAP, &got, why, sizeof(why)), -EINVAL);
    e.min_tensors = 0;
    e.layout.dtype = "nope";
    assert_rc(kvp_envelope_decode(b, n, &e, out, CAP, &got, why, sizeof(why)), -EINVAL);
}

/*
 * An envelope of two float32 [2, 1, 2, 2] tensors, valid unless @mut names one thing to break.
 */
static void build(struct lmc_mp_writer *w, const char *mut)
{
    static const uint8_t data[40];
    bool m_top3 = strcmp(mut, "top3") == 0;
    lmc_mp_writer_reset(w);
    if (strcmp(mut, "no-version") == 0 || strcmp(mut, "no-tensors") == 0)
        lmc_mp_put_map(w, 1);
    else
        lmc_mp_put_map(w, m_top3 || strcmp(mut, "groups") == 0 ? 3 : 2);
    if (strcmp(mut, "tensors-first") != 0 && strcmp(mut, "no-version") != 0) {
        lmc_mp_put_cstr(w, "version");
        if (strcmp(mut, "version2") == 0)
            lmc_mp_put_uint(w, 2);
        else if (strcmp(mut, "version-bool") == 0)
            lmc_mp_put_bool(w, true);
        else if (strcmp(mut, "version-str") == 0)
            lmc_mp_put_cstr(w, "1");
        else if (strcmp(mut, "version-neg") == 0)
            lmc_mp_put_int(w, -1);
        else
            lmc_mp_put_uint(w, 1);
    }
    if (strcmp(mut, "groups") == 0) {
        lmc_mp_put_cstr(w, "groups");
        lmc_mp_put_array(w, 0);
    }
    if (m_top3) {
        lmc_mp_put_cstr(w, "extra");
        lmc_mp_put_nil(w);
    }
    if (strcmp(mut, "no-tensors") != 0) {
        uint32_t n = strcmp(mut, "three") == 0 ? 3 : strcmp(mut, "one") == 0 ? 1 : 2;
        lmc_mp_put_cstr(w, "tensors");
        if (strcmp(mut, "tensors-map") == 0) {
            lmc_mp_put_map(w, 0);
            n = 0;
        } else {
            lmc_mp_put_array(w, n);
        }
        for (uint32_t i = 0; i < n; i++) {
            bool last = i == n - 1; /* mutations hit the last tensor */
            if (last && strcmp(mut, "tensor-array") == 0) {
                lmc_mp_put_array(w, 0);
                continue;
            }
            uint32_t nf = 3;
            if (last && (strcmp(mut, "no-data") == 0))
                nf = 2;
            if (last && (strcmp(mut, "tensor-extra") == 0 || strcmp(mut, "dtype-twice") == 0))
                nf = 4;
            lmc_mp_put_map(w, nf);
            if (last && strcmp(mut, "data-first") == 0) {
                lmc_mp_put_cstr(w, "data");
                lmc_mp_put_bin(w, data, 32);
            }
            lmc_mp_put_cstr(w, "dtype");
            if (last && strcmp(mut, "dtype") == 0)
                lmc_mp_put_cstr(w, "float16");
            else if (last && strcmp(mut, "dtype-bin") == 0)
                lmc_mp_put_bin(w, "float32", 7);
            else if (last && strcmp(mut, "dtype-nul") == 0)
                lmc_mp_put_str(w, "float32\0\n", 9);
            else
                lmc_mp_put_cstr(w, "float32");
            if (last && strcmp(mut, "dtype-twice") == 0) {
                lmc_mp_put_cstr(w, "dtype");
                lmc_mp_put_cstr(w, "float32");
            }
            if (last && strcmp(mut, "tensor-extra") == 0) {
                lmc_mp_put_cstr(w, "stride");
                lmc_mp_put_array(w, 0);
            }
            lmc_mp_put_cstr(w, "shape");
            if (last && strcmp(mut, "rank3") == 0) {
                lmc_mp_put_array(w, 3);
                lmc_mp_put_uint(w, 2);
                lmc_mp_put_uint(w, 2);
                lmc_mp_put_uint(w, 2);
            } else if (last && strcmp(mut, "rank17") == 0) {
                lmc_mp_put_array(w, 17);
                for (int k = 0; k < 17; k++)
                    lmc_mp_put_uint(w, 1);
            } else {
                lmc_mp_put_array(w, 4);
                lmc_mp_put_uint(w, 2);
                if (last && strcmp(mut, "dim") == 0)
                    lmc_mp_put_uint(w, 2);
                else if (last && strcmp(mut, "dim-neg") == 0)
                    lmc_mp_put_int(w, -1);
                else if (last && strcmp(mut, "dim-float") == 0)
                    lmc_mp_put_nil(w);
                else if (last && strcmp(mut, "dim-huge") == 0)
                    lmc_mp_put_uint(w, UINT64_MAX);
                else
                    lmc_mp_put_uint(w, 1);
                lmc_mp_put_uint(w, 2);
                lmc_mp_put_uint(w, 2);
            }
            if (last && strcmp(mut, "data-first") == 0)
                continue;
            if (last && strcmp(mut, "no-data") == 0)
                continue;
            lmc_mp_put_cstr(w, "data");
            if (last && strcmp(mut, "data-short") == 0)
                lmc_mp_put_bin(w, data, 31);
            else if (last && strcmp(mut, "data-long") == 0)
                lmc_mp_put_bin(w, data, 33);
            else if (last && strcmp(mut, "data-str") == 0)
                lmc_mp_put_str(w, (const char *)data, 32);
            else if (last && strcmp(mut, "data-nil") == 0)
                lmc_mp_put_nil(w);
            else
                lmc_mp_put_bin(w, data, 32);
        }
    }
    if (strcmp(mut, "tensors-first") == 0) {
        lmc_mp_put_cstr(w, "version");
        lmc_mp_put_uint(w, 1);
    }
    if (strcmp(mut, "trailing") == 0)
        lmc_mp_put_nil(w);
    assert_false(w->failed);
}

static void refused(struct lmc_mp_writer *w, const char *mut, const char *reason)
{
    struct kvp_envelope_tensor out[CAP];
    uint32_t got = 99;
    char why[200];
    build(w, mut);
    int rc = decode(w->buf, w->len, 0, 2, out, &got, why);
    if (rc != -EPROTO || !strstr(why, reason))
        fail_msg("%s: rc %d, why '%s', want -EPROTO and '%s'", mut, rc, why, reason);
}

static void test_hostile(void **state)
{
    (void)state;
    struct lmc_mp_writer w;
    struct kvp_envelope_tensor out[CAP];
    uint32_t got;
    char why[200];
    lmc_mp_writer_init(&w);
    /* The baseline and the orders msgspec accepts. */
    static const char *const fine[] = {"", "tensors-first", "data-first", "one"};
    for (size_t i = 0; i < sizeof(fine) / sizeof(fine[0]); i++) {
        build(&w, fine[i]);
        if (decode(w.buf, w.len, 0, 2, out, &got, why) != 0)
            fail_msg("%s refused: %s", fine[i], why);
    }
    refused(&w, "version2", "version is not 1");
    refused(&w, "version-bool", "version has the wrong type");
    refused(&w, "version-str", "version has the wrong type");
    refused(&w, "version-neg", "version is not 1");
    refused(&w, "no-version", "no version");
    refused(&w, "no-tensors", "no tensors");
    refused(&w, "top3", "more than two fields");
    refused(&w, "groups", "more than two fields");
    refused(&w, "three", "more than 2 tensors");
    refused(&w, "tensors-map", "tensors has the wrong type");
    refused(&w, "tensor-array", "tensor 1 has the wrong type");
    refused(&w, "tensor-extra", "tensor 1: more fields than dtype, shape and data");
    refused(&w, "no-data", "tensor 1: no data");
    refused(&w, "dtype", "tensor 1: dtype 'float16', expected float32");
    refused(&w, "dtype-bin", "tensor 1: dtype has the wrong type");
    refused(&w, "dtype-nul",
            "tensor 1: dtype 'float32?"
            "?', expected float32");
    refused(&w, "rank3", "tensor 1: shape of rank 3, expected 4");
    refused(&w, "rank17", "tensor 1: shape is too long");
    refused(&w, "dim", "tensor 1: shape dimension 1 is 2, expected 1");
    refused(&w, "dim-neg", "tensor 1: shape dimension 1 is negative");
    refused(&w, "dim-float", "tensor 1: shape dimension 1 has the wrong type");
    refused(&w, "dim-huge", "shape dimension 1 is 18446744073709551615");
    refused(&w, "data-short", "tensor 1: data of 31 bytes, expected 32");
    refused(&w, "data-long", "tensor 1: data of 33 bytes, expected 32");
    refused(&w, "data-str", "tensor 1: data has the wrong type");
    refused(&w, "data-nil", "tensor 1: data has the wrong type");
    refused(&w, "trailing", "1 bytes after the envelope");

    /* A field twice inside a tensor, and groups or an unknown field in a two-field map. */
    uint8_t b[512];
    size_t n = unhex("82a776657273696f6e01a667726f75707390", b, sizeof(b));
    assert_rc(decode(b, n, 0, 2, out, &got, why), -EPROTO);
    assert_non_null(strstr(why, "grouped tensor envelope"));
    n = unhex("82a776657273696f6e01a776657273696f6e01", b, sizeof(b));
    assert_rc(decode(b, n, 0, 2, out, &got, why), -EPROTO);
    assert_non_null(strstr(why, "version twice"));
    n = unhex("82a774656e736f727390a774656e736f727390", b, sizeof(b));
    assert_rc(decode(b, n, 0, 2, out, &got, why), -EPROTO);
    assert_non_null(strstr(why, "tensors twice"));
    n = unhex("82a776657273696f6e01a3787878c0", b, sizeof(b));
    assert_rc(decode(b, n, 0, 2, out, &got, why), -EPROTO);
    assert_non_null(strstr(why, "unknown field 'xxx'"));
    n = unhex("82a776657273696f6e0101c0", b, sizeof(b)); /* an int key */
    assert_rc(decode(b, n, 0, 2, out, &got, why), -EPROTO);
    assert_non_null(strstr(why, "no field name"));
    n = unhex("82a776657273696f6e01a774656e736f72739183a56474797065a7666c6f61743332a564747970"
              "65a7666c6f61743332a464617461c0",
              b, sizeof(b));
    assert_rc(decode(b, n, 0, 2, out, &got, why), -EPROTO);
    assert_non_null(strstr(why, "tensor 0: field 'dtype' twice"));
    /* Not a map; an empty map (also a pickle's first byte); nothing; a tensor count beyond the
     * bytes left (no loop over it). */
    n = unhex("9101", b, sizeof(b));
    assert_rc(decode(b, n, 0, 2, out, &got, why), -EPROTO);
    n = unhex("80", b, sizeof(b));
    assert_rc(decode(b, n, 0, 2, out, &got, why), -EPROTO);
    assert_rc(decode(b, 0, 0, 2, out, &got, why), -EPROTO);
    n = unhex("82a776657273696f6e01a774656e736f7273dd7fffffff", b, sizeof(b));
    assert_rc(decode(b, n, 0, 2, out, &got, why), -EPROTO);
    assert_non_null(strstr(why, "at byte"));

    /* Every prefix of a valid envelope is refused (and read within its bytes: ASan). */
    build(&w, "");
    for (size_t cut = 0; cut < w.len; cut++) {
        uint8_t *copy = malloc(cut ? cut : 1);
        assert_non_null(copy);
        memcpy(copy, w.buf, cut);
        assert_rc(decode(copy, cut, 0, 2, out, &got, why), -EPROTO);
        assert_true(strlen(why) > 0);
        free(copy);
    }
    /* Every single-byte change: accepted only as a valid envelope (tensors inside the input,
     * chunk-sized, disjoint), else refused with a reason. */
    uint8_t copy[512];
    assert_true(w.len <= sizeof(copy));
    for (size_t at = 0; at < w.len; at++) {
        for (unsigned v = 0; v < 256; v += 7) {
            memcpy(copy, w.buf, w.len);
            copy[at] ^= (uint8_t)(v | 1);
            int rc = decode(copy, w.len, 0, 2, out, &got, why);
            assert_true(rc == 0 || rc == -EPROTO);
            if (rc) {
                assert_true(strlen(why) > 0);
                continue;
            }
            for (uint32_t i = 0; i < got; i++) {
                assert_int_equal(out[i].len, 32);
                assert_true(out[i].data >= copy && out[i].data + 32 <= copy + w.len);
                if (i)
                    assert_true(out[i].data >= out[i - 1].data + 32);
            }
        }
    }
    lmc_mp_writer_free(&w);
}

/* The encoder's output decodes to the same bytes, for every dtype, both chunk ranks, counts. */
static void test_roundtrip(void **state)
{
    (void)state;
    static const char *const dtypes[] = {"float16", "bfloat16", "float32",       "float64",
                                         "int8",    "uint8",    "float8_e4m3fn", "float8_e5m2"};
    static const struct kvp_envelope_layout shapes[] = {
        {.ndim = 4, .shape = {2, 2, 16, 128}}, /* K and V */
        {.ndim = 3, .shape = {2, 16, 576}},    /* MLA */
        {.ndim = 1, .shape = {300}},           /* a uint16 dimension, a bin16 */
        {.ndim = 2, .shape = {70000, 1}},      /* a uint32 dimension, a bin32 */
    };
    char why[200];
    for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            struct kvp_envelope_layout l = shapes[s];
            l.dtype = dtypes[d];
            struct kvp_envelope_template t;
            assert_rc(kvp_envelope_template_init(&t, &l, why, sizeof(why)), 0);
            for (uint32_t n = 0; n <= 17; n += 17 / 3 + 1) {
                uint8_t *chunks = malloc(t.chunk_bytes * n + 1);
                const uint8_t *ptrs[18];
                assert_non_null(chunks);
                for (uint64_t k = 0; k < t.chunk_bytes * n; k++)
                    chunks[k] = (uint8_t)(k * 131 + d);
                for (uint32_t i = 0; i < n; i++)
                    ptrs[i] = chunks + i * t.chunk_bytes;
                uint64_t size;
                assert_rc(kvp_envelope_encoded_size(&t, n, &size), 0);
                uint8_t *enc = malloc(size);
                assert_non_null(enc);
                assert_int_equal(kvp_envelope_encode(&t, n, ptrs, enc, size), (int64_t)size);
                struct kvp_envelope_expect e = {.layout = l, .min_tensors = n, .max_tensors = n};
                struct kvp_envelope_tensor out[18];
                uint32_t got = 99;
                if (kvp_envelope_decode(enc, size, &e, out, 18, &got, why, sizeof(why)))
                    fail_msg("%s %zu x%u: %s", l.dtype, s, n, why);
                assert_int_equal(got, n);
                for (uint32_t i = 0; i < n; i++) {
                    assert_int_equal(out[i].len, t.chunk_bytes);
                    assert_memory_equal(out[i].data, ptrs[i], t.chunk_bytes);
                }
                /* Its size is inside the decoder's bound, and msgpack the codec walks whole. */
                uint64_t max;
                assert_rc(kvp_envelope_max_payload(&e, &max), 0);
                assert_true(size <= max);
                assert_rc(lmc_mp_check_one(enc, size), 0);
                free(enc);
                free(chunks);
            }
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lmcache_bytes), cmocka_unit_test(test_sniff),
        cmocka_unit_test(test_layout),        cmocka_unit_test(test_hostile),
        cmocka_unit_test(test_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
