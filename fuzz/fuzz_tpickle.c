/*
 * fuzz_tpickle.c - LMCache's pickle transport (src/server/lmc/torch_pickle.c): the recogniser of
 * what a worker sends, and the encoder of what it loads, by round trip.
 *
 * Input: a registration, then a payload.
 *   byte 0        dtype (index into DTYPES, modulo its size)
 *   byte 1        rank - 1 (modulo 4)
 *   2 bytes/dim   each dimension, little-endian (0 is a bad layout: only the -EINVAL path)
 *   1 byte        the most tensors accepted (modulo 16); at least 0
 *   the rest      the payload
 * The seeds (fuzz/corpus/tpickle/) are real torch payloads with their registration in front
 * (tests/server/tpickle_payloads.py --fuzz-corpus), and seed-reply-*: the encoder's own form.
 *
 * Checked: the decoder returns only 0, -EPROTO, -EMSGSIZE or -EINVAL; on success the tensors are
 * within bounds, chunk-sized, in buffer order and disjoint, and why is empty; on failure *n is
 * 0 and why says something. Then, while the chunks fit in 256 KiB, the encoder's pickle of as many
 * chunks (their bytes taken from the payload) decodes back to exactly those bytes, and its
 * iovec form concatenates to the same pickle.
 */
#include <errno.h>
#include <string.h>

#include "fuzz.h"
#include "lmc/torch_pickle.h"

#define MAXN 16

static const char *const DTYPES[] = {"float16", "bfloat16", "float32",       "float64",
                                     "int8",    "uint8",    "float8_e4m3fn", "float8_e5m2"};

static void check_decoded(const uint8_t *buf, size_t len, const struct kvp_tpickle_expect *e,
                          uint64_t chunk, int rc, uint32_t n, const struct kvp_tpickle_tensor *out,
                          const char *why)
{
    FUZZ_CHECK(rc == 0 || rc == -EPROTO || rc == -EMSGSIZE || rc == -EINVAL);
    if (rc != 0) {
        FUZZ_CHECK(n == 0);
        FUZZ_CHECK(why[0] != '\0');
        return;
    }
    FUZZ_CHECK(why[0] == '\0');
    FUZZ_CHECK(n >= e->min_tensors && n <= e->max_tensors);
    for (uint32_t i = 0; i < n; i++) {
        FUZZ_CHECK(out[i].len == chunk);
        FUZZ_CHECK(out[i].data >= buf && out[i].len <= len &&
                   (size_t)(out[i].data - buf) <= len - out[i].len);
        if (i)
            FUZZ_CHECK(out[i].data >= out[i - 1].data + out[i - 1].len);
    }
}

static void roundtrip(const struct kvp_tpickle_layout *l, uint64_t chunk, uint32_t n,
                      const uint8_t *fill, size_t fill_len)
{
    struct kvp_tpickle_template t;
    uint64_t size;
    char why[200];

    FUZZ_CHECK(kvp_tpickle_template_init(&t, l, why, sizeof(why)) == 0);
    FUZZ_CHECK(t.chunk_bytes == chunk);
    FUZZ_CHECK(kvp_tpickle_encoded_size(&t, n, &size) == 0);

    uint8_t *chunks = malloc(chunk * n + 1);
    uint8_t *dst = malloc(size);
    FUZZ_CHECK(chunks && dst);
    const uint8_t *ptrs[MAXN];
    for (uint64_t j = 0; j < chunk * n; j++)
        chunks[j] = fill_len ? fill[j % fill_len] : (uint8_t)j;
    for (uint32_t i = 0; i < n; i++)
        ptrs[i] = chunks + i * chunk;
    FUZZ_CHECK(kvp_tpickle_encode(&t, n, ptrs, dst, size) == (int64_t)size);

    struct iovec iov[2 + 3 * MAXN];
    int k = kvp_tpickle_encode_iov(&t, n, ptrs, iov, 2 + 3 * MAXN);
    FUZZ_CHECK(k == (int)(2 + 3 * n));
    size_t at = 0;
    for (int i = 0; i < k; i++) {
        FUZZ_CHECK(at + iov[i].iov_len <= size);
        FUZZ_CHECK(memcmp(dst + at, iov[i].iov_base, iov[i].iov_len) == 0);
        at += iov[i].iov_len;
    }
    FUZZ_CHECK(at == size);

    struct kvp_tpickle_expect e = {.layout = *l, .min_tensors = n, .max_tensors = n};
    struct kvp_tpickle_tensor out[MAXN];
    uint32_t got = 0;
    FUZZ_CHECK(kvp_tpickle_decode(dst, size, &e, out, MAXN, &got, why, sizeof(why)) == 0);
    FUZZ_CHECK(got == n);
    for (uint32_t i = 0; i < n; i++)
        FUZZ_CHECK(out[i].len == chunk && memcmp(out[i].data, ptrs[i], chunk) == 0);
    free(dst);
    free(chunks);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    struct kvp_tpickle_expect e = {0};
    e.layout.dtype = DTYPES[data[0] % (sizeof(DTYPES) / sizeof(DTYPES[0]))];
    e.layout.ndim = (uint32_t)(data[1] % 4) + 1;
    size_t at = 2;
    if (size < at + 2 * e.layout.ndim + 1)
        return 0;
    for (uint32_t i = 0; i < e.layout.ndim; i++, at += 2)
        e.layout.shape[i] = (uint64_t)data[at] | (uint64_t)data[at + 1] << 8;
    e.max_tensors = data[at++] % MAXN;
    const uint8_t *payload = data + at;
    size_t len = size - at;

    /* A copy of exactly len bytes, so reading past the payload is caught by ASan. */
    uint8_t *buf = malloc(len ? len : 1);
    FUZZ_CHECK(buf);
    memcpy(buf, payload, len);
    struct kvp_tpickle_tensor out[MAXN];
    uint32_t n = 99;
    char why[200] = "unset";
    int rc = kvp_tpickle_decode(buf, len, &e, out, MAXN, &n, why, sizeof(why));
    uint64_t chunk = 0;
    int lrc = kvp_tpickle_layout_check(&e.layout, &chunk, NULL, 0);
    FUZZ_CHECK((rc == -EINVAL) == (lrc < 0));
    check_decoded(buf, len, &e, chunk, rc, n, out, why);
    free(buf);

    if (lrc == 0 && chunk * e.max_tensors <= (1u << 18))
        roundtrip(&e.layout, chunk, e.max_tensors, payload, len);
    return 0;
}
