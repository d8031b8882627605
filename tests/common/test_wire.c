/*
 * test_wire.c - frame header codec and the bounds-checked buffer reader/writer (wire.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_assert.h"
#include "common/wire.h"

static struct kvp_header valid_header(void)
{
    return (struct kvp_header){
        .magic = KVP_MAGIC,
        .version = KVP_PROTO_VERSION,
        .opcode = KVP_OP_STORE_INLINE | KVP_REPLY_FLAG,
        .request_id = 0x0102030405060708ull,
        .body_len = 1234,
        .status = -EINVAL,
        .payload_len = 0x1122334455667788ull,
    };
}

static void test_header_round_trip(void **state)
{
    (void)state;
    struct kvp_header h = valid_header(), d;
    uint8_t raw[KVP_HEADER_SIZE];

    kvp_header_encode(&h, raw);
    assert_rc(kvp_header_decode(raw, &d), 0);
    assert_int_equal(d.magic, h.magic);
    assert_int_equal(d.version, h.version);
    assert_int_equal(d.opcode, h.opcode);
    assert_int_equal(d.request_id, h.request_id);
    assert_int_equal(d.body_len, h.body_len);
    assert_rc(d.status, -EINVAL);
    assert_int_equal(d.payload_len, h.payload_len);
}

/* The byte layout of docs/PROTOCOL.md: little-endian fields at fixed offsets. */
static void test_header_layout(void **state)
{
    (void)state;
    struct kvp_header h = valid_header();
    uint8_t raw[KVP_HEADER_SIZE];
    static const uint8_t want[KVP_HEADER_SIZE] = {
        'K',  'V',  'P',  '1',  0x01, 0x00, 0x0a, 0x80, /* magic, version, opcode|reply */
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, /* request id */
        0xd2, 0x04, 0x00, 0x00, 0xea, 0xff, 0xff, 0xff, /* body_len 1234, status -22 */
        0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, /* payload_len */
    };

    kvp_header_encode(&h, raw);
    assert_memory_equal(raw, want, sizeof(want));
}

static int decode_modified(size_t off, uint8_t byte)
{
    struct kvp_header h = valid_header(), d;
    uint8_t raw[KVP_HEADER_SIZE];

    kvp_header_encode(&h, raw);
    raw[off] = byte;
    return kvp_header_decode(raw, &d);
}

static int decode_with(struct kvp_header h)
{
    struct kvp_header d;
    uint8_t raw[KVP_HEADER_SIZE];

    kvp_header_encode(&h, raw);
    return kvp_header_decode(raw, &d);
}

static void test_header_rejects(void **state)
{
    (void)state;
    struct kvp_header h;

    assert_rc(decode_modified(0, 'X'), -EPROTO);        /* magic */
    assert_rc(decode_modified(3, '2'), -EPROTO);        /* magic */
    assert_rc(decode_modified(4, 2), -EPROTONOSUPPORT); /* version 2 */
    assert_rc(decode_modified(5, 1), -EPROTONOSUPPORT); /* version 257 */

    h = valid_header();
    h.opcode = 0;
    assert_rc(decode_with(h), -EPROTO);
    h.opcode = KVP_OP_MAX_;
    assert_rc(decode_with(h), -EPROTO);
    h.opcode = KVP_OP_MAX_ | KVP_REPLY_FLAG;
    assert_rc(decode_with(h), -EPROTO);
    h.opcode = 0x7fff;
    assert_rc(decode_with(h), -EPROTO);
    h.opcode = KVP_OP_RETRIEVE_INLINE;
    assert_rc(decode_with(h), 0);
    h.opcode = KVP_OP_HELLO | KVP_REPLY_FLAG;
    assert_rc(decode_with(h), 0);

    h = valid_header();
    h.body_len = KVP_MAX_BODY;
    assert_rc(decode_with(h), 0);
    h.body_len = KVP_MAX_BODY + 1;
    assert_rc(decode_with(h), -EPROTO);
    h.body_len = UINT32_MAX;
    assert_rc(decode_with(h), -EPROTO);
}

/* A wrong version is reported as such even when other fields are bad too. */
static void test_header_version_first(void **state)
{
    (void)state;
    struct kvp_header h = valid_header();

    h.version = 2;
    h.opcode = 0x7777;
    h.body_len = UINT32_MAX;
    assert_rc(decode_with(h), -EPROTONOSUPPORT);
}

static void test_opcode_names(void **state)
{
    (void)state;
    assert_string_equal(kvp_opcode_name(KVP_OP_HELLO), "HELLO");
    assert_string_equal(kvp_opcode_name(KVP_OP_RETRIEVE_INLINE | KVP_REPLY_FLAG),
                        "RETRIEVE_INLINE");
    assert_string_equal(kvp_opcode_name(0), "?");
    assert_string_equal(kvp_opcode_name(KVP_OP_MAX_), "?");
}

