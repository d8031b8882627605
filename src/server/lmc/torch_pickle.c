/*
 * torch_pickle.c - LMCache's pickle transport, recognised and written without a pickle machine.
 *
 * An LMCache worker that cannot map shared memory sends its chunks as pickle.dumps(list of CPU
 * tensors) and loads what a retrieve returns with pickle.loads. Unpickling bytes from a socket
 * runs whatever callables they name, so kvpoold never unpickles: this module is a recogniser for
 * the one shape torch gives such a list (and for kvpoold's own reply form), and a template
 * writer for the reply form.
 *
 * The decoder walks the opcodes once, left to right, over a small typed stack. Every value it
 * can hold is a descriptor (an integer, a slice of the input, a tuple of at most
 * KVP_TPICKLE_MAX_DIMS integers, a name from a fixed whitelist, a checked storage, a run of
 * tensors); an opcode outside the format, a tuple of any other shape or a global outside the
 * whitelist refuses the payload. REDUCE calls nothing: it checks that the "callable" is the
 * whitelisted name the format puts there and that its arguments have the format's shape, then
 * builds the next descriptor. The storage blob (torch's legacy torch.save: five protocol 2
 * pickles and the raw data) is matched by a sequential grammar: a constant header, the
 * persistent id naming the registration's storage class, the key list, the element count and
 * exactly the element bytes of one chunk. The reply form (below) is matched by the same stack:
 * asarray of a bytearray of one chunk, viewed as the registered dtype, then as the registered
 * shape. Tensors are written to the caller's array as they are built and may only be appended,
 * in that order, to the one list at the bottom of the stack.
 *
 * Bounds: the stack holds TP_STACK_MAX descriptors (a real payload needs 13), the memo keeps at
 * most TP_MEMO_MAX names (other memoised values are counted, never stored, so a memo reference
 * can only ever fetch a name), strings are at most TP_NAME_MAX bytes, the input is at most
 * kvp_tpickle_max_payload() bytes. No recursion, no allocation; all state is one struct on the
 * caller's stack. Every multiplication of a client-given number is checked.
 *
 * The encoder writes the form that loads fastest, not torch's: protocol 5, each tensor
 * Tensor.view(Tensor.view(asarray(bytearray), dtype), shape), which the worker's pickle.loads
 * turns into a tensor with one copy of the bytes, where torch's own form runs torch.load on each
 * blob (4-10x slower). No memo or frames: the same bytes ("pre") before every chunk, the same
 * ("post") after it, so a reply is start, (pre, chunk, post) * n, end.
 *
 * Thread safety: no state outside the caller's arguments.
 */
#include "lmc/torch_pickle.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common/layout.h"
#include "common/why.h"

#define TP_STACK_MAX 24
#define TP_MEMO_MAX 32
#define TP_NAME_MAX 64

/* Pickle opcodes the format uses (CPython's Lib/pickle.py names). */
enum {
    OP_MARK = '(',
    OP_STOP = '.',
    OP_BININT = 'J',
    OP_BININT1 = 'K',
    OP_BININT2 = 'M',
    OP_NONE = 'N',
    OP_BINPERSID = 'Q',
    OP_REDUCE = 'R',
    OP_BINUNICODE = 'X',
    OP_EMPTY_LIST = ']',
    OP_APPEND = 'a',
    OP_GLOBAL = 'c',
    OP_APPENDS = 'e',
    OP_BINGET = 'h',
    OP_LONG_BINGET = 'j',
    OP_BINPUT = 'q',
    OP_LONG_BINPUT = 'r',
    OP_TUPLE = 't',
    OP_EMPTY_TUPLE = ')',
    OP_BINBYTES = 'B',
    OP_SHORT_BINBYTES = 'C',
    OP_PROTO = 0x80,
    OP_TUPLE1 = 0x85,
    OP_TUPLE2 = 0x86,
    OP_TUPLE3 = 0x87,
    OP_NEWTRUE = 0x88,
    OP_NEWFALSE = 0x89,
    OP_LONG1 = 0x8a,
    OP_SHORT_BINUNICODE = 0x8c,
    OP_BINBYTES8 = 0x8e,
    OP_STACK_GLOBAL = 0x93,
    OP_MEMOIZE = 0x94,
    OP_FRAME = 0x95,
    OP_BYTEARRAY8 = 0x96,
};

/* The dtypes are common/layout.h's, with their torch pickle form (struct kvp_dtype's
 * torch_storage): the legacy storage class of a _rebuild_tensor_v2 tensor, or NULL for torch's
 * "new" dtypes, which travel as _rebuild_tensor_v3 over an UntypedStorage (counted in bytes)
 * with the dtype as a global. */

/*
 * The torch.save header every blob starts with: the magic number (LONG1), the protocol version
 * 1001, and sys_info {'protocol_version': 1001, 'little_endian': True, 'type_sizes': {'short':
 * 2, 'int': 4, 'long': 4}}, each a protocol 2 pickle, as torch/serialization.py's _legacy_save
 * has written them since 2017. A big-endian writer differs here and is refused.
 */
static const uint8_t tp_blob_header[] = {
    0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e, 0x80,
    0x02, 0x4d, 0xe9, 0x03, 0x2e, 0x80, 0x02, 0x7d, 0x71, 0x00, 0x28, 0x58, 0x10, 0x00, 0x00, 0x00,
    0x70, 0x72, 0x6f, 0x74, 0x6f, 0x63, 0x6f, 0x6c, 0x5f, 0x76, 0x65, 0x72, 0x73, 0x69, 0x6f, 0x6e,
    0x71, 0x01, 0x4d, 0xe9, 0x03, 0x58, 0x0d, 0x00, 0x00, 0x00, 0x6c, 0x69, 0x74, 0x74, 0x6c, 0x65,
    0x5f, 0x65, 0x6e, 0x64, 0x69, 0x61, 0x6e, 0x71, 0x02, 0x88, 0x58, 0x0a, 0x00, 0x00, 0x00, 0x74,
    0x79, 0x70, 0x65, 0x5f, 0x73, 0x69, 0x7a, 0x65, 0x73, 0x71, 0x03, 0x7d, 0x71, 0x04, 0x28, 0x58,
    0x05, 0x00, 0x00, 0x00, 0x73, 0x68, 0x6f, 0x72, 0x74, 0x71, 0x05, 0x4b, 0x02, 0x58, 0x03, 0x00,
    0x00, 0x00, 0x69, 0x6e, 0x74, 0x71, 0x06, 0x4b, 0x04, 0x58, 0x04, 0x00, 0x00, 0x00, 0x6c, 0x6f,
    0x6e, 0x67, 0x71, 0x07, 0x4b, 0x04, 0x75, 0x75, 0x2e,
};

