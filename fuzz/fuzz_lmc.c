/*
 * fuzz_lmc.c - the LMCache front end's decoding of untrusted ZeroMQ messages: the msgpack
 * codec (src/server/lmc/codec.c) and every payload decoder of LMCache's messages
 * (src/server/lmc/messages.c).
 *
 * Input: one multipart message as the listener receives it after the identity frame, each
 * frame as a 4-byte little-endian length and its bytes (a short last frame takes the rest).
 * The committed seeds, fuzz/corpus/lmc/, are real requests of LMCache 0.5.5 and 0.5.6 workers
 * recorded between them and `lmcache server` (tests/lmcache/record_frames.py).
 *
 * What must hold, beyond "no crash, no leak, no read outside the frame":
 *   - the skipper and the typed readers agree: a frame the skipper calls one whole value is
 *     exactly what lmc_mp_check_one() accepts;
 *   - every decoder that accepts a payload leaves values inside their documented bounds;
 *   - every reply encoder produces exactly one well-formed msgpack value, for any inputs.
 */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "fuzz.h"
#include "lmc/codec.h"
#include "lmc/messages.h"

#define MAX_FRAMES 16

static uint8_t tokens[KVP_MAX_TOKENS * 4];

struct frame {
    const uint8_t *p;
    size_t n;
};

