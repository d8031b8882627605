/*
 * msg.c - encoders and strict decoders of every kvpool message body.
 *
 * Each decoder reads fields in wire order through kvp_rbuf, checks each variable length against
 * its limit before touching the bytes, and finishes with kvp_rbuf_finish() so that a short or
 * over-long body is always -EPROTO. Decoders never allocate: variable parts either point into
 * the body (token ids, salt) or are copied into caller-sized arrays. The field order here is
 * the normative definition that docs/PROTOCOL.md describes.
 */
#include "common/msg.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

void kvp_encode_hello_reply(struct kvp_wbuf *w, const struct kvp_hello_reply *m)
{
    kvp_put_u16(w, m->major);
    kvp_put_u16(w, m->minor);
    kvp_put_u32(w, m->pid);
    kvp_put_u32(w, m->chunk_tokens);
    kvp_put_u32(w, m->shm_backend);
    kvp_put_u64(w, m->segment_size);
    kvp_put_bytes(w, m->nonce, KVP_NONCE_SIZE);
    kvp_put_str(w, m->shm_name);
    kvp_put_str(w, m->shm_reason);
}

int kvp_decode_hello_reply(const void *body, size_t len, struct kvp_hello_reply *m)
{
    struct kvp_rbuf r;
    kvp_rbuf_init(&r, body, len);
    m->major = kvp_get_u16(&r);
    m->minor = kvp_get_u16(&r);
    m->pid = kvp_get_u32(&r);
    m->chunk_tokens = kvp_get_u32(&r);
    m->shm_backend = kvp_get_u32(&r);
    if (!r.err && m->shm_backend > KVP_WIRE_BACKEND_MEMFD)
        return -EPROTO;
    m->segment_size = kvp_get_u64(&r);
    const void *nonce = kvp_get_bytes(&r, KVP_NONCE_SIZE);
    if (nonce)
        memcpy(m->nonce, nonce, KVP_NONCE_SIZE);
    kvp_get_str(&r, m->shm_name, sizeof(m->shm_name), KVP_MAX_NAME);
    kvp_get_str(&r, m->shm_reason, sizeof(m->shm_reason), KVP_MAX_REASON);
    return kvp_rbuf_finish(&r);
}

void kvp_encode_register_req(struct kvp_wbuf *w, const struct kvp_register_req *m)
{
    kvp_put_str(w, m->instance_id);
    kvp_put_str(w, m->model_name);
    kvp_put_str(w, m->dtype);
    kvp_put_u32(w, m->world_size);
    kvp_put_u32(w, m->worker_rank);
    kvp_put_u32(w, m->block_size);
    kvp_put_u32(w, m->num_layers);
    kvp_put_u32(w, m->hidden_dim);
    kvp_put_u8(w, m->use_mla);
    kvp_put_u8(w, m->transport);
    kvp_put_str(w, m->reason);
}

int kvp_decode_register_req(const void *body, size_t len, struct kvp_register_req *m)
{
    struct kvp_rbuf r;
    kvp_rbuf_init(&r, body, len);
    kvp_get_str(&r, m->instance_id, sizeof(m->instance_id), KVP_MAX_NAME);
    kvp_get_str(&r, m->model_name, sizeof(m->model_name), KVP_MAX_NAME);
    kvp_get_str(&r, m->dtype, sizeof(m->dtype), KVP_MAX_NAME);
    m->world_size = kvp_get_u32(&r);
    m->worker_rank = kvp_get_u32(&r);
    m->block_size = kvp_get_u32(&r);
    m->num_layers = kvp_get_u32(&r);
    m->hidden_dim = kvp_get_u32(&r);
    m->use_mla = kvp_get_u8(&r);
    m->transport = kvp_get_u8(&r);
    kvp_get_str(&r, m->reason, sizeof(m->reason), KVP_MAX_REASON);
    return kvp_rbuf_finish(&r);
}

void kvp_encode_register_reply(struct kvp_wbuf *w, const struct kvp_register_reply *m)
{
    kvp_put_u32(w, m->handle);
    kvp_put_u8(w, m->transport);
    kvp_put_u8(w, m->existing);
    kvp_put_u8(w, m->ndim);
    kvp_put_u32(w, m->chunk_tokens);
    for (int i = 0; i < 4; i++)
        kvp_put_u32(w, m->shape[i]);
    kvp_put_u64(w, m->chunk_bytes);
    kvp_put_u32(w, m->dtype_size);
    kvp_put_str(w, m->dtype);
    kvp_put_str(w, m->shm_name);
    kvp_put_u64(w, m->segment_size);
    kvp_put_str(w, m->reason);
}

