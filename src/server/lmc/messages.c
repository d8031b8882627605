/*
 * messages.c - decoders and encoders of LMCache's multiprocess messages (see messages.h).
 *
 * A struct decoder walks the map once: each key is compared with the field names it knows,
 * the value is read with the field's type and bound, a bit records that the field was seen, and
 * an unknown key's value is skipped whole (msgspec ignores unknown fields too, which is how
 * LMCache stays compatible across versions). After the walk the required bits must all be set,
 * and the payload must have ended exactly at the end of the frame.
 *
 * Encoders write the fields in LMCache's definition order and msgspec's smallest forms, so a
 * reply is byte for byte what `lmcache server` would send for the same values (the tests compare
 * against frames recorded from it).
 */
#include "lmc/messages.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/why.h"

static const struct {
    enum lmc_op op;
    const char *name;
} op_table[] = {
#define LMC_OP_ROW(sym, id, name) {LMC_OP_##sym, name},
    LMC_OPS(LMC_OP_ROW)
#undef LMC_OP_ROW
};

#define NOPS (sizeof(op_table) / sizeof(op_table[0]))

const char *lmc_op_name(enum lmc_op op)
{
    for (size_t i = 0; i < NOPS; i++)
        if (op_table[i].op == op)
            return op_table[i].name;
    return "?";
}

enum lmc_op lmc_op_decode(const void *frame, size_t n, char *name, size_t cap)
{
    struct lmc_mp_reader r;
    enum lmc_mp_type t;
    if (cap)
        name[0] = '\0';
    lmc_mp_reader_init(&r, frame, n);
    if (lmc_mp_peek(&r, &t))
        return LMC_OP_UNKNOWN;
    if (t == LMC_MP_INT) {
        int64_t id;
        if (lmc_mp_read_int(&r, 1, 99, &id) || lmc_mp_left(&r))
            return LMC_OP_UNKNOWN;
        for (size_t i = 0; i < NOPS; i++)
            if ((int64_t)op_table[i].op == id)
                return op_table[i].op;
        return LMC_OP_UNKNOWN;
    }
    if (t != LMC_MP_STR)
        return LMC_OP_UNKNOWN;
    const char *s;
    uint32_t len;
    if (lmc_mp_read_str(&r, UINT32_MAX, &s, &len) || lmc_mp_left(&r))
        return LMC_OP_UNKNOWN;
    if (cap) {
        size_t c = len < cap - 1 ? len : cap - 1;
        /* Only printable ASCII reaches a log line. */
        for (size_t i = 0; i < c; i++)
            name[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
        name[c] = '\0';
    }
    for (size_t i = 0; i < NOPS; i++)
        if (strlen(op_table[i].name) == len && memcmp(op_table[i].name, s, len) == 0)
            return op_table[i].op;
    return LMC_OP_UNKNOWN;
}

/* Compares a map key (s, len) with a field name. */
static bool key_is(const char *s, uint32_t len, const char *field)
{
    return strlen(field) == len && memcmp(s, field, len) == 0;
}

/* Number of UTF-8 characters in s (continuation bytes not counted). */
static uint32_t utf8_chars(const char *s, uint32_t len)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < len; i++)
        n += ((unsigned char)s[i] & 0xc0) != 0x80;
    return n;
}

static int read_u32(struct lmc_mp_reader *r, uint32_t min, uint32_t max, uint32_t *v)
{
    int64_t x;
    int rc = lmc_mp_read_int(r, min, max, &x);
    if (rc == 0)
        *v = (uint32_t)x;
    return rc;
}

/* Opens a message that is a map of at most 64 fields; @what names the message in @why. */
static int open_map(struct lmc_mp_reader *r, const void *frame, size_t n, const char *what,
                    uint32_t *nfields, char *why, size_t why_size)
{
    lmc_mp_reader_init(r, frame, n);
    int rc = lmc_mp_read_map(r, 64, nfields);
    if (rc)
        return kvp_why(why, why_size, rc, "%s: not a map (%s)", what, lmc_mp_error_words(rc));
    return 0;
}

