/*
 * test_msg.c - every message encoder/decoder of msg.c: round trips, and rejection of malformed
 * bodies (truncation at every byte, trailing bytes, every limit).
 *
 * Decoders are fed exact-size heap copies so that a sanitizer build catches any read past the
 * received bytes.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_assert.h"
#include "common/msg.h"

static struct kvp_wire_slot slot_scratch[KVP_MAX_CHUNKS];

/* A decoder under test: returns its result for body[0..len). */
typedef int (*decode_fn)(const void *body, size_t len);

/* Runs fn on an exact-size heap copy of the first len bytes of body. */
static int decode_copy(decode_fn fn, const uint8_t *body, size_t len)
{
    uint8_t *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    if (len)
        memcpy(copy, body, len);
    int rc = fn(copy, len);
    free(copy);
    return rc;
}

/* A valid encoding must decode; every proper prefix and one trailing byte must be -EPROTO. */
static void check_strict(decode_fn fn, const struct kvp_wbuf *w)
{
    assert_rc(w->err, 0);
    assert_true(decode_copy(fn, w->data, w->len) >= 0);
    for (size_t len = 0; len < w->len; len++) {
        int rc = decode_copy(fn, w->data, len);
        if (rc != -EPROTO)
            fail_msg("truncated at %zu of %zu bytes: decoder returned %d, expected -EPROTO", len,
                     w->len, rc);
    }
    uint8_t *longer = malloc(w->len + 1);
    assert_non_null(longer);
    memcpy(longer, w->data, w->len);
    longer[w->len] = 0;
    assert_rc(decode_copy(fn, longer, w->len + 1), -EPROTO);
    free(longer);
}

/* ---- HELLO ---------------------------------------------------------------------------- */

static struct kvp_hello_reply sample_hello(void)
{
    struct kvp_hello_reply m = {
        .major = 1,
        .minor = 3,
        .pid = 4242,
        .chunk_tokens = 256,
        .shm_backend = 1,
        .segment_size = (1ull << 33) + 4096,
    };
    for (int i = 0; i < KVP_NONCE_SIZE; i++)
        m.nonce[i] = (uint8_t)(0xa0 + i);
    strcpy(m.shm_name, "kvpool_l1_pool_4242");
    strcpy(m.shm_reason, "");
    return m;
}

static int dec_hello(const void *b, size_t n)
{
    struct kvp_hello_reply m;
    return kvp_decode_hello_reply(b, n, &m);
}

static void test_hello(void **state)
{
    (void)state;
    struct kvp_hello_reply m = sample_hello(), d;
    struct kvp_wbuf w;

    kvp_wbuf_init(&w);
    kvp_encode_hello_reply(&w, &m);
    assert_rc(kvp_decode_hello_reply(w.data, w.len, &d), 0);
    assert_int_equal(d.major, 1);
    assert_int_equal(d.minor, 3);
    assert_int_equal(d.pid, 4242);
    assert_int_equal(d.chunk_tokens, 256);
    assert_int_equal(d.shm_backend, 1);
    assert_int_equal(d.segment_size, m.segment_size);
    assert_memory_equal(d.nonce, m.nonce, KVP_NONCE_SIZE);
    assert_string_equal(d.shm_name, m.shm_name);
    assert_string_equal(d.shm_reason, "");
    check_strict(dec_hello, &w);

    /* Disabled, with a reason. */
    strcpy(m.shm_name, "");
    strcpy(m.shm_reason, "Insufficient /dev/shm capacity");
    m.shm_backend = 0;
    kvp_wbuf_reset(&w);
    kvp_encode_hello_reply(&w, &m);
    assert_rc(kvp_decode_hello_reply(w.data, w.len, &d), 0);
    assert_string_equal(d.shm_name, "");
    assert_string_equal(d.shm_reason, m.shm_reason);
    check_strict(dec_hello, &w);
    kvp_wbuf_free(&w);
}