int kvp_decode_register_reply(const void *body, size_t len, struct kvp_register_reply *m)
{
    struct kvp_rbuf r;
    kvp_rbuf_init(&r, body, len);
    m->handle = kvp_get_u32(&r);
    m->transport = kvp_get_u8(&r);
    m->existing = kvp_get_u8(&r);
    m->ndim = kvp_get_u8(&r);
    m->chunk_tokens = kvp_get_u32(&r);
    for (int i = 0; i < 4; i++)
        m->shape[i] = kvp_get_u32(&r);
    m->chunk_bytes = kvp_get_u64(&r);
    m->dtype_size = kvp_get_u32(&r);
    kvp_get_str(&r, m->dtype, sizeof(m->dtype), KVP_MAX_NAME);
    kvp_get_str(&r, m->shm_name, sizeof(m->shm_name), KVP_MAX_NAME);
    m->segment_size = kvp_get_u64(&r);
    kvp_get_str(&r, m->reason, sizeof(m->reason), KVP_MAX_REASON);
    if (!r.err && (m->ndim < 3 || m->ndim > 4))
        return -EPROTO;
    return kvp_rbuf_finish(&r);
}

void kvp_encode_key_req(struct kvp_wbuf *w, uint32_t handle, uint32_t start, uint32_t end,
                        const uint32_t *tokens, uint32_t ntokens, const void *salt,
                        uint16_t salt_len)
{
    kvp_put_u32(w, handle);
    kvp_put_u32(w, start);
    kvp_put_u32(w, end);
    kvp_put_blob(w, salt, salt_len);
    kvp_put_u32(w, ntokens);
    kvp_put_u32_array(w, tokens, ntokens);
}

int kvp_decode_key_req(const void *body, size_t len, struct kvp_key_req *m)
{
    struct kvp_rbuf r;
    kvp_rbuf_init(&r, body, len);
    m->handle = kvp_get_u32(&r);
    m->start = kvp_get_u32(&r);
    m->end = kvp_get_u32(&r);
    m->salt = kvp_get_blob(&r, &m->salt_len, KVP_MAX_SALT);
    m->ntokens = kvp_get_u32(&r);
    if (!r.err && m->ntokens > KVP_MAX_TOKENS)
        return -EPROTO;
    m->tokens = kvp_get_bytes(&r, (size_t)m->ntokens * 4);
    return kvp_rbuf_finish(&r);
}

