/*
 * envelope.c - LMCache 0.5.7's TensorEnvelope, recognised and written without an object model
 * (see envelope.h).
 *
 * LMCache decodes an envelope with msgspec into typed structs that forbid unknown fields, then
 * checks every tensor against the registered chunk (tensor_wire.py, decode_tensors()). The
 * decoder here makes the same checks in one pass over the bytes with the front end's bounded
 * msgpack reader (codec.h): the top map's two fields in any order, each tensor's three fields in
 * any order, each value's type and bound before it is used. A tensor's bytes are not copied:
 * out[i] points at them inside the frame, and the caller copies each chunk once, into its slot.
 *
 * It is stricter than msgspec where msgspec's leniency could only hide a mistake: a field that
 * comes twice is refused (msgspec keeps the last), and the rank is compared before the
 * dimensions are read, so a shape can never make the decoder read more than the layout's rank
 * (plus LMCache's limit of 16 to name the error). Everything a client controls is bounded before
 * it is used: the payload by kvp_envelope_max_payload(), the tensor count by the caller's
 * max_tensors (and LMCache's 65536), every str and bin by the bytes left in the frame (codec.c),
 * the sum of the data by LMCache's 16 GiB.
 *
 * The encoder writes what msgspec writes for encode_tensors(): {"version": 1, "tensors": [...]},
 * each tensor {"dtype", "shape", "data"} in that order, ints and headers in their smallest form.
 * Every tensor of a layout starts with the same bytes, built once (the template).
 *
 * Thread safety: no state outside the caller's arguments.
 */
#include "lmc/envelope.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/layout.h"
#include "common/why.h"
#include "lmc/codec.h"

bool kvp_envelope_sniff(const uint8_t *buf, size_t len)
{
    return len > 0 && ((buf[0] > 0x80 && buf[0] <= 0x8f) || buf[0] == 0xde || buf[0] == 0xdf);
}

int kvp_envelope_layout_check(const struct kvp_envelope_layout *l, uint64_t *bytes, char *why,
                              size_t why_size)
{
    if (!l || !l->dtype)
        return kvp_why(why, why_size, -EINVAL, "no layout");
    const struct kvp_dtype *dt = kvp_dtype_find(l->dtype);
    if (!dt)
        return kvp_why(why, why_size, -EINVAL, "dtype %.32s is not one kvpool knows", l->dtype);
    if (l->ndim < 1 || l->ndim > KVP_ENVELOPE_MAX_RANK)
        return kvp_why(why, why_size, -EINVAL, "%u dimensions, 1..%u allowed", l->ndim,
                       KVP_ENVELOPE_MAX_RANK);
    uint64_t size = dt->size;
    for (uint32_t i = 0; i < l->ndim; i++) {
        if (l->shape[i] == 0)
            return kvp_why(why, why_size, -EINVAL, "dimension %u is 0", i);
        if (l->shape[i] > KVP_ENVELOPE_MAX_TENSOR_BYTES / size)
            return kvp_why(why, why_size, -EINVAL, "a tensor of more than 2 GiB (LMCache's limit)");
        size *= l->shape[i];
    }
    if (bytes)
        *bytes = size;
    return 0;
}

int kvp_envelope_max_payload(const struct kvp_envelope_expect *exp, uint64_t *max)
{
    uint64_t chunk;
    if (!exp || kvp_envelope_layout_check(&exp->layout, &chunk, NULL, 0) < 0 ||
        exp->max_tensors > KVP_ENVELOPE_MAX_TENSORS)
        return -EINVAL;
    /* Neither product can overflow: 2^16 tensors of at most 2^31 + 2^10 bytes. */
    uint64_t ours = KVP_ENVELOPE_STREAM_OVERHEAD +
                    (uint64_t)exp->max_tensors * (chunk + KVP_ENVELOPE_TENSOR_OVERHEAD);
    uint64_t lmcache = KVP_ENVELOPE_STREAM_OVERHEAD + KVP_ENVELOPE_MAX_TOTAL_BYTES +
                       (uint64_t)exp->max_tensors * KVP_ENVELOPE_TENSOR_OVERHEAD;
    *max = ours < lmcache ? ours : lmcache;
    return 0;
}

/* ---- decoding ---------------------------------------------------------------------------- */

struct env_dec {
    struct lmc_mp_reader r;
    const struct kvp_envelope_expect *exp;
    uint64_t chunk;
    uint64_t total; /* data bytes so far */
    char *why;
    size_t why_size;
};

/* A client's string as a reason may quote it: at most 32 bytes, printable ASCII only. */
struct quoted {
    char s[33];
};

