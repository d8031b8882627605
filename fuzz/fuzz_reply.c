/*
 * fuzz_reply.c - the reply body decoders the client library runs on what the daemon sends:
 * HELLO, REGISTER, slots (PREPARE_STORE, PREPARE_RETRIEVE, RETRIEVE_INLINE), LOOKUP, STATS,
 * count (COMMIT_STORE, ABORT_STORE, STORE_INLINE, COMMIT_RETRIEVE, CLEAR), text (STATUS, METRICS)
 * and error replies, plus the check every slot of a slots reply goes through before the library
 * forms a pointer from it (kvp_shm_slot). The daemon is not trusted: another process may own the
 * socket path.
 *
 * Input: one selector byte (which decoder, modulo 8), one parameter byte (the caller's buffer
 * size for error and stats replies), then the body. An accepted body must respect the limits,
 * and re-encode to exactly the same bytes; an accepted slot must lie inside the pool.
 */
#include <string.h>

#include "client/shm_map.h"
#include "common/msg.h"
#include "fuzz.h"

/* A small pool for kvp_shm_slot: header page plus 64 KiB. Only addresses are computed. */
static uint8_t pool[KVP_SHM_HEADER_SIZE + 65536];

static void check_same(struct kvp_wbuf *w, const uint8_t *body, size_t len)
{
    FUZZ_CHECK(w->err == 0);
    FUZZ_CHECK(w->len == len);
    FUZZ_CHECK(len == 0 || memcmp(w->data, body, len) == 0);
}

static void fuzz_hello(const uint8_t *body, size_t len, struct kvp_wbuf *w)
{
    struct kvp_hello_reply m;
    if (kvp_decode_hello_reply(body, len, &m) != 0)
        return;
    FUZZ_CHECK(m.shm_backend <= KVP_WIRE_BACKEND_MEMFD);
    FUZZ_CHECK(strlen(m.shm_name) <= KVP_MAX_NAME);
    FUZZ_CHECK(strlen(m.shm_reason) <= KVP_MAX_REASON);
    kvp_encode_hello_reply(w, &m);
    check_same(w, body, len);
}

static void fuzz_register(const uint8_t *body, size_t len, struct kvp_wbuf *w)
{
    struct kvp_register_reply m;
    if (kvp_decode_register_reply(body, len, &m) != 0)
        return;
    FUZZ_CHECK(m.ndim == 3 || m.ndim == 4);
    FUZZ_CHECK(strlen(m.dtype) <= KVP_MAX_NAME);
    FUZZ_CHECK(strlen(m.shm_name) <= KVP_MAX_NAME);
    FUZZ_CHECK(strlen(m.reason) <= KVP_MAX_REASON);
    kvp_encode_register_reply(w, &m);
    check_same(w, body, len);
}

/* What kvp_shm_slot must decide, written out independently of its implementation. */
static void check_slot(const struct kvp_shm_map *map, const struct kvp_wire_slot *s,
                       uint64_t chunk_bytes)
{
    uint8_t *p = kvp_shm_slot(map, s->offset, s->length, chunk_bytes);
    bool inside = s->offset >= KVP_SHM_HEADER_SIZE && s->offset <= map->size &&
                  s->length <= map->size - s->offset;
    bool valid = inside && s->length == chunk_bytes && s->length > 0;
    FUZZ_CHECK((p != NULL) == valid);
    if (p) {
        FUZZ_CHECK(p == map->base + s->offset);
        FUZZ_CHECK(p >= map->base + KVP_SHM_HEADER_SIZE);
        FUZZ_CHECK(p + s->length <= map->base + map->size);
    }
}

static void fuzz_slots(const uint8_t *body, size_t len, struct kvp_wbuf *w)
{
    static struct kvp_wire_slot slots[KVP_MAX_CHUNKS];
    struct kvp_slots_reply m = {.slots = slots};
    if (kvp_decode_slots_reply(body, len, &m) != 0)
        return;
    FUZZ_CHECK(m.nchunks <= KVP_MAX_CHUNKS);
    FUZZ_CHECK(m.nslots <= m.nchunks);
    for (uint32_t i = 0; i < m.nslots; i++)
        FUZZ_CHECK(m.slots[i].chunk_index < m.nchunks);
    kvp_encode_slots_reply(w, &m);
    check_same(w, body, len);

    /* The library knows its chunk size from REGISTER; take the first slot's claim. */
    struct kvp_shm_map map = {.base = pool, .size = sizeof(pool)};
    uint64_t chunk_bytes = m.nslots ? m.slots[0].length : 0;
    for (uint32_t i = 0; i < m.nslots; i++)
        check_slot(&map, &m.slots[i], chunk_bytes);
    struct kvp_shm_map unmapped = {0};
    const struct kvp_wire_slot *s0 = &m.slots[0];
    if (m.nslots)
        FUZZ_CHECK(kvp_shm_slot(&unmapped, s0->offset, s0->length, chunk_bytes) == NULL);
}