/* Reads the name of field @i. A key we cannot know (not a short str) is skipped with its
 * value and 1 is returned; 0 means (*name, *len) is the name and its value comes next. */
static int field_name(struct lmc_mp_reader *r, const char *what, uint32_t i, const char **name,
                      uint32_t *len, char *why, size_t why_size)
{
    int rc = lmc_mp_read_str(r, 64, name, len);
    if (rc == -E2BIG || rc == -EINVAL) {
        if ((rc = lmc_mp_skip(r)) || (rc = lmc_mp_skip(r)))
            return kvp_why(why, why_size, rc, "%s: field %u %s", what, i, lmc_mp_error_words(rc));
        return 1;
    }
    if (rc)
        return kvp_why(why, why_size, rc, "%s: field %u %s", what, i, lmc_mp_error_words(rc));
    return 0;
}

/* Checks that nothing follows the map and that every required field was seen: bit b of @seen
 * stands for names[b], and all @nnames of them are required. */
static int close_map(const struct lmc_mp_reader *r, const char *what, uint32_t seen,
                     const char *const *names, unsigned nnames, char *why, size_t why_size)
{
    if (lmc_mp_left(r))
        return kvp_why(why, why_size, -EPROTO, "%s: %zu bytes after the map", what, lmc_mp_left(r));
    for (unsigned b = 0; b < nnames; b++)
        if (!(seen & (1u << b)))
            return kvp_why(why, why_size, -EINVAL, "%s: no %s", what, names[b]);
    return 0;
}

enum {
    K_MODEL = 1u << 0,
    K_WORLD = 1u << 1,
    K_WORKER = 1u << 2,
    K_TOKENS = 1u << 3,
    K_START = 1u << 4,
    K_END = 1u << 5,
    K_REQID = 1u << 6,
};

static int key_tokens(struct lmc_mp_reader *r, struct lmc_key *k, uint8_t *tokens_le)
{
    uint32_t n;
    int rc = lmc_mp_read_array(r, KVP_MAX_TOKENS, &n);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < n; i++) {
        int64_t t;
        rc = lmc_mp_read_int(r, 0, UINT32_MAX, &t);
        if (rc)
            return rc;
        uint8_t *p = tokens_le + (size_t)i * 4;
        p[0] = (uint8_t)t;
        p[1] = (uint8_t)(t >> 8);
        p[2] = (uint8_t)(t >> 16);
        p[3] = (uint8_t)(t >> 24);
    }
    k->ntokens = n;
    k->token_form = LMC_TOKENS_IDS;
    return 0;
}

/* token_bytes (0.5.7): big-endian uint32 words, turned around into the little-endian array
 * token_ids decode to, so a 0.5.6 and a 0.5.7 worker derive the same keys. */
static int key_token_bytes(struct lmc_mp_reader *r, struct lmc_key *k, uint8_t *tokens_le,
                           char *why, size_t why_size)
{
    const uint8_t *b;
    uint64_t len;
    int rc = lmc_mp_read_bin(r, (uint64_t)KVP_MAX_TOKENS * 4, &b, &len);
    if (rc)
        return kvp_why(why, why_size, rc, "key: token_bytes %s", lmc_mp_error_words(rc));
    if (len % 4)
        return kvp_why(why, why_size, -EINVAL,
                       "key: token_bytes has %llu bytes, not a whole number of 4-byte tokens",
                       (unsigned long long)len);
    for (uint64_t i = 0; i < len; i += 4) {
        tokens_le[i] = b[i + 3];
        tokens_le[i + 1] = b[i + 2];
        tokens_le[i + 2] = b[i + 1];
        tokens_le[i + 3] = b[i];
    }
    k->ntokens = (uint32_t)(len / 4);
    k->token_form = LMC_TOKENS_BYTES;
    return 0;
}

