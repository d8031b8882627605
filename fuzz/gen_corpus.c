/*
 * gen_corpus.c - writes the seed corpus of the fuzz drivers: valid encodings, made with the real
 * encoders, of every message each driver parses, and a few plausible daemon sessions.
 *
 * Usage: fuzz_gen_corpus DIR   (make fuzz-corpus runs it on fuzz/corpus). Writes
 * DIR/<driver>/seed-<name>; the output is deterministic, so regenerating changes nothing unless
 * an encoding changed. Inputs found by fuzzing (crash-*, ...) live beside the seeds and are not
 * touched.
 *
 * The daemon sessions assume fuzz_daemon.c's set-up: chunks of 4 tokens, first instance handle
 * 0x10000, reservation and pin ids 1, 2, ... per connection; a layout of 1 layer x 4 hidden x
 * uint8 makes 32-byte chunks.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/msg.h"
#include "lmc/envelope.h"

#define HANDLE0 0x10000u
#define CHUNK_BYTES 32u

static const char *out_dir;
static int failures;

static void write_seed(const char *driver, const char *name, const void *p, size_t n)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", out_dir, driver);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "mkdir %s: %s\n", path, strerror(errno));
        failures++;
        return;
    }
    snprintf(path, sizeof(path), "%s/%s/seed-%s", out_dir, driver, name);
    FILE *f = fopen(path, "wbe");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        failures++;
    }
}

/* Writes prefix bytes then the body in w as one seed, and empties w. */
static void seed_with_prefix(const char *driver, const char *name, const uint8_t *prefix,
                             size_t nprefix, struct kvp_wbuf *w)
{
    struct kvp_wbuf s;
    kvp_wbuf_init(&s);
    kvp_put_bytes(&s, prefix, nprefix);
    kvp_put_bytes(&s, w->data, w->len);
    if (s.err || w->err) {
        fprintf(stderr, "cannot encode %s/%s\n", driver, name);
        failures++;
    } else {
        write_seed(driver, name, s.data, s.len);
    }
    kvp_wbuf_free(&s);
    kvp_wbuf_reset(w);
}

static void put_header(struct kvp_wbuf *w, uint16_t opcode, uint64_t id, uint32_t body_len,
                       int32_t status, uint64_t payload_len)
{
    uint8_t raw[KVP_HEADER_SIZE];
    struct kvp_header h = {
        .magic = KVP_MAGIC,
        .version = KVP_PROTO_VERSION,
        .opcode = opcode,
        .request_id = id,
        .body_len = body_len,
        .status = status,
        .payload_len = payload_len,
    };
    kvp_header_encode(&h, raw);
    kvp_put_bytes(w, raw, sizeof(raw));
}

static void gen_header(void)
{
    struct kvp_wbuf w;
    kvp_wbuf_init(&w);
    put_header(&w, KVP_OP_HELLO, 1, 0, 0, 0);
    seed_with_prefix("header", "hello", NULL, 0, &w);
    put_header(&w, KVP_OP_STORE_INLINE, 7, 12, 0, 4096);
    seed_with_prefix("header", "store-inline", NULL, 0, &w);
    put_header(&w, KVP_OP_LOOKUP | KVP_REPLY_FLAG, 9, 8, 0, 0);
    seed_with_prefix("header", "lookup-reply", NULL, 0, &w);
    put_header(&w, KVP_REPLY_FLAG, 3, 24, -71 /* -EPROTO */, 0);
    seed_with_prefix("header", "error-reply", NULL, 0, &w);
    put_header(&w, KVP_OP_MAP_SEGMENT, 2, 0, 0, 0);
    seed_with_prefix("header", "map-segment", NULL, 0, &w);
    put_header(&w, KVP_OP_STATUS | KVP_REPLY_FLAG, 5, KVP_MAX_BODY, 0, 0);
    seed_with_prefix("header", "status-reply", NULL, 0, &w);
    kvp_wbuf_free(&w);
}

