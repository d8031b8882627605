/*
 * test_torch_pickle.c - the pickle-transport recogniser and encoder (lmc/torch_pickle.c) over
 * payloads written by the real torch (tests/server/data/tpickle/, made by tpickle_payloads.py
 * with torch 2.13.0) and over hostile ones, committed and hand-made.
 */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/kvp_assert.h"
#include "common/layout.h"
#include "lmc/torch_pickle.h"

#ifndef KVP_TPICKLE_DATA /* tests/CMakeLists.txt gives the absolute path */
#define KVP_TPICKLE_DATA "tests/server/data/tpickle"
#endif

#define MARKER "/tmp/kvpool-tpickle-marker"
#define MAXN 64

/* Byte j of tensor k of every committed payload (pattern() in tpickle_payloads.py). */
static uint8_t pattern(uint32_t k, uint64_t j)
{
    return (uint8_t)((k * 37 + j * 11 + 5) & 0xff);
}

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    struct stat st;
    assert_rc(fstat(fileno(f), &st), 0);
    uint8_t *buf = malloc((size_t)st.st_size + 1);
    assert_non_null(buf);
    *len = fread(buf, 1, (size_t)st.st_size, f);
    assert_int_equal(*len, (size_t)st.st_size);
    fclose(f);
    return buf;
}

static struct kvp_tpickle_expect expect(const char *dtype, uint32_t ndim, const uint64_t *shape,
                                        uint32_t min, uint32_t max)
{
    struct kvp_tpickle_expect e = {.layout = {.dtype = dtype, .ndim = ndim},
                                   .min_tensors = min,
                                   .max_tensors = max};
    memcpy(e.layout.shape, shape, ndim * sizeof(shape[0]));
    return e;
}

static const uint64_t kv_shape[] = {2, 2, 4, 8};

/* A payload's name says what it holds: DTYPE_D0xD1..._nCOUNT_pPROTO.pkl. */
struct real {
    char dtype[32];
    uint32_t ndim, count, proto;
    uint64_t shape[KVP_TPICKLE_MAX_DIMS];
};

static int parse_name(const char *name, struct real *r)
{
    char tmp[128];
    size_t n = strlen(name);
    if (n < 5 || n >= sizeof(tmp) || strcmp(name + n - 4, ".pkl") != 0)
        return -1;
    memcpy(tmp, name, n - 4);
    tmp[n - 4] = '\0';
    char *p = strrchr(tmp, '_');
    if (!p || sscanf(p, "_p%u", &r->proto) != 1)
        return -1;
    *p = '\0';
    if (!(p = strrchr(tmp, '_')) || sscanf(p, "_n%u", &r->count) != 1)
        return -1;
    *p = '\0';
    if (!(p = strrchr(tmp, '_')))
        return -1;
    *p++ = '\0';
    r->ndim = 0;
    char *save = NULL;
    for (char *tok = strtok_r(p, "x", &save); tok && r->ndim < KVP_TPICKLE_MAX_DIMS;
         tok = strtok_r(NULL, "x", &save))
        r->shape[r->ndim++] = strtoull(tok, NULL, 10);
    if (strlen(tmp) >= sizeof(r->dtype))
        return -1;
    memcpy(r->dtype, tmp, strlen(tmp) + 1);
    return 0;
}

static void check_pattern(const struct kvp_tpickle_tensor *t, uint32_t n, uint64_t bytes,
                          const uint8_t *buf, size_t len, const char *what)
{
    for (uint32_t k = 0; k < n; k++) {
        assert_int_equal(t[k].len, bytes);
        assert_true(t[k].data >= buf && t[k].data + t[k].len <= buf + len);
        for (uint64_t j = 0; j < bytes; j++)
            if (t[k].data[j] != pattern(k, j))
                fail_msg("%s: tensor %u byte %llu is %u, want %u", what, k, (unsigned long long)j,
                         t[k].data[j], pattern(k, j));
    }
}