int lmc_decode_key(const void *frame, size_t n, struct lmc_key *k, uint8_t *tokens_le, char *why,
                   size_t why_size)
{
    struct lmc_mp_reader r;
    uint32_t nfields, seen = 0;
    int rc;

    memset(k, 0, sizeof(*k));
    if ((rc = open_map(&r, frame, n, "key", &nfields, why, why_size)))
        return rc;
    for (uint32_t i = 0; i < nfields; i++) {
        const char *name;
        uint32_t len;
        const char *field = "?";
        rc = field_name(&r, "key", i, &name, &len, why, why_size);
        if (rc < 0)
            return rc;
        if (rc > 0)
            continue;
        if (key_is(name, len, "model_name")) {
            field = "model_name";
            rc = lmc_mp_read_cstr(&r, k->model_name, sizeof(k->model_name));
            if (rc == 0 && k->model_name[0] == '\0')
                rc = -EINVAL;
            seen |= K_MODEL;
        } else if (key_is(name, len, "world_size")) {
            field = "world_size";
            rc = read_u32(&r, 1, 255, &k->world_size);
            seen |= K_WORLD;
        } else if (key_is(name, len, "worker_id")) {
            field = "worker_id";
            k->has_worker_id = !lmc_mp_try_nil(&r);
            if (k->has_worker_id)
                rc = read_u32(&r, 0, 254, &k->worker_id);
            seen |= K_WORKER;
        } else if (key_is(name, len, "token_ids") || key_is(name, len, "token_bytes")) {
            bool ids = key_is(name, len, "token_ids");
            field = ids ? "token_ids" : "token_bytes";
            /* Either form, once: two of them could disagree on the tokens. */
            if (seen & K_TOKENS)
                return kvp_why(why, why_size, -EINVAL, "key: a second token_ids or token_bytes");
            if (ids) {
                rc = key_tokens(&r, k, tokens_le);
            } else if ((rc = key_token_bytes(&r, k, tokens_le, why, why_size))) {
                return rc;
            }
            seen |= K_TOKENS;
        } else if (key_is(name, len, "start")) {
            field = "start";
            rc = read_u32(&r, 0, KVP_MAX_TOKENS, &k->start);
            seen |= K_START;
        } else if (key_is(name, len, "end")) {
            field = "end";
            rc = read_u32(&r, 0, KVP_MAX_TOKENS, &k->end);
            seen |= K_END;
        } else if (key_is(name, len, "request_id")) {
            field = "request_id";
            rc = lmc_mp_read_cstr(&r, k->request_id, sizeof(k->request_id));
            seen |= K_REQID;
        } else if (key_is(name, len, "cache_salt")) {
            const char *s;
            field = "cache_salt";
            rc = lmc_mp_read_str(&r, LMC_MAX_SALT_BYTES, &s, &k->salt_len);
            if (rc == 0) {
                if (utf8_chars(s, k->salt_len) > LMC_MAX_SALT_CHARS)
                    rc = -E2BIG;
                else if (memchr(s, '@', k->salt_len) || memchr(s, '/', k->salt_len) ||
                         memchr(s, '\\', k->salt_len) || memchr(s, '\0', k->salt_len))
                    return kvp_why(why, why_size, -EINVAL,
                                   "key: cache_salt contains one of @ / \\ or NUL");
                else
                    memcpy(k->salt, s, k->salt_len);
            }
        } else if (key_is(name, len, "num_kv_readers")) {
            field = "num_kv_readers";
            rc = read_u32(&r, 0, 65535, &k->num_kv_readers);
        } else {
            /* request_configs (metadata), null_chunk_mask and fields of later versions. */
            rc = lmc_mp_skip(&r);
        }
        if (rc)
            return kvp_why(why, why_size, rc, "key: %s %s", field, lmc_mp_error_words(rc));
    }
    static const char *const names[] = {"model_name", "world_size",
                                        "worker_id",  "token_ids (or token_bytes)",
                                        "start",      "end",
                                        "request_id"};
    if ((rc = close_map(&r, "key", seen, names, 7, why, why_size)))
        return rc;
    if (k->has_worker_id && k->worker_id >= k->world_size)
        return kvp_why(why, why_size, -EINVAL, "key: worker_id %u is not below world_size %u",
                       k->worker_id, k->world_size);
    if (k->start > k->end)
        return kvp_why(why, why_size, -EINVAL, "key: start %u is after end %u", k->start, k->end);
    return 0;
}