/* The names a payload may use (the whitelist); torch dtypes are matched against common/layout.h's
 * table. */
enum tp_global {
    TG_REBUILD_V2 = 1,
    TG_REBUILD_V3,
    TG_LOAD_FROM_BYTES,
    TG_ORDERED_DICT,
    TG_ASARRAY,
    TG_VIEW,
    TG_DTYPE
};

static const struct {
    const char *module, *name;
    enum tp_global g;
} tp_globals[] = {
    {"torch._utils", "_rebuild_tensor_v2", TG_REBUILD_V2},
    {"torch._utils", "_rebuild_tensor_v3", TG_REBUILD_V3},
    {"torch.storage", "_load_from_bytes", TG_LOAD_FROM_BYTES},
    {"collections", "OrderedDict", TG_ORDERED_DICT},
    {"torch", "asarray", TG_ASARRAY},
    {"torch", "Tensor.view", TG_VIEW},
};

/* What a stack slot describes. */
enum tp_kind {
    TK_MARK = 1,
    TK_LIST,      /* the outer list; n = items appended */
    TK_INT,       /* v[0] */
    TK_BOOL,      /* v[0] */
    TK_STR,       /* off, len */
    TK_BYTES,     /* off, len */
    TK_GLOBAL,    /* g, dtype (TG_DTYPE) */
    TK_TUPLE0,    /* () */
    TK_INTS,      /* n integers in v */
    TK_BLOBARG,   /* (bytes,): off, len of the bytes */
    TK_STORAGE,   /* a checked blob: off, len of its element bytes; untyped */
    TK_ODICT,     /* OrderedDict(), empty */
    TK_TARGS,     /* checked _rebuild_tensor arguments: off, len of the elements; untyped */
    TK_TENSORS,   /* n tensors built in a row, the first being out[first] */
    TK_BUF,       /* a bytearray: off, len */
    TK_BUFARG,    /* (bytearray,): off, len */
    TK_FLAT,      /* asarray(bytearray) of one chunk's bytes: off, len */
    TK_DTARGS,    /* (flat tensor, registered dtype): off, len */
    TK_TYPED,     /* a flat tensor viewed as the registered dtype: off, len */
    TK_SHAPEARGS, /* (typed tensor, registered shape): off, len */
};

static const char *const tp_kind_names[] = {
    "?",
    "mark",
    "list",
    "int",
    "bool",
    "str",
    "bytes",
    "global",
    "tuple",
    "int tuple",
    "(bytes,)",
    "storage",
    "OrderedDict",
    "tensor args",
    "tensor",
    "bytearray",
    "(bytearray,)",
    "flat tensor",
    "(tensor, dtype)",
    "typed tensor",
    "(tensor, shape)",
};

struct tp_item {
    uint8_t kind;
    uint8_t g;       /* TK_GLOBAL */
    uint8_t dtype;   /* TK_GLOBAL of TG_DTYPE: index in common/layout.h's table (kvp_dtype_at()) */
    uint8_t untyped; /* TK_STORAGE, TK_TARGS: an UntypedStorage (_rebuild_tensor_v3) */
    uint32_t n;      /* TK_INTS, TK_TENSORS, TK_LIST */
    uint32_t first;  /* TK_TENSORS */
    uint64_t off, len;
    int64_t v[KVP_TPICKLE_MAX_DIMS];
};

struct tp_memo {
    uint32_t idx;
    struct tp_item item;
};

struct tp_dec {
    const uint8_t *buf;
    size_t len;
    size_t pos;       /* next byte to read */
    size_t op_pos;    /* where the current opcode starts (for messages) */
    size_t limit;     /* reads stop here: the end of the current frame, or len */
    size_t frame_end; /* end of the last FRAME (0: none yet) */
    const struct kvp_tpickle_expect *exp;
    const struct kvp_dtype *dt;
    uint64_t chunk_bytes;
    int64_t stride[KVP_TPICKLE_MAX_DIMS];
    struct kvp_tpickle_tensor *out;
    uint32_t ntensors;
    uint32_t sp;
    uint32_t memo_count; /* MEMOIZE operations so far: the next memo index */
    uint32_t memo_used;  /* entries of memo[] */
    char *why;
    size_t why_size;
    struct tp_item stack[TP_STACK_MAX];
    struct tp_memo memo[TP_MEMO_MAX];
};

/* Refuses the payload: -EPROTO with "offset N: <reason>". */
__attribute__((format(printf, 2, 3))) static int fail(struct tp_dec *d, const char *fmt, ...)
{
    if (d->why && d->why_size) {
        char msg[160];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        snprintf(d->why, d->why_size, "offset %zu: %s", d->op_pos, msg);
    }
    return -EPROTO;
}

/* A client-given name, printable for a log line: non-printable bytes become '?'. */
static const char *printable(const uint8_t *p, uint64_t n, char *dst, size_t dst_size)
{
    size_t k = 0;
    for (; k < n && k + 1 < dst_size; k++)
        dst[k] = (p[k] >= 0x20 && p[k] < 0x7f) ? (char)p[k] : '?';
    dst[k] = '\0';
    return dst;
}

static bool slice_is(const uint8_t *p, uint64_t n, const char *s)
{
    return strlen(s) == n && memcmp(p, s, n) == 0;
}