/* Hand-built HELLO body with a shm name of name_len bytes. */
static void hello_with_name(struct kvp_wbuf *w, size_t name_len)
{
    char name[300];
    memset(name, 'n', name_len);
    name[name_len] = '\0';
    kvp_put_u16(w, 1);
    kvp_put_u16(w, 0);
    kvp_put_u32(w, 1);
    kvp_put_u32(w, 256);
    kvp_put_u32(w, 1);
    kvp_put_u64(w, 1 << 20);
    kvp_put_bytes(w, "0123456789abcdef", KVP_NONCE_SIZE);
    kvp_put_str(w, name);
    kvp_put_str(w, "");
}

static void test_hello_name_limit(void **state)
{
    (void)state;
    struct kvp_hello_reply d;
    struct kvp_wbuf w;

    kvp_wbuf_init(&w);
    hello_with_name(&w, KVP_MAX_NAME);
    assert_rc(kvp_decode_hello_reply(w.data, w.len, &d), 0);
    assert_int_equal(strlen(d.shm_name), KVP_MAX_NAME);
    kvp_wbuf_reset(&w);
    hello_with_name(&w, KVP_MAX_NAME + 1);
    assert_rc(kvp_decode_hello_reply(w.data, w.len, &d), -EPROTO);
    kvp_wbuf_free(&w);
}

/* ---- REGISTER --------------------------------------------------------------------------- */

static struct kvp_register_req sample_register_req(void)
{
    struct kvp_register_req m = {
        .world_size = 8,
        .worker_rank = 3,
        .block_size = 16,
        .num_layers = 32,
        .hidden_dim = 1024,
        .use_mla = 1,
        .transport = KVP_WIRE_INLINE,
    };
    strcpy(m.instance_id, "vllm-rank3-pid77");
    strcpy(m.model_name, "meta-llama/Llama-3-8B");
    strcpy(m.dtype, "bfloat16");
    strcpy(m.reason, "cannot open /dev/shm/x: Permission denied");
    return m;
}

static int dec_register_req(const void *b, size_t n)
{
    struct kvp_register_req m;
    return kvp_decode_register_req(b, n, &m);
}

static void test_register_req(void **state)
{
    (void)state;
    struct kvp_register_req m = sample_register_req(), d;
    struct kvp_wbuf w;

    kvp_wbuf_init(&w);
    kvp_encode_register_req(&w, &m);
    assert_rc(kvp_decode_register_req(w.data, w.len, &d), 0);
    assert_string_equal(d.instance_id, m.instance_id);
    assert_string_equal(d.model_name, m.model_name);
    assert_string_equal(d.dtype, m.dtype);
    assert_int_equal(d.world_size, 8);
    assert_int_equal(d.worker_rank, 3);
    assert_int_equal(d.block_size, 16);
    assert_int_equal(d.num_layers, 32);
    assert_int_equal(d.hidden_dim, 1024);
    assert_int_equal(d.use_mla, 1);
    assert_int_equal(d.transport, KVP_WIRE_INLINE);
    assert_string_equal(d.reason, m.reason);
    check_strict(dec_register_req, &w);
    kvp_wbuf_free(&w);
}

static struct kvp_register_reply sample_register_reply(void)
{
    struct kvp_register_reply m = {
        .handle = 0x00010002,
        .transport = KVP_WIRE_SHM,
        .existing = 1,
        .ndim = 4,
        .chunk_tokens = 256,
        .shape = {2, 32, 256, 1024},
        .chunk_bytes = 2ull * 32 * 256 * 1024 * 2,
        .dtype_size = 2,
        .segment_size = 1ull << 30,
    };
    strcpy(m.dtype, "float16");
    strcpy(m.shm_name, "kvpool_l1_pool_1");
    strcpy(m.reason, "");
    return m;
}

static int dec_register_reply(const void *b, size_t n)
{
    struct kvp_register_reply m;
    return kvp_decode_register_reply(b, n, &m);
}