enum {
    R_IID = 1u << 0,
    R_MODEL = 1u << 1,
    R_WORLD = 1u << 2,
    R_BLOCK = 1u << 3,
    R_LAYERS = 1u << 4,
    R_HIDDEN = 1u << 5,
    R_DTYPE = 1u << 6,
    R_MLA = 1u << 7,
};

/* engine_group_infos: kvpool serves one group. An empty list is the plain layout; one entry is
 * accepted as it is (the worker already refuses more than one group for the engine-driven
 * transfer, and the layout fields decide the chunk). More entries are refused. */
static int reg_groups(struct lmc_mp_reader *r, struct lmc_register *m)
{
    uint32_t n;
    int rc = lmc_mp_read_array(r, 4096, &n);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < n; i++)
        if ((rc = lmc_mp_skip(r)))
            return rc;
    if (n > 1)
        snprintf(m->unsupported, sizeof(m->unsupported),
                 "%u KV cache groups (kvpool serves one; run vLLM with "
                 "--disable-hybrid-kv-cache-manager)",
                 n);
    return 0;
}

/* group_layouts (0.5.7): one GroupLayout per KV cache group of a hybrid model, empty for a
 * single-group worker. The entries are stepped over: any entry means several groups, which
 * kvpool refuses (0.5.7's worker fills the list only for more than one group). */
static int reg_group_layouts(struct lmc_mp_reader *r, struct lmc_register *m)
{
    uint32_t n;
    int rc = lmc_mp_read_array(r, LMC_MAX_GROUPS, &n);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < n; i++) {
        enum lmc_mp_type t;
        if ((rc = lmc_mp_peek(r, &t)))
            return rc;
        if (t != LMC_MP_MAP)
            return -EINVAL;
        if ((rc = lmc_mp_skip(r)))
            return rc;
    }
    m->has_group_layouts = true;
    m->ngroup_layouts = n;
    if (n > 0)
        snprintf(m->unsupported, sizeof(m->unsupported),
                 "a hybrid model (%u KV cache groups in group_layouts): kvpool serves one group; "
                 "run vLLM with --disable-hybrid-kv-cache-manager",
                 n);
    return 0;
}

