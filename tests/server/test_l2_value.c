/*
 * test_l2_value.c - the L2 value format (src/server/l2/l2_value.h): key names, the header, and the
 * checks that keep a truncated, corrupted, foreign or misplaced value from ever being served.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_assert.h"
#include "l2/l2_value.h"

#define DATA 4096

static const struct kvp_l2_layout lay = {.ndim = 4,
                                         .shape = {2, 2, 16, 64},
                                         .dtype = "float16",
                                         .bytes = DATA};

/* A good value for key: header + DATA bytes of a pattern. Caller frees. */
static uint8_t *make_value(const uint8_t *key, size_t *len)
{
    uint8_t *v = malloc(KVP_L2_HEADER_SIZE + DATA + 16);
    assert_non_null(v);
    for (size_t i = 0; i < DATA; i++)
        v[KVP_L2_HEADER_SIZE + i] = (uint8_t)(i * 7 + 3);
    kvp_l2_header_encode(v, key, &lay, v + KVP_L2_HEADER_SIZE);
    *len = KVP_L2_HEADER_SIZE + DATA;
    return v;
}

static void key_of(uint8_t *key, uint8_t seed)
{
    for (int i = 0; i < KVP_KEY_SIZE; i++)
        key[i] = (uint8_t)(seed + i * 13);
}

static void test_key_name(void **state)
{
    (void)state;
    uint8_t key[KVP_KEY_SIZE];
    char name[KVP_L2_KEY_LEN + 1];
    for (int i = 0; i < KVP_KEY_SIZE; i++)
        key[i] = (uint8_t)i;
    kvp_l2_key_name(key, name);
    assert_int_equal(strlen(name), KVP_L2_KEY_LEN);
    assert_string_equal(name, "kvpool:v1:000102030405060708090a0b0c0d0e0f"
                              "101112131415161718191a1b1c1d1e1f");
}

static void test_good_value(void **state)
{
    (void)state;
    uint8_t key[KVP_KEY_SIZE];
    size_t len;
    key_of(key, 1);
    uint8_t *v = make_value(key, &len);
    assert_int_equal(kvp_l2_value_check(v, len, key, &lay), KVP_L2_VALUE_OK);
    /* The header is little-endian and fixed: the magic and the length sit where documented. */
    assert_memory_equal(v, "KVPL2VAL", 8);
    assert_int_equal(v[80] | v[81] << 8, DATA);
    free(v);
}

static void test_truncated(void **state)
{
    (void)state;
    uint8_t key[KVP_KEY_SIZE];
    size_t len;
    key_of(key, 2);
    uint8_t *v = make_value(key, &len);
    assert_int_equal(kvp_l2_value_check(v, 0, key, &lay), KVP_L2_VALUE_SHORT);
    assert_int_equal(kvp_l2_value_check(v, KVP_L2_HEADER_SIZE - 1, key, &lay), KVP_L2_VALUE_SHORT);
    assert_int_equal(kvp_l2_value_check(v, KVP_L2_HEADER_SIZE, key, &lay), KVP_L2_VALUE_SHORT);
    assert_int_equal(kvp_l2_value_check(v, len - 1, key, &lay), KVP_L2_VALUE_SHORT);
    /* Bytes after the data (a value cut at the reader's limit + 1). */
    v[len] = 0;
    assert_int_equal(kvp_l2_value_check(v, len + 1, key, &lay), KVP_L2_VALUE_LONG);
    free(v);
}