static struct kvp_register_req layout(const char *id, uint8_t transport, uint8_t mla)
{
    struct kvp_register_req r = {
        .world_size = 2,
        .worker_rank = 1,
        .block_size = 16,
        .num_layers = 1,
        .hidden_dim = 4,
        .use_mla = mla,
        .transport = transport,
    };
    snprintf(r.instance_id, sizeof(r.instance_id), "%s", id);
    snprintf(r.model_name, sizeof(r.model_name), "llama-3-8b");
    snprintf(r.dtype, sizeof(r.dtype), "uint8");
    if (transport == KVP_WIRE_INLINE)
        snprintf(r.reason, sizeof(r.reason), "requested by worker");
    return r;
}

static const uint32_t tokens[12] = {101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112};

static void gen_request(void)
{
    struct kvp_wbuf w;
    struct kvp_register_req reg;
    const uint8_t sel_register = 0, sel_key = 1, sel_ref = 2;

    kvp_wbuf_init(&w);
    reg = layout("worker-0", KVP_WIRE_INLINE, 0);
    kvp_encode_register_req(&w, &reg);
    seed_with_prefix("request", "register-inline", &sel_register, 1, &w);
    reg = layout("worker-mla", KVP_WIRE_SHM, 1);
    kvp_encode_register_req(&w, &reg);
    seed_with_prefix("request", "register-shm-mla", &sel_register, 1, &w);
    kvp_encode_key_req(&w, HANDLE0, 0, 8, tokens, 8, NULL, 0);
    seed_with_prefix("request", "key", &sel_key, 1, &w);
    kvp_encode_key_req(&w, HANDLE0, 4, 12, tokens, 12, "tenant-a", 8);
    seed_with_prefix("request", "key-salt", &sel_key, 1, &w);
    kvp_encode_ref_req(&w, &(struct kvp_ref_req){.handle = HANDLE0, .id = 1});
    seed_with_prefix("request", "ref", &sel_ref, 1, &w);
    kvp_wbuf_free(&w);
}

/* The beginnings of a STATUS and a METRICS reply's text. */
static const char status_json[] = "{\n  \"version\": \"1.0.0\",\n  \"state\": \"serving\",\n  "
                                  "\"pid\": 4242,\n  \"instances\": []\n}";
static const char metrics_text[] = "# HELP kvpool_objects committed chunks (visible to lookups)\n"
                                   "# TYPE kvpool_objects gauge\nkvpool_objects 3\n";

/* A reply seed: selector byte (which decoder), parameter byte (buffer size), body. */
static void reply_seed(const char *name, uint8_t selector, uint8_t param, struct kvp_wbuf *w)
{
    const uint8_t prefix[2] = {selector, param};
    seed_with_prefix("reply", name, prefix, 2, w);
}

static void gen_reply(void)
{
    struct kvp_wbuf w;

    kvp_wbuf_init(&w);
    struct kvp_hello_reply hello = {
        .major = 1,
        .pid = 4242,
        .chunk_tokens = 256,
        .shm_backend = KVP_WIRE_BACKEND_POSIX,
        .segment_size = 4096 + 65536,
        .nonce = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
        .shm_name = "kvpool_l1_pool_4242",
    };
    kvp_encode_hello_reply(&w, &hello);
    reply_seed("hello", 0, 0, &w);
    hello = (struct kvp_hello_reply){
        .major = 1,
        .chunk_tokens = 16,
        .shm_reason = "SHM disabled by configuration",
    };
    kvp_encode_hello_reply(&w, &hello);
    reply_seed("hello-inline", 0, 0, &w);

    struct kvp_register_reply reg = {
        .handle = HANDLE0,
        .transport = KVP_WIRE_SHM,
        .ndim = 4,
        .chunk_tokens = 4,
        .shape = {2, 1, 4, 4},
        .chunk_bytes = CHUNK_BYTES,
        .dtype_size = 1,
        .dtype = "uint8",
        .shm_name = "kvpool_l1_pool_4242",
        .segment_size = 4096 + 65536,
    };
    kvp_encode_register_reply(&w, &reg);
    reply_seed("register", 1, 0, &w);

    struct kvp_wire_slot slots[3] = {
        {.chunk_index = 0, .offset = 4096, .length = CHUNK_BYTES},
        {.chunk_index = 2, .offset = 8192, .length = CHUNK_BYTES},
        {.chunk_index = 3, .offset = 4096 + 65536 - CHUNK_BYTES, .length = CHUNK_BYTES},
    };
    struct kvp_slots_reply sr = {.id = 1, .nchunks = 4, .cached = 1, .nslots = 3, .slots = slots};
    kvp_encode_slots_reply(&w, &sr);
    reply_seed("slots", 2, 0, &w);

    kvp_encode_lookup_reply(&w, &(struct kvp_lookup_reply){.nchunks = 3, .cached = 2});
    reply_seed("lookup", 3, 0, &w);

    struct kvp_stat_entry stats[3] = {
        {"requests", 12},
        {"pool_size", 1u << 30},
        {"connections", 1},
    };
    kvp_encode_stats_reply(&w, stats, 3);
    reply_seed("stats", 4, 3, &w);

    kvp_encode_count_reply(&w, 2);
    reply_seed("count", 5, 0, &w);

    kvp_encode_error(&w, "num_layers must be >= 1");
    reply_seed("error", 6, 255, &w);

    kvp_encode_text_reply(&w, status_json, (uint32_t)strlen(status_json));
    reply_seed("text-status", 7, 0, &w);
    kvp_encode_text_reply(&w, metrics_text, (uint32_t)strlen(metrics_text));
    reply_seed("text-metrics", 7, 0, &w);
    kvp_wbuf_free(&w);
}