int kvp_tpickle_layout_check(const struct kvp_tpickle_layout *l, uint64_t *bytes, char *why,
                             size_t why_size)
{
    if (!l || !l->dtype)
        return kvp_why(why, why_size, -EINVAL, "no layout");
    const struct kvp_dtype *dt = kvp_dtype_find(l->dtype);
    if (!dt)
        return kvp_why(why, why_size, -EINVAL, "dtype %.32s has no torch pickle form", l->dtype);
    if (l->ndim < 1 || l->ndim > KVP_TPICKLE_MAX_DIMS)
        return kvp_why(why, why_size, -EINVAL, "%u dimensions, 1..%d allowed", l->ndim,
                       KVP_TPICKLE_MAX_DIMS);
    /* Element count and bytes both stay below 2^63: they travel as pickle ints (int64). */
    uint64_t numel = 1;
    for (uint32_t i = 0; i < l->ndim; i++) {
        if (l->shape[i] == 0)
            return kvp_why(why, why_size, -EINVAL, "dimension %u is 0", i);
        if (l->shape[i] > (uint64_t)INT64_MAX / numel)
            return kvp_why(why, why_size, -EINVAL, "shape overflows 63 bits");
        numel *= l->shape[i];
    }
    if (numel > (uint64_t)INT64_MAX / dt->size)
        return kvp_why(why, why_size, -EINVAL, "chunk bytes overflow 63 bits");
    if (bytes)
        *bytes = numel * dt->size;
    return 0;
}

int kvp_tpickle_max_payload(const struct kvp_tpickle_expect *exp, uint64_t *max)
{
    uint64_t chunk;
    if (!exp || kvp_tpickle_layout_check(&exp->layout, &chunk, NULL, 0) < 0)
        return -EINVAL;
    if (chunk > UINT64_MAX - KVP_TPICKLE_TENSOR_OVERHEAD)
        return -EOVERFLOW;
    uint64_t per = chunk + KVP_TPICKLE_TENSOR_OVERHEAD;
    if (exp->max_tensors && per > (UINT64_MAX - KVP_TPICKLE_STREAM_OVERHEAD) / exp->max_tensors)
        return -EOVERFLOW;
    *max = KVP_TPICKLE_STREAM_OVERHEAD + per * exp->max_tensors;
    return 0;
}

/* ---- reading ---------------------------------------------------------------------------- */

/* Reads n bytes at the cursor (within the current frame): a pointer to them, or NULL. */
static const uint8_t *take(struct tp_dec *d, uint64_t n)
{
    if (n > d->limit - d->pos)
        return NULL;
    const uint8_t *p = d->buf + d->pos;
    d->pos += (size_t)n;
    return p;
}

