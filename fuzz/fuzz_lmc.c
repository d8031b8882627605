/*
 * fuzz_lmc.c - the LMCache front end on untrusted ZeroMQ messages: the msgpack codec
 * (src/server/lmc/codec.c), every payload decoder of LMCache's messages (messages.c), and the
 * whole front end behind the socket: dispatch, handlers, LMCache's semantics, the core's
 * operations, store and registry (handlers.c, instances.c), as the listener's thread runs them.
 *
 * Input: a session of multipart messages as the listener receives them after the identity
 * frame. Each frame is a 4-byte little-endian length and its bytes (a short last frame takes the
 * rest); the length 0xffffffff ends a message. The committed seeds, fuzz/corpus/lmc/, are real
 * requests of LMCache 0.5.5 and 0.5.6 workers recorded between them and `lmcache server`
 * (tests/lmcache/record_frames.py), one per file, and whole recorded sessions.
 *
 * What must hold, beyond "no crash, no leak, no read outside the frame":
 *   - the skipper and the typed readers agree: a frame the skipper calls one whole value is
 *     exactly what lmc_mp_check_one() accepts;
 *   - every decoder that accepts a payload leaves values inside their documented bounds;
 *   - every reply encoder produces exactly one well-formed msgpack value, for any inputs;
 *   - the front end answers every message of 3 frames or more with nothing (a None reply) or
 *     exactly one well-formed value, a bool where the operation's type is bool, an int where
 *     it is int, and slots that lie inside the segment;
 *   - once the front end is gone, nothing is held: no reservation, no pin, no instance.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "core/daemon.h"
#include "core/owner.h"
#include "fuzz.h"
#include "lmc/codec.h"
#include "lmc/front.h"
#include "lmc/messages.h"
#include "server_setup.h"

#define MAX_FRAMES 16
#define END_OF_MESSAGE 0xffffffffu
#define POOL_SIZE (256u << 10)
#define CHUNK_TOKENS 16u

static uint8_t tokens[KVP_MAX_TOKENS * 4];

struct frame {
    const uint8_t *p;
    size_t n;
};

/* Splits the next message off *data: its frames into f (at most MAX_FRAMES; more are
 * counted in *total). Returns false when the input is used up. */
static bool next_message(const uint8_t **data, size_t *size, struct frame *f, size_t *n,
                         size_t *total)
{
    *n = *total = 0;
    if (*size == 0)
        return false;
    while (*size > 0) {
        size_t len = *size;
        if (*size >= 4) {
            uint32_t v = (uint32_t)(*data)[0] | (uint32_t)(*data)[1] << 8 |
                         (uint32_t)(*data)[2] << 16 | (uint32_t)(*data)[3] << 24;
            *data += 4;
            *size -= 4;
            if (v == END_OF_MESSAGE)
                break;
            len = v > *size ? *size : v;
        }
        if (*n < MAX_FRAMES) {
            f[*n].p = *data;
            f[*n].n = len;
            (*n)++;
        }
        (*total)++;
        *data += len;
        *size -= len;
    }
    return true;
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

static struct kvp_server srv;
static struct kvp_offer offer;

static void init_once(void)
{
    static bool done;
    if (done)
        return;
    done = true;
    fuzz_server_init(&srv, POOL_SIZE, CHUNK_TOKENS);
    kvp_owners_init(&srv.owners);
    offer = fuzz_shm_offer("kvpool_l1_pool_fuzz", POOL_SIZE, CHUNK_TOKENS);
}

/* Slots of a prepare reply lie inside the segment and have the chunk's length. */
static void check_slots(struct lmc_mp_reader *r)
{
    uint32_t n;
    FUZZ_CHECK(lmc_mp_read_array(r, UINT32_MAX, &n) == 0);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t nf;
        uint64_t off = UINT64_MAX, len = UINT64_MAX;
        FUZZ_CHECK(lmc_mp_read_map(r, 4, &nf) == 0 && nf == 4);
        for (uint32_t k = 0; k < nf; k++) {
            const char *s;
            uint32_t sl;
            FUZZ_CHECK(lmc_mp_read_str(r, 16, &s, &sl) == 0);
            if (sl == 6 && memcmp(s, "offset", 6) == 0)
                FUZZ_CHECK(lmc_mp_read_uint(r, UINT64_MAX, &off) == 0);
            else if (sl == 6 && memcmp(s, "length", 6) == 0)
                FUZZ_CHECK(lmc_mp_read_uint(r, UINT64_MAX, &len) == 0);
            else
                FUZZ_CHECK(lmc_mp_skip(r) == 0);
        }
        FUZZ_CHECK(off >= KVP_SEG_HEADER && len > 0 && len <= POOL_SIZE);
        FUZZ_CHECK(off + len <= srv.seg.size);
    }
}