/* A client session: frames appended to one buffer with increasing request ids. */
struct session {
    struct kvp_wbuf out;
    struct kvp_wbuf body;
    uint64_t next_id;
};

static void frame(struct session *s, uint16_t opcode, const void *payload, size_t payload_len)
{
    put_header(&s->out, opcode, s->next_id++, (uint32_t)s->body.len, 0, payload_len);
    kvp_put_bytes(&s->out, s->body.data, s->body.len);
    kvp_put_bytes(&s->out, payload, payload_len);
    kvp_wbuf_reset(&s->body);
}

static void session_begin(struct session *s)
{
    kvp_wbuf_init(&s->out);
    kvp_wbuf_init(&s->body);
    s->next_id = 1;
}

static void session_end(struct session *s, const char *name)
{
    seed_with_prefix("daemon", name, NULL, 0, &s->out);
    kvp_wbuf_free(&s->out);
    kvp_wbuf_free(&s->body);
}

static void gen_daemon(void)
{
    struct session s;
    struct kvp_register_req reg;
    uint8_t payload[2 * CHUNK_BYTES];

    for (size_t i = 0; i < sizeof(payload); i++)
        payload[i] = (uint8_t)(i * 7 + 1);

    /* Session-less requests. */
    session_begin(&s);
    frame(&s, KVP_OP_HELLO, NULL, 0);
    frame(&s, KVP_OP_PING, NULL, 0);
    frame(&s, KVP_OP_STATS, NULL, 0);
    frame(&s, KVP_OP_MAP_SEGMENT, NULL, 0);
    session_end(&s, "hello-ping-stats");

    /* Inline store, lookup and retrieve. */
    session_begin(&s);
    frame(&s, KVP_OP_HELLO, NULL, 0);
    reg = layout("worker-0", KVP_WIRE_INLINE, 0);
    kvp_encode_register_req(&s.body, &reg);
    frame(&s, KVP_OP_REGISTER, NULL, 0);
    kvp_encode_key_req(&s.body, HANDLE0, 0, 8, tokens, 8, NULL, 0);
    frame(&s, KVP_OP_PREPARE_STORE, NULL, 0);
    kvp_encode_ref_req(&s.body, &(struct kvp_ref_req){.handle = HANDLE0, .id = 1});
    frame(&s, KVP_OP_STORE_INLINE, payload, sizeof(payload));
    kvp_encode_key_req(&s.body, HANDLE0, 0, 0, tokens, 12, NULL, 0);
    frame(&s, KVP_OP_LOOKUP, NULL, 0);
    kvp_encode_key_req(&s.body, HANDLE0, 0, 8, tokens, 8, NULL, 0);
    frame(&s, KVP_OP_RETRIEVE_INLINE, NULL, 0);
    kvp_encode_ref_req(&s.body, &(struct kvp_ref_req){.handle = HANDLE0});
    frame(&s, KVP_OP_UNREGISTER, NULL, 0);
    session_end(&s, "inline-roundtrip");

    /* Shared-memory store and retrieve, with a salt, on an MLA layout. */
    session_begin(&s);
    reg = layout("worker-shm", KVP_WIRE_SHM, 1);
    kvp_encode_register_req(&s.body, &reg);
    frame(&s, KVP_OP_REGISTER, NULL, 0);
    kvp_encode_key_req(&s.body, HANDLE0, 4, 12, tokens, 12, "tenant-a", 8);
    frame(&s, KVP_OP_PREPARE_STORE, NULL, 0);
    kvp_encode_ref_req(&s.body, &(struct kvp_ref_req){.handle = HANDLE0, .id = 1});
    frame(&s, KVP_OP_COMMIT_STORE, NULL, 0);
    kvp_encode_key_req(&s.body, HANDLE0, 0, 12, tokens, 12, "tenant-a", 8);
    frame(&s, KVP_OP_PREPARE_STORE, NULL, 0);
    kvp_encode_ref_req(&s.body, &(struct kvp_ref_req){.handle = HANDLE0, .id = 2});
    frame(&s, KVP_OP_ABORT_STORE, NULL, 0);
    kvp_encode_key_req(&s.body, HANDLE0, 4, 12, tokens, 12, "tenant-a", 8);
    frame(&s, KVP_OP_PREPARE_RETRIEVE, NULL, 0);
    kvp_encode_ref_req(&s.body, &(struct kvp_ref_req){.handle = HANDLE0, .id = 3});
    frame(&s, KVP_OP_COMMIT_RETRIEVE, NULL, 0);
    session_end(&s, "shm-store-retrieve");

    /* A worker that disconnects holding a reservation and a pin. */
    session_begin(&s);
    reg = layout("worker-1", KVP_WIRE_AUTO, 0);
    kvp_encode_register_req(&s.body, &reg);
    frame(&s, KVP_OP_REGISTER, NULL, 0);
    kvp_encode_key_req(&s.body, HANDLE0, 0, 4, tokens, 4, NULL, 0);
    frame(&s, KVP_OP_PREPARE_STORE, NULL, 0);
    kvp_encode_ref_req(&s.body, &(struct kvp_ref_req){.handle = HANDLE0, .id = 1});
    frame(&s, KVP_OP_COMMIT_STORE, NULL, 0);
    kvp_encode_key_req(&s.body, HANDLE0, 0, 8, tokens, 8, NULL, 0);
    frame(&s, KVP_OP_PREPARE_STORE, NULL, 0);
    session_end(&s, "disconnect-holding");

    /* An operator's requests while a worker holds a pin: STATUS, METRICS, CLEAR (the pinned
     * chunks stay), then CLEAR again once they are unpinned. */
    session_begin(&s);
    frame(&s, KVP_OP_HELLO, NULL, 0);
    reg = layout("worker-shm", KVP_WIRE_SHM, 0);
    kvp_encode_register_req(&s.body, &reg);
    frame(&s, KVP_OP_REGISTER, NULL, 0);
    kvp_encode_key_req(&s.body, HANDLE0, 0, 12, tokens, 12, NULL, 0);
    frame(&s, KVP_OP_PREPARE_STORE, NULL, 0);
    kvp_encode_ref_req(&s.body, &(struct kvp_ref_req){.handle = HANDLE0, .id = 1});
    frame(&s, KVP_OP_COMMIT_STORE, NULL, 0);
    kvp_encode_key_req(&s.body, HANDLE0, 0, 8, tokens, 8, NULL, 0);
    frame(&s, KVP_OP_PREPARE_RETRIEVE, NULL, 0);
    frame(&s, KVP_OP_STATUS, NULL, 0);
    frame(&s, KVP_OP_METRICS, NULL, 0);
    frame(&s, KVP_OP_CLEAR, NULL, 0);
    kvp_encode_key_req(&s.body, HANDLE0, 0, 0, tokens, 12, NULL, 0);
    frame(&s, KVP_OP_LOOKUP, NULL, 0);
    kvp_encode_ref_req(&s.body, &(struct kvp_ref_req){.handle = HANDLE0, .id = 2});
    frame(&s, KVP_OP_COMMIT_RETRIEVE, NULL, 0);
    frame(&s, KVP_OP_CLEAR, NULL, 0);
    session_end(&s, "status-metrics-clear");

    /* STATUS takes no body: a malformed frame, answered, then the connection is closed. */
    session_begin(&s);
    kvp_put_u32(&s.body, 1);
    frame(&s, KVP_OP_STATUS, NULL, 0);
    frame(&s, KVP_OP_PING, NULL, 0);
    session_end(&s, "status-with-body");

    /* Framing errors: a request with the reply flag, then one with a bad magic. */
    session_begin(&s);
    frame(&s, KVP_OP_PING | KVP_REPLY_FLAG, NULL, 0);
    session_end(&s, "reply-flag");
    session_begin(&s);
    kvp_put_bytes(&s.out, "GET / HTTP/1.1\r\nHost: kvpool\r\n\r\n", 32);
    session_end(&s, "not-kvpool");
}