static uint64_t le(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* The little-endian two's complement integer of n <= 8 bytes (LONG1). */
static int64_t le_signed(const uint8_t *p, unsigned n)
{
    if (n == 0)
        return 0;
    uint64_t v = le(p, n);
    if (n < 8 && (p[n - 1] & 0x80))
        v |= ~(uint64_t)0 << (8 * n);
    return (int64_t)v;
}

static int push(struct tp_dec *d, const struct tp_item *it)
{
    if (d->sp == TP_STACK_MAX)
        return fail(d, "stack deeper than %d", TP_STACK_MAX);
    d->stack[d->sp++] = *it;
    return 0;
}

/* Index of the topmost mark, or -1. */
static int find_mark(const struct tp_dec *d)
{
    for (int i = (int)d->sp - 1; i >= 0; i--)
        if (d->stack[i].kind == TK_MARK)
            return i;
    return -1;
}

/* ---- the storage blob: torch's legacy torch.save format, five protocol 2 pickles ---------- */

struct tp_blob {
    const uint8_t *p;
    uint64_t n, pos;
};

static bool blob_byte(struct tp_blob *b, uint8_t c)
{
    if (b->pos < b->n && b->p[b->pos] == c) {
        b->pos++;
        return true;
    }
    return false;
}

/* An optional BINPUT or LONG_BINPUT (protocol 2 memoises; the blob never reads its memo back). */
static bool blob_put(struct tp_blob *b)
{
    if (blob_byte(b, OP_BINPUT))
        return b->pos++ < b->n;
    if (blob_byte(b, OP_LONG_BINPUT)) {
        if (b->n - b->pos < 4)
            return false;
        b->pos += 4;
    }
    return true;
}

/* BINUNICODE of 1..TP_NAME_MAX bytes, then an optional put. */
static bool blob_str(struct tp_blob *b, const uint8_t **s, uint64_t *len)
{
    if (!blob_byte(b, OP_BINUNICODE) || b->n - b->pos < 4)
        return false;
    *len = le(b->p + b->pos, 4);
    b->pos += 4;
    if (*len < 1 || *len > TP_NAME_MAX || *len > b->n - b->pos)
        return false;
    *s = b->p + b->pos;
    b->pos += *len;
    return blob_put(b);
}

/* A line of GLOBAL's argument, up to '\n', of 1..TP_NAME_MAX bytes. */
static bool blob_line(struct tp_blob *b, const uint8_t **s, uint64_t *len)
{
    *s = b->p + b->pos;
    for (*len = 0; *len <= TP_NAME_MAX && b->pos + *len < b->n; (*len)++)
        if ((*s)[*len] == '\n') {
            b->pos += *len + 1;
            return *len > 0;
        }
    return false;
}

/* BININT1, BININT2, BININT (>= 0) or LONG1 (<= 8 bytes, >= 0). */
static bool blob_count(struct tp_blob *b, uint64_t *v)
{
    if (b->pos >= b->n)
        return false;
    uint8_t op = b->p[b->pos++];
    unsigned w = op == OP_BININT1 ? 1 : op == OP_BININT2 ? 2 : op == OP_BININT ? 4 : 0;
    if (op == OP_LONG1) {
        if (b->pos >= b->n || b->p[b->pos] > 8)
            return false;
        w = b->p[b->pos++];
    }
    if (w == 0 && op != OP_LONG1)
        return false;
    if (b->n - b->pos < w)
        return false;
    int64_t x = (op == OP_BININT1 || op == OP_BININT2) ? (int64_t)le(b->p + b->pos, w)
                : op == OP_BININT                      ? (int32_t)(uint32_t)le(b->p + b->pos, 4)
                                                       : le_signed(b->p + b->pos, w);
    b->pos += w;
    if (x < 0)
        return false;
    *v = (uint64_t)x;
    return true;
}

/*
 * Checks the blob at buf[off..off+len) and describes its element bytes in *st. Grammar:
 *   tp_blob_header
 *   PROTO 2, MARK, 'storage', GLOBAL torch.<Class>, key, 'cpu', numel, NONE, TUPLE, BINPERSID,
 *   STOP                                          (strings BINUNICODE, each object may be put)
 *   PROTO 2, EMPTY_LIST, key, APPEND, STOP        (the same key)
 *   int64 numel, then numel * element size bytes, ending the blob
 */
static int blob_check(struct tp_dec *d, uint64_t off, uint64_t len, struct tp_item *st)
{
    struct tp_blob b = {.p = d->buf + off, .n = len, .pos = 0};
    const uint8_t *s, *mod, *cls, *key, *key2;
    uint64_t slen, modlen, clslen, keylen, key2len, numel;
    char p1[TP_NAME_MAX + 1], p2[TP_NAME_MAX + 1];

    if (len < sizeof(tp_blob_header) || memcmp(b.p, tp_blob_header, sizeof(tp_blob_header)))
        return fail(d, "storage blob does not start with torch's legacy save header");
    b.pos = sizeof(tp_blob_header);
    if (!blob_byte(&b, OP_PROTO) || !blob_byte(&b, 2) || !blob_byte(&b, OP_MARK) ||
        !blob_str(&b, &s, &slen) || !slice_is(s, slen, "storage"))
        return fail(d, "storage blob: no ('storage', ...) persistent id");
    if (!blob_byte(&b, OP_GLOBAL) || !blob_line(&b, &mod, &modlen) ||
        !blob_line(&b, &cls, &clslen) || !blob_put(&b))
        return fail(d, "storage blob: no storage class");
    /*
     * A legacy dtype names its own class. A new dtype's storage is torch's UntypedStorage,
     * counted in bytes.
     */
    bool untyped_cls = slice_is(cls, clslen, "UntypedStorage") &&
                       (slice_is(mod, modlen, "torch") || slice_is(mod, modlen, "torch.storage"));
    bool torch_mod = slice_is(mod, modlen, "torch");
    bool ok = d->dt->torch_storage ? torch_mod && slice_is(cls, clslen, d->dt->torch_storage)
                                   : untyped_cls;
    if (!ok && untyped_cls)
        return fail(d, "storage blob: untyped storage for dtype %s", d->dt->name);
    if (!ok)
        return fail(d, "storage blob names global %s.%s, not the storage of %s",
                    printable(mod, modlen, p1, sizeof(p1)), printable(cls, clslen, p2, sizeof(p2)),
                    d->dt->name);
    bool untyped = d->dt->torch_storage == NULL;
    if (!blob_str(&b, &key, &keylen) || !blob_str(&b, &s, &slen) || !slice_is(s, slen, "cpu"))
        return fail(d, "storage blob: no key or not a 'cpu' storage");
    if (!blob_count(&b, &numel) || !blob_byte(&b, OP_NONE) || !blob_byte(&b, OP_TUPLE) ||
        !blob_put(&b) || !blob_byte(&b, OP_BINPERSID) || !blob_byte(&b, OP_STOP))
        return fail(d, "storage blob: persistent id is not (..., numel, None)");
    if (!blob_byte(&b, OP_PROTO) || !blob_byte(&b, 2) || !blob_byte(&b, OP_EMPTY_LIST) ||
        !blob_put(&b) || !blob_str(&b, &key2, &key2len) || !blob_byte(&b, OP_APPEND) ||
        !blob_byte(&b, OP_STOP))
        return fail(d, "storage blob: no single-key list");
    if (keylen != key2len || memcmp(key, key2, keylen) != 0)
        return fail(d, "storage blob: key list names another storage");
    if (b.n - b.pos < 8 || le(b.p + b.pos, 8) != numel)
        return fail(d, "storage blob: data header does not repeat numel %llu",
                    (unsigned long long)numel);
    b.pos += 8;
    uint64_t elsize = untyped ? 1 : d->dt->size;
    uint64_t have = b.n - b.pos;
    if (numel > UINT64_MAX / elsize || numel * elsize != have)
        return fail(d, "storage blob: numel %llu does not match its %llu data bytes",
                    (unsigned long long)numel, (unsigned long long)have);
    if (have != d->chunk_bytes)
        return fail(d, "storage of %llu bytes, a chunk is %llu", (unsigned long long)have,
                    (unsigned long long)d->chunk_bytes);
    *st = (struct tp_item){.kind = TK_STORAGE, .untyped = untyped, .off = off + b.pos, .len = have};
    return 0;
}

/* ---- tuples and REDUCE ------------------------------------------------------------------- */

static bool is_ints(const struct tp_item *it)
{
    return it->kind == TK_INTS || it->kind == TK_TUPLE0;
}

/* Whether t is a tuple of integers equal to the registered shape. */
static bool registered_shape(const struct tp_dec *d, const struct tp_item *t)
{
    const struct kvp_tpickle_layout *l = &d->exp->layout;
    if (t->kind != TK_INTS || t->n != l->ndim)
        return false;
    for (uint32_t i = 0; i < t->n; i++)
        if (t->v[i] < 0 || (uint64_t)t->v[i] != l->shape[i])
            return false;
    return true;
}

/*
 * The arguments of _rebuild_tensor_v2 (6) or _v3 (7): (storage, storage_offset, size, stride,
 * requires_grad, backward_hooks[, dtype]), checked against the registration.
 */
static int tensor_args(struct tp_dec *d, const struct tp_item *a, uint32_t n, struct tp_item *res)
{
    const struct kvp_tpickle_layout *l = &d->exp->layout;
    static const uint8_t want[] = {TK_STORAGE, TK_INT,   TK_INTS,  TK_INTS,
                                   TK_BOOL,    TK_ODICT, TK_GLOBAL};
    for (uint32_t i = 0; i < n; i++)
        if (a[i].kind != want[i] && !(want[i] == TK_INTS && is_ints(&a[i])))
            return fail(d, "tensor argument %u is a %s, not a %s", i, tp_kind_names[a[i].kind],
                        tp_kind_names[want[i]]);
    if (a[0].untyped != (n == 7))
        return fail(d, "%s storage in a %u-item tensor tuple", a[0].untyped ? "untyped" : "typed",
                    n);
    if (a[1].v[0] != 0)
        return fail(d, "storage offset %lld, only 0 is accepted", (long long)a[1].v[0]);
    uint32_t rank = a[2].kind == TK_INTS ? a[2].n : 0;
    if (!registered_shape(d, &a[2]))
        return fail(d, "tensor of rank %u (first dimension %lld) is not the registered shape", rank,
                    rank ? (long long)a[2].v[0] : 0LL);
    if (a[3].kind != TK_INTS || a[3].n != l->ndim)
        return fail(d, "stride of rank %u for a tensor of rank %u",
                    a[3].kind == TK_INTS ? a[3].n : 0, l->ndim);
    /* Row-major; the stride of a dimension of size 1 never moves through memory. */
    for (uint32_t i = 0; i < l->ndim; i++)
        if (l->shape[i] > 1 && a[3].v[i] != d->stride[i])
            return fail(d, "stride %lld in dimension %u, contiguous is %lld", (long long)a[3].v[i],
                        i, (long long)d->stride[i]);
    if (a[4].v[0])
        return fail(d, "requires_grad is true");
    if (n == 7) {
        if (a[6].g != TG_DTYPE)
            return fail(d, "tensor dtype argument is not a dtype");
        if (kvp_dtype_at(a[6].dtype) != d->dt)
            return fail(d, "dtype %s, registered %s", kvp_dtype_at(a[6].dtype)->name, d->dt->name);
    }
    *res = (struct tp_item){.kind = TK_TARGS,
                            .untyped = a[0].untyped,
                            .off = a[0].off,
                            .len = a[0].len};
    return 0;
}

/*
 * The arguments of Tensor.view in kvpoold's own form: (flat tensor, dtype) with the registered
 * dtype, or (typed tensor, shape) with the registered shape.
 */
static int view_args(struct tp_dec *d, const struct tp_item *a, struct tp_item *res)
{
    if (a[0].kind == TK_FLAT) {
        if (a[1].kind != TK_GLOBAL || a[1].g != TG_DTYPE)
            return fail(d, "view of a flat tensor as a %s, not a dtype", tp_kind_names[a[1].kind]);
        if (kvp_dtype_at(a[1].dtype) != d->dt)
            return fail(d, "dtype %s, registered %s", kvp_dtype_at(a[1].dtype)->name, d->dt->name);
        *res = (struct tp_item){.kind = TK_DTARGS, .off = a[0].off, .len = a[0].len};
        return 0;
    }
    uint32_t rank = a[1].kind == TK_INTS ? a[1].n : 0;
    if (!registered_shape(d, &a[1]))
        return fail(d, "view of rank %u (first dimension %lld) is not the registered shape", rank,
                    rank ? (long long)a[1].v[0] : 0LL);
    *res = (struct tp_item){.kind = TK_SHAPEARGS, .off = a[0].off, .len = a[0].len};
    return 0;
}

/* Replaces a[0..n) (the top of the stack) by the tuple they form, if the format has it. */
static int make_tuple(struct tp_dec *d, uint32_t base)
{
    struct tp_item *a = &d->stack[base];
    uint32_t n = d->sp - base;
    struct tp_item res = {.kind = TK_TUPLE0};
    bool ints = n > 0;
    for (uint32_t i = 0; i < n; i++) {
        if (a[i].kind == TK_MARK)
            return fail(d, "tuple over a mark");
        ints = ints && a[i].kind == TK_INT;
    }
    if (ints && n <= KVP_TPICKLE_MAX_DIMS) {
        res.kind = TK_INTS;
        res.n = n;
        for (uint32_t i = 0; i < n; i++)
            res.v[i] = a[i].v[0];
    } else if (n == 1 && a[0].kind == TK_BYTES) {
        res = (struct tp_item){.kind = TK_BLOBARG, .off = a[0].off, .len = a[0].len};
    } else if ((n == 6 || n == 7) && a[0].kind == TK_STORAGE) {
        int rc = tensor_args(d, a, n, &res);
        if (rc < 0)
            return rc;
    } else if (n == 1 && a[0].kind == TK_BUF) {
        res = (struct tp_item){.kind = TK_BUFARG, .off = a[0].off, .len = a[0].len};
    } else if (n == 2 && (a[0].kind == TK_FLAT || a[0].kind == TK_TYPED)) {
        int rc = view_args(d, a, &res);
        if (rc < 0)
            return rc;
    } else if (n != 0) {
        return fail(d, "tuple of %u items starting with a %s is not part of the format", n,
                    tp_kind_names[a[0].kind]);
    }
    d->sp = base;
    return push(d, &res);
}

/* A tensor was built: record it and push it, or extend the run of tensors on top. */
static int add_tensor(struct tp_dec *d, const struct tp_item *targs)
{
    if (d->ntensors >= d->exp->max_tensors)
        return fail(d, "more than %u tensors", d->exp->max_tensors);
    d->out[d->ntensors] = (struct kvp_tpickle_tensor){.data = d->buf + targs->off,
                                                      .len = targs->len};
    struct tp_item *top = d->sp ? &d->stack[d->sp - 1] : NULL;
    d->ntensors++;
    if (top && top->kind == TK_TENSORS && top->first + top->n == d->ntensors - 1) {
        top->n++;
        return 0;
    }
    struct tp_item run = {.kind = TK_TENSORS, .first = d->ntensors - 1, .n = 1};
    return push(d, &run);
}

/* REDUCE: never a call; the whitelisted name on the stack says which descriptor to build. */
static int reduce(struct tp_dec *d)
{
    if (d->sp < 2)
        return fail(d, "REDUCE on a stack of %u", d->sp);
    struct tp_item fn = d->stack[d->sp - 2], args = d->stack[d->sp - 1];
    struct tp_item res = {0};
    if (fn.kind != TK_GLOBAL)
        return fail(d, "REDUCE of a %s", tp_kind_names[fn.kind]);
    d->sp -= 2;
    switch (fn.g) {
    case TG_LOAD_FROM_BYTES: {
        if (args.kind != TK_BLOBARG)
            return fail(d, "_load_from_bytes of a %s", tp_kind_names[args.kind]);
        int rc = blob_check(d, args.off, args.len, &res);
        return rc < 0 ? rc : push(d, &res);
    }
    case TG_ORDERED_DICT:
        if (args.kind != TK_TUPLE0)
            return fail(d, "OrderedDict of a %s", tp_kind_names[args.kind]);
        res.kind = TK_ODICT;
        return push(d, &res);
    case TG_REBUILD_V2:
    case TG_REBUILD_V3:
        if (args.kind != TK_TARGS || args.untyped != (fn.g == TG_REBUILD_V3))
            return fail(d, "_rebuild_tensor_v%d of a %s%s", fn.g == TG_REBUILD_V3 ? 3 : 2,
                        args.kind == TK_TARGS ? "mismatched " : "", tp_kind_names[args.kind]);
        return add_tensor(d, &args);
    case TG_ASARRAY:
        if (args.kind != TK_BUFARG)
            return fail(d, "asarray of a %s", tp_kind_names[args.kind]);
        if (args.len != d->chunk_bytes)
            return fail(d, "bytearray of %llu bytes, a chunk is %llu", (unsigned long long)args.len,
                        (unsigned long long)d->chunk_bytes);
        res = (struct tp_item){.kind = TK_FLAT, .off = args.off, .len = args.len};
        return push(d, &res);
    case TG_VIEW:
        if (args.kind == TK_DTARGS) {
            res = (struct tp_item){.kind = TK_TYPED, .off = args.off, .len = args.len};
            return push(d, &res);
        }
        if (args.kind == TK_SHAPEARGS)
            return add_tensor(d, &args);
        return fail(d, "Tensor.view of a %s", tp_kind_names[args.kind]);
    default:
        return fail(d, "REDUCE of a dtype");
    }
}

/* STACK_GLOBAL: the two strings on top must name a whitelisted global. */
static int stack_global(struct tp_dec *d)
{
    if (d->sp < 2 || d->stack[d->sp - 1].kind != TK_STR || d->stack[d->sp - 2].kind != TK_STR)
        return fail(d, "STACK_GLOBAL without two strings");
    const struct tp_item *m = &d->stack[d->sp - 2], *nm = &d->stack[d->sp - 1];
    const uint8_t *mp = d->buf + m->off, *np = d->buf + nm->off;
    struct tp_item res = {.kind = TK_GLOBAL};
    for (size_t i = 0; i < sizeof(tp_globals) / sizeof(tp_globals[0]) && !res.g; i++)
        if (slice_is(mp, m->len, tp_globals[i].module) && slice_is(np, nm->len, tp_globals[i].name))
            res.g = (uint8_t)tp_globals[i].g;
    for (size_t i = 0; kvp_dtype_at(i) && !res.g; i++)
        if (slice_is(mp, m->len, "torch") && slice_is(np, nm->len, kvp_dtype_at(i)->name)) {
            res.g = TG_DTYPE;
            res.dtype = (uint8_t)i;
        }
    if (!res.g) {
        char p1[TP_NAME_MAX + 1], p2[TP_NAME_MAX + 1];
        return fail(d, "global %s.%s is not allowed", printable(mp, m->len, p1, sizeof(p1)),
                    printable(np, nm->len, p2, sizeof(p2)));
    }
    d->sp -= 2;
    return push(d, &res);
}

static int memoize(struct tp_dec *d)
{
    if (d->sp == 0 || d->stack[d->sp - 1].kind == TK_MARK)
        return fail(d, "MEMOIZE with nothing to memoise");
    const struct tp_item *top = &d->stack[d->sp - 1];
    /* Names are the only values a real payload reads back; anything else is only counted. */
    if (top->kind == TK_STR || top->kind == TK_GLOBAL) {
        if (d->memo_used == TP_MEMO_MAX)
            return fail(d, "more than %d names memoised", TP_MEMO_MAX);
        d->memo[d->memo_used].idx = d->memo_count;
        d->memo[d->memo_used++].item = *top;
    }
    if (d->memo_count == UINT32_MAX)
        return fail(d, "memo full");
    d->memo_count++;
    return 0;
}

static int memo_get(struct tp_dec *d, uint64_t idx)
{
    for (uint32_t i = 0; i < d->memo_used; i++)
        if (d->memo[i].idx == idx)
            return push(d, &d->memo[i].item);
    if (idx < d->memo_count)
        return fail(d, "memo reference %llu to something other than a name",
                    (unsigned long long)idx);
    return fail(d, "memo reference %llu is undefined", (unsigned long long)idx);
}

static int append(struct tp_dec *d, bool many)
{
    uint32_t base = d->sp - 1; /* APPEND: the one item on top */
    if (many) {
        int m = find_mark(d);
        if (m < 0)
            return fail(d, "APPENDS without a mark");
        base = (uint32_t)m + 1;
    }
    if (base != (many ? 2u : 1u) || d->stack[0].kind != TK_LIST)
        return fail(d, "append to something other than the outer list");
    uint32_t items = d->sp - base;
    struct tp_item *list = &d->stack[0], *run = &d->stack[base];
    if (items > 1 || (items == 1 && run->kind != TK_TENSORS) || (!many && items != 1))
        return fail(d, "appending something other than tensors");
    if (items == 1) {
        if (run->first != list->n || (!many && run->n != 1))
            return fail(d, "tensors appended out of order");
        list->n += run->n;
    }
    d->sp = 1;
    return 0;
}

/* One opcode of the outer stream. Returns 1 at STOP, 0 to go on, or a negative errno. */
static int step(struct tp_dec *d)
{
    const uint8_t *p;
    struct tp_item it = {0};
    int m;

    d->op_pos = d->pos;
    d->limit = d->pos < d->frame_end ? d->frame_end : d->len;
    if (d->pos >= d->len)
        return fail(d, "truncated: no STOP");
    uint8_t op = d->buf[d->pos++];
    switch (op) {
    case OP_FRAME:
        if (d->op_pos < d->frame_end)
            return fail(d, "FRAME inside a frame");
        if (!(p = take(d, 8)))
            return fail(d, "truncated FRAME");
        if (le(p, 8) > d->len - d->pos)
            return fail(d, "FRAME of %llu bytes past the end", (unsigned long long)le(p, 8));
        d->frame_end = d->pos + (size_t)le(p, 8);
        return 0;
    case OP_EMPTY_LIST:
        if (d->sp != 0)
            return fail(d, "a list inside something");
        it.kind = TK_LIST;
        return push(d, &it);
    case OP_MARK:
        it.kind = TK_MARK;
        return push(d, &it);
    case OP_SHORT_BINUNICODE:
    case OP_BINUNICODE: {
        unsigned w = op == OP_SHORT_BINUNICODE ? 1 : 4;
        if (!(p = take(d, w)))
            return fail(d, "truncated string length");
        uint64_t n = le(p, w);
        if (n > TP_NAME_MAX)
            return fail(d, "string of %llu bytes", (unsigned long long)n);
        it = (struct tp_item){.kind = TK_STR, .off = d->pos, .len = n};
        if (!take(d, n))
            return fail(d, "truncated string");
        return push(d, &it);
    }
    case OP_STACK_GLOBAL:
        return stack_global(d);
    case OP_SHORT_BINBYTES:
    case OP_BINBYTES:
    case OP_BINBYTES8:
    case OP_BYTEARRAY8: {
        unsigned w = op == OP_SHORT_BINBYTES ? 1 : op == OP_BINBYTES ? 4 : 8;
        if (!(p = take(d, w)))
            return fail(d, "truncated bytes length");
        it = (struct tp_item){.kind = op == OP_BYTEARRAY8 ? TK_BUF : TK_BYTES,
                              .off = d->pos,
                              .len = le(p, w)};
        if (!take(d, it.len))
            return fail(d, "bytes of %llu past the end", (unsigned long long)it.len);
        return push(d, &it);
    }
    case OP_BININT1:
    case OP_BININT2:
    case OP_BININT:
    case OP_LONG1: {
        unsigned w = op == OP_BININT1 ? 1 : op == OP_BININT2 ? 2 : 4;
        if (op == OP_LONG1) {
            if (!(p = take(d, 1)) || *p > 8)
                return fail(d, "LONG1 missing or wider than 64 bits");
            w = *p;
        }
        if (!(p = take(d, w)))
            return fail(d, "truncated integer");
        it.kind = TK_INT;
        it.v[0] = op == OP_LONG1    ? le_signed(p, w)
                  : op == OP_BININT ? (int32_t)(uint32_t)le(p, 4)
                                    : (int64_t)le(p, w);
        return push(d, &it);
    }
    case OP_NEWFALSE:
    case OP_NEWTRUE:
        it.kind = TK_BOOL;
        it.v[0] = op == OP_NEWTRUE;
        return push(d, &it);
    case OP_EMPTY_TUPLE:
        it.kind = TK_TUPLE0;
        return push(d, &it);
    case OP_TUPLE1:
    case OP_TUPLE2:
    case OP_TUPLE3:
        if (d->sp < (uint32_t)(op - OP_TUPLE1 + 1))
            return fail(d, "TUPLE%d on a stack of %u", op - OP_TUPLE1 + 1, d->sp);
        return make_tuple(d, d->sp - (uint32_t)(op - OP_TUPLE1 + 1));
    case OP_TUPLE:
        if ((m = find_mark(d)) < 0)
            return fail(d, "TUPLE without a mark");
        /* Drop the mark: the items above it become the tuple's. */
        memmove(&d->stack[m], &d->stack[m + 1], (d->sp - (uint32_t)m - 1) * sizeof(d->stack[0]));
        d->sp--;
        return make_tuple(d, (uint32_t)m);
    case OP_REDUCE:
        return reduce(d);
    case OP_APPEND:
    case OP_APPENDS:
        if (d->sp == 0)
            return fail(d, "append on an empty stack");
        return append(d, op == OP_APPENDS);
    case OP_MEMOIZE:
        return memoize(d);
    case OP_BINGET:
    case OP_LONG_BINGET:
        if (!(p = take(d, op == OP_BINGET ? 1 : 4)))
            return fail(d, "truncated memo reference");
        return memo_get(d, le(p, op == OP_BINGET ? 1 : 4));
    case OP_STOP:
        if (d->sp != 1 || d->stack[0].kind != TK_LIST)
            return fail(d, "STOP with %u values on the stack, not one list", d->sp);
        if (d->pos != d->len)
            return fail(d, "%zu trailing bytes after STOP", d->len - d->pos);
        if (d->stack[0].n != d->ntensors || d->ntensors < d->exp->min_tensors)
            return fail(d, "%u tensors, at least %u expected", d->ntensors, d->exp->min_tensors);
        return 1;
    default:
        return fail(d, "opcode 0x%02x is not part of the format", op);
    }
}

int kvp_tpickle_decode(const uint8_t *buf, size_t len, const struct kvp_tpickle_expect *exp,
                       struct kvp_tpickle_tensor *out, uint32_t cap, uint32_t *n, char *why,
                       size_t why_size)
{
    struct tp_dec d = {
        .buf = buf, .len = len, .exp = exp, .out = out, .why = why, .why_size = why_size};
    uint64_t max;
    int rc;

    if (n)
        *n = 0;
    if (why && why_size)
        why[0] = '\0';
    if (!buf || !exp || !out || !n || cap < exp->max_tensors || exp->min_tensors > exp->max_tensors)
        return kvp_why(why, why_size, -EINVAL, "bad arguments");
    rc = kvp_tpickle_layout_check(&exp->layout, &d.chunk_bytes, why, why_size);
    if (rc < 0)
        return rc;
    d.dt = kvp_dtype_find(exp->layout.dtype);
    /* A bound beyond 64 bits bounds nothing a buffer can hold. */
    if (kvp_tpickle_max_payload(exp, &max) < 0)
        max = UINT64_MAX;
    if (len > max)
        return kvp_why(why, why_size, -EMSGSIZE,
                       "payload of %zu bytes, at most %llu for %u tensors", len,
                       (unsigned long long)max, exp->max_tensors);
    /* Row-major strides in elements (no overflow: numel < 2^63 was checked). */
    int64_t s = 1;
    for (uint32_t i = exp->layout.ndim; i-- > 0;) {
        d.stride[i] = s;
        s *= (int64_t)exp->layout.shape[i];
    }

    if (len < 2 || buf[0] != OP_PROTO || (buf[1] != 4 && buf[1] != 5))
        return kvp_why(why, why_size, -EPROTO, "offset 0: not a protocol 4 or 5 pickle");
    d.pos = 2;
    while ((rc = step(&d)) == 0)
        ;
    if (rc < 0)
        return rc;
    *n = d.ntensors;
    return 0;
}

/* ---- encoder ----------------------------------------------------------------------------- */

struct tp_w {
    uint8_t *p;
    size_t cap, n;
};

static void w_bytes(struct tp_w *w, const void *src, size_t len)
{
    /* Past cap nothing is written and n stays cap + 1, which the caller checks. */
    if (w->n <= w->cap && len <= w->cap - w->n) {
        memcpy(w->p + w->n, src, len);
        w->n += len;
    } else {
        w->n = w->cap + 1;
    }
}

static void w_byte(struct tp_w *w, uint8_t c)
{
    w_bytes(w, &c, 1);
}

static void w_le(struct tp_w *w, uint64_t v, unsigned n)
{
    uint8_t b[8];
    for (unsigned i = 0; i < n; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    w_bytes(w, b, n);
}

/* A non-negative int the way CPython's pickler writes it (protocol >= 2). */
static void w_int(struct tp_w *w, uint64_t v)
{
    if (v <= 0xff) {
        w_byte(w, OP_BININT1);
        w_le(w, v, 1);
    } else if (v <= 0xffff) {
        w_byte(w, OP_BININT2);
        w_le(w, v, 2);
    } else if (v <= 0x7fffffff) {
        w_byte(w, OP_BININT);
        w_le(w, v, 4);
    } else {
        /* LONG1: the fewest bytes whose two's complement keeps the sign bit clear. */
        unsigned n = 1;
        while (n < 8 && (v >> (8 * n - 1)) != 0)
            n++;
        w_byte(w, OP_LONG1);
        w_byte(w, (uint8_t)n);
        w_le(w, v, n);
    }
}

static void w_str8(struct tp_w *w, const char *s) /* protocol 4 SHORT_BINUNICODE */
{
    w_byte(w, OP_SHORT_BINUNICODE);
    w_byte(w, (uint8_t)strlen(s));
    w_bytes(w, s, strlen(s));
}

static void w_tuple(struct tp_w *w, const uint64_t *v, uint32_t n)
{
    if (n > 3)
        w_byte(w, OP_MARK);
    for (uint32_t i = 0; i < n; i++)
        w_int(w, v[i]);
    w_byte(w, n > 3 ? OP_TUPLE : (uint8_t)(OP_TUPLE1 + n - 1));
}

int kvp_tpickle_template_init(struct kvp_tpickle_template *t, const struct kvp_tpickle_layout *l,
                              char *why, size_t why_size)
{
    int rc = kvp_tpickle_layout_check(l, &t->chunk_bytes, why, why_size);
    if (rc < 0)
        return rc;
    const struct kvp_dtype *dt = kvp_dtype_find(l->dtype);

    static const uint8_t start[] = {OP_PROTO, 5, OP_EMPTY_LIST, OP_MARK};
    static const uint8_t end[] = {OP_APPENDS, OP_STOP};
    memcpy(t->start, start, sizeof(start));
    t->start_len = sizeof(start);
    memcpy(t->end, end, sizeof(end));
    t->end_len = sizeof(end);

    /* pre: Tensor.view twice, asarray, then the chunk as a bytearray. */
    struct tp_w w = {.p = t->pre, .cap = sizeof(t->pre)};
    for (int i = 0; i < 2; i++) {
        w_str8(&w, "torch");
        w_str8(&w, "Tensor.view");
        w_byte(&w, OP_STACK_GLOBAL);
    }
    w_str8(&w, "torch");
    w_str8(&w, "asarray");
    w_byte(&w, OP_STACK_GLOBAL);
    w_byte(&w, OP_BYTEARRAY8);
    w_le(&w, t->chunk_bytes, 8);
    if (w.n > w.cap)
        return kvp_why(why, why_size, -EINVAL, "template does not fit");
    t->pre_len = (uint32_t)w.n;

    /* post: asarray(ba), .view(dtype), .view(shape). */
    w = (struct tp_w){.p = t->post, .cap = sizeof(t->post)};
    w_byte(&w, OP_TUPLE1);
    w_byte(&w, OP_REDUCE);
    w_str8(&w, "torch");
    w_str8(&w, dt->name);
    w_byte(&w, OP_STACK_GLOBAL);
    w_byte(&w, OP_TUPLE2);
    w_byte(&w, OP_REDUCE);
    w_tuple(&w, l->shape, l->ndim);
    w_byte(&w, OP_TUPLE2);
    w_byte(&w, OP_REDUCE);
    if (w.n > w.cap)
        return kvp_why(why, why_size, -EINVAL, "template does not fit");
    t->post_len = (uint32_t)w.n;
    return 0;
}

int kvp_tpickle_encoded_size(const struct kvp_tpickle_template *t, uint32_t n, uint64_t *size)
{
    uint64_t per = (uint64_t)t->pre_len + t->post_len;
    if (t->chunk_bytes > UINT64_MAX - per)
        return -EOVERFLOW;
    per += t->chunk_bytes;
    uint64_t fixed = (uint64_t)t->start_len + t->end_len;
    if (n && per > (UINT64_MAX - fixed) / n)
        return -EOVERFLOW;
    *size = fixed + per * n;
    return 0;
}

int kvp_tpickle_encode_iov(const struct kvp_tpickle_template *t, uint32_t n,
                           const uint8_t *const *chunks, struct iovec *iov, size_t iov_cap)
{
    size_t need = 2 + 3 * (size_t)n;
    if (iov_cap < need || need > INT32_MAX)
        return -ENOSPC;
    size_t k = 0;
    iov[k++] = (struct iovec){.iov_base = (void *)t->start, .iov_len = t->start_len};
    for (uint32_t i = 0; i < n; i++) {
        iov[k++] = (struct iovec){.iov_base = (void *)t->pre, .iov_len = t->pre_len};
        iov[k++] = (struct iovec){.iov_base = (void *)chunks[i], .iov_len = t->chunk_bytes};
        iov[k++] = (struct iovec){.iov_base = (void *)t->post, .iov_len = t->post_len};
    }
    iov[k++] = (struct iovec){.iov_base = (void *)t->end, .iov_len = t->end_len};
    return (int)k;
}

int64_t kvp_tpickle_encode(const struct kvp_tpickle_template *t, uint32_t n,
                           const uint8_t *const *chunks, uint8_t *dst, size_t dst_size)
{
    uint64_t size;
    if (kvp_tpickle_encoded_size(t, n, &size) < 0 || size > INT64_MAX)
        return -EOVERFLOW;
    if (size > dst_size)
        return -ENOSPC;
    uint8_t *p = dst;
    memcpy(p, t->start, t->start_len);
    p += t->start_len;
    for (uint32_t i = 0; i < n; i++) {
        memcpy(p, t->pre, t->pre_len);
        p += t->pre_len;
        memcpy(p, chunks[i], t->chunk_bytes);
        p += t->chunk_bytes;
        memcpy(p, t->post, t->post_len);
        p += t->post_len;
    }
    memcpy(p, t->end, t->end_len);
    return (int64_t)size;
}
