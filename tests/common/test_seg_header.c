/*
 * test_seg_header.c - the segment header page (src/common/seg_header.c): what the daemon writes
 * is what the worker's check accepts, and each field the check covers makes it fail when wrong.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/seg_header.h"

static _Alignas(64) uint8_t page[KVP_SEG_HEADER];
static const uint8_t nonce[KVP_SEG_NONCE_SIZE] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
#define SIZE (KVP_SEG_HEADER + (1u << 20))

static int check(char *why, size_t n)
{
    return kvp_seg_header_check(page, sizeof(page), SIZE, nonce, "seg-test", why, n);
}

static void test_written_header_passes(void **state)
{
    (void)state;
    char why[256] = "untouched";
    memset(page, 0xee, sizeof(page));
    kvp_seg_header_write(page, nonce, SIZE, 4242);
    assert_int_equal(check(why, sizeof(why)), 0);
    assert_memory_equal(page, "KVPOOLSG", 8);
    assert_int_equal(kvp_seg_header_pid(page, sizeof(page)), 4242);
    assert_true(kvp_seg_header_has_magic(page, sizeof(page)));
    /* The rest of the page is zeroed. */
    for (size_t i = sizeof(struct kvp_seg_header); i < sizeof(page); i++)
        assert_int_equal(page[i], 0);
}

/* The reservation's progress: nothing said after the write, then counts, then final. */
static void test_reserved_published(void **state)
{
    (void)state;
    bool final = true;
    kvp_seg_header_write(page, nonce, SIZE, 4242);
    assert_int_equal(kvp_seg_header_reserved(page, &final), 0);
    assert_false(final);
    kvp_seg_header_publish_reserved(page, 8192, false);
    assert_int_equal(kvp_seg_header_reserved(page, &final), 8192);
    assert_false(final);
    kvp_seg_header_publish_reserved(page, 16384, true);
    assert_int_equal(kvp_seg_header_reserved(page, &final), 16384);
    assert_true(final);
    /* Still a valid header. */
    char why[256];
    assert_int_equal(check(why, sizeof(why)), 0);
}

/* One field at a time: each must make the check fail, with a message naming the segment. */
static void test_each_field_checked(void **state)
{
    (void)state;
    char why[256];
    static const struct {
        size_t off;
        const char *want;
    } cases[] = {
        {offsetof(struct kvp_seg_header, magic), "has no kvpool header"},
        {offsetof(struct kvp_seg_header, version), "header version"},
        {offsetof(struct kvp_seg_header, header_size), "-byte header"},
        {offsetof(struct kvp_seg_header, size), "the daemon announced"},
        {offsetof(struct kvp_seg_header, nonce) + 5, "nonce mismatch"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvp_seg_header_write(page, nonce, SIZE, 1);
        page[cases[i].off] ^= 0x40;
        assert_int_equal(check(why, sizeof(why)), -EPROTO);
        assert_non_null(strstr(why, cases[i].want));
    }
    /* A segment of another size than the one mapped. */
    kvp_seg_header_write(page, nonce, SIZE + 4096, 1);
    assert_int_equal(check(why, sizeof(why)), -EPROTO);
    assert_non_null(strstr(why, "seg-test"));
}

static void test_short_or_headerless(void **state)
{
    (void)state;
    kvp_seg_header_write(page, nonce, SIZE, 7);
    assert_int_equal(kvp_seg_header_check(page, 16, SIZE, nonce, "short", NULL, 0), -EPROTO);
    assert_int_equal(kvp_seg_header_pid(page, 16), 0);
    memset(page, 0, sizeof(page));
    assert_false(kvp_seg_header_has_magic(page, sizeof(page)));
    assert_int_equal(kvp_seg_header_pid(page, sizeof(page)), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_written_header_passes),
        cmocka_unit_test(test_reserved_published),
        cmocka_unit_test(test_each_field_checked),
        cmocka_unit_test(test_short_or_headerless),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