/* A daemon's reply stream, as fuzz_client.c's script reads it: request ids 1, 2, ... */
struct replies {
    struct kvp_wbuf out;
    struct kvp_wbuf body;
    uint64_t next_id;
};

static void reply(struct replies *r, uint16_t opcode, int32_t status, const void *payload,
                  size_t payload_len)
{
    put_header(&r->out, opcode | KVP_REPLY_FLAG, r->next_id++, (uint32_t)r->body.len, status,
               payload_len);
    kvp_put_bytes(&r->out, r->body.data, r->body.len);
    kvp_put_bytes(&r->out, payload, payload_len);
    kvp_wbuf_reset(&r->body);
}

/* HELLO (protocol 1.minor), PING, STATS and REGISTER as a daemon without SHM answers them. */
static void client_prologue(struct replies *r, uint16_t minor)
{
    struct kvp_hello_reply hello = {
        .major = 1,
        .minor = minor,
        .pid = 4242,
        .chunk_tokens = 4,
        .shm_reason = "SHM disabled by configuration",
    };
    struct kvp_stat_entry stats[2] = {{"requests", 3}, {"connections", 1}};
    struct kvp_register_reply reg = {
        .handle = HANDLE0,
        .transport = KVP_WIRE_INLINE,
        .ndim = 4,
        .chunk_tokens = 4,
        .shape = {2, 1, 4, 4},
        .chunk_bytes = CHUNK_BYTES,
        .dtype_size = 1,
        .dtype = "uint8",
        .reason = "requested by worker",
    };

    kvp_wbuf_init(&r->out);
    kvp_wbuf_init(&r->body);
    r->next_id = 1;
    kvp_encode_hello_reply(&r->body, &hello);
    reply(r, KVP_OP_HELLO, 0, NULL, 0);
    reply(r, KVP_OP_PING, 0, NULL, 0);
    kvp_encode_stats_reply(&r->body, stats, 2);
    reply(r, KVP_OP_STATS, 0, NULL, 0);
    kvp_encode_register_reply(&r->body, &reg);
    reply(r, KVP_OP_REGISTER, 0, NULL, 0);
}

