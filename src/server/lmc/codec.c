/*
 * codec.c - the LMCache front end's MessagePack reader and writer (see codec.h).
 *
 * Every read goes through head(): it decodes the type byte and the fixed-size header that
 * follows (a length, or the value of a scalar) without moving the cursor, and checks that the
 * header and, for str, bin and ext, the payload are inside the frame. The readers then check
 * the type and bounds and only move the cursor on success. Integers are carried as a sign flag
 * plus a 64-bit magnitude so that every width, uint64 included, is compared exactly.
 *
 * lmc_mp_skip() keeps one counter of values still to step over: an array adds its length, a map
 * twice its length. Every value takes at least one byte, so a counter larger than the bytes
 * left is already a truncated frame, which bounds the loop by the frame's length.
 */
#include "lmc/codec.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* One decoded header: what the next value is and where its payload starts. */
struct head {
    enum lmc_mp_type type;
    size_t hlen; /* bytes of the type byte and the header */
    uint64_t n;  /* str/bin/ext payload bytes, array/map count, bool value, uint magnitude */
    bool neg;    /* LMC_MP_INT: n is the magnitude of a negative value */
    double f;    /* LMC_MP_FLOAT */
};

static uint64_t be(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

static void set_int(struct head *h, int64_t v)
{
    h->type = LMC_MP_INT;
    h->neg = v < 0;
    h->n = v < 0 ? (uint64_t)(-(v + 1)) + 1 : (uint64_t)v;
}

static int head(const struct lmc_mp_reader *r, struct head *h)
{
    size_t left = (size_t)(r->end - r->p);
    if (left == 0)
        return -EPROTO;
    const uint8_t *p = r->p;
    uint8_t b = p[0];
    unsigned extra = 0; /* header bytes after the type byte */
    memset(h, 0, sizeof(*h));

    if (b <= 0x7f) {
        set_int(h, b);
    } else if (b <= 0x8f) {
        h->type = LMC_MP_MAP;
        h->n = b & 0x0f;
    } else if (b <= 0x9f) {
        h->type = LMC_MP_ARRAY;
        h->n = b & 0x0f;
    } else if (b <= 0xbf) {
        h->type = LMC_MP_STR;
        h->n = b & 0x1f;
    } else if (b >= 0xe0) {
        set_int(h, (int8_t)b);
    } else {
        static const uint8_t hdr_len[32] = {
            /* c0 nil, c1 never, c2 false, c3 true */ 0,
            0,
            0,
            0,
            /* c4-c6 bin8/16/32 */ 1,
            2,
            4,
            /* c7-c9 ext8/16/32 (+1 type byte) */ 2,
            3,
            5,
            /* ca float32, cb float64 */ 4,
            8,
            /* cc-cf uint8-64 */ 1,
            2,
            4,
            8,
            /* d0-d3 int8-64 */ 1,
            2,
            4,
            8,
            /* d4-d8 fixext 1/2/4/8/16 (type byte) */ 1,
            1,
            1,
            1,
            1,
            /* d9-db str8/16/32 */ 1,
            2,
            4,
            /* dc-dd array16/32 */ 2,
            4,
            /* de-df map16/32 */ 2,
            4,
        };
        if (b == 0xc1)
            return -EPROTO;
        extra = hdr_len[b - 0xc0];
        if (left < 1 + (size_t)extra)
            return -EPROTO;
        const uint8_t *q = p + 1;
        switch (b) {
        case 0xc0:
            h->type = LMC_MP_NIL;
            break;
        case 0xc2:
        case 0xc3:
            h->type = LMC_MP_BOOL;
            h->n = b == 0xc3;
            break;
        case 0xc4:
        case 0xc5:
        case 0xc6:
            h->type = LMC_MP_BIN;
            h->n = be(q, extra);
            break;
        case 0xc7:
        case 0xc8:
        case 0xc9:
            h->type = LMC_MP_EXT;
            h->n = be(q, extra - 1);
            break;
        case 0xca: {
            uint32_t u = (uint32_t)be(q, 4);
            float f;
            memcpy(&f, &u, sizeof(f));
            h->type = LMC_MP_FLOAT;
            h->f = f;
            break;
        }
        case 0xcb: {
            uint64_t u = be(q, 8);
            memcpy(&h->f, &u, sizeof(h->f));
            h->type = LMC_MP_FLOAT;
            break;
        }
        case 0xcc:
        case 0xcd:
        case 0xce:
        case 0xcf:
            h->type = LMC_MP_INT;
            h->n = be(q, extra);
            break;
        case 0xd0:
            set_int(h, (int8_t)q[0]);
            break;
        case 0xd1:
            set_int(h, (int16_t)be(q, 2));
            break;
        case 0xd2:
            set_int(h, (int32_t)be(q, 4));
            break;
        case 0xd3:
            set_int(h, (int64_t)be(q, 8));
            break;
        case 0xd4:
        case 0xd5:
        case 0xd6:
        case 0xd7:
        case 0xd8:
            h->type = LMC_MP_EXT;
            h->n = 1u << (b - 0xd4);
            break;
        case 0xd9:
        case 0xda:
        case 0xdb:
            h->type = LMC_MP_STR;
            h->n = be(q, extra);
            break;
        case 0xdc:
        case 0xdd:
            h->type = LMC_MP_ARRAY;
            h->n = be(q, extra);
            break;
        default: /* 0xde, 0xdf */
            h->type = LMC_MP_MAP;
            h->n = be(q, extra);
            break;
        }
    }
    h->hlen = 1 + (size_t)extra;
    /* Payloads must be inside the frame; containers must not announce more values than there
     * are bytes left (each takes one at least). */
    size_t rest = left - h->hlen;
    switch (h->type) {
    case LMC_MP_STR:
    case LMC_MP_BIN:
    case LMC_MP_EXT:
        if (h->n > rest)
            return -EPROTO;
        break;
    case LMC_MP_ARRAY:
        if (h->n > rest)
            return -EPROTO;
        break;
    case LMC_MP_MAP:
        if (h->n > rest / 2)
            return -EPROTO;
        break;
    default:
        break;
    }
    return 0;
}

void lmc_mp_reader_init(struct lmc_mp_reader *r, const void *p, size_t n)
{
    r->p = p;
    r->end = (const uint8_t *)p + n;
}

size_t lmc_mp_left(const struct lmc_mp_reader *r)
{
    return (size_t)(r->end - r->p);
}

int lmc_mp_peek(const struct lmc_mp_reader *r, enum lmc_mp_type *t)
{
    struct head h;
    int rc = head(r, &h);
    if (rc == 0)
        *t = h.type;
    return rc;
}

bool lmc_mp_try_nil(struct lmc_mp_reader *r)
{
    if (r->p < r->end && r->p[0] == 0xc0) {
        r->p++;
        return true;
    }
    return false;
}

/* head() plus the checks every typed read makes: the value is a @want and its length, count or
 * magnitude is at most @max. The cursor does not move. */
static int expect(const struct lmc_mp_reader *r, enum lmc_mp_type want, uint64_t max,
                  struct head *h)
{
    int rc = head(r, h);
    if (rc)
        return rc;
    if (h->type != want)
        return -EINVAL;
    if (h->n > max)
        return -E2BIG;
    return 0;
}

/* A str or bin of at most @max bytes: its payload is left in place, the cursor moves past it. */
static int read_payload(struct lmc_mp_reader *r, enum lmc_mp_type want, uint64_t max,
                        const uint8_t **b, uint64_t *len)
{
    struct head h;
    int rc = expect(r, want, max, &h);
    if (rc)
        return rc;
    *b = r->p + h.hlen;
    *len = h.n;
    r->p += h.hlen + h.n;
    return 0;
}

int lmc_mp_read_nil(struct lmc_mp_reader *r)
{
    struct head h;
    int rc = expect(r, LMC_MP_NIL, UINT64_MAX, &h);
    if (rc)
        return rc;
    r->p += h.hlen;
    return 0;
}

int lmc_mp_read_bool(struct lmc_mp_reader *r, bool *v)
{
    struct head h;
    int rc = expect(r, LMC_MP_BOOL, UINT64_MAX, &h);
    if (rc)
        return rc;
    *v = h.n != 0;
    r->p += h.hlen;
    return 0;
}

int lmc_mp_read_int(struct lmc_mp_reader *r, int64_t min, int64_t max, int64_t *v)
{
    struct head h;
    int rc = expect(r, LMC_MP_INT, UINT64_MAX, &h);
    if (rc)
        return rc;
    int64_t x;
    if (h.neg) {
        if (h.n > (uint64_t)INT64_MAX + 1)
            return -ERANGE;
        x = h.n == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)h.n;
    } else {
        if (h.n > (uint64_t)INT64_MAX)
            return -ERANGE;
        x = (int64_t)h.n;
    }
    if (x < min || x > max)
        return -ERANGE;
    *v = x;
    r->p += h.hlen;
    return 0;
}