int lmc_decode_register(const void *frame, size_t n, struct lmc_register *m, char *why,
                        size_t why_size)
{
    struct lmc_mp_reader r;
    uint32_t nfields, seen = 0;
    int rc;

    memset(m, 0, sizeof(*m));
    if ((rc = open_map(&r, frame, n, "registration", &nfields, why, why_size)))
        return rc;
    for (uint32_t i = 0; i < nfields; i++) {
        const char *name;
        uint32_t len;
        const char *field = "?";
        rc = field_name(&r, "registration", i, &name, &len, why, why_size);
        if (rc < 0)
            return rc;
        if (rc > 0)
            continue;
        if (key_is(name, len, "instance_id")) {
            field = "instance_id";
            rc = lmc_mp_read_uint(&r, INT64_MAX, &m->instance_id);
            seen |= R_IID;
        } else if (key_is(name, len, "model_name")) {
            field = "model_name";
            rc = lmc_mp_read_cstr(&r, m->model_name, sizeof(m->model_name));
            if (rc == 0 && m->model_name[0] == '\0')
                rc = -EINVAL;
            seen |= R_MODEL;
        } else if (key_is(name, len, "world_size")) {
            field = "world_size";
            rc = read_u32(&r, 1, 255, &m->world_size);
            seen |= R_WORLD;
        } else if (key_is(name, len, "block_size")) {
            field = "block_size";
            rc = read_u32(&r, 1, KVP_MAX_TOKENS, &m->block_size);
            seen |= R_BLOCK;
        } else if (key_is(name, len, "num_layers")) {
            field = "num_layers";
            rc = read_u32(&r, 1, 65535, &m->num_layers);
            seen |= R_LAYERS;
        } else if (key_is(name, len, "hidden_dim_size")) {
            field = "hidden_dim_size";
            rc = read_u32(&r, 1, 1u << 24, &m->hidden_dim);
            seen |= R_HIDDEN;
        } else if (key_is(name, len, "dtype_str")) {
            field = "dtype_str";
            rc = lmc_mp_read_cstr(&r, m->dtype, sizeof(m->dtype));
            seen |= R_DTYPE;
        } else if (key_is(name, len, "use_mla")) {
            field = "use_mla";
            rc = lmc_mp_read_bool(&r, &m->use_mla);
            seen |= R_MLA;
        } else if (key_is(name, len, "num_physical_slots")) {
            field = "num_physical_slots";
            if (!lmc_mp_try_nil(&r)) {
                int64_t v;
                rc = lmc_mp_read_int(&r, INT64_MIN, INT64_MAX, &v);
                if (rc == 0 && (v <= 0 || v > KVP_MAX_TOKENS))
                    return kvp_why(why, why_size, -EINVAL,
                                   "registration: num_physical_slots %lld is not in 1..%u",
                                   (long long)v, KVP_MAX_TOKENS);
                m->num_physical_slots = (uint32_t)v;
            }
        } else if (key_is(name, len, "engine_group_infos")) {
            field = "engine_group_infos";
            rc = reg_groups(&r, m);
        } else if (key_is(name, len, "group_layouts")) {
            field = "group_layouts";
            if (m->has_group_layouts)
                return kvp_why(why, why_size, -EINVAL, "registration: a second group_layouts");
            rc = reg_group_layouts(&r, m);
        } else if (key_is(name, len, "group_layout_descs")) {
            field = "group_layout_descs";
            if (!lmc_mp_try_nil(&r)) {
                rc = lmc_mp_skip(&r);
                snprintf(m->unsupported, sizeof(m->unsupported),
                         "per-group layouts (group_layout_descs): kvpool serves one plain layout");
            }
        } else if (key_is(name, len, "enable_l1_kvweave_quant")) {
            bool q = false;
            field = "enable_l1_kvweave_quant";
            rc = lmc_mp_read_bool(&r, &q);
            if (rc == 0 && q)
                snprintf(m->unsupported, sizeof(m->unsupported),
                         "quantized L1 (enable_l1_kvweave_quant): not served by kvpool");
        } else {
            /* group_hidden_dim_sizes and fields of later versions. */
            rc = lmc_mp_skip(&r);
        }
        if (rc)
            return kvp_why(why, why_size, rc, "registration: %s %s", field, lmc_mp_error_words(rc));
    }
    static const char *const names[] = {"instance_id", "model_name", "world_size",
                                        "block_size",  "num_layers", "hidden_dim_size",
                                        "dtype_str",   "use_mla"};
    return close_map(&r, "registration", seen, names, 8, why, why_size);
}

/* Reads one value with fn and checks that nothing follows it. */
#define WHOLE(call)                           \
    do {                                      \
        int rc_ = (call);                     \
        if (rc_)                              \
            return rc_;                       \
        return lmc_mp_left(&r) ? -EPROTO : 0; \
    } while (0)

int lmc_decode_instance_id(const void *frame, size_t n, uint64_t *iid)
{
    struct lmc_mp_reader r;
    lmc_mp_reader_init(&r, frame, n);
    WHOLE(lmc_mp_read_uint(&r, INT64_MAX, iid));
}

int lmc_decode_opt_instance_id(const void *frame, size_t n, bool *has, uint64_t *iid)
{
    struct lmc_mp_reader r;
    lmc_mp_reader_init(&r, frame, n);
    *has = !lmc_mp_try_nil(&r);
    *iid = 0;
    if (!*has)
        return lmc_mp_left(&r) ? -EPROTO : 0;
    WHOLE(lmc_mp_read_uint(&r, INT64_MAX, iid));
}

int lmc_decode_request_id(const void *frame, size_t n, char *buf, size_t cap)
{
    struct lmc_mp_reader r;
    lmc_mp_reader_init(&r, frame, n);
    WHOLE(lmc_mp_read_cstr(&r, buf, cap));
}

int lmc_decode_bool(const void *frame, size_t n, bool *v)
{
    struct lmc_mp_reader r;
    lmc_mp_reader_init(&r, frame, n);
    WHOLE(lmc_mp_read_bool(&r, v));
}