static void client_end(struct replies *r, const char *name)
{
    seed_with_prefix("client", name, NULL, 0, &r->out);
    kvp_wbuf_free(&r->out);
    kvp_wbuf_free(&r->body);
}

static void gen_client(void)
{
    struct replies r;
    uint8_t payload[2 * CHUNK_BYTES];
    struct kvp_wire_slot slots[2] = {
        {.chunk_index = 0, .offset = 4096, .length = CHUNK_BYTES},
        {.chunk_index = 1, .offset = 8192, .length = CHUNK_BYTES},
    };

    for (size_t i = 0; i < sizeof(payload); i++)
        payload[i] = (uint8_t)(i * 5 + 3);

    /* Everything succeeds: two chunks stored, then retrieved. */
    client_prologue(&r, 0);
    kvp_encode_lookup_reply(&r.body, &(struct kvp_lookup_reply){.nchunks = 2});
    reply(&r, KVP_OP_LOOKUP, 0, NULL, 0);
    kvp_encode_slots_reply(
        &r.body, &(struct kvp_slots_reply){.id = 1, .nchunks = 2, .nslots = 2, .slots = slots});
    reply(&r, KVP_OP_PREPARE_STORE, 0, NULL, 0);
    kvp_encode_count_reply(&r.body, 2);
    reply(&r, KVP_OP_STORE_INLINE, 0, NULL, 0);
    kvp_encode_slots_reply(&r.body,
                           &(struct kvp_slots_reply){.nchunks = 2, .nslots = 2, .slots = slots});
    reply(&r, KVP_OP_RETRIEVE_INLINE, 0, payload, sizeof(payload));
    reply(&r, KVP_OP_UNREGISTER, 0, NULL, 0);
    client_end(&r, "roundtrip");

    /* A 1.1 daemon: the same, then the operator's status, metrics and clear. */
    client_prologue(&r, 1);
    kvp_encode_lookup_reply(&r.body, &(struct kvp_lookup_reply){.nchunks = 2, .cached = 2});
    reply(&r, KVP_OP_LOOKUP, 0, NULL, 0);
    kvp_encode_slots_reply(&r.body, &(struct kvp_slots_reply){.nchunks = 2, .cached = 2});
    reply(&r, KVP_OP_PREPARE_STORE, 0, NULL, 0);
    kvp_encode_slots_reply(&r.body,
                           &(struct kvp_slots_reply){.nchunks = 2, .nslots = 2, .slots = slots});
    reply(&r, KVP_OP_RETRIEVE_INLINE, 0, payload, sizeof(payload));
    reply(&r, KVP_OP_UNREGISTER, 0, NULL, 0);
    kvp_encode_text_reply(&r.body, status_json, (uint32_t)strlen(status_json));
    reply(&r, KVP_OP_STATUS, 0, NULL, 0);
    kvp_encode_text_reply(&r.body, metrics_text, (uint32_t)strlen(metrics_text));
    reply(&r, KVP_OP_METRICS, 0, NULL, 0);
    kvp_encode_count_reply(&r.body, 2);
    reply(&r, KVP_OP_CLEAR, 0, NULL, 0);
    client_end(&r, "status-metrics-clear");

    /* Everything cached already; an error reply to the retrieve. */
    client_prologue(&r, 0);
    kvp_encode_lookup_reply(&r.body, &(struct kvp_lookup_reply){.nchunks = 2, .cached = 2});
    reply(&r, KVP_OP_LOOKUP, 0, NULL, 0);
    kvp_encode_slots_reply(&r.body, &(struct kvp_slots_reply){.nchunks = 2, .cached = 2});
    reply(&r, KVP_OP_PREPARE_STORE, 0, NULL, 0);
    kvp_encode_error(&r.body, "unknown instance handle 0x00010000");
    reply(&r, KVP_OP_RETRIEVE_INLINE, -2 /* -ENOENT */, NULL, 0);
    reply(&r, KVP_OP_UNREGISTER, 0, NULL, 0);
    client_end(&r, "cached-then-error");

    /* A refused registration. */
    kvp_wbuf_init(&r.out);
    kvp_wbuf_init(&r.body);
    r.next_id = 1;
    kvp_encode_hello_reply(&r.body, &(struct kvp_hello_reply){.major = 1, .chunk_tokens = 4});
    reply(&r, KVP_OP_HELLO, 0, NULL, 0);
    reply(&r, KVP_OP_PING, 0, NULL, 0);
    kvp_encode_stats_reply(&r.body, NULL, 0);
    reply(&r, KVP_OP_STATS, 0, NULL, 0);
    kvp_encode_error(&r.body, "dtype 'uint8' is not supported");
    reply(&r, KVP_OP_REGISTER, -22 /* -EINVAL */, NULL, 0);
    client_end(&r, "register-refused");
}

