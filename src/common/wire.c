/*
 * wire.c - frame header codec and the bounds-checked buffer reader/writer.
 *
 * Design: every decoder in kvpool reads through struct kvp_rbuf, whose error flag is sticky, so a
 * message decoder is a straight sequence of kvp_get_*() calls followed by one kvp_rbuf_finish()
 * check; no field can be read past the end of the received bytes, and trailing garbage is an
 * error. Writers append to a growable kvp_wbuf whose allocation failure is also sticky. Integers
 * are explicitly little-endian byte by byte, independent of the host's byte order.
 *
 * Thread safety: none needed; buffers belong to one caller.
 */
#include "common/wire.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/le.h"

const char *kvp_opcode_name(uint16_t opcode)
{
    switch (opcode & ~KVP_REPLY_FLAG) {
#define KVP_OPCODE_NAME(name, val) \
    case val:                      \
        return #name;
        KVP_OPCODE_MAP(KVP_OPCODE_NAME)
#undef KVP_OPCODE_NAME
    default:
        return "?";
    }
}

/* Header layout: magic@0 version@4 opcode@6 request_id@8 body_len@16 status@20 payload_len@24. */
void kvp_header_encode(const struct kvp_header *h, uint8_t out[KVP_HEADER_SIZE])
{
    kvp_put_le32(out + 0, h->magic);
    kvp_put_le16(out + 4, h->version);
    kvp_put_le16(out + 6, h->opcode);
    kvp_put_le64(out + 8, h->request_id);
    kvp_put_le32(out + 16, h->body_len);
    kvp_put_le32(out + 20, (uint32_t)h->status);
    kvp_put_le64(out + 24, h->payload_len);
}

void kvp_reply_header_encode(const struct kvp_header *req, int32_t status, uint32_t body_len,
                             uint64_t payload_len, uint8_t out[KVP_HEADER_SIZE])
{
    uint16_t op = (uint16_t)(req->opcode & ~KVP_REPLY_FLAG);
    struct kvp_header h = {
        .magic = KVP_MAGIC,
        .version = KVP_PROTO_VERSION,
        .opcode = (uint16_t)((op == 0 || op >= KVP_OP_MAX_ ? 0 : op) | KVP_REPLY_FLAG),
        .request_id = req->request_id,
        .body_len = body_len,
        .status = status,
        .payload_len = payload_len,
    };
    kvp_header_encode(&h, out);
}

int kvp_header_decode(const uint8_t in[KVP_HEADER_SIZE], struct kvp_header *h)
{
    h->magic = kvp_get_le32(in + 0);
    h->version = kvp_get_le16(in + 4);
    h->opcode = kvp_get_le16(in + 6);
    h->request_id = kvp_get_le64(in + 8);
    h->body_len = kvp_get_le32(in + 16);
    h->status = (int32_t)kvp_get_le32(in + 20);
    h->payload_len = kvp_get_le64(in + 24);

    if (h->magic != KVP_MAGIC)
        return -EPROTO;
    /* Version is checked before anything else is trusted, so that a future client gets a clear
     * EPROTONOSUPPORT rather than a confusing decode error. */
    if (h->version != KVP_PROTO_VERSION)
        return -EPROTONOSUPPORT;
    uint16_t op = h->opcode & (uint16_t)~KVP_REPLY_FLAG;
    /* Opcode 0 exists only as a reply: the answer to a header that could not be decoded. */
    if (op >= KVP_OP_MAX_ || (op == 0 && !(h->opcode & KVP_REPLY_FLAG)))
        return -EPROTO;
    if (h->body_len > KVP_MAX_BODY)
        return -EPROTO;
    return 0;
}

void kvp_wbuf_init(struct kvp_wbuf *w)
{
    *w = (struct kvp_wbuf){0};
}

void kvp_wbuf_free(struct kvp_wbuf *w)
{
    free(w->data);
    *w = (struct kvp_wbuf){0};
}

void kvp_wbuf_reset(struct kvp_wbuf *w)
{
    w->len = 0;
    w->err = 0;
}

/* Returns a pointer to n fresh bytes at the end of the buffer, or NULL (sticky -ENOMEM). */
static uint8_t *wbuf_grow(struct kvp_wbuf *w, size_t n)
{
    if (w->err)
        return NULL;
    if (n > SIZE_MAX / 2 - w->len) {
        w->err = -ENOMEM;
        return NULL;
    }
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n)
            cap *= 2;
        uint8_t *d = realloc(w->data, cap);
        if (!d) {
            w->err = -ENOMEM;
            return NULL;
        }
        w->data = d;
        w->cap = cap;
    }
    uint8_t *p = w->data + w->len;
    w->len += n;
    return p;
}

