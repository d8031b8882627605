/*
 * fuzz_request.c - the request body decoders the daemon runs on what a client sends:
 * kvp_decode_register_req (REGISTER), kvp_decode_key_req (LOOKUP, PREPARE_STORE,
 * PREPARE_RETRIEVE, RETRIEVE_INLINE) and kvp_decode_ref_req (UNREGISTER, COMMIT_STORE,
 * ABORT_STORE, STORE_INLINE, COMMIT_RETRIEVE).
 *
 * Input: one selector byte (which decoder, modulo 3), then the body. An accepted body must
 * respect every limit of wire.h, point only inside itself, and re-encode to exactly the same
 * bytes: the decoders are strict, so there is one encoding per message.
 */
#include <string.h>

#include "common/msg.h"
#include "fuzz.h"

static void check_same(struct kvp_wbuf *w, const uint8_t *body, size_t len)
{
    FUZZ_CHECK(w->err == 0);
    FUZZ_CHECK(w->len == len);
    FUZZ_CHECK(len == 0 || memcmp(w->data, body, len) == 0);
}

static void check_str(const char *s, size_t max)
{
    FUZZ_CHECK(strlen(s) <= max);
}

static void fuzz_register(const uint8_t *body, size_t len, struct kvp_wbuf *w)
{
    struct kvp_register_req m;
    if (kvp_decode_register_req(body, len, &m) != 0)
        return;
    check_str(m.instance_id, KVP_MAX_NAME);
    check_str(m.model_name, KVP_MAX_NAME);
    check_str(m.dtype, KVP_MAX_NAME);
    check_str(m.reason, KVP_MAX_REASON);
    kvp_encode_register_req(w, &m);
    check_same(w, body, len);
}

static void fuzz_key(const uint8_t *body, size_t len, struct kvp_wbuf *w)
{
    struct kvp_key_req m;
    if (kvp_decode_key_req(body, len, &m) != 0)
        return;
    FUZZ_CHECK(m.salt_len <= KVP_MAX_SALT);
    FUZZ_CHECK(m.ntokens <= KVP_MAX_TOKENS);
    /* Both views point into the body, and the tokens end where the body ends. */
    FUZZ_CHECK(m.salt != NULL && m.salt >= body && m.salt + m.salt_len <= body + len);
    FUZZ_CHECK(m.tokens != NULL && m.tokens + (size_t)m.ntokens * 4 == body + len);

    uint32_t *tokens = malloc((size_t)m.ntokens * sizeof(*tokens) + 1);
    FUZZ_CHECK(tokens != NULL);
    for (uint32_t i = 0; i < m.ntokens; i++)
        tokens[i] = kvp_key_token(&m, i);
    kvp_encode_key_req(w, m.handle, m.start, m.end, tokens, m.ntokens, m.salt, m.salt_len);
    free(tokens);
    check_same(w, body, len);
}

static void fuzz_ref(const uint8_t *body, size_t len, struct kvp_wbuf *w)
{
    struct kvp_ref_req m;
    if (kvp_decode_ref_req(body, len, &m) != 0)
        return;
    kvp_encode_ref_req(w, &m);
    check_same(w, body, len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvp_wbuf w;

    if (size < 1)
        return 0;
    /* A private copy of exactly the body's size, so that ASan sees any read past its end. */
    size_t len = size - 1;
    uint8_t *body = malloc(len ? len : 1);
    FUZZ_CHECK(body != NULL);
    if (len)
        memcpy(body, data + 1, len);

    kvp_wbuf_init(&w);
    switch (data[0] % 3) {
    case 0:
        fuzz_register(body, len, &w);
        break;
    case 1:
        fuzz_key(body, len, &w);
        break;
    default:
        fuzz_ref(body, len, &w);
        break;
    }
    kvp_wbuf_free(&w);
    free(body);
    return 0;
}