/*
 * fuzz_envelope's seeds: LMCache 0.5.7 TensorEnvelopes of the encoder, with fuzz_envelope.c's
 * registration in front (dtype index, rank - 1, 2 bytes per dimension, most tensors | 0x80 for
 * "exactly"), and variants each wrong in one way.
 */
static void envelope_seed(const char *name, uint8_t dtype_idx, const char *dtype, uint32_t ndim,
                          const uint16_t *dims, uint8_t count, uint32_t n, const char *mutation)
{
    struct kvp_envelope_layout l = {.dtype = dtype, .ndim = ndim};
    struct kvp_envelope_template t;
    uint8_t prefix[16];
    size_t np = 0;
    uint64_t size;

    prefix[np++] = dtype_idx;
    prefix[np++] = (uint8_t)(ndim - 1);
    for (uint32_t i = 0; i < ndim; i++) {
        l.shape[i] = dims[i];
        prefix[np++] = (uint8_t)dims[i];
        prefix[np++] = (uint8_t)(dims[i] >> 8);
    }
    prefix[np++] = count;
    if (kvp_envelope_template_init(&t, &l, NULL, 0) || kvp_envelope_encoded_size(&t, n, &size) ||
        t.chunk_bytes * n > 4096) {
        fprintf(stderr, "cannot encode envelope/%s\n", name);
        failures++;
        return;
    }
    uint8_t chunks[4096], env[8192];
    const uint8_t *ptrs[16];
    for (size_t i = 0; i < sizeof(chunks); i++)
        chunks[i] = (uint8_t)(i * 7);
    for (uint32_t i = 0; i < n; i++)
        ptrs[i] = chunks + i * t.chunk_bytes;
    int64_t len = kvp_envelope_encode(&t, n, ptrs, env, sizeof(env));
    if (len < 0) {
        fprintf(stderr, "cannot encode envelope/%s\n", name);
        failures++;
        return;
    }
    /* "version": 1 is bytes 1..9 (fixstr "version", then the int). */
    if (strcmp(mutation, "version2") == 0)
        env[9] = 0x02;
    else if (strcmp(mutation, "groups") == 0) /* "tensors" becomes "groupss", unknown */
        memcpy(env + 11, "groupss", 7);
    else if (strcmp(mutation, "truncated") == 0)
        len -= 3;
    struct kvp_wbuf w;
    kvp_wbuf_init(&w);
    kvp_put_bytes(&w, env, (size_t)len);
    seed_with_prefix("envelope", name, prefix, np, &w);
    kvp_wbuf_free(&w);
}