int lmc_mp_read_uint(struct lmc_mp_reader *r, uint64_t max, uint64_t *v)
{
    struct head h;
    int rc = expect(r, LMC_MP_INT, UINT64_MAX, &h);
    if (rc)
        return rc;
    if ((h.neg && h.n != 0) || h.n > max)
        return -ERANGE;
    *v = h.n;
    r->p += h.hlen;
    return 0;
}

int lmc_mp_read_float(struct lmc_mp_reader *r, double *v)
{
    struct head h;
    int rc = head(r, &h);
    if (rc)
        return rc;
    if (h.type == LMC_MP_FLOAT)
        *v = h.f;
    else if (h.type == LMC_MP_INT)
        *v = h.neg ? -(double)h.n : (double)h.n;
    else
        return -EINVAL;
    r->p += h.hlen;
    return 0;
}

int lmc_mp_read_str(struct lmc_mp_reader *r, uint32_t max, const char **s, uint32_t *len)
{
    const uint8_t *b;
    uint64_t n;
    int rc = read_payload(r, LMC_MP_STR, max, &b, &n);
    if (rc)
        return rc;
    *s = (const char *)b;
    *len = (uint32_t)n;
    return 0;
}

int lmc_mp_read_cstr(struct lmc_mp_reader *r, char *buf, size_t cap)
{
    struct lmc_mp_reader save = *r;
    const char *s;
    uint32_t n;
    if (cap == 0)
        return -E2BIG;
    int rc = lmc_mp_read_str(r, (uint32_t)(cap - 1 > UINT32_MAX ? UINT32_MAX : cap - 1), &s, &n);
    if (rc)
        return rc;
    if (memchr(s, '\0', n)) {
        *r = save;
        return -EINVAL;
    }
    memcpy(buf, s, n);
    buf[n] = '\0';
    return 0;
}