static void test_register_reply(void **state)
{
    (void)state;
    struct kvp_register_reply m = sample_register_reply(), d;
    struct kvp_wbuf w;

    kvp_wbuf_init(&w);
    kvp_encode_register_reply(&w, &m);
    assert_rc(kvp_decode_register_reply(w.data, w.len, &d), 0);
    assert_int_equal(d.handle, m.handle);
    assert_int_equal(d.transport, KVP_WIRE_SHM);
    assert_int_equal(d.existing, 1);
    assert_int_equal(d.ndim, 4);
    assert_int_equal(d.chunk_tokens, 256);
    assert_memory_equal(d.shape, m.shape, sizeof(m.shape));
    assert_int_equal(d.chunk_bytes, m.chunk_bytes);
    assert_int_equal(d.dtype_size, 2);
    assert_string_equal(d.dtype, "float16");
    assert_string_equal(d.shm_name, m.shm_name);
    assert_int_equal(d.segment_size, m.segment_size);
    assert_string_equal(d.reason, "");
    check_strict(dec_register_reply, &w);

    /* ndim other than 3 or 4 */
    for (uint8_t ndim = 0; ndim < 8; ndim++) {
        m.ndim = ndim;
        kvp_wbuf_reset(&w);
        kvp_encode_register_reply(&w, &m);
        assert_rc(kvp_decode_register_reply(w.data, w.len, &d),
                  ndim == 3 || ndim == 4 ? 0 : -EPROTO);
    }
    kvp_wbuf_free(&w);
}

/* ---- keyed requests --------------------------------------------------------------------- */

static int dec_key(const void *b, size_t n)
{
    struct kvp_key_req m;
    return kvp_decode_key_req(b, n, &m);
}

static void test_key_req(void **state)
{
    (void)state;
    uint32_t tokens[5] = {0, 1, 0xdeadbeef, 70000, UINT32_MAX};
    struct kvp_key_req d;
    struct kvp_wbuf w;

    kvp_wbuf_init(&w);
    kvp_encode_key_req(&w, 7, 256, 512, tokens, 5, "salty", 5);
    assert_rc(kvp_decode_key_req(w.data, w.len, &d), 0);
    assert_int_equal(d.handle, 7);
    assert_int_equal(d.start, 256);
    assert_int_equal(d.end, 512);
    assert_int_equal(d.ntokens, 5);
    assert_int_equal(d.salt_len, 5);
    assert_memory_equal(d.salt, "salty", 5);
    for (uint32_t i = 0; i < 5; i++)
        assert_int_equal(kvp_key_token(&d, i), tokens[i]);
    /* Tokens travel little-endian. */
    assert_memory_equal(d.tokens + 8, "\xef\xbe\xad\xde", 4);
    check_strict(dec_key, &w);

    /* No salt, no tokens. */
    kvp_wbuf_reset(&w);
    kvp_encode_key_req(&w, 1, 0, 0, NULL, 0, NULL, 0);
    assert_rc(kvp_decode_key_req(w.data, w.len, &d), 0);
    assert_int_equal(d.ntokens, 0);
    assert_int_equal(d.salt_len, 0);
    check_strict(dec_key, &w);
    kvp_wbuf_free(&w);
}

static void key_header(struct kvp_wbuf *w, uint16_t salt_len, uint32_t ntokens)
{
    static const uint8_t salt[KVP_MAX_SALT + 1];
    kvp_put_u32(w, 1);
    kvp_put_u32(w, 0);
    kvp_put_u32(w, 0);
    kvp_put_blob(w, salt, salt_len);
    kvp_put_u32(w, ntokens);
}