void kvp_put_u8(struct kvp_wbuf *w, uint8_t v)
{
    uint8_t *p = wbuf_grow(w, 1);
    if (p)
        *p = v;
}

void kvp_put_u16(struct kvp_wbuf *w, uint16_t v)
{
    uint8_t *p = wbuf_grow(w, 2);
    if (p)
        kvp_put_le16(p, v);
}

void kvp_put_u32(struct kvp_wbuf *w, uint32_t v)
{
    uint8_t *p = wbuf_grow(w, 4);
    if (p)
        kvp_put_le32(p, v);
}

void kvp_put_u32_array(struct kvp_wbuf *w, const uint32_t *v, size_t n)
{
    if (n > SIZE_MAX / 4) {
        w->err = -ENOMEM;
        return;
    }
    uint8_t *p = wbuf_grow(w, n * 4);
    if (!p || !n)
        return;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(p, v, n * 4);
#else
    for (size_t i = 0; i < n; i++)
        kvp_put_le32(p + 4 * i, v[i]);
#endif
}

void kvp_put_u64(struct kvp_wbuf *w, uint64_t v)
{
    uint8_t *p = wbuf_grow(w, 8);
    if (p)
        kvp_put_le64(p, v);
}

void kvp_put_bytes(struct kvp_wbuf *w, const void *src, size_t n)
{
    if (n == 0)
        return;
    uint8_t *p = wbuf_grow(w, n);
    if (p)
        memcpy(p, src, n);
}

void kvp_put_blob(struct kvp_wbuf *w, const void *src, uint16_t n)
{
    kvp_put_u16(w, n);
    kvp_put_bytes(w, src, n);
}

void kvp_put_str(struct kvp_wbuf *w, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n > UINT16_MAX) {
        /* Callers bound their strings far below this; refuse rather than truncate silently. */
        w->err = -EINVAL;
        return;
    }
    kvp_put_blob(w, s, (uint16_t)n);
}

void kvp_rbuf_init(struct kvp_rbuf *r, const void *p, size_t len)
{
    *r = (struct kvp_rbuf){.p = p, .len = len};
}

static const uint8_t *rbuf_take(struct kvp_rbuf *r, size_t n)
{
    if (r->err || n > r->len - r->off) {
        r->err = -EPROTO;
        return NULL;
    }
    const uint8_t *p = r->p + r->off;
    r->off += n;
    return p;
}

uint8_t kvp_get_u8(struct kvp_rbuf *r)
{
    const uint8_t *p = rbuf_take(r, 1);
    return p ? p[0] : 0;
}

uint16_t kvp_get_u16(struct kvp_rbuf *r)
{
    const uint8_t *p = rbuf_take(r, 2);
    return p ? kvp_get_le16(p) : 0;
}

uint32_t kvp_get_u32(struct kvp_rbuf *r)
{
    const uint8_t *p = rbuf_take(r, 4);
    return p ? kvp_get_le32(p) : 0;
}

uint64_t kvp_get_u64(struct kvp_rbuf *r)
{
    const uint8_t *p = rbuf_take(r, 8);
    return p ? kvp_get_le64(p) : 0;
}

const void *kvp_get_bytes(struct kvp_rbuf *r, size_t n)
{
    return rbuf_take(r, n);
}

const void *kvp_get_blob(struct kvp_rbuf *r, uint16_t *len, size_t max)
{
    uint16_t n = kvp_get_u16(r);
    *len = 0;
    if (r->err)
        return NULL;
    if (n > max) {
        r->err = -EPROTO;
        return NULL;
    }
    const void *p = rbuf_take(r, n);
    if (p)
        *len = n;
    return p;
}

void kvp_get_str(struct kvp_rbuf *r, char *out, size_t size, size_t max)
{
    uint16_t n;
    if (size == 0) {
        r->err = -EPROTO;
        return;
    }
    out[0] = '\0';
    if (max >= size) {
        r->err = -EPROTO;
        return;
    }
    const char *p = kvp_get_blob(r, &n, max);
    if (!p)
        return;
    if (memchr(p, '\0', n)) {
        r->err = -EPROTO;
        return;
    }
    memcpy(out, p, n);
    out[n] = '\0';
}

int kvp_rbuf_finish(const struct kvp_rbuf *r)
{
    if (r->err)
        return r->err;
    return r->off == r->len ? 0 : -EPROTO;
}