int lmc_mp_read_bin(struct lmc_mp_reader *r, uint64_t max, const uint8_t **b, uint64_t *len)
{
    return read_payload(r, LMC_MP_BIN, max, b, len);
}

static int read_container(struct lmc_mp_reader *r, enum lmc_mp_type want, uint32_t max, uint32_t *n)
{
    struct head h;
    int rc = expect(r, want, max, &h);
    if (rc)
        return rc;
    *n = (uint32_t)h.n;
    r->p += h.hlen;
    return 0;
}

int lmc_mp_read_array(struct lmc_mp_reader *r, uint32_t max, uint32_t *n)
{
    return read_container(r, LMC_MP_ARRAY, max, n);
}

int lmc_mp_read_map(struct lmc_mp_reader *r, uint32_t max, uint32_t *n)
{
    return read_container(r, LMC_MP_MAP, max, n);
}

int lmc_mp_skip(struct lmc_mp_reader *r)
{
    const uint8_t *start = r->p;
    uint64_t todo = 1;
    while (todo > 0) {
        struct head h;
        int rc = head(r, &h);
        if (rc) {
            r->p = start;
            return rc;
        }
        todo--;
        r->p += h.hlen;
        switch (h.type) {
        case LMC_MP_STR:
        case LMC_MP_BIN:
        case LMC_MP_EXT:
            r->p += h.n;
            break;
        case LMC_MP_ARRAY:
            todo += h.n;
            break;
        case LMC_MP_MAP:
            todo += 2 * h.n;
            break;
        default:
            break;
        }
        if (todo > lmc_mp_left(r)) {
            r->p = start;
            return -EPROTO;
        }
    }
    return 0;
}

int lmc_mp_check_one(const void *buf, size_t n)
{
    struct lmc_mp_reader r;
    lmc_mp_reader_init(&r, buf, n);
    int rc = lmc_mp_skip(&r);
    if (rc)
        return rc;
    return lmc_mp_left(&r) == 0 ? 0 : -EPROTO;
}

void lmc_mp_writer_init(struct lmc_mp_writer *w)
{
    memset(w, 0, sizeof(*w));
}

void lmc_mp_writer_init_fixed(struct lmc_mp_writer *w, uint8_t *buf, size_t cap)
{
    *w = (struct lmc_mp_writer){.buf = buf, .cap = cap, .fixed = true};
}

void lmc_mp_writer_reset(struct lmc_mp_writer *w)
{
    w->len = 0;
    w->failed = false;
}

void lmc_mp_writer_free(struct lmc_mp_writer *w)
{
    if (!w->fixed)
        free(w->buf);
    memset(w, 0, sizeof(*w));
}

/* Room for n more bytes, or NULL (and failed set). */
static uint8_t *room(struct lmc_mp_writer *w, size_t n)
{
    if (w->failed)
        return NULL;
    if (n > SIZE_MAX / 2 - w->len) {
        w->failed = true;
        return NULL;
    }
    if (w->len + n > w->cap) {
        if (w->fixed) {
            w->failed = true;
            return NULL;
        }
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n)
            cap *= 2;
        uint8_t *b = realloc(w->buf, cap);
        if (!b) {
            w->failed = true;
            return NULL;
        }
        w->buf = b;
        w->cap = cap;
    }
    uint8_t *p = w->buf + w->len;
    w->len += n;
    return p;
}