static void test_integers_little_endian(void **state)
{
    (void)state;
    struct kvp_wbuf w;
    struct kvp_rbuf r;
    static const uint8_t want[] = {0xab, 0x34, 0x12, 0x78, 0x56, 0x34, 0x12, 0xef,
                                   0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01};

    kvp_wbuf_init(&w);
    kvp_put_u8(&w, 0xab);
    kvp_put_u16(&w, 0x1234);
    kvp_put_u32(&w, 0x12345678);
    kvp_put_u64(&w, 0x0123456789abcdefull);
    assert_rc(w.err, 0);
    assert_int_equal(w.len, sizeof(want));
    assert_memory_equal(w.data, want, sizeof(want));

    kvp_rbuf_init(&r, w.data, w.len);
    assert_int_equal(kvp_get_u8(&r), 0xab);
    assert_int_equal(kvp_get_u16(&r), 0x1234);
    assert_int_equal(kvp_get_u32(&r), 0x12345678);
    assert_int_equal(kvp_get_u64(&r), 0x0123456789abcdefull);
    assert_rc(kvp_rbuf_finish(&r), 0);
    kvp_wbuf_free(&w);
}

/* An array goes out as the same bytes as one kvp_put_u32 per element; empty adds nothing. */
static void test_u32_array(void **state)
{
    (void)state;
    struct kvp_wbuf a, b;
    uint32_t v[300];
    for (uint32_t i = 0; i < 300; i++)
        v[i] = 0x01020304u * (i + 1);

    kvp_wbuf_init(&a);
    kvp_wbuf_init(&b);
    kvp_put_u8(&a, 7);
    kvp_put_u8(&b, 7);
    kvp_put_u32_array(&a, v, 300);
    for (uint32_t i = 0; i < 300; i++)
        kvp_put_u32(&b, v[i]);
    kvp_put_u32_array(&a, v, 0);
    assert_rc(a.err, 0);
    assert_int_equal(a.len, 1 + 300 * 4);
    assert_int_equal(a.len, b.len);
    assert_memory_equal(a.data, b.data, a.len);
    assert_int_equal(a.data[1], 0x04); /* little-endian: lowest byte first */
    kvp_wbuf_free(&a);
    kvp_wbuf_free(&b);
}

/* The writer grows past its first allocation and keeps every byte. */
static void test_wbuf_grows(void **state)
{
    (void)state;
    struct kvp_wbuf w;

    kvp_wbuf_init(&w);
    for (uint32_t i = 0; i < 10000; i++)
        kvp_put_u32(&w, i);
    assert_rc(w.err, 0);
    assert_int_equal(w.len, 40000);
    struct kvp_rbuf r;
    kvp_rbuf_init(&r, w.data, w.len);
    for (uint32_t i = 0; i < 10000; i++)
        assert_int_equal(kvp_get_u32(&r), i);
    assert_rc(kvp_rbuf_finish(&r), 0);

    kvp_wbuf_reset(&w);
    assert_int_equal(w.len, 0);
    kvp_wbuf_free(&w);
    assert_null(w.data);
}

/* Once a read overruns, the error sticks and later reads return zeros even if bytes remain. */
static void test_rbuf_overrun_sticky(void **state)
{
    (void)state;
    static const uint8_t buf[] = {1, 2, 3};
    struct kvp_rbuf r;

    kvp_rbuf_init(&r, buf, sizeof(buf));
    assert_int_equal(kvp_get_u32(&r), 0);
    assert_rc(r.err, -EPROTO);
    assert_int_equal(kvp_get_u8(&r), 0);
    assert_int_equal(kvp_get_u16(&r), 0);
    assert_null(kvp_get_bytes(&r, 1));
    assert_rc(r.err, -EPROTO);
    assert_rc(kvp_rbuf_finish(&r), -EPROTO);

    /* Exactly enough is fine; one more byte is not. */
    kvp_rbuf_init(&r, buf, sizeof(buf));
    assert_non_null(kvp_get_bytes(&r, 3));
    assert_rc(kvp_rbuf_finish(&r), 0);
    assert_int_equal(kvp_get_u8(&r), 0);
    assert_rc(kvp_rbuf_finish(&r), -EPROTO);

    /* A huge length must not wrap the bounds check. */
    kvp_rbuf_init(&r, buf, sizeof(buf));
    kvp_get_u8(&r);
    assert_null(kvp_get_bytes(&r, SIZE_MAX));
    assert_rc(r.err, -EPROTO);
}

static void test_trailing_bytes(void **state)
{
    (void)state;
    static const uint8_t buf[] = {1, 0, 0, 0, 9};
    struct kvp_rbuf r;

    kvp_rbuf_init(&r, buf, sizeof(buf));
    assert_int_equal(kvp_get_u32(&r), 1);
    assert_rc(r.err, 0);
    assert_rc(kvp_rbuf_finish(&r), -EPROTO);
}