int lmc_decode_int(const void *frame, size_t n, int64_t min, int64_t max, int64_t *v)
{
    struct lmc_mp_reader r;
    lmc_mp_reader_init(&r, frame, n);
    WHOLE(lmc_mp_read_int(&r, min, max, v));
}

int lmc_decode_float(const void *frame, size_t n, double *v)
{
    struct lmc_mp_reader r;
    lmc_mp_reader_init(&r, frame, n);
    WHOLE(lmc_mp_read_float(&r, v));
}

int lmc_decode_bin(const void *frame, size_t n, uint64_t max, const uint8_t **data, uint64_t *len)
{
    struct lmc_mp_reader r;
    lmc_mp_reader_init(&r, frame, n);
    WHOLE(lmc_mp_read_bin(&r, max, data, len));
}

int lmc_decode_any(const void *frame, size_t n)
{
    return lmc_mp_check_one(frame, n);
}

int lmc_decode_skipped_chunks(const void *frame, size_t n, struct lmc_skipped_chunks *s, char *why,
                              size_t why_size)
{
    struct lmc_mp_reader r;
    uint32_t ngroups;
    int rc;

    memset(s, 0, sizeof(*s));
    lmc_mp_reader_init(&r, frame, n);
    if ((rc = lmc_mp_read_array(&r, LMC_MAX_GROUPS, &ngroups)))
        return kvp_why(why, why_size, rc, "skipped_chunks: not an array of at most %u groups (%s)",
                       LMC_MAX_GROUPS, lmc_mp_error_words(rc));
    for (uint32_t g = 0; g < ngroups; g++) {
        uint32_t npos;
        if ((rc = lmc_mp_read_array(&r, KVP_MAX_CHUNKS, &npos)))
            return kvp_why(why, why_size, rc,
                           "skipped_chunks: group %u is not an array of at most %u positions (%s)",
                           g, KVP_MAX_CHUNKS, lmc_mp_error_words(rc));
        for (uint32_t i = 0; i < npos; i++) {
            int64_t pos;
            if ((rc = lmc_mp_read_int(&r, 0, KVP_MAX_CHUNKS - 1, &pos)))
                return kvp_why(why, why_size, rc, "skipped_chunks: group %u position %u %s", g, i,
                               lmc_mp_error_words(rc));
        }
        s->npositions += npos;
    }
    s->ngroups = ngroups;
    if (lmc_mp_left(&r))
        return kvp_why(why, why_size, -EPROTO, "skipped_chunks: %zu bytes after the array",
                       lmc_mp_left(&r));
    return 0;
}

int lmc_decode_extra_ranges(const void *frame, size_t n, struct lmc_range *out, uint32_t cap,
                            uint32_t *nout, char *why, size_t why_size)
{
    struct lmc_mp_reader r;
    uint32_t count;
    int rc;

    *nout = 0;
    lmc_mp_reader_init(&r, frame, n);
    if ((rc = lmc_mp_read_array(&r, cap, &count)))
        return kvp_why(why, why_size, rc, "extra_ranges: not an array of at most %u pairs (%s)",
                       cap, lmc_mp_error_words(rc));
    for (uint32_t i = 0; i < count; i++) {
        uint32_t two;
        if ((rc = lmc_mp_read_array(&r, 2, &two)) || (two != 2 && (rc = -EINVAL)))
            return kvp_why(why, why_size, rc, "extra_ranges: pair %u is not [start, end] (%s)", i,
                           lmc_mp_error_words(rc));
        if ((rc = read_u32(&r, 0, KVP_MAX_TOKENS, &out[i].start)) ||
            (rc = read_u32(&r, 0, KVP_MAX_TOKENS, &out[i].end)))
            return kvp_why(why, why_size, rc, "extra_ranges: pair %u %s", i,
                           lmc_mp_error_words(rc));
    }
    if (lmc_mp_left(&r))
        return kvp_why(why, why_size, -EPROTO, "extra_ranges: %zu bytes after the array",
                       lmc_mp_left(&r));
    *nout = count;
    return 0;
}