/* Every committed real payload decodes to its tensors' exact bytes, and only with its count. */
static void test_real_payloads(void **state)
{
    (void)state;
    DIR *dir = opendir(KVP_TPICKLE_DATA);
    assert_non_null(dir);
    struct dirent *de;
    unsigned seen = 0, dtypes_v3 = 0, proto5 = 0;
    struct kvp_tpickle_tensor out[MAXN];
    char why[200];

    /* cppcheck-suppress readdirCalled ; readdir_r is deprecated, and dir is private to this call */
    while ((de = readdir(dir))) {
        struct real r;
        if (parse_name(de->d_name, &r) < 0)
            continue;
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", KVP_TPICKLE_DATA, de->d_name);
        size_t len;
        uint8_t *buf = slurp(path, &len);
        struct kvp_tpickle_expect e = expect(r.dtype, r.ndim, r.shape, r.count, r.count);
        uint64_t bytes;
        uint32_t n = 99;

        assert_rc(kvp_tpickle_layout_check(&e.layout, &bytes, why, sizeof(why)), 0);
        int rc = kvp_tpickle_decode(buf, len, &e, out, MAXN, &n, why, sizeof(why));
        if (rc != 0)
            fail_msg("%s refused: %s", de->d_name, why);
        assert_int_equal(n, r.count);
        assert_string_equal(why, "");
        check_pattern(out, n, bytes, buf, len, de->d_name);

        /* One tensor more than allowed (refused by length first when the payload exceeds the
         * bound for one tensor less), or fewer than required: refused. */
        e = expect(r.dtype, r.ndim, r.shape, 0, r.count - 1);
        uint64_t max;
        assert_rc(kvp_tpickle_max_payload(&e, &max), 0);
        rc = kvp_tpickle_decode(buf, len, &e, out, MAXN, &n, why, sizeof(why));
        assert_int_equal(n, 0);
        assert_rc(rc, len > max ? -EMSGSIZE : -EPROTO);
        assert_non_null(strstr(why, len > max ? "at most" : "more than"));
        e = expect(r.dtype, r.ndim, r.shape, r.count + 1, r.count + 1);
        assert_rc(kvp_tpickle_decode(buf, len, &e, out, MAXN, &n, why, sizeof(why)), -EPROTO);
        assert_non_null(strstr(why, "at least"));

        /* Another shape of the same size: refused. */
        e = expect(r.dtype, r.ndim, r.shape, r.count, r.count);
        e.layout.shape[0] = r.shape[1];
        e.layout.shape[1] = r.shape[0];
        if (r.shape[0] != r.shape[1]) {
            assert_rc(kvp_tpickle_decode(buf, len, &e, out, MAXN, &n, why, sizeof(why)), -EPROTO);
            assert_non_null(strstr(why, "registered shape"));
        }

        /* Every other dtype: refused (the storage class or the dtype global differ). */
        static const char *const all[] = {"float16", "bfloat16", "float32",       "float64",
                                          "int8",    "uint8",    "float8_e4m3fn", "float8_e5m2"};
        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
            if (strcmp(all[i], r.dtype) == 0)
                continue;
            e = expect(all[i], r.ndim, r.shape, r.count, r.count);
            rc = kvp_tpickle_decode(buf, len, &e, out, MAXN, &n, why, sizeof(why));
            if (rc != -EPROTO && rc != -EMSGSIZE) /* a smaller dtype's bound can be shorter */
                fail_msg("%s as %s: %d", de->d_name, all[i], rc);
        }

        dtypes_v3 += strncmp(r.dtype, "float8", 6) == 0;
        proto5 += r.proto == 5;
        seen++;
        free(buf);
    }
    closedir(dir);
    /* The committed set: 8 dtypes x 2 shapes x 2 protocols, and 2 single-chunk payloads. */
    assert_int_equal(seen, 34);
    assert_true(dtypes_v3 >= 8);
    assert_true(proto5 >= 16);
}