static void gen_envelope(void)
{
    static const uint16_t kv[4] = {2, 2, 4, 8}; /* [2, layers, tokens, hidden] */
    static const uint16_t mla[3] = {2, 4, 16};  /* [layers, tokens, hidden] */
    envelope_seed("float16_2x2x4x8_n3", 0, "float16", 4, kv, 0x80 | 3, 3, "");
    envelope_seed("bfloat16_2x2x4x8_n2_upto4", 1, "bfloat16", 4, kv, 4, 2, "");
    envelope_seed("float32_2x4x16_n1", 2, "float32", 3, mla, 0x80 | 1, 1, "");
    envelope_seed("uint8_2x4x16_n0", 5, "uint8", 3, mla, 0x80 | 0, 0, "");
    envelope_seed("float8_e4m3fn_2x2x4x8_n2", 6, "float8_e4m3fn", 4, kv, 2, 2, "");
    envelope_seed("version2", 0, "float16", 4, kv, 3, 3, "version2");
    envelope_seed("unknown_field", 0, "float16", 4, kv, 3, 3, "groups");
    envelope_seed("truncated", 0, "float16", 4, kv, 3, 3, "truncated");
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    out_dir = argv[1];
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "mkdir %s: %s\n", out_dir, strerror(errno));
        return 1;
    }
    gen_header();
    gen_request();
    gen_reply();
    gen_daemon();
    gen_client();
    gen_envelope();
    return failures ? 1 : 0;
}