static void fuzz_lookup(const uint8_t *body, size_t len, struct kvp_wbuf *w)
{
    struct kvp_lookup_reply m;
    if (kvp_decode_lookup_reply(body, len, &m) != 0)
        return;
    FUZZ_CHECK(m.cached <= m.nchunks);
    kvp_encode_lookup_reply(w, &m);
    check_same(w, body, len);
}

static void fuzz_stats(const uint8_t *body, size_t len, uint8_t param, struct kvp_wbuf *w)
{
    static struct kvp_stat_entry e[KVP_MAX_STATS];
    size_t cap = param % (KVP_MAX_STATS + 1);
    int n = kvp_decode_stats_reply(body, len, cap ? e : NULL, cap);
    if (n < 0)
        return;
    FUZZ_CHECK(n <= (int)KVP_MAX_STATS);
    for (int i = 0; i < n && (size_t)i < cap; i++)
        FUZZ_CHECK(strlen(e[i].name) < sizeof(e[i].name));
    if ((size_t)n <= cap) {
        kvp_encode_stats_reply(w, e, (uint32_t)n);
        check_same(w, body, len);
    }
}

static void fuzz_count(const uint8_t *body, size_t len, struct kvp_wbuf *w)
{
    struct kvp_count_reply m;
    if (kvp_decode_count_reply(body, len, &m) != 0)
        return;
    kvp_encode_count_reply(w, m.count);
    check_same(w, body, len);
}

static void fuzz_text(const uint8_t *body, size_t len, struct kvp_wbuf *w)
{
    const char *text;
    uint32_t n;
    if (kvp_decode_text_reply(body, len, &text, &n) != 0)
        return;
    /* The text is the rest of the body, within the limit, and holds no NUL. */
    FUZZ_CHECK(n <= KVP_MAX_TEXT && (size_t)n + 4 == len);
    FUZZ_CHECK((const uint8_t *)text == body + 4);
    FUZZ_CHECK(memchr(text, '\0', n) == NULL);
    kvp_encode_text_reply(w, text, n);
    check_same(w, body, len);
}

static void fuzz_error(const uint8_t *body, size_t len, uint8_t param, struct kvp_wbuf *w)
{
    /* Callers pass anything from a tiny buffer to KVP_MAX_ERRMSG + 1 bytes and more. */
    size_t size = (size_t)param + 1;
    char *msg = malloc(size);
    FUZZ_CHECK(msg != NULL);
    if (kvp_decode_error(body, len, msg, size) == 0) {
        FUZZ_CHECK(strlen(msg) < size);
        FUZZ_CHECK(strlen(msg) <= KVP_MAX_ERRMSG);
        kvp_encode_error(w, msg);
        check_same(w, body, len);
    }
    free(msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvp_wbuf w;

    if (size < 2)
        return 0;
    /* A private copy of exactly the body's size, so that ASan sees any read past its end. */
    size_t len = size - 2;
    uint8_t *body = malloc(len ? len : 1);
    FUZZ_CHECK(body != NULL);
    if (len)
        memcpy(body, data + 2, len);

    kvp_wbuf_init(&w);
    switch (data[0] % 8) {
    case 0:
        fuzz_hello(body, len, &w);
        break;
    case 1:
        fuzz_register(body, len, &w);
        break;
    case 2:
        fuzz_slots(body, len, &w);
        break;
    case 3:
        fuzz_lookup(body, len, &w);
        break;
    case 4:
        fuzz_stats(body, len, data[1], &w);
        break;
    case 5:
        fuzz_count(body, len, &w);
        break;
    case 7:
        fuzz_text(body, len, &w);
        break;
    default:
        fuzz_error(body, len, data[1], &w);
        break;
    }
    kvp_wbuf_free(&w);
    free(body);
    return 0;
}