void lmc_encode_register_reply(struct lmc_mp_writer *w, const char *shm_name, uint64_t pool_size,
                               const char *error)
{
    lmc_mp_put_map(w, 5);
    lmc_mp_put_cstr(w, "shm_name");
    lmc_mp_put_cstr(w, shm_name);
    lmc_mp_put_cstr(w, "pool_size");
    lmc_mp_put_uint(w, pool_size);
    lmc_mp_put_cstr(w, "scratch_offset");
    lmc_mp_put_uint(w, 0);
    lmc_mp_put_cstr(w, "scratch_size");
    lmc_mp_put_uint(w, 0);
    lmc_mp_put_cstr(w, "error");
    if (error)
        lmc_mp_put_cstr(w, error);
    else
        lmc_mp_put_nil(w);
}

void lmc_encode_register_reply_to(struct lmc_mp_writer *w, const struct lmc_register *m,
                                  const char *shm_name, uint64_t pool_size, const char *error)
{
    if (!m || !m->has_group_layouts) {
        lmc_encode_register_reply(w, shm_name, pool_size, error);
        return;
    }
    lmc_mp_put_map(w, 4);
    lmc_mp_put_cstr(w, "shm_name");
    lmc_mp_put_cstr(w, shm_name);
    lmc_mp_put_cstr(w, "pool_size");
    lmc_mp_put_uint(w, pool_size);
    lmc_mp_put_cstr(w, "null_block_id");
    lmc_mp_put_uint(w, 0);
    lmc_mp_put_cstr(w, "error");
    if (error)
        lmc_mp_put_cstr(w, error);
    else
        lmc_mp_put_nil(w);
}

void lmc_encode_kv_events_disabled(struct lmc_mp_writer *w, uint64_t incarnation)
{
    lmc_mp_put_map(w, 5);
    lmc_mp_put_cstr(w, "enabled");
    lmc_mp_put_bool(w, false);
    lmc_mp_put_cstr(w, "incarnation");
    lmc_mp_put_uint(w, incarnation);
    lmc_mp_put_cstr(w, "next_cursor");
    lmc_mp_put_uint(w, 0);
    lmc_mp_put_cstr(w, "lost");
    lmc_mp_put_bool(w, false);
    lmc_mp_put_cstr(w, "events");
    lmc_mp_put_array(w, 0);
}

static void put_slots(struct lmc_mp_writer *w, const struct lmc_slot *slots, uint32_t n,
                      const struct lmc_slot_shape *sh)
{
    lmc_mp_put_array(w, n);
    for (uint32_t i = 0; i < n; i++) {
        lmc_mp_put_map(w, 4);
        lmc_mp_put_cstr(w, "offset");
        lmc_mp_put_uint(w, slots[i].offset);
        lmc_mp_put_cstr(w, "length");
        lmc_mp_put_uint(w, slots[i].length);
        lmc_mp_put_cstr(w, "shape");
        lmc_mp_put_array(w, sh->ndim);
        for (uint32_t d = 0; d < sh->ndim; d++)
            lmc_mp_put_uint(w, sh->shape[d]);
        lmc_mp_put_cstr(w, "dtype");
        lmc_mp_put_cstr(w, sh->dtype);
    }
}

void lmc_encode_prepare_store_reply(struct lmc_mp_writer *w, const struct lmc_slot *slots,
                                    const uint32_t *chunk_indices, uint32_t n,
                                    const struct lmc_slot_shape *sh, bool no_buffers)
{
    lmc_mp_put_map(w, 1);
    lmc_mp_put_cstr(w, "context");
    if (no_buffers) {
        lmc_mp_put_map(w, 0);
        return;
    }
    lmc_mp_put_map(w, 2);
    lmc_mp_put_cstr(w, "slots");
    put_slots(w, slots, n, sh);
    lmc_mp_put_cstr(w, "chunk_indices");
    lmc_mp_put_array(w, n);
    for (uint32_t i = 0; i < n; i++)
        lmc_mp_put_uint(w, chunk_indices[i]);
}