static void test_key_req_limits(void **state)
{
    (void)state;
    struct kvp_key_req d;
    struct kvp_wbuf w;

    kvp_wbuf_init(&w);
    /* Salt: 256 is the limit. */
    key_header(&w, KVP_MAX_SALT, 0);
    assert_rc(kvp_decode_key_req(w.data, w.len, &d), 0);
    kvp_wbuf_reset(&w);
    key_header(&w, KVP_MAX_SALT + 1, 0);
    assert_rc(kvp_decode_key_req(w.data, w.len, &d), -EPROTO);

    /* Oversized ntokens is refused before the tokens are looked at. */
    kvp_wbuf_reset(&w);
    key_header(&w, 0, KVP_MAX_TOKENS + 1);
    assert_rc(kvp_decode_key_req(w.data, w.len, &d), -EPROTO);
    kvp_wbuf_reset(&w);
    key_header(&w, 0, UINT32_MAX);
    for (int i = 0; i < 16; i++)
        kvp_put_u32(&w, 0);
    assert_rc(kvp_decode_key_req(w.data, w.len, &d), -EPROTO);

    /* The maximum itself is accepted. */
    kvp_wbuf_reset(&w);
    key_header(&w, 0, KVP_MAX_TOKENS);
    for (uint32_t i = 0; i < KVP_MAX_TOKENS; i++)
        kvp_put_u32(&w, i);
    assert_rc(w.err, 0);
    assert_rc(kvp_decode_key_req(w.data, w.len, &d), 0);
    assert_int_equal(kvp_key_token(&d, KVP_MAX_TOKENS - 1), KVP_MAX_TOKENS - 1);

    /* ntokens larger than the tokens present. */
    kvp_wbuf_reset(&w);
    key_header(&w, 0, 3);
    kvp_put_u32(&w, 1);
    kvp_put_u32(&w, 2);
    assert_rc(kvp_decode_key_req(w.data, w.len, &d), -EPROTO);
    kvp_wbuf_free(&w);
}

/* ---- ref requests, count, lookup -------------------------------------------------------- */

static int dec_ref(const void *b, size_t n)
{
    struct kvp_ref_req m;
    return kvp_decode_ref_req(b, n, &m);
}

static int dec_count(const void *b, size_t n)
{
    struct kvp_count_reply m;
    return kvp_decode_count_reply(b, n, &m);
}

static int dec_lookup(const void *b, size_t n)
{
    struct kvp_lookup_reply m;
    return kvp_decode_lookup_reply(b, n, &m);
}

static void test_ref_count_lookup(void **state)
{
    (void)state;
    struct kvp_ref_req ref = {.handle = 0xfeedface, .id = 0x1122334455667788ull}, dref;
    struct kvp_count_reply cnt;
    struct kvp_lookup_reply lk = {.nchunks = 10, .cached = 4}, dlk;
    struct kvp_wbuf w;

    kvp_wbuf_init(&w);
    kvp_encode_ref_req(&w, &ref);
    assert_int_equal(w.len, 12);
    assert_rc(kvp_decode_ref_req(w.data, w.len, &dref), 0);
    assert_int_equal(dref.handle, ref.handle);
    assert_int_equal(dref.id, ref.id);
    check_strict(dec_ref, &w);

    kvp_wbuf_reset(&w);
    kvp_encode_count_reply(&w, 4096);
    assert_rc(kvp_decode_count_reply(w.data, w.len, &cnt), 0);
    assert_int_equal(cnt.count, 4096);
    check_strict(dec_count, &w);

    kvp_wbuf_reset(&w);
    kvp_encode_lookup_reply(&w, &lk);
    assert_rc(kvp_decode_lookup_reply(w.data, w.len, &dlk), 0);
    assert_int_equal(dlk.nchunks, 10);
    assert_int_equal(dlk.cached, 4);
    check_strict(dec_lookup, &w);

    /* More cached chunks than chunks. */
    lk.cached = 11;
    kvp_wbuf_reset(&w);
    kvp_encode_lookup_reply(&w, &lk);
    assert_rc(kvp_decode_lookup_reply(w.data, w.len, &dlk), -EPROTO);
    kvp_wbuf_free(&w);
}

/* ---- slots replies ---------------------------------------------------------------------- */

