/*
 * fuzz_envelope.c - LMCache 0.5.7's inline transport (src/server/lmc/envelope.c): the
 * TensorEnvelope decoder, the encoder by round trip, and the two other payloads 0.5.7 added
 * beside it (messages.c: prepare_store's skipped_chunks, free_lookup_locks's extra_ranges).
 *
 * Input: a registration, then a payload.
 *   byte 0        dtype (index into DTYPES, modulo its size)
 *   byte 1        rank - 1 (modulo 4)
 *   2 bytes/dim   each dimension, little-endian (0 is a bad layout: only the -EINVAL path)
 *   1 byte        the most tensors accepted (low 4 bits); bit 7: the fewest is the same number
 *   the rest      the payload
 * The seeds (fuzz/corpus/envelope/) are the encoder's envelopes and hostile variants with their
 * registration in front (fuzz_gen_corpus), and the envelope a real 0.5.7 worker committed
 * (tests/lmcache/frames/conversation-0.5.7rc2-inline.txt).
 *
 * Checked: the decoder returns only 0, -EPROTO, -EMSGSIZE or -EINVAL (exactly when the layout is
 * bad); on success the tensors lie within the payload, are chunk-sized, in order and disjoint,
 * their count within the bounds, the payload starts like an envelope (kvp_envelope_sniff) and
 * is one msgpack value, and why is empty; on failure *n is 0 and why says something. Then, while
 * the chunks fit in 256 KiB, the encoder's envelope of as many chunks (their bytes taken from the
 * payload) decodes back to exactly those bytes. The payload also goes through the skipped_chunks
 * and extra_ranges decoders, whose results must stay inside their bounds.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "lmc/codec.h"
#include "lmc/envelope.h"
#include "lmc/messages.h"

#define MAXN 16

static const char *const DTYPES[] = {"float16", "bfloat16", "float32",       "float64",
                                     "int8",    "uint8",    "float8_e4m3fn", "float8_e5m2"};

static void check_decoded(const uint8_t *buf, size_t len, const struct kvp_envelope_expect *e,
                          uint64_t chunk, int rc, uint32_t n, const struct kvp_envelope_tensor *out,
                          const char *why)
{
    FUZZ_CHECK(rc == 0 || rc == -EPROTO || rc == -EMSGSIZE || rc == -EINVAL);
    if (rc != 0) {
        FUZZ_CHECK(n == 0);
        FUZZ_CHECK(why[0] != '\0');
        return;
    }
    FUZZ_CHECK(why[0] == '\0');
    FUZZ_CHECK(kvp_envelope_sniff(buf, len));
    FUZZ_CHECK(lmc_mp_check_one(buf, len) == 0);
    FUZZ_CHECK(n >= e->min_tensors && n <= e->max_tensors);
    for (uint32_t i = 0; i < n; i++) {
        FUZZ_CHECK(out[i].len == chunk);
        FUZZ_CHECK(out[i].data >= buf && out[i].len <= len &&
                   (size_t)(out[i].data - buf) <= len - out[i].len);
        if (i)
            FUZZ_CHECK(out[i].data >= out[i - 1].data + out[i - 1].len);
    }
}

static void roundtrip(const struct kvp_envelope_layout *l, uint64_t chunk, uint32_t n,
                      const uint8_t *fill, size_t fill_len)
{
    struct kvp_envelope_template t;
    uint64_t size;
    char why[200];

    FUZZ_CHECK(kvp_envelope_template_init(&t, l, why, sizeof(why)) == 0);
    FUZZ_CHECK(t.chunk_bytes == chunk);
    FUZZ_CHECK(kvp_envelope_encoded_size(&t, n, &size) == 0);

    uint8_t *chunks = malloc(chunk * n + 1);
    uint8_t *dst = malloc(size);
    FUZZ_CHECK(chunks && dst);
    const uint8_t *ptrs[MAXN];
    for (uint64_t j = 0; j < chunk * n; j++)
        chunks[j] = fill_len ? fill[j % fill_len] : (uint8_t)j;
    for (uint32_t i = 0; i < n; i++)
        ptrs[i] = chunks + i * chunk;
    FUZZ_CHECK(kvp_envelope_encode(&t, n, ptrs, dst, size) == (int64_t)size);
    FUZZ_CHECK(kvp_envelope_encode(&t, n, ptrs, dst, size - 1) == -ENOSPC);

    struct kvp_envelope_expect e = {.layout = *l, .min_tensors = n, .max_tensors = n};
    struct kvp_envelope_tensor out[MAXN];
    uint32_t got = 0;
    FUZZ_CHECK(kvp_envelope_decode(dst, size, &e, out, MAXN, &got, why, sizeof(why)) == 0);
    FUZZ_CHECK(got == n);
    for (uint32_t i = 0; i < n; i++)
        FUZZ_CHECK(out[i].len == chunk && memcmp(out[i].data, ptrs[i], chunk) == 0);
    free(dst);
    free(chunks);
}

/* 0.5.7's other new payloads, on the same bytes. */
static void check_payload_decoders(const uint8_t *buf, size_t len)
{
    struct lmc_skipped_chunks s;
    struct lmc_range r[8];
    uint32_t n = 99;
    char why[160] = "";
    if (lmc_decode_skipped_chunks(buf, len, &s, why, sizeof(why)) == 0) {
        FUZZ_CHECK(s.ngroups <= LMC_MAX_GROUPS);
        FUZZ_CHECK(s.npositions <= len); /* a position takes a byte at least */
    } else {
        FUZZ_CHECK(why[0] != '\0');
    }
    why[0] = '\0';
    if (lmc_decode_extra_ranges(buf, len, r, 8, &n, why, sizeof(why)) == 0) {
        FUZZ_CHECK(n <= 8);
        for (uint32_t i = 0; i < n; i++)
            FUZZ_CHECK(r[i].start <= KVP_MAX_TOKENS && r[i].end <= KVP_MAX_TOKENS);
    } else {
        FUZZ_CHECK(n == 0 && why[0] != '\0');
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    struct kvp_envelope_expect e = {0};
    e.layout.dtype = DTYPES[data[0] % (sizeof(DTYPES) / sizeof(DTYPES[0]))];
    e.layout.ndim = (uint32_t)(data[1] % 4) + 1;
    size_t at = 2;
    if (size < at + 2 * e.layout.ndim + 1)
        return 0;
    for (uint32_t i = 0; i < e.layout.ndim; i++, at += 2)
        e.layout.shape[i] = (uint64_t)data[at] | (uint64_t)data[at + 1] << 8;
    e.max_tensors = data[at] % MAXN;
    e.min_tensors = data[at] & 0x80 ? e.max_tensors : 0;
    at++;
    const uint8_t *payload = data + at;
    size_t len = size - at;

    /* A copy of exactly len bytes, so reading past the payload is caught by ASan. */
    uint8_t *buf = malloc(len ? len : 1);
    FUZZ_CHECK(buf);
    memcpy(buf, payload, len);
    struct kvp_envelope_tensor out[MAXN];
    uint32_t n = 99;
    char why[200] = "unset";
    int rc = kvp_envelope_decode(buf, len, &e, out, MAXN, &n, why, sizeof(why));
    uint64_t chunk = 0;
    int lrc = kvp_envelope_layout_check(&e.layout, &chunk, NULL, 0);
    FUZZ_CHECK((rc == -EINVAL) == (lrc < 0));
    check_decoded(buf, len, &e, chunk, rc, n, out, why);
    check_payload_decoders(buf, len);
    free(buf);

    if (lrc == 0 && chunk * e.max_tensors <= (1u << 18))
        roundtrip(&e.layout, chunk, e.max_tensors, payload, len);
    return 0;
}