static struct quoted quote(const char *s, uint32_t len)
{
    struct quoted q;
    uint32_t n = len < 32 ? len : 32;
    for (uint32_t i = 0; i < n; i++)
        q.s[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    q.s[n] = '\0';
    return q;
}

static bool name_is(const char *s, uint32_t len, const char *field)
{
    return strlen(field) == len && memcmp(s, field, len) == 0;
}

/* A map key: a str of at most 32 bytes. Anything else is no field of LMCache's. */
static int field_name(struct env_dec *d, const char *where, const char **s, uint32_t *len)
{
    int rc = lmc_mp_read_str(&d->r, 32, s, len);
    if (rc)
        return kvp_why(d->why, d->why_size, -EPROTO, "%s: a key that is no field name (%s)", where,
                       lmc_mp_error_words(rc));
    return 0;
}

/* The shape of tensor @i: LMCache's rank limit first, then exactly the layout's dimensions. */
static int dec_shape(struct env_dec *d, uint32_t i)
{
    const struct kvp_envelope_layout *l = &d->exp->layout;
    uint32_t rank;
    int rc = lmc_mp_read_array(&d->r, KVP_ENVELOPE_MAX_RANK, &rank);
    if (rc)
        return kvp_why(d->why, d->why_size, -EPROTO, "tensor %u: shape %s (an array of at most %u)",
                       i, lmc_mp_error_words(rc), KVP_ENVELOPE_MAX_RANK);
    if (rank != l->ndim)
        return kvp_why(d->why, d->why_size, -EPROTO, "tensor %u: shape of rank %u, expected %u", i,
                       rank, l->ndim);
    for (uint32_t k = 0; k < rank; k++) {
        uint64_t dim;
        if ((rc = lmc_mp_read_uint(&d->r, UINT64_MAX, &dim)))
            return kvp_why(d->why, d->why_size, -EPROTO, "tensor %u: shape dimension %u %s", i, k,
                           rc == -ERANGE ? "is negative" : lmc_mp_error_words(rc));
        if (dim != l->shape[k])
            return kvp_why(d->why, d->why_size, -EPROTO,
                           "tensor %u: shape dimension %u is %llu, expected %llu", i, k,
                           (unsigned long long)dim, (unsigned long long)l->shape[k]);
    }
    return 0;
}

enum { F_DTYPE = 1u << 0, F_SHAPE = 1u << 1, F_DATA = 1u << 2 };

/* One TensorFrame: exactly dtype, shape and data, in any order. */
static int dec_tensor(struct env_dec *d, uint32_t i, struct kvp_envelope_tensor *t)
{
    uint32_t nf, seen = 0;
    char where[32];
    int rc = lmc_mp_read_map(&d->r, 3, &nf);
    if (rc == -E2BIG)
        return kvp_why(d->why, d->why_size, -EPROTO,
                       "tensor %u: more fields than dtype, shape and data (unknown fields are "
                       "refused)",
                       i);
    if (rc)
        return kvp_why(d->why, d->why_size, -EPROTO,
                       "tensor %u %s (a map of dtype, shape and data)", i, lmc_mp_error_words(rc));
    snprintf(where, sizeof(where), "tensor %u", i);
    for (uint32_t f = 0; f < nf; f++) {
        const char *s;
        uint32_t len;
        unsigned bit;
        if ((rc = field_name(d, where, &s, &len)))
            return rc;
        if (name_is(s, len, "dtype"))
            bit = F_DTYPE;
        else if (name_is(s, len, "shape"))
            bit = F_SHAPE;
        else if (name_is(s, len, "data"))
            bit = F_DATA;
        else
            return kvp_why(d->why, d->why_size, -EPROTO, "tensor %u: unknown field '%s'", i,
                           quote(s, len).s);
        if (seen & bit)
            return kvp_why(d->why, d->why_size, -EPROTO, "tensor %u: field '%s' twice", i,
                           quote(s, len).s);
        seen |= bit;
        if (bit == F_DTYPE) {
            const char *dt;
            uint32_t dl;
            if ((rc = lmc_mp_read_str(&d->r, 64, &dt, &dl)))
                return kvp_why(d->why, d->why_size, -EPROTO, "tensor %u: dtype %s", i,
                               lmc_mp_error_words(rc));
            if (!name_is(dt, dl, d->exp->layout.dtype))
                return kvp_why(d->why, d->why_size, -EPROTO, "tensor %u: dtype '%s', expected %s",
                               i, quote(dt, dl).s, d->exp->layout.dtype);
        } else if (bit == F_SHAPE) {
            if ((rc = dec_shape(d, i)))
                return rc;
        } else {
            const uint8_t *b;
            uint64_t bl;
            if ((rc = lmc_mp_read_bin(&d->r, KVP_ENVELOPE_MAX_TENSOR_BYTES, &b, &bl)))
                return kvp_why(d->why, d->why_size, -EPROTO, "tensor %u: data %s (a bin of %llu)",
                               i, lmc_mp_error_words(rc), (unsigned long long)d->chunk);
            if (bl != d->chunk)
                return kvp_why(d->why, d->why_size, -EPROTO,
                               "tensor %u: data of %llu bytes, expected %llu", i,
                               (unsigned long long)bl, (unsigned long long)d->chunk);
            d->total += bl;
            if (d->total > KVP_ENVELOPE_MAX_TOTAL_BYTES)
                return kvp_why(d->why, d->why_size, -EPROTO,
                               "tensor %u: more than 16 GiB of data (LMCache's limit)", i);
            t->data = b;
            t->len = bl;
        }
    }
    if (seen != (F_DTYPE | F_SHAPE | F_DATA))
        return kvp_why(d->why, d->why_size, -EPROTO, "tensor %u: no %s", i,
                       !(seen & F_DTYPE)   ? "dtype"
                       : !(seen & F_SHAPE) ? "shape"
                                           : "data");
    return 0;
}

/* The tensor list: between min and max tensors, each checked. */
static int dec_tensors(struct env_dec *d, struct kvp_envelope_tensor *out, uint32_t *n)
{
    uint32_t count;
    const struct kvp_envelope_expect *e = d->exp;
    int rc = lmc_mp_read_array(&d->r, e->max_tensors, &count);
    if (rc == -E2BIG)
        return kvp_why(d->why, d->why_size, -EPROTO, "more than %u tensors", e->max_tensors);
    if (rc)
        return kvp_why(d->why, d->why_size, -EPROTO, "tensors %s (an array)",
                       lmc_mp_error_words(rc));
    if (count < e->min_tensors)
        return kvp_why(d->why, d->why_size, -EPROTO, "%u tensors, expected at least %u", count,
                       e->min_tensors);
    for (uint32_t i = 0; i < count; i++)
        if ((rc = dec_tensor(d, i, &out[i])))
            return rc;
    *n = count;
    return 0;
}

int kvp_envelope_decode(const uint8_t *buf, size_t len, const struct kvp_envelope_expect *exp,
                        struct kvp_envelope_tensor *out, uint32_t cap, uint32_t *n, char *why,
                        size_t why_size)
{
    struct env_dec d = {.exp = exp, .why = why, .why_size = why_size};
    uint64_t max;
    uint32_t nf, count = 0;
    bool have_version = false, have_tensors = false;
    int rc;

    *n = 0;
    if (why && why_size)
        why[0] = '\0';
    if (!exp || kvp_envelope_layout_check(&exp->layout, &d.chunk, why, why_size) < 0 ||
        exp->max_tensors > KVP_ENVELOPE_MAX_TENSORS || exp->min_tensors > exp->max_tensors)
        return kvp_why(why, why_size, -EINVAL, "bad expectation");
    if (!out || cap < exp->max_tensors)
        return kvp_why(why, why_size, -EINVAL, "room for %u tensors, %u expected", cap,
                       exp->max_tensors);
    if (kvp_envelope_max_payload(exp, &max) < 0)
        return kvp_why(why, why_size, -EINVAL, "bad expectation");
    if (len > max)
        return kvp_why(why, why_size, -EMSGSIZE, "an envelope of %zu bytes, at most %llu expected",
                       len, (unsigned long long)max);

    lmc_mp_reader_init(&d.r, buf, len);
    if ((rc = lmc_mp_read_map(&d.r, 2, &nf))) {
        if (rc == -E2BIG)
            return kvp_why(why, why_size, -EPROTO,
                           "an envelope of more than two fields (version, tensors)");
        return kvp_why(why, why_size, -EPROTO, "the envelope %s (a map)", lmc_mp_error_words(rc));
    }
    for (uint32_t f = 0; f < nf; f++) {
        const char *s;
        uint32_t sl;
        if ((rc = field_name(&d, "envelope", &s, &sl)))
            goto fail;
        if (name_is(s, sl, "version")) {
            int64_t v;
            if (have_version) {
                rc = kvp_why(why, why_size, -EPROTO, "version twice");
                goto fail;
            }
            have_version = true;
            /* Literal[1]: the int 1 only (msgspec tells a bool or a float from an int). */
            if ((rc = lmc_mp_read_int(&d.r, INT64_MIN, INT64_MAX, &v)) || v != 1) {
                rc = kvp_why(why, why_size, -EPROTO, "version %s, expected 1",
                             rc ? lmc_mp_error_words(rc) : "is not 1");
                goto fail;
            }
        } else if (name_is(s, sl, "tensors")) {
            if (have_tensors) {
                rc = kvp_why(why, why_size, -EPROTO, "tensors twice");
                goto fail;
            }
            have_tensors = true;
            if ((rc = dec_tensors(&d, out, &count)))
                goto fail;
        } else if (name_is(s, sl, "groups")) {
            rc = kvp_why(why, why_size, -EPROTO,
                         "a grouped tensor envelope (a hybrid model's KV cache groups): kvpool "
                         "serves one group");
            goto fail;
        } else {
            rc = kvp_why(why, why_size, -EPROTO, "unknown field '%s'", quote(s, sl).s);
            goto fail;
        }
    }
    if (!have_version || !have_tensors) {
        rc = kvp_why(why, why_size, -EPROTO, "no %s", have_version ? "tensors" : "version");
        goto fail;
    }
    if (lmc_mp_left(&d.r)) {
        rc = kvp_why(why, why_size, -EPROTO, "%zu bytes after the envelope", lmc_mp_left(&d.r));
        goto fail;
    }
    *n = count;
    return 0;

fail:
    /* Reasons name the tensor; the offset says where the reader stopped. */
    if (why && why_size) {
        size_t used = strlen(why);
        if (used + 1 < why_size)
            snprintf(why + used, why_size - used, " (at byte %zu)", len - lmc_mp_left(&d.r));
    }
    return rc;
}

/* ---- encoding ---------------------------------------------------------------------------- */

/* {"version": 1, "tensors": [ with the array header of n tensors; at most 23 bytes. */
static uint32_t put_head(uint8_t *dst, uint32_t n)
{
    struct lmc_mp_writer w;
    lmc_mp_writer_init_fixed(&w, dst, 32);
    lmc_mp_put_map(&w, 2);
    lmc_mp_put_cstr(&w, "version");
    lmc_mp_put_uint(&w, 1);
    lmc_mp_put_cstr(&w, "tensors");
    lmc_mp_put_array(&w, n);
    return (uint32_t)w.len;
}

int kvp_envelope_template_init(struct kvp_envelope_template *t, const struct kvp_envelope_layout *l,
                               char *why, size_t why_size)
{
    int rc = kvp_envelope_layout_check(l, &t->chunk_bytes, why, why_size);
    if (rc)
        return rc;
    /* msgspec's smallest forms, as codec.c's writer writes them. */
    struct lmc_mp_writer w;
    lmc_mp_writer_init_fixed(&w, t->pre, sizeof(t->pre));
    lmc_mp_put_map(&w, 3);
    lmc_mp_put_cstr(&w, "dtype");
    lmc_mp_put_cstr(&w, l->dtype);
    lmc_mp_put_cstr(&w, "shape");
    lmc_mp_put_array(&w, l->ndim);
    for (uint32_t i = 0; i < l->ndim; i++)
        lmc_mp_put_uint(&w, l->shape[i]);
    lmc_mp_put_cstr(&w, "data");
    lmc_mp_put_bin_header(&w, t->chunk_bytes);
    if (w.failed) /* 16 dimensions of 9 bytes and a dtype name of 127 still fit */
        return kvp_why(why, why_size, -EINVAL, "the tensor header does not fit");
    t->pre_len = (uint32_t)w.len;
    return 0;
}

int kvp_envelope_encoded_size(const struct kvp_envelope_template *t, uint32_t n, uint64_t *size)
{
    uint8_t head[32];
    if (n > KVP_ENVELOPE_MAX_TENSORS || t->chunk_bytes * n > KVP_ENVELOPE_MAX_TOTAL_BYTES)
        return -E2BIG;
    *size = put_head(head, n) + (uint64_t)n * (t->pre_len + t->chunk_bytes);
    return 0;
}

int64_t kvp_envelope_encode(const struct kvp_envelope_template *t, uint32_t n,
                            const uint8_t *const *chunks, uint8_t *dst, size_t dst_size)
{
    uint64_t size;
    if (kvp_envelope_encoded_size(t, n, &size))
        return -E2BIG;
    if (size > dst_size)
        return -ENOSPC;
    uint8_t *p = dst + put_head(dst, n);
    for (uint32_t i = 0; i < n; i++) {
        memcpy(p, t->pre, t->pre_len);
        p += t->pre_len;
        memcpy(p, chunks[i], t->chunk_bytes);
        p += t->chunk_bytes;
    }
    return (int64_t)size;
}