static int dec_slots(const void *b, size_t n)
{
    struct kvp_slots_reply m = {.slots = slot_scratch};
    return kvp_decode_slots_reply(b, n, &m);
}

static void test_slots_reply(void **state)
{
    (void)state;
    struct kvp_wire_slot slots[3] = {
        {.chunk_index = 0, .offset = 4096, .length = 65536},
        {.chunk_index = 2, .offset = 4096 + 65536, .length = 65536},
        {.chunk_index = 4, .offset = 1ull << 40, .length = 65536},
    };
    struct kvp_slots_reply m = {
        .id = 99, .nchunks = 6, .cached = 2, .busy = 1, .no_space = 0, .nslots = 3, .slots = slots};
    struct kvp_slots_reply d = {.slots = slot_scratch};
    struct kvp_wbuf w;

    kvp_wbuf_init(&w);
    kvp_encode_slots_reply(&w, &m);
    assert_int_equal(w.len, 28 + 3 * 20);
    assert_rc(kvp_decode_slots_reply(w.data, w.len, &d), 0);
    assert_int_equal(d.id, 99);
    assert_int_equal(d.nchunks, 6);
    assert_int_equal(d.cached, 2);
    assert_int_equal(d.busy, 1);
    assert_int_equal(d.no_space, 0);
    assert_int_equal(d.nslots, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(d.slots[i].chunk_index, slots[i].chunk_index);
        assert_int_equal(d.slots[i].offset, slots[i].offset);
        assert_int_equal(d.slots[i].length, slots[i].length);
    }
    check_strict(dec_slots, &w);

    /* Empty reply. */
    struct kvp_slots_reply empty = {.nchunks = 0};
    kvp_wbuf_reset(&w);
    kvp_encode_slots_reply(&w, &empty);
    assert_rc(kvp_decode_slots_reply(w.data, w.len, &d), 0);
    assert_int_equal(d.nslots, 0);
    check_strict(dec_slots, &w);
    kvp_wbuf_free(&w);
}

static int encode_decode_slots(struct kvp_slots_reply *m)
{
    struct kvp_slots_reply d = {.slots = slot_scratch};
    struct kvp_wbuf w;

    kvp_wbuf_init(&w);
    kvp_encode_slots_reply(&w, m);
    assert_rc(w.err, 0);
    int rc = kvp_decode_slots_reply(w.data, w.len, &d);
    kvp_wbuf_free(&w);
    return rc;
}

static void test_slots_reply_rejects(void **state)
{
    (void)state;
    static struct kvp_wire_slot slots[KVP_MAX_CHUNKS + 1];
    struct kvp_slots_reply m = {.id = 1, .nchunks = 4, .nslots = 2, .slots = slots};

    for (uint32_t i = 0; i <= KVP_MAX_CHUNKS; i++)
        slots[i] = (struct kvp_wire_slot){.chunk_index = i, .offset = 4096, .length = 1};

    assert_rc(encode_decode_slots(&m), 0);
    /* chunk_index >= nchunks */
    slots[1].chunk_index = 4;
    assert_rc(encode_decode_slots(&m), -EPROTO);
    slots[1].chunk_index = UINT32_MAX;
    assert_rc(encode_decode_slots(&m), -EPROTO);
    slots[1].chunk_index = 1;
    /* nslots > nchunks */
    m.nslots = 5;
    assert_rc(encode_decode_slots(&m), -EPROTO);
    /* nchunks at and over the range limit */
    m.nchunks = KVP_MAX_CHUNKS;
    m.nslots = KVP_MAX_CHUNKS;
    assert_rc(encode_decode_slots(&m), 0);
    m.nchunks = KVP_MAX_CHUNKS + 1;
    m.nslots = KVP_MAX_CHUNKS + 1;
    assert_rc(encode_decode_slots(&m), -EPROTO);
    m.nslots = 0;
    assert_rc(encode_decode_slots(&m), -EPROTO);
}

/* ---- stats ------------------------------------------------------------------------------ */