uint32_t kvp_key_token(const struct kvp_key_req *m, uint32_t i)
{
    const uint8_t *p = m->tokens + (size_t)i * 4;
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

void kvp_encode_ref_req(struct kvp_wbuf *w, const struct kvp_ref_req *m)
{
    kvp_put_u32(w, m->handle);
    kvp_put_u64(w, m->id);
}

int kvp_decode_ref_req(const void *body, size_t len, struct kvp_ref_req *m)
{
    struct kvp_rbuf r;
    kvp_rbuf_init(&r, body, len);
    m->handle = kvp_get_u32(&r);
    m->id = kvp_get_u64(&r);
    return kvp_rbuf_finish(&r);
}

void kvp_encode_lookup_reply(struct kvp_wbuf *w, const struct kvp_lookup_reply *m)
{
    kvp_put_u32(w, m->nchunks);
    kvp_put_u32(w, m->cached);
}

int kvp_decode_lookup_reply(const void *body, size_t len, struct kvp_lookup_reply *m)
{
    struct kvp_rbuf r;
    kvp_rbuf_init(&r, body, len);
    m->nchunks = kvp_get_u32(&r);
    m->cached = kvp_get_u32(&r);
    if (!r.err && m->cached > m->nchunks)
        return -EPROTO;
    return kvp_rbuf_finish(&r);
}

void kvp_encode_slots_reply(struct kvp_wbuf *w, const struct kvp_slots_reply *m)
{
    kvp_put_u64(w, m->id);
    kvp_put_u32(w, m->nchunks);
    kvp_put_u32(w, m->cached);
    kvp_put_u32(w, m->busy);
    kvp_put_u32(w, m->no_space);
    kvp_put_u32(w, m->nslots);
    for (uint32_t i = 0; i < m->nslots; i++) {
        kvp_put_u32(w, m->slots[i].chunk_index);
        kvp_put_u64(w, m->slots[i].offset);
        kvp_put_u64(w, m->slots[i].length);
    }
}

int kvp_decode_slots_reply(const void *body, size_t len, struct kvp_slots_reply *m)
{
    struct kvp_rbuf r;
    kvp_rbuf_init(&r, body, len);
    m->id = kvp_get_u64(&r);
    m->nchunks = kvp_get_u32(&r);
    m->cached = kvp_get_u32(&r);
    m->busy = kvp_get_u32(&r);
    m->no_space = kvp_get_u32(&r);
    m->nslots = kvp_get_u32(&r);
    if (r.err)
        return -EPROTO;
    if (m->nchunks > KVP_MAX_CHUNKS || m->nslots > m->nchunks)
        return -EPROTO;
    for (uint32_t i = 0; i < m->nslots; i++) {
        m->slots[i].chunk_index = kvp_get_u32(&r);
        m->slots[i].offset = kvp_get_u64(&r);
        m->slots[i].length = kvp_get_u64(&r);
        if (!r.err && m->slots[i].chunk_index >= m->nchunks)
            return -EPROTO;
    }
    return kvp_rbuf_finish(&r);
}

void kvp_encode_count_reply(struct kvp_wbuf *w, uint32_t count)
{
    kvp_put_u32(w, count);
}

int kvp_decode_count_reply(const void *body, size_t len, struct kvp_count_reply *m)
{
    struct kvp_rbuf r;
    kvp_rbuf_init(&r, body, len);
    m->count = kvp_get_u32(&r);
    return kvp_rbuf_finish(&r);
}

void kvp_encode_stats_reply(struct kvp_wbuf *w, const struct kvp_stat_entry *e, uint32_t n)
{
    kvp_put_u32(w, n);
    for (uint32_t i = 0; i < n; i++) {
        kvp_put_str(w, e[i].name);
        kvp_put_u64(w, e[i].value);
    }
}

int kvp_decode_stats_reply(const void *body, size_t len, struct kvp_stat_entry *e, size_t cap)
{
    struct kvp_rbuf r;
    struct kvp_stat_entry scratch;
    kvp_rbuf_init(&r, body, len);
    uint32_t n = kvp_get_u32(&r);
    if (r.err || n > KVP_MAX_STATS)
        return -EPROTO;
    for (uint32_t i = 0; i < n; i++) {
        /* cppcheck-suppress uninitvar ; scratch is only written: entries past cap are dropped */
        struct kvp_stat_entry *d = i < cap ? &e[i] : &scratch;
        kvp_get_str(&r, d->name, sizeof(d->name), sizeof(d->name) - 1);
        d->value = kvp_get_u64(&r);
    }
    int rc = kvp_rbuf_finish(&r);
    return rc ? rc : (int)n;
}

void kvp_encode_text_reply(struct kvp_wbuf *w, const char *text, uint32_t len)
{
    kvp_put_u32(w, len);
    kvp_put_bytes(w, text, len);
}

int kvp_decode_text_reply(const void *body, size_t len, const char **text, uint32_t *text_len)
{
    struct kvp_rbuf r;
    kvp_rbuf_init(&r, body, len);
    uint32_t n = kvp_get_u32(&r);
    if (r.err || n > KVP_MAX_TEXT)
        return -EPROTO;
    const char *p = kvp_get_bytes(&r, n);
    /* A NUL would silently cut the document short once it is a C string. */
    if (r.err || memchr(p, '\0', n))
        return -EPROTO;
    int rc = kvp_rbuf_finish(&r);
    if (rc == 0) {
        *text = p;
        *text_len = n;
    }
    return rc;
}

void kvp_encode_error(struct kvp_wbuf *w, const char *msg)
{
    char buf[KVP_MAX_ERRMSG + 1];
    /* Truncate long messages instead of failing: the status code is what matters. */
    snprintf(buf, sizeof(buf), "%s", msg ? msg : "");
    kvp_put_str(w, buf);
}

int kvp_decode_error(const void *body, size_t len, char *msg, size_t size)
{
    struct kvp_rbuf r;
    kvp_rbuf_init(&r, body, len);
    kvp_get_str(&r, msg, size, size - 1 < KVP_MAX_ERRMSG ? size - 1 : KVP_MAX_ERRMSG);
    return kvp_rbuf_finish(&r);
}