static void test_strings(void **state)
{
    (void)state;
    struct kvp_wbuf w;
    struct kvp_rbuf r;
    char out[8];

    kvp_wbuf_init(&w);
    kvp_put_str(&w, "abc");
    kvp_put_str(&w, NULL); /* written as "" */
    kvp_put_str(&w, "");
    assert_rc(w.err, 0);
    assert_int_equal(w.len, 2 + 3 + 2 + 2);
    assert_memory_equal(w.data,
                        "\x03\x00"
                        "abc"
                        "\x00\x00"
                        "\x00\x00",
                        w.len);

    kvp_rbuf_init(&r, w.data, w.len);
    kvp_get_str(&r, out, sizeof(out), sizeof(out) - 1);
    assert_string_equal(out, "abc");
    kvp_get_str(&r, out, sizeof(out), sizeof(out) - 1);
    assert_string_equal(out, "");
    kvp_get_str(&r, out, sizeof(out), sizeof(out) - 1);
    assert_string_equal(out, "");
    assert_rc(kvp_rbuf_finish(&r), 0);
    kvp_wbuf_free(&w);
}

static int get_str_rc(const void *blob, uint16_t n, size_t size, size_t max, char *out)
{
    struct kvp_wbuf w;
    struct kvp_rbuf r;

    kvp_wbuf_init(&w);
    kvp_put_blob(&w, blob, n);
    kvp_rbuf_init(&r, w.data, w.len);
    kvp_get_str(&r, out, size, max);
    int rc = kvp_rbuf_finish(&r);
    kvp_wbuf_free(&w);
    return rc;
}

static void test_string_rejects(void **state)
{
    (void)state;
    char out[16];

    /* Embedded NUL. */
    assert_rc(get_str_rc("a\0b", 3, sizeof(out), 15, out), -EPROTO);
    assert_string_equal(out, "");
    assert_rc(get_str_rc("ab\0", 3, sizeof(out), 15, out), -EPROTO);
    /* Longer than max: at max it is fine, one over is not. */
    assert_rc(get_str_rc("12345", 5, sizeof(out), 5, out), 0);
    assert_string_equal(out, "12345");
    assert_rc(get_str_rc("123456", 6, sizeof(out), 5, out), -EPROTO);
    /* A max that leaves no room for the NUL is a caller bug, rejected. */
    assert_rc(get_str_rc("1", 1, 4, 4, out), -EPROTO);
    /* A zero-size output buffer is refused without being written. */
    char none[1] = {'z'};
    assert_rc(get_str_rc("", 0, 0, 0, none), -EPROTO);
    assert_int_equal(none[0], 'z');
    /* Declared length beyond the buffer. */
    static const uint8_t lying[] = {10, 0, 'a', 'b'};
    struct kvp_rbuf r;
    kvp_rbuf_init(&r, lying, sizeof(lying));
    kvp_get_str(&r, out, sizeof(out), 15);
    assert_rc(kvp_rbuf_finish(&r), -EPROTO);
}

static void test_blob_limit(void **state)
{
    (void)state;
    uint8_t data[300];
    struct kvp_wbuf w;
    struct kvp_rbuf r;
    uint16_t n;

    memset(data, 0x5a, sizeof(data));
    kvp_wbuf_init(&w);
    kvp_put_blob(&w, data, 256);
    kvp_put_blob(&w, data, 257);
    kvp_rbuf_init(&r, w.data, w.len);
    const uint8_t *p = kvp_get_blob(&r, &n, 256);
    assert_non_null(p);
    assert_int_equal(n, 256);
    assert_memory_equal(p, data, 256);
    assert_null(kvp_get_blob(&r, &n, 256));
    assert_int_equal(n, 0);
    assert_rc(kvp_rbuf_finish(&r), -EPROTO);
    kvp_wbuf_free(&w);
}

/* A string too long for its u16 length is refused, not truncated. */
static void test_str_too_long_for_wire(void **state)
{
    (void)state;
    struct kvp_wbuf w;
    char *big = malloc(70000);

    assert_non_null(big);
    memset(big, 'x', 69999);
    big[69999] = '\0';
    kvp_wbuf_init(&w);
    kvp_put_str(&w, big);
    assert_true(w.err < 0);
    kvp_wbuf_free(&w);
    free(big);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_round_trip),
        cmocka_unit_test(test_header_layout),
        cmocka_unit_test(test_header_rejects),
        cmocka_unit_test(test_header_version_first),
        cmocka_unit_test(test_opcode_names),
        cmocka_unit_test(test_integers_little_endian),
        cmocka_unit_test(test_u32_array),
        cmocka_unit_test(test_wbuf_grows),
        cmocka_unit_test(test_rbuf_overrun_sticky),
        cmocka_unit_test(test_trailing_bytes),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_string_rejects),
        cmocka_unit_test(test_blob_limit),
        cmocka_unit_test(test_str_too_long_for_wire),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