static size_t split(const uint8_t *data, size_t size, struct frame *f)
{
    size_t n = 0;
    while (size > 0 && n < MAX_FRAMES) {
        size_t len = size;
        if (size >= 4) {
            len = (size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16 |
                  (size_t)data[3] << 24;
            data += 4;
            size -= 4;
            if (len > size)
                len = size;
        } else {
            len = size;
        }
        f[n].p = data;
        f[n].n = len;
        n++;
        data += len;
        size -= len;
    }
    return n;
}

static void check_frame_codec(const struct frame *f)
{
    struct lmc_mp_reader r;
    lmc_mp_reader_init(&r, f->p, f->n);
    int rc = lmc_mp_skip(&r);
    if (rc == 0) {
        FUZZ_CHECK(lmc_mp_left(&r) <= f->n);
        FUZZ_CHECK((lmc_mp_check_one(f->p, f->n) == 0) == (lmc_mp_left(&r) == 0));
    } else {
        FUZZ_CHECK(lmc_mp_left(&r) == f->n); /* a failed skip does not move */
        FUZZ_CHECK(lmc_mp_check_one(f->p, f->n) != 0);
    }
    /* Walk a container's direct elements with the typed readers. */
    lmc_mp_reader_init(&r, f->p, f->n);
    uint32_t n;
    if (lmc_mp_read_array(&r, UINT32_MAX, &n) == 0 || lmc_mp_read_map(&r, UINT32_MAX, &n) == 0) {
        FUZZ_CHECK(n <= f->n);
        enum lmc_mp_type t;
        while (lmc_mp_peek(&r, &t) == 0) {
            int64_t i;
            uint64_t u;
            double d;
            bool b;
            const char *s;
            uint32_t len;
            const uint8_t *bin;
            uint64_t blen;
            char buf[8];
            size_t before = lmc_mp_left(&r);
            if (lmc_mp_read_int(&r, INT64_MIN, INT64_MAX, &i) == 0 ||
                lmc_mp_read_uint(&r, UINT64_MAX, &u) == 0 || lmc_mp_read_float(&r, &d) == 0 ||
                lmc_mp_read_bool(&r, &b) == 0 || lmc_mp_read_nil(&r) == 0 ||
                lmc_mp_read_cstr(&r, buf, sizeof(buf)) == 0 ||
                lmc_mp_read_str(&r, UINT32_MAX, &s, &len) == 0 ||
                lmc_mp_read_bin(&r, UINT64_MAX, &bin, &blen) == 0) {
                FUZZ_CHECK(lmc_mp_left(&r) < before);
                continue;
            }
            if (lmc_mp_skip(&r))
                break;
            FUZZ_CHECK(lmc_mp_left(&r) < before);
        }
    }
}

static void check_key(const struct frame *f)
{
    struct lmc_key k;
    char why[160];
    if (lmc_decode_key(f->p, f->n, &k, tokens, why, sizeof(why)) == 0) {
        FUZZ_CHECK(k.ntokens <= KVP_MAX_TOKENS);
        FUZZ_CHECK(k.start <= k.end && k.end <= KVP_MAX_TOKENS);
        FUZZ_CHECK(k.world_size >= 1 && k.world_size <= 255);
        FUZZ_CHECK(!k.has_worker_id || k.worker_id < k.world_size);
        FUZZ_CHECK(k.salt_len <= LMC_MAX_SALT_BYTES);
        FUZZ_CHECK(memchr(k.salt, '/', k.salt_len) == NULL);
        FUZZ_CHECK(strlen(k.model_name) > 0 && strlen(k.model_name) <= KVP_MAX_NAME);
        FUZZ_CHECK(strlen(k.request_id) <= LMC_MAX_REQUEST_ID);
        FUZZ_CHECK((size_t)k.ntokens * 4 <= f->n * 4); /* each id took a byte at least */
    } else {
        FUZZ_CHECK(strlen(why) > 0);
    }
}

static void check_register(const struct frame *f)
{
    struct lmc_register m;
    char why[160];
    if (lmc_decode_register(f->p, f->n, &m, why, sizeof(why)) == 0) {
        FUZZ_CHECK(m.instance_id <= (uint64_t)INT64_MAX);
        FUZZ_CHECK(m.world_size >= 1 && m.world_size <= 255);
        FUZZ_CHECK(m.num_layers >= 1 && m.hidden_dim >= 1 && m.block_size >= 1);
        FUZZ_CHECK(m.num_physical_slots <= KVP_MAX_TOKENS);
        FUZZ_CHECK(strlen(m.dtype) <= KVP_MAX_NAME);
    } else {
        FUZZ_CHECK(strlen(why) > 0);
    }
}

static void check_scalars(const struct frame *f)
{
    uint64_t u;
    bool has, b;
    int64_t i;
    double d;
    char rid[LMC_MAX_REQUEST_ID + 1];
    const uint8_t *bin;
    uint64_t blen;
    if (lmc_decode_instance_id(f->p, f->n, &u) == 0)
        FUZZ_CHECK(u <= (uint64_t)INT64_MAX);
    if (lmc_decode_opt_instance_id(f->p, f->n, &has, &u) == 0)
        FUZZ_CHECK(has || u == 0);
    if (lmc_decode_request_id(f->p, f->n, rid, sizeof(rid)) == 0)
        FUZZ_CHECK(strlen(rid) < sizeof(rid));
    (void)lmc_decode_bool(f->p, f->n, &b);
    if (lmc_decode_int(f->p, f->n, -5, 5, &i) == 0)
        FUZZ_CHECK(i >= -5 && i <= 5);
    (void)lmc_decode_float(f->p, f->n, &d);
    if (lmc_decode_bin(f->p, f->n, 1u << 20, &bin, &blen) == 0)
        FUZZ_CHECK(blen <= f->n && bin >= f->p && bin + blen <= f->p + f->n);
    (void)lmc_decode_any(f->p, f->n);
}

/* Every encoder, fed from the input, writes one well-formed value. */
static void check_encoders(const uint8_t *data, size_t size)
{
    struct lmc_mp_writer w;
    struct lmc_slot slots[4];
    uint32_t idx[4];
    uint64_t v = 0;
    for (size_t i = 0; i < size && i < 8; i++)
        v = v << 8 | data[i];
    for (unsigned i = 0; i < 4; i++) {
        slots[i].offset = v * (i + 1);
        slots[i].length = v >> i;
        idx[i] = (uint32_t)(v >> (8 * i));
    }
    struct lmc_slot_shape sh = {.ndim = 4, .shape = {2, (uint32_t)v, 16, 128}, .dtype = "float16"};
    lmc_mp_writer_init(&w);
    for (int op = 0; op <= 110; op++) {
        lmc_mp_writer_reset(&w);
        if (lmc_encode_negative(&w, (enum lmc_op)op))
            FUZZ_CHECK(!w.failed && lmc_mp_check_one(w.buf, w.len) == 0);
        else
            FUZZ_CHECK(w.len == 0);
    }
    lmc_mp_writer_reset(&w);
    lmc_encode_prepare_store_reply(&w, slots, idx, (uint32_t)(v % 5), &sh, false);
    FUZZ_CHECK(!w.failed && lmc_mp_check_one(w.buf, w.len) == 0);
    lmc_mp_writer_reset(&w);
    lmc_encode_prepare_retrieve_reply(&w, true, slots, (uint32_t)(v % 5), &sh);
    FUZZ_CHECK(!w.failed && lmc_mp_check_one(w.buf, w.len) == 0);
    lmc_mp_writer_reset(&w);
    lmc_mp_put_int(&w, (int64_t)v);
    int64_t back;
    struct lmc_mp_reader r;
    lmc_mp_reader_init(&r, w.buf, w.len);
    FUZZ_CHECK(lmc_mp_read_int(&r, INT64_MIN, INT64_MAX, &back) == 0 && back == (int64_t)v);
    lmc_mp_writer_free(&w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct frame f[MAX_FRAMES];
    size_t n = split(data, size, f);
    char name[64];

    for (size_t i = 0; i < n; i++) {
        check_frame_codec(&f[i]);
        check_scalars(&f[i]);
    }
    if (n >= 2) {
        enum lmc_op op = lmc_op_decode(f[1].p, f[1].n, name, sizeof(name));
        for (const char *c = name; *c; c++)
            FUZZ_CHECK(*c >= 0x20 && *c < 0x7f);
        FUZZ_CHECK(op == LMC_OP_UNKNOWN || strcmp(lmc_op_name(op), "?") != 0);
    }
    /* Payloads: the first is the key of keyed operations and the registration struct. */
    for (size_t i = 2; i < n; i++) {
        check_key(&f[i]);
        check_register(&f[i]);
    }
    check_encoders(data, size);
    return 0;
}