static void put_be(struct lmc_mp_writer *w, uint8_t tag, uint64_t v, unsigned n)
{
    uint8_t *p = room(w, 1 + (size_t)n);
    if (!p)
        return;
    p[0] = tag;
    for (unsigned i = 0; i < n; i++)
        p[1 + i] = (uint8_t)(v >> (8 * (n - 1 - i)));
}

void lmc_mp_put_nil(struct lmc_mp_writer *w)
{
    put_be(w, 0xc0, 0, 0);
}

void lmc_mp_put_bool(struct lmc_mp_writer *w, bool v)
{
    put_be(w, v ? 0xc3 : 0xc2, 0, 0);
}

const char *lmc_mp_error_words(int rc)
{
    switch (rc) {
    case -EPROTO:
        return "is not valid msgpack (truncated?)";
    case -ERANGE:
        return "is out of range";
    case -E2BIG:
        return "is too long";
    default:
        return "has the wrong type";
    }
}

void lmc_mp_put_uint(struct lmc_mp_writer *w, uint64_t v)
{
    if (v <= 0x7f)
        put_be(w, (uint8_t)v, 0, 0);
    else if (v <= UINT8_MAX)
        put_be(w, 0xcc, v, 1);
    else if (v <= UINT16_MAX)
        put_be(w, 0xcd, v, 2);
    else if (v <= UINT32_MAX)
        put_be(w, 0xce, v, 4);
    else
        put_be(w, 0xcf, v, 8);
}

void lmc_mp_put_int(struct lmc_mp_writer *w, int64_t v)
{
    if (v >= 0)
        lmc_mp_put_uint(w, (uint64_t)v);
    else if (v >= -32)
        put_be(w, (uint8_t)(int8_t)v, 0, 0);
    else if (v >= INT8_MIN)
        put_be(w, 0xd0, (uint8_t)(int8_t)v, 1);
    else if (v >= INT16_MIN)
        put_be(w, 0xd1, (uint16_t)(int16_t)v, 2);
    else if (v >= INT32_MIN)
        put_be(w, 0xd2, (uint32_t)(int32_t)v, 4);
    else
        put_be(w, 0xd3, (uint64_t)v, 8);
}

static void put_bytes(struct lmc_mp_writer *w, const void *b, size_t len)
{
    uint8_t *p = room(w, len);
    if (p && len)
        memcpy(p, b, len);
}

void lmc_mp_put_str(struct lmc_mp_writer *w, const char *s, size_t len)
{
    if (len <= 31)
        put_be(w, (uint8_t)(0xa0 | len), 0, 0);
    else if (len <= UINT8_MAX)
        put_be(w, 0xd9, len, 1);
    else if (len <= UINT16_MAX)
        put_be(w, 0xda, len, 2);
    else if (len <= UINT32_MAX)
        put_be(w, 0xdb, len, 4);
    else
        w->failed = true;
    put_bytes(w, s, len);
}

void lmc_mp_put_cstr(struct lmc_mp_writer *w, const char *s)
{
    lmc_mp_put_str(w, s, strlen(s));
}

void lmc_mp_put_bin(struct lmc_mp_writer *w, const void *b, size_t len)
{
    lmc_mp_put_bin_header(w, len);
    put_bytes(w, b, len);
}

uint8_t *lmc_mp_put_room(struct lmc_mp_writer *w, size_t n)
{
    return room(w, n);
}

void lmc_mp_put_bin_header(struct lmc_mp_writer *w, size_t len)
{
    if (len <= UINT8_MAX)
        put_be(w, 0xc4, len, 1);
    else if (len <= UINT16_MAX)
        put_be(w, 0xc5, len, 2);
    else if (len <= UINT32_MAX)
        put_be(w, 0xc6, len, 4);
    else
        w->failed = true;
}

static void put_container(struct lmc_mp_writer *w, uint8_t fix, uint8_t t16, uint32_t n)
{
    if (n <= 15)
        put_be(w, (uint8_t)(fix | n), 0, 0);
    else if (n <= UINT16_MAX)
        put_be(w, t16, n, 2);
    else
        put_be(w, (uint8_t)(t16 + 1), n, 4);
}

void lmc_mp_put_array(struct lmc_mp_writer *w, uint32_t n)
{
    put_container(w, 0x90, 0xdc, n);
}

void lmc_mp_put_map(struct lmc_mp_writer *w, uint32_t n)
{
    put_container(w, 0x80, 0xde, n);
}