static void test_corrupted(void **state)
{
    (void)state;
    uint8_t key[KVP_KEY_SIZE];
    size_t len;
    key_of(key, 3);
    uint8_t *v = make_value(key, &len);

    /* Any flipped bit of the data or of the checksummed header fails. */
    const size_t spots[] = {KVP_L2_HEADER_SIZE, KVP_L2_HEADER_SIZE + DATA / 2, len - 1, 88, 95};
    for (size_t i = 0; i < sizeof(spots) / sizeof(spots[0]); i++) {
        v[spots[i]] ^= 0x10;
        enum kvp_l2_verdict r = kvp_l2_value_check(v, len, key, &lay);
        if (r != KVP_L2_VALUE_CHECKSUM)
            fail_msg("flip at %zu: verdict %s, expected checksum mismatch", spots[i],
                     kvp_l2_verdict_name(r));
        v[spots[i]] ^= 0x10;
    }
    assert_int_equal(kvp_l2_value_check(v, len, key, &lay), KVP_L2_VALUE_OK);

    v[0] = 'X';
    assert_int_equal(kvp_l2_value_check(v, len, key, &lay), KVP_L2_VALUE_MAGIC);
    v[0] = 'K';
    v[8] = 2; /* format version */
    assert_int_equal(kvp_l2_value_check(v, len, key, &lay), KVP_L2_VALUE_VERSION);
    v[8] = 1;
    v[100] = 1; /* reserved bytes must be zero */
    assert_int_equal(kvp_l2_value_check(v, len, key, &lay), KVP_L2_VALUE_LAYOUT);
    v[100] = 0;
    /* A huge length in the header is refused before it is trusted. */
    v[87] = 0x7f;
    assert_int_equal(kvp_l2_value_check(v, len, key, &lay), KVP_L2_VALUE_SHORT);
    free(v);
}

static void test_foreign(void **state)
{
    (void)state;
    uint8_t key[KVP_KEY_SIZE], other[KVP_KEY_SIZE];
    size_t len;
    key_of(key, 4);
    key_of(other, 5);
    uint8_t *v = make_value(key, &len);

    /* Renamed to another key. */
    assert_int_equal(kvp_l2_value_check(v, len, other, &lay), KVP_L2_VALUE_KEY);
    /* Read by a daemon with another layout. */
    struct kvp_l2_layout l = lay;
    snprintf(l.dtype, sizeof(l.dtype), "bfloat16");
    assert_int_equal(kvp_l2_value_check(v, len, key, &l), KVP_L2_VALUE_LAYOUT);
    l = lay;
    l.shape[1] = 3;
    assert_int_equal(kvp_l2_value_check(v, len, key, &l), KVP_L2_VALUE_LAYOUT);
    l = lay;
    l.bytes = DATA * 2;
    assert_int_equal(kvp_l2_value_check(v, len, key, &l), KVP_L2_VALUE_LAYOUT);
    assert_string_equal(kvp_l2_verdict_name(KVP_L2_VALUE_CHECKSUM), "checksum mismatch");
    free(v);
}

/* The two-part form used when a value is received straight into its slot. */
static void test_parts(void **state)
{
    (void)state;
    uint8_t key[KVP_KEY_SIZE];
    size_t len;
    key_of(key, 6);
    uint8_t *v = make_value(key, &len);
    uint8_t hdr[KVP_L2_HEADER_SIZE];
    uint8_t *data = malloc(DATA);
    assert_non_null(data);
    memcpy(hdr, v, sizeof(hdr));
    memcpy(data, v + KVP_L2_HEADER_SIZE, DATA);
    assert_int_equal(kvp_l2_value_check_parts(hdr, data, len, key, &lay), KVP_L2_VALUE_OK);
    assert_int_equal(kvp_l2_value_check_parts(hdr, data, len - 10, key, &lay), KVP_L2_VALUE_SHORT);
    assert_int_equal(kvp_l2_value_check_parts(hdr, data, 50, key, &lay), KVP_L2_VALUE_SHORT);
    data[DATA - 1] ^= 0x80;
    assert_int_equal(kvp_l2_value_check_parts(hdr, data, len, key, &lay), KVP_L2_VALUE_CHECKSUM);
    free(data);
    free(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_name),  cmocka_unit_test(test_good_value),
        cmocka_unit_test(test_truncated), cmocka_unit_test(test_corrupted),
        cmocka_unit_test(test_foreign),   cmocka_unit_test(test_parts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