/* Every proper prefix of a real payload is refused, and so is any byte after its STOP. */
static void test_truncated_and_trailing(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = slurp(KVP_TPICKLE_DATA "/float16_2x2x4x8_n3_p4.pkl", &len);
    struct kvp_tpickle_expect e = expect("float16", 4, kv_shape, 0, 3);
    struct kvp_tpickle_tensor out[3];
    uint32_t n;
    char why[200];

    for (size_t cut = 0; cut < len; cut++) {
        int rc = kvp_tpickle_decode(buf, cut, &e, out, 3, &n, why, sizeof(why));
        if (rc != -EPROTO)
            fail_msg("prefix of %zu bytes: %d (%s)", cut, rc, why);
    }
    buf[len] = '.';
    assert_rc(kvp_tpickle_decode(buf, len + 1, &e, out, 3, &n, why, sizeof(why)), -EPROTO);
    assert_non_null(strstr(why, "trailing"));
    assert_rc(kvp_tpickle_decode(buf, len, &e, out, 3, &n, why, sizeof(why)), 0);
    free(buf);
}

/* Input longer than the bound the registration and count give is not even looked at. */
static void test_oversized(void **state)
{
    (void)state;
    struct kvp_tpickle_expect e = expect("float16", 4, kv_shape, 1, 2);
    uint64_t max;
    assert_rc(kvp_tpickle_max_payload(&e, &max), 0);
    assert_int_equal(max, KVP_TPICKLE_STREAM_OVERHEAD + 2 * (256 + KVP_TPICKLE_TENSOR_OVERHEAD));
    uint8_t *buf = calloc(1, max + 1);
    assert_non_null(buf);
    struct kvp_tpickle_tensor out[2];
    uint32_t n;
    char why[200];
    buf[0] = 0x80;
    buf[1] = 4;
    assert_rc(kvp_tpickle_decode(buf, max + 1, &e, out, 2, &n, why, sizeof(why)), -EMSGSIZE);
    assert_non_null(strstr(why, "at most"));
    /* At the bound it is parsed (and refused for what it is). */
    assert_rc(kvp_tpickle_decode(buf, max, &e, out, 2, &n, why, sizeof(why)), -EPROTO);
    free(buf);
}

/* A registration whose bound overflows 64 bits bounds nothing: payloads are still parsed. */
static void test_huge_layout(void **state)
{
    (void)state;
    static const uint64_t huge[] = {1ull << 31, 1ull << 30};
    struct kvp_tpickle_expect e = expect("float16", 2, huge, 0, 4);
    struct kvp_tpickle_tensor out[4];
    uint64_t max;
    uint32_t n;
    char why[200];
    assert_rc(kvp_tpickle_max_payload(&e, &max), -EOVERFLOW);
    assert_rc(kvp_tpickle_decode((const uint8_t *)"\x80\x04].", 4, &e, out, 4, &n, why,
                                 sizeof(why)),
              0);
    assert_int_equal(n, 0);
    assert_rc(kvp_tpickle_decode((const uint8_t *)"\x80\x04]]", 4, &e, out, 4, &n, why,
                                 sizeof(why)),
              -EPROTO);
}