/* The reply of op: its type, and for prepares the slots. */
static void check_reply(enum lmc_op op, bool has, const struct lmc_mp_writer *w)
{
    /* The chunk size is never None: LMCache's connector calls int() on the answer. */
    if (op == LMC_OP_GET_CHUNK_SIZE || op == LMC_OP_NEGOTIATE_CHUNK_SIZE)
        FUZZ_CHECK(has);
    if (!has) {
        FUZZ_CHECK(w->len == 0);
        return;
    }
    FUZZ_CHECK(!w->failed && lmc_mp_check_one(w->buf, w->len) == 0);
    struct lmc_mp_reader r;
    enum lmc_mp_type t;
    lmc_mp_reader_init(&r, w->buf, w->len);
    FUZZ_CHECK(lmc_mp_peek(&r, &t) == 0);
    switch (op) {
    case LMC_OP_PING:
    case LMC_OP_COMMIT_STORE:
    case LMC_OP_COMMIT_RETRIEVE:
        FUZZ_CHECK(t == LMC_MP_BOOL);
        break;
    case LMC_OP_GET_CHUNK_SIZE:
    case LMC_OP_NEGOTIATE_CHUNK_SIZE:
    case LMC_OP_QUERY_PREFETCH_STATUS:
    case LMC_OP_WAIT_PREFETCH_STATUS:
        FUZZ_CHECK(t == LMC_MP_INT);
        break;
    case LMC_OP_SUBSCRIBE_KV_EVENTS:
        FUZZ_CHECK(t == LMC_MP_MAP); /* the KVEventBatch that says no events are recorded */
        break;
    case LMC_OP_PREPARE_STORE:
    case LMC_OP_PREPARE_RETRIEVE: {
        uint32_t nf;
        FUZZ_CHECK(lmc_mp_read_map(&r, 3, &nf) == 0);
        for (uint32_t k = 0; k < nf; k++) {
            const char *s;
            uint32_t sl, nc;
            FUZZ_CHECK(lmc_mp_read_str(&r, 16, &s, &sl) == 0);
            if (sl != 7 || memcmp(s, "context", 7) != 0) {
                FUZZ_CHECK(lmc_mp_skip(&r) == 0);
                continue;
            }
            FUZZ_CHECK(lmc_mp_read_map(&r, 2, &nc) == 0);
            for (uint32_t c = 0; c < nc; c++) {
                FUZZ_CHECK(lmc_mp_read_str(&r, 16, &s, &sl) == 0);
                if (sl == 5 && memcmp(s, "slots", 5) == 0)
                    check_slots(&r);
                else
                    FUZZ_CHECK(lmc_mp_skip(&r) == 0);
            }
        }
        break;
    }
    default:
        break;
    }
}

/* The session through a fresh front end over a fresh store and registry. */
static void run_front(const uint8_t *data, size_t size)
{
    struct lmc_front front;
    struct frame fr[MAX_FRAMES];
    size_t n, total;
    char name[64];

    init_once();
    fuzz_server_pool(&srv, "kvpool_l1_pool_fuzz");
    kvp_registry_init(&srv.registry, &offer);
    FUZZ_CHECK(lmc_front_init(&front, &srv) == 0);

    uint64_t now = 1000;
    while (next_message(&data, &size, fr, &n, &total)) {
        if (total < 3 || fr[1].n == 0)
            continue; /* the listener drops these before dispatching */
        struct lmc_req r;
        memset(&r, 0, sizeof(r));
        r.op_frame = fr[1].p;
        r.op_len = fr[1].n;
        r.op = lmc_op_decode(fr[1].p, fr[1].n, name, sizeof(name));
        memcpy(r.name, name, sizeof(r.name));
        r.npayloads = (uint32_t)(total - 2);
        for (size_t i = 2; i < n && i - 2 < LMC_MAX_PAYLOADS; i++) {
            r.p[i - 2] = fr[i].p;
            r.n[i - 2] = fr[i].n;
        }
        /* Time moves a second per message, so reaping and the read TTL are reachable. */
        now += 1000;
        front.now_ms = now;
        lmc_tick(&front);
        lmc_mp_writer_reset(&front.out);
        bool has = lmc_dispatch(&front, &r);
        check_reply(r.op, has, &front.out);
    }
    lmc_front_destroy(&front);

    struct kvp_store_gauges g;
    kvp_store_get_gauges(&srv.store, &g);
    FUZZ_CHECK(g.reserved == 0 && g.expired == 0 && g.pinned == 0);
    FUZZ_CHECK(kvp_registry_count(&srv.registry) == 0);
    kvp_registry_destroy(&srv.registry);
    kvp_store_destroy(&srv.store);
    free(srv.seg.base);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct frame f[MAX_FRAMES];
    size_t n, total;
    const uint8_t *p = data;
    size_t left = size;
    char name[64];

    /* The decoders, on the first message: identity frame left out, [uid][op][payload...]. */
    next_message(&p, &left, f, &n, &total);
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
    run_front(data, size);
    return 0;
}
