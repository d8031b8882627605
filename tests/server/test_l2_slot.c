/*
 * test_l2_slot.c - Redis Cluster key slots (src/server/l2/l2_cluster.h): CRC16 (XMODEM) known
 * vectors, hash tags, and the slots of kvpool's own key names.
 */
#include <stdio.h>
#include <string.h>

#include "common/kvp_assert.h"
#include "l2/l2_cluster.h"
#include "l2/l2_value.h"

static uint32_t slot(const char *key)
{
    return kvp_l2_key_slot(key, strlen(key));
}

static void test_crc16_vectors(void **state)
{
    (void)state;
    /* The check value of CRC-16/XMODEM, and the example of the Redis Cluster specification. */
    assert_int_equal(kvp_l2_crc16("123456789", 9), 0x31C3);
    assert_int_equal(kvp_l2_crc16("", 0), 0);
    assert_int_equal(kvp_l2_crc16("A", 1), 0x58E5);
}

static void test_slots(void **state)
{
    (void)state;
    /* Values that redis-cli CLUSTER KEYSLOT gives. */
    assert_int_equal(slot("123456789"), 0x31C3 % 16384);
    assert_int_equal(slot("foo"), 12182);
    assert_int_equal(slot("bar"), 5061);
    assert_int_equal(slot("hello"), 866);
}

static void test_hash_tags(void **state)
{
    (void)state;
    /* Only the part between the first '{' and the next '}' counts... */
    assert_int_equal(slot("{user1000}.following"), slot("user1000"));
    assert_int_equal(slot("{user1000}.followers"), slot("{user1000}.following"));
    assert_int_equal(slot("foo{bar}{zap}"), slot("bar"));
    assert_int_equal(slot("foo{{bar}}zap"), slot("{bar"));
    /* ...unless it is empty or unterminated: then the whole key counts. */
    assert_int_equal(slot("foo{}{bar}"), kvp_l2_crc16("foo{}{bar}", 10) % 16384);
    assert_int_equal(slot("foo{bar"), kvp_l2_crc16("foo{bar", 7) % 16384);
}

static void test_kvpool_keys_spread(void **state)
{
    (void)state;
    /* kvpool's names carry no hash tag: chunks spread over the slots (and the masters). */
    uint8_t key[KVP_KEY_SIZE];
    char name[KVP_L2_KEY_LEN + 1];
    int thirds[3] = {0};
    for (int k = 0; k < 300; k++) {
        for (int i = 0; i < KVP_KEY_SIZE; i++)
            key[i] = (uint8_t)(k * 31 + i * 7 + (k >> 3));
        kvp_l2_key_name(key, name);
        uint32_t s = slot(name);
        assert_true(s < 16384);
        thirds[s * 3 / 16384]++;
    }
    for (int i = 0; i < 3; i++)
        assert_true(thirds[i] > 50);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc16_vectors),
        cmocka_unit_test(test_slots),
        cmocka_unit_test(test_hash_tags),
        cmocka_unit_test(test_kvpool_keys_spread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