/* Committed hostile payloads (tpickle_payloads.py): refused, with the reason named. */
static void test_hostile_payloads(void **state)
{
    (void)state;
    static const uint64_t wide[] = {2, 2, 4, 16};
    static const struct {
        const char *file;
        const char *reason;
        const uint64_t *shape; /* NULL: [2, 2, 4, 8] */
    } cases[] = {
        {"os_system", "global posix.system is not allowed", NULL},
        {"subprocess", "global subprocess.check_call is not allowed", NULL},
        {"builtins_eval", "global builtins.eval is not allowed", NULL},
        {"eval_in_tensor", "global builtins.eval is not allowed", NULL},
        {"blob_other_global", "storage blob names global os.system", NULL},
        {"blob_os_system", "persistent id", NULL},
        {"shape_too_big", "registered shape", NULL},
        {"shape_too_big", "storage of 256 bytes, a chunk is 512", wide},
        {"numel_too_big", "numel 129 does not match its 256 data bytes", NULL},
        {"wrong_dtype", "global torch.FloatStorage, not the storage of float16", NULL},
        {"wrong_dtype_v3", "untyped storage for dtype float16", NULL},
        {"non_contiguous", "stride", NULL},
        {"storage_offset", "storage offset 5", NULL},
        {"requires_grad", "requires_grad", NULL},
        {"hooks", "is not part of the format", NULL},
        {"parameter", "global torch._utils._rebuild_parameter is not allowed", NULL},
        {"view_of_bigger", "storage of 512 bytes, a chunk is 256", NULL},
        {"nested_list", "a list inside", NULL},
        {"tuple", "tuple of 1 items starting with a tensor", NULL},
        {"dict", "opcode 0x7d", NULL},
        {"same_tensor_twice", "memo reference 17 to something other than a name", NULL},
        {"protocol2", "not a protocol 4 or 5 pickle", NULL},
        {"bare_tensor", "not one list", NULL},
    };
    struct kvp_tpickle_tensor out[4];
    char why[200];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char path[512];
        size_t len;
        snprintf(path, sizeof(path), "%s/hostile/%s.pkl", KVP_TPICKLE_DATA, cases[i].file);
        uint8_t *buf = slurp(path, &len);
        struct kvp_tpickle_expect e = expect("float16", 4,
                                             cases[i].shape ? cases[i].shape : kv_shape, 0, 4);
        uint32_t n = 7;
        int rc = kvp_tpickle_decode(buf, len, &e, out, 4, &n, why, sizeof(why));
        if (rc != -EPROTO || !strstr(why, cases[i].reason))
            fail_msg("%s: rc %d, \"%s\" (want \"%s\")", cases[i].file, rc, why, cases[i].reason);
        assert_int_equal(n, 0);
        free(buf);
    }
    /* Nothing was run: the command each would have run creates this file. */
    assert_int_equal(access(MARKER, F_OK), -1);
}

static int decode_bytes(const uint8_t *buf, size_t len, char *why, size_t why_size)
{
    struct kvp_tpickle_expect e = expect("float16", 4, kv_shape, 0, 4);
    struct kvp_tpickle_tensor out[4];
    uint32_t n;
    return kvp_tpickle_decode(buf, len, &e, out, 4, &n, why, why_size);
}