void lmc_encode_prepare_retrieve_reply(struct lmc_mp_writer *w, bool success,
                                       const struct lmc_slot *slots, uint32_t n,
                                       const struct lmc_slot_shape *sh)
{
    lmc_mp_put_map(w, 3);
    lmc_mp_put_cstr(w, "success");
    lmc_mp_put_bool(w, success);
    lmc_mp_put_cstr(w, "data");
    lmc_mp_put_bin(w, "", 0);
    lmc_mp_put_cstr(w, "context");
    if (!success) {
        lmc_mp_put_map(w, 0);
        return;
    }
    lmc_mp_put_map(w, 1);
    lmc_mp_put_cstr(w, "slots");
    put_slots(w, slots, n, sh);
}

/* tuple[bytes, bool]: [b"", false], the refusal of the GPU transfer operations. */
static void put_empty_pair(struct lmc_mp_writer *w)
{
    lmc_mp_put_array(w, 2);
    lmc_mp_put_bin(w, "", 0);
    lmc_mp_put_bool(w, false);
}

bool lmc_encode_negative(struct lmc_mp_writer *w, enum lmc_op op)
{
    switch (op) {
    case LMC_OP_STORE_Q:
    case LMC_OP_STORE:
    case LMC_OP_RETRIEVE:
    case LMC_OP_CB_RETRIEVE_PRE_COMPUTED:
        put_empty_pair(w);
        return true;
    case LMC_OP_QUERY_PREFETCH_STATUS:
    case LMC_OP_WAIT_PREFETCH_STATUS:
    case LMC_OP_QUERY_PREFETCH_LOOKUP_HITS:
    case LMC_OP_P2P_LOOKUP_AND_LOCK:
        lmc_mp_put_uint(w, 0);
        return true;
    case LMC_OP_REGISTER_ENGINE_DRIVEN:
        lmc_encode_register_reply(w, "", 0, "malformed registration");
        return true;
    case LMC_OP_PREPARE_STORE:
        lmc_encode_prepare_store_reply(w, NULL, NULL, 0, NULL, false);
        return true;
    case LMC_OP_PREPARE_RETRIEVE:
        lmc_encode_prepare_retrieve_reply(w, false, NULL, 0, NULL);
        return true;
    case LMC_OP_COMMIT_STORE:
    case LMC_OP_COMMIT_RETRIEVE:
    case LMC_OP_PING:
        lmc_mp_put_bool(w, false);
        return true;
    case LMC_OP_NOOP:
        lmc_mp_put_cstr(w, "OK");
        return true;
    case LMC_OP_GET_EXPERIMENTAL:
    case LMC_OP_P2P_QUERY_LOOKUP_RESULTS:
    case LMC_OP_CB_REORDER_PLAN:
        lmc_mp_put_array(w, 0);
        return true;
    case LMC_OP_CB_UNIFIED_LOOKUP:
        /* An empty result (None would mean "still loading" and keep the caller polling). */
        lmc_mp_put_map(w, 3);
        lmc_mp_put_cstr(w, "prefix_coverage_tokens");
        lmc_mp_put_uint(w, 0);
        lmc_mp_put_cstr(w, "non_prefix_segments");
        lmc_mp_put_array(w, 0);
        lmc_mp_put_cstr(w, "segmented_prefix_segments");
        lmc_mp_put_array(w, 0);
        return true;
    case LMC_OP_CB_PROTOCOL_HANDSHAKE:
        lmc_mp_put_array(w, 2);
        lmc_mp_put_uint(w, 0);
        lmc_mp_put_bool(w, false);
        return true;
    case LMC_OP_SERVER_MODULE_CALL:
    case LMC_OP_SERVER_MODULE_AFFINITY_CALL:
        lmc_mp_put_map(w, 3);
        lmc_mp_put_cstr(w, "success");
        lmc_mp_put_bool(w, false);
        lmc_mp_put_cstr(w, "payload");
        lmc_mp_put_bin(w, "", 0);
        lmc_mp_put_cstr(w, "error");
        lmc_mp_put_cstr(w, "kvpoold serves no server modules");
        return true;
    default:
        /* None-typed operations (lookup, end_session, the unregistrations, clear, ...), a
         * stream (subscribe_kv_events: a reply without a value ends it) and unknown ones.
         * negotiate_chunk_size is an int, for which no value is negative: its handler answers
         * the chunk size. */
        return false;
    }
}