static int dec_stats(const void *b, size_t n)
{
    struct kvp_stat_entry e[4];
    return kvp_decode_stats_reply(b, n, e, 4);
}

static void test_stats_reply(void **state)
{
    (void)state;
    struct kvp_stat_entry e[3] = {{"requests", 10}, {"l1_used_bytes", 1ull << 40}, {"zero", 0}};
    struct kvp_stat_entry d[3];
    struct kvp_wbuf w;

    kvp_wbuf_init(&w);
    kvp_encode_stats_reply(&w, e, 3);
    assert_rc(kvp_decode_stats_reply(w.data, w.len, d, 3), 3);
    for (int i = 0; i < 3; i++) {
        assert_string_equal(d[i].name, e[i].name);
        assert_int_equal(d[i].value, e[i].value);
    }
    check_strict(dec_stats, &w);

    /* cap smaller than n: the count is still n, only cap entries are written. */
    memset(d, 0x77, sizeof(d));
    assert_rc(kvp_decode_stats_reply(w.data, w.len, d, 1), 3);
    assert_string_equal(d[0].name, "requests");
    assert_int_equal(d[1].value, 0x7777777777777777ull);
    assert_rc(kvp_decode_stats_reply(w.data, w.len, NULL, 0), 3);
    kvp_wbuf_free(&w);
}

static void test_stats_reply_rejects(void **state)
{
    (void)state;
    static struct kvp_stat_entry e[KVP_MAX_STATS + 1];
    struct kvp_wbuf w;

    for (int i = 0; i <= (int)KVP_MAX_STATS; i++)
        e[i] = (struct kvp_stat_entry){.value = (uint64_t)i};
    kvp_wbuf_init(&w);
    kvp_encode_stats_reply(&w, e, KVP_MAX_STATS);
    assert_rc(kvp_decode_stats_reply(w.data, w.len, e, KVP_MAX_STATS), KVP_MAX_STATS);
    kvp_wbuf_reset(&w);
    kvp_encode_stats_reply(&w, e, KVP_MAX_STATS + 1);
    assert_rc(kvp_decode_stats_reply(w.data, w.len, e, KVP_MAX_STATS + 1), -EPROTO);

    /* A name that does not fit the 48-byte field. */
    kvp_wbuf_reset(&w);
    kvp_put_u32(&w, 1);
    kvp_put_str(&w, "0123456789012345678901234567890123456789012345678"); /* 49 */
    kvp_put_u64(&w, 1);
    assert_rc(kvp_decode_stats_reply(w.data, w.len, e, 1), -EPROTO);
    kvp_wbuf_free(&w);
}

/* ---- error replies ---------------------------------------------------------------------- */

static int dec_error(const void *b, size_t n)
{
    char msg[KVP_MAX_ERRMSG + 1];
    return kvp_decode_error(b, n, msg, sizeof(msg));
}