#define DECODE_REFUSED(lit, reason)                                           \
    do {                                                                      \
        static const uint8_t b_[] = lit;                                      \
        char w_[200];                                                         \
        int rc_ = decode_bytes(b_, sizeof(b_) - 1, w_, sizeof(w_));           \
        if (rc_ != -EPROTO || !strstr(w_, reason))                            \
            fail_msg("%s: rc %d \"%s\", want \"%s\"", #lit, rc_, w_, reason); \
    } while (0)

/* Hand-made streams: memo tricks, deep nesting, misplaced opcodes. */
static void test_hand_made(void **state)
{
    (void)state;
    /* The empty list is a valid payload of zero tensors. */
    char why[200];
    assert_rc(decode_bytes((const uint8_t *)"\x80\x04]\x94.", 5, why, sizeof(why)), 0);
    assert_rc(decode_bytes((const uint8_t *)"\x80\x05](e.", 6, why, sizeof(why)), 0);

    /* The list appended to itself through the memo; the memo read before it is written. */
    DECODE_REFUSED("\x80\x04]\x94h\x00"
                   "a.",
                   "memo reference 0 to something other than a name");
    DECODE_REFUSED("\x80\x04]j\x05\x00\x00\x00"
                   "a.",
                   "memo reference 5 is undefined");
    DECODE_REFUSED("\x80\x04]\x94\x94\x94\x94\x8c\x01x\x94h\x04h\x00t.", "to something other");
    /* A name from the memo is still only a name: posix.system through BINGET. */
    DECODE_REFUSED("\x80\x04]\x8c\x05posix\x94\x8c\x06system\x94h\x00h\x01\x93.",
                   "global posix.system is not allowed");
    /* Deep nesting: marks, tuples of tuples. */
    DECODE_REFUSED("\x80\x04]((((((((((((((((((((((((((((((((((((((((", "stack deeper than");
    DECODE_REFUSED("\x80\x04](K\x01\x85\x85\x85.", "tuple of 1 items starting with a int tuple");
    /* More memoised names than the table holds. */
    DECODE_REFUSED("\x80\x04]\x8c\x01x\x94\x94\x94\x94\x94\x94\x94\x94\x94\x94\x94\x94\x94\x94"
                   "\x94\x94\x94\x94\x94\x94\x94\x94\x94\x94\x94\x94\x94\x94\x94\x94\x94\x94\x94",
                   "names memoised");
    /* Misplaced or foreign opcodes. */
    DECODE_REFUSED("\x80\x04]]", "a list inside");
    DECODE_REFUSED("\x80\x04\x80\x04].", "opcode 0x80");
    DECODE_REFUSED("\x80\x04]cos\nsystem\n.", "opcode 0x63");
    DECODE_REFUSED("\x80\x04]\x8c\x02osI1\n.", "opcode 0x49");
    DECODE_REFUSED("\x80\x04]K\x01R.", "REDUCE of a list");
    DECODE_REFUSED("\x80\x04]K\x01K\x02R.", "REDUCE of a int");
    DECODE_REFUSED("\x80\x04]K\x01"
                   "a.",
                   "appending something other than tensors");
    DECODE_REFUSED("\x80\x04]\x8c\x0b"
                   "collections\x8c\x0bOrderedDict\x93K\x01\x85R.",
                   "OrderedDict of a int tuple");
    DECODE_REFUSED("\x80\x04]\x8c\x05torch\x8c\x0b"
                   "float8_e5m2\x93)R.",
                   "REDUCE of a dtype");
    DECODE_REFUSED("\x80\x04]\x8a\x09\x01\x01\x01\x01\x01\x01\x01\x01\x01.", "LONG1");
    DECODE_REFUSED("\x80\x04]X\x41\x00\x00\x00.", "string of 65 bytes");
    DECODE_REFUSED("\x80\x04]\x93.", "STACK_GLOBAL without two strings");
    DECODE_REFUSED("\x80\x04]t.", "TUPLE without a mark");
    DECODE_REFUSED("\x80\x04]e.", "APPENDS without a mark");
    DECODE_REFUSED("\x80\x04].\x00", "trailing");
    DECODE_REFUSED("\x80\x04]", "no STOP");
    /* Frames: past the end, nested, an opcode across a frame's end. */
    DECODE_REFUSED("\x80\x04\x95\x09\x00\x00\x00\x00\x00\x00\x00].", "past the end");
    DECODE_REFUSED("\x80\x04\x95\x0a\x00\x00\x00\x00\x00\x00\x00\x95\x01\x00\x00\x00\x00\x00"
                   "\x00\x00].",
                   "FRAME inside a frame");
    DECODE_REFUSED("\x80\x04\x95\x02\x00\x00\x00\x00\x00\x00\x00]\x8c\x01x.", "truncated string");
    assert_rc(decode_bytes((const uint8_t *)"\x80\x04\x95\x02\x00\x00\x00\x00\x00\x00\x00].", 13,
                           why, sizeof(why)),
              0);
    assert_int_equal(access(MARKER, F_OK), -1);
}

/* A name pair for STACK_GLOBAL, protocol 4 strings. */
static size_t put_global(uint8_t *p, const char *mod, const char *name)
{
    size_t n = 0;
    p[n++] = 0x8c;
    p[n++] = (uint8_t)strlen(mod);
    memcpy(p + n, mod, strlen(mod));
    n += strlen(mod);
    p[n++] = 0x8c;
    p[n++] = (uint8_t)strlen(name);
    memcpy(p + n, name, strlen(name));
    n += strlen(name);
    p[n++] = 0x93;
    return n;
}

/*
 * kvpoold's reply form of one tensor, written by hand so each part can be wrong on its own:
 * [view(view(asarray(bytearray(nbytes)), dtype), shape)], with `buf_op` the opcode carrying the
 * bytes (BYTEARRAY8 in the form) and `skip_dtype` leaving out the dtype step.
 */
static size_t view_form(uint8_t *p, const char *asarray_mod, uint8_t buf_op, uint64_t nbytes,
                        const char *dtype, bool skip_dtype, const uint64_t *shape, uint32_t ndim)
{
    size_t n = 0;
    memcpy(p, "\x80\x05](", 4);
    n += 4;
    n += put_global(p + n, "torch", "Tensor.view");
    if (!skip_dtype)
        n += put_global(p + n, "torch", "Tensor.view");
    n += put_global(p + n, asarray_mod, "asarray");
    p[n++] = buf_op;
    for (int i = 0; i < 8; i++)
        p[n++] = (uint8_t)(nbytes >> (8 * i));
    for (uint64_t j = 0; j < nbytes; j++)
        p[n++] = pattern(0, j);
    p[n++] = 0x85; /* TUPLE1 */
    p[n++] = 'R';
    if (!skip_dtype) {
        n += put_global(p + n, "torch", dtype);
        p[n++] = 0x86; /* TUPLE2 */
        p[n++] = 'R';
    }
    p[n++] = '(';
    for (uint32_t i = 0; i < ndim; i++) {
        p[n++] = 'K';
        p[n++] = (uint8_t)shape[i];
    }
    p[n++] = 't';
    p[n++] = 0x86;
    p[n++] = 'R';
    p[n++] = 'e';
    p[n++] = '.';
    return n;
}

/* kvpoold's own reply form is recognised exactly: every part checked against the registration. */
static void test_view_form(void **state)
{
    (void)state;
    static const uint64_t other_shape[] = {2, 2, 8, 4};
    struct kvp_tpickle_expect e = expect("float16", 4, kv_shape, 1, 1);
    struct kvp_tpickle_tensor out[1];
    uint8_t buf[1024];
    char why[200];
    uint32_t n;
    size_t len;

    len = view_form(buf, "torch", 0x96, 256, "float16", false, kv_shape, 4);
    if (kvp_tpickle_decode(buf, len, &e, out, 1, &n, why, sizeof(why)) != 0)
        fail_msg("view form refused: %s", why);
    assert_int_equal(n, 1);
    check_pattern(out, 1, 256, buf, len, "float16");

    static const struct {
        const char *mod;
        uint8_t op;
        uint64_t nbytes;
        const char *dtype;
        bool skip_dtype;
        const uint64_t *shape;
        const char *reason;
    } bad[] = {
        {"torch", 0x96, 256, "bfloat16", false, kv_shape, "dtype bfloat16, registered float16"},
        {"torch", 0x96, 256, "float16", false, other_shape, "is not the registered shape"},
        {"torch", 0x96, 255, "float16", false, kv_shape, "bytearray of 255 bytes"},
        {"torch", 0x96, 512, "float16", false, kv_shape, "bytearray of 512 bytes"},
        {"torch", 0x8e, 256, "float16", false, kv_shape, "asarray of a (bytes,)"},
        {"torch", 0x96, 256, "float16", true, kv_shape, "as a int tuple, not a dtype"},
        {"numpy", 0x96, 256, "float16", false, kv_shape, "global numpy.asarray is not allowed"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        len = view_form(buf, bad[i].mod, bad[i].op, bad[i].nbytes, bad[i].dtype, bad[i].skip_dtype,
                        bad[i].shape, 4);
        int rc = kvp_tpickle_decode(buf, len, &e, out, 1, &n, why, sizeof(why));
        if (rc != -EPROTO || !strstr(why, bad[i].reason))
            fail_msg("case %zu: rc %d, \"%s\", expected \"%s\"", i, rc, why, bad[i].reason);
        assert_int_equal(n, 0);
    }

    /* A typed tensor not yet given its shape is not a tensor of the list. */
    DECODE_REFUSED("\x80\x05]\x8c\x05torch\x8c\x0bTensor.view\x93\x8c\x05torch\x8c\x07"
                   "asarray\x93\x96\x00\x01\x00\x00\x00\x00\x00\x00"
                   "                                                                "
                   "                                                                "
                   "                                                                "
                   "                                                                "
                   "\x85R\x8c\x05torch\x8c\x07"
                   "float16\x93\x86R"
                   "a.",
                   "appending something other than tensors");
    /* Tensor.view called on anything but the form's arguments. */
    DECODE_REFUSED("\x80\x05]\x8c\x05torch\x8c\x0bTensor.view\x93)R.", "Tensor.view of a tuple");
    DECODE_REFUSED("\x80\x05]\x8c\x05torch\x8c\x07"
                   "asarray\x93)R.",
                   "asarray of a tuple");
}

static void test_layout_check(void **state)
{
    (void)state;
    char why[200];
    uint64_t bytes;
    struct kvp_tpickle_expect e = expect("float16", 4, kv_shape, 1, 1);

    assert_rc(kvp_tpickle_layout_check(&e.layout, &bytes, why, sizeof(why)), 0);
    assert_int_equal(bytes, 256);
    e.layout.dtype = "float128";
    assert_rc(kvp_tpickle_layout_check(&e.layout, &bytes, why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "float128"));
    e.layout.dtype = "float16";
    e.layout.shape[2] = 0;
    assert_rc(kvp_tpickle_layout_check(&e.layout, &bytes, why, sizeof(why)), -EINVAL);
    e.layout.shape[2] = 1ull << 62;
    assert_rc(kvp_tpickle_layout_check(&e.layout, &bytes, why, sizeof(why)), -EINVAL);
    e.layout.shape[2] = 4;
    e.layout.ndim = 0;
    assert_rc(kvp_tpickle_layout_check(&e.layout, &bytes, why, sizeof(why)), -EINVAL);
    e.layout.ndim = KVP_TPICKLE_MAX_DIMS + 1;
    assert_rc(kvp_tpickle_layout_check(&e.layout, &bytes, why, sizeof(why)), -EINVAL);

    /* Every dtype kvpool registers has a pickle form. */
    char names[256];
    snprintf(names, sizeof(names), "%s", kvp_dtype_names());
    e = expect("", 4, kv_shape, 1, 1);
    char *save = NULL;
    for (char *tok = strtok_r(names, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        e.layout.dtype = tok;
        if (kvp_tpickle_layout_check(&e.layout, &bytes, why, sizeof(why)) != 0)
            fail_msg("%s: %s", tok, why);
        assert_int_equal(bytes, 128 * kvp_dtype_find(tok)->size);
    }

    /* cap below max, min above max: the caller's mistake, not the payload's. */
    struct kvp_tpickle_tensor out[2];
    uint32_t n;
    e = expect("float16", 4, kv_shape, 1, 3);
    assert_rc(kvp_tpickle_decode((const uint8_t *)"", 0, &e, out, 2, &n, why, sizeof(why)),
              -EINVAL);
    e = expect("float16", 4, kv_shape, 3, 2);
    assert_rc(kvp_tpickle_decode((const uint8_t *)"", 0, &e, out, 2, &n, why, sizeof(why)),
              -EINVAL);
}

/* The encoder's output decodes to the chunks it was given, through both of its forms. */
static void test_encode_roundtrip(void **state)
{
    (void)state;
    static const char *const dtypes[] = {"float16", "bfloat16", "float32",       "float64",
                                         "int8",    "uint8",    "float8_e4m3fn", "float8_e5m2"};
    static const uint64_t shapes[][5] = {
        {4, 2, 2, 4, 8}, {3, 2, 4, 8}, {4, 2, 1, 300, 2}, {1, 70000}, {4, 1, 1, 1, 1},
    };
    char why[200];

    for (size_t di = 0; di < sizeof(dtypes) / sizeof(dtypes[0]); di++)
        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
            for (uint32_t count = 0; count <= 3; count++) {
                struct kvp_tpickle_expect e = expect(dtypes[di], (uint32_t)shapes[si][0],
                                                     &shapes[si][1], count, count);
                struct kvp_tpickle_template t;
                uint64_t bytes, size;
                if (kvp_tpickle_template_init(&t, &e.layout, why, sizeof(why)) != 0)
                    fail_msg("%s: %s", dtypes[di], why);
                assert_rc(kvp_tpickle_layout_check(&e.layout, &bytes, NULL, 0), 0);
                assert_int_equal(t.chunk_bytes, bytes);

                uint8_t *chunks = malloc(bytes * 3 + 1);
                const uint8_t *ptrs[3];
                for (uint32_t k = 0; k < 3; k++) {
                    ptrs[k] = chunks + k * bytes;
                    for (uint64_t j = 0; j < bytes; j++)
                        chunks[k * bytes + j] = pattern(k, j);
                }
                assert_rc(kvp_tpickle_encoded_size(&t, count, &size), 0);
                uint8_t *dst = malloc(size + 1);
                assert_rc(kvp_tpickle_encode(&t, count, ptrs, dst, size - 1), -ENOSPC);
                assert_rc(kvp_tpickle_encode(&t, count, ptrs, dst, size + 1), (int64_t)size);

                /* The iovec form is the same bytes. */
                struct iovec iov[2 + 3 * 3];
                assert_rc(kvp_tpickle_encode_iov(&t, count, ptrs, iov, 1 + 3 * count), -ENOSPC);
                int k = kvp_tpickle_encode_iov(&t, count, ptrs, iov, 11);
                assert_rc(k, 2 + 3 * count);
                size_t at = 0;
                for (int i = 0; i < k; i++) {
                    assert_true(at + iov[i].iov_len <= size);
                    assert_memory_equal(dst + at, iov[i].iov_base, iov[i].iov_len);
                    at += iov[i].iov_len;
                }
                assert_int_equal(at, size);

                struct kvp_tpickle_tensor out[3];
                uint32_t n;
                if (kvp_tpickle_decode(dst, size, &e, out, 3, &n, why, sizeof(why)) != 0)
                    fail_msg("%s: own output refused: %s", dtypes[di], why);
                assert_int_equal(n, count);
                check_pattern(out, n, bytes, dst, size, dtypes[di]);
                free(dst);
                free(chunks);
            }
}

/*
 * A sweep of single-byte changes over a real payload: whatever is accepted still satisfies the
 * decoder's promises (count, lengths, slices inside the buffer, in order, not overlapping).
 */
static void test_mutations(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = slurp(KVP_TPICKLE_DATA "/float8_e4m3fn_2x4x8_n2_p5.pkl", &len);
    static const uint8_t vals[] = {0x00, 0x01, 0x7f, 0x80, 0xff, '(', 't', 'R', 0x94, 'h', '.'};
    struct kvp_tpickle_expect e = expect("float8_e4m3fn", 3, &kv_shape[1], 0, 4);
    struct kvp_tpickle_tensor out[4];
    char why[200];
    unsigned accepted = 0;

    for (size_t i = 0; i < len; i++)
        for (size_t v = 0; v < sizeof(vals); v++) {
            uint8_t save = buf[i];
            buf[i] = vals[v];
            uint32_t n;
            int rc = kvp_tpickle_decode(buf, len, &e, out, 4, &n, why, sizeof(why));
            assert_true(rc == 0 || rc == -EPROTO);
            if (rc == 0) {
                accepted++;
                assert_true(n <= 4);
                for (uint32_t k = 0; k < n; k++) {
                    assert_int_equal(out[k].len, 64);
                    assert_true(out[k].data >= buf && out[k].data + 64 <= buf + len);
                    if (k)
                        assert_true(out[k].data >= out[k - 1].data + 64);
                }
            }
            buf[i] = save;
        }
    /* Changed element bytes are still a valid payload; changed opcodes mostly are not. */
    assert_true(accepted > 0);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_payloads),    cmocka_unit_test(test_truncated_and_trailing),
        cmocka_unit_test(test_oversized),        cmocka_unit_test(test_huge_layout),
        cmocka_unit_test(test_hostile_payloads), cmocka_unit_test(test_hand_made),
        cmocka_unit_test(test_layout_check),     cmocka_unit_test(test_encode_roundtrip),
        cmocka_unit_test(test_mutations),        cmocka_unit_test(test_view_form),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