static void test_error_reply(void **state)
{
    (void)state;
    char msg[KVP_MAX_ERRMSG + 1];
    char big[400];
    struct kvp_wbuf w;

    kvp_wbuf_init(&w);
    kvp_encode_error(&w, "num_layers must be >= 1");
    assert_rc(kvp_decode_error(w.data, w.len, msg, sizeof(msg)), 0);
    assert_string_equal(msg, "num_layers must be >= 1");
    check_strict(dec_error, &w);

    /* Long messages are truncated to the limit by the encoder, never refused. */
    memset(big, 'e', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    kvp_wbuf_reset(&w);
    kvp_encode_error(&w, big);
    assert_rc(kvp_decode_error(w.data, w.len, msg, sizeof(msg)), 0);
    assert_int_equal(strlen(msg), KVP_MAX_ERRMSG);

    /* A small output buffer: the message must fit it, else -EPROTO (never overflow). */
    char small[8];
    assert_rc(kvp_decode_error(w.data, w.len, small, sizeof(small)), -EPROTO);
    kvp_wbuf_reset(&w);
    kvp_encode_error(&w, NULL);
    assert_rc(kvp_decode_error(w.data, w.len, small, sizeof(small)), 0);
    assert_string_equal(small, "");
    kvp_wbuf_free(&w);
}

/* ---- STATUS and METRICS replies ------------------------------------------------------- */

static int dec_text(const void *b, size_t n)
{
    const char *text;
    uint32_t len;
    int rc = kvp_decode_text_reply(b, n, &text, &len);
    /* The text lies inside the body, right after its length. */
    if (rc == 0 && (text != (const char *)b + 4 || len != n - 4))
        fail_msg("text at +%td, %u bytes, in a body of %zu", text - (const char *)b, len, n);
    return rc;
}

static void test_text_reply(void **state)
{
    (void)state;
    static const char doc[] = "{\n  \"version\": \"1.0.0\",\n  \"state\": \"serving\"\n}";
    const char *text = NULL;
    uint32_t len = 0;
    struct kvp_wbuf w;

    assert_string_equal(kvp_opcode_name(KVP_OP_STATUS), "STATUS");
    assert_string_equal(kvp_opcode_name(KVP_OP_METRICS), "METRICS");
    assert_string_equal(kvp_opcode_name(KVP_OP_CLEAR), "CLEAR");

    kvp_wbuf_init(&w);
    kvp_encode_text_reply(&w, doc, (uint32_t)strlen(doc));
    assert_int_equal(w.len, 4 + strlen(doc));
    assert_rc(kvp_decode_text_reply(w.data, w.len, &text, &len), 0);
    assert_int_equal(len, strlen(doc));
    assert_memory_equal(text, doc, len);
    check_strict(dec_text, &w);

    /* Empty text is fine. */
    kvp_wbuf_reset(&w);
    kvp_encode_text_reply(&w, "", 0);
    assert_rc(kvp_decode_text_reply(w.data, w.len, &text, &len), 0);
    assert_int_equal(len, 0);
    check_strict(dec_text, &w);

    /* A NUL would cut the C string the library makes of it. */
    kvp_wbuf_reset(&w);
    kvp_encode_text_reply(&w, "ab\0cd", 5);
    assert_rc(decode_copy(dec_text, w.data, w.len), -EPROTO);

    /* The limit: KVP_MAX_TEXT bytes decode (a body of KVP_MAX_BODY bytes), one more does not. */
    char *big = malloc(KVP_MAX_TEXT + 1);
    assert_non_null(big);
    memset(big, 'm', KVP_MAX_TEXT + 1);
    kvp_wbuf_reset(&w);
    kvp_encode_text_reply(&w, big, KVP_MAX_TEXT);
    assert_int_equal(w.len, KVP_MAX_BODY);
    assert_rc(decode_copy(dec_text, w.data, w.len), 0);
    kvp_wbuf_reset(&w);
    kvp_encode_text_reply(&w, big, KVP_MAX_TEXT + 1);
    assert_rc(decode_copy(dec_text, w.data, w.len), -EPROTO);
    free(big);
    /* A length claiming more than the body holds. */
    kvp_wbuf_reset(&w);
    kvp_put_u32(&w, 10);
    kvp_put_bytes(&w, "short", 5);
    assert_rc(decode_copy(dec_text, w.data, w.len), -EPROTO);
    kvp_wbuf_free(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hello),
        cmocka_unit_test(test_hello_name_limit),
        cmocka_unit_test(test_register_req),
        cmocka_unit_test(test_register_reply),
        cmocka_unit_test(test_key_req),
        cmocka_unit_test(test_key_req_limits),
        cmocka_unit_test(test_ref_count_lookup),
        cmocka_unit_test(test_slots_reply),
        cmocka_unit_test(test_slots_reply_rejects),
        cmocka_unit_test(test_stats_reply),
        cmocka_unit_test(test_stats_reply_rejects),
        cmocka_unit_test(test_error_reply),
        cmocka_unit_test(test_text_reply),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
