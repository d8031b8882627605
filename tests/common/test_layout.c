/*
 * test_layout.c - the dtype table and the chunk shape rule (layout.c).
 */
#include <errno.h>
#include <string.h>

#include "common/kvp_assert.h"
#include "common/layout.h"

static void test_dtype_sizes(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        uint32_t size;
    } want[] = {
        {"float16", 2}, {"bfloat16", 2}, {"float32", 4},       {"float64", 8},
        {"int8", 1},    {"uint8", 1},    {"float8_e4m3fn", 1}, {"float8_e5m2", 1},
    };

    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const struct kvp_dtype *d = kvp_dtype_find(want[i].name);
        if (!d)
            fail_msg("dtype %s not found", want[i].name);
        assert_string_equal(d->name, want[i].name);
        assert_int_equal(d->size, want[i].size);
        /* The list used in messages and --help names every dtype. */
        assert_non_null(strstr(kvp_dtype_names(), want[i].name));
    }
}

static void test_dtype_unknown(void **state)
{
    (void)state;
    assert_null(kvp_dtype_find(NULL));
    assert_null(kvp_dtype_find(""));
    assert_null(kvp_dtype_find("float"));
    assert_null(kvp_dtype_find("Float16"));
    assert_null(kvp_dtype_find("float16 "));
    assert_null(kvp_dtype_find("half"));
    assert_null(kvp_dtype_find("float8"));
}

/* torch's alias names reach their dtype; kvpool's own names still work, anything else does not.
 * Every dtype is reachable by index, and the table ends. */
static void test_dtype_torch_names(void **state)
{
    (void)state;
    assert_string_equal(kvp_dtype_find_torch("half")->name, "float16");
    assert_string_equal(kvp_dtype_find_torch("float")->name, "float32");
    assert_string_equal(kvp_dtype_find_torch("double")->name, "float64");
    assert_string_equal(kvp_dtype_find_torch("bfloat16")->name, "bfloat16");
    assert_null(kvp_dtype_find_torch("Half"));
    assert_null(kvp_dtype_find_torch(NULL));
    assert_string_equal(kvp_dtype_find("float16")->torch_storage, "HalfStorage");
    assert_null(kvp_dtype_find("float8_e5m2")->torch_storage);
    size_t n = 0;
    while (kvp_dtype_at(n)) {
        assert_ptr_equal(kvp_dtype_find(kvp_dtype_at(n)->name), kvp_dtype_at(n));
        n++;
    }
    assert_int_equal(n, 8);
}

static void test_shape_kv(void **state)
{
    (void)state;
    struct kvp_chunk_layout l;

    assert_rc(kvp_chunk_layout(32, 256, 1024, 2, false, 0, &l), 0);
    assert_int_equal(l.ndim, 4);
    assert_int_equal(l.shape[0], 2);
    assert_int_equal(l.shape[1], 32);
    assert_int_equal(l.shape[2], 256);
    assert_int_equal(l.shape[3], 1024);
    assert_int_equal(l.bytes, 2ull * 32 * 256 * 1024 * 2);
}

static void test_shape_mla(void **state)
{
    (void)state;
    struct kvp_chunk_layout l;

    assert_rc(kvp_chunk_layout(61, 256, 576, 2, true, 0, &l), 0);
    assert_int_equal(l.ndim, 3);
    assert_int_equal(l.shape[0], 61);
    assert_int_equal(l.shape[1], 256);
    assert_int_equal(l.shape[2], 576);
    assert_int_equal(l.shape[3], 0);
    /* No factor 2: one latent instead of K and V. */
    assert_int_equal(l.bytes, 61ull * 256 * 576 * 2);
}

static void test_zero_dims(void **state)
{
    (void)state;
    struct kvp_chunk_layout l;

    assert_rc(kvp_chunk_layout(0, 256, 1024, 2, false, 0, &l), -EINVAL);
    assert_rc(kvp_chunk_layout(32, 0, 1024, 2, false, 0, &l), -EINVAL);
    assert_rc(kvp_chunk_layout(32, 256, 0, 2, false, 0, &l), -EINVAL);
    assert_rc(kvp_chunk_layout(32, 256, 1024, 0, false, 0, &l), -EINVAL);
    assert_rc(kvp_chunk_layout(0, 256, 1024, 2, true, 0, &l), -EINVAL);
}

static void test_overflow(void **state)
{
    (void)state;
    struct kvp_chunk_layout l;

    /* 2 * 2^32 * 2^32 * ... cannot fit 64 bits. */
    assert_rc(kvp_chunk_layout(UINT32_MAX, UINT32_MAX, UINT32_MAX, 8, false, 0, &l), -EOVERFLOW);
    assert_rc(kvp_chunk_layout(UINT32_MAX, UINT32_MAX, 1, 1, true, 0, &l), 0);
    assert_int_equal(l.bytes, (uint64_t)UINT32_MAX * UINT32_MAX);
    assert_rc(kvp_chunk_layout(UINT32_MAX, UINT32_MAX, 2, 1, true, 0, &l), -EOVERFLOW);
    assert_rc(kvp_chunk_layout(UINT32_MAX, UINT32_MAX, UINT32_MAX, 1, true, 0, &l), -EOVERFLOW);
    /* 2^63 fits, 2^64 does not: 2 * 2^31 * 2^31 * 2 * 1 = 2^64 overflows. */
    assert_rc(kvp_chunk_layout(1u << 31, 1u << 31, 2, 1, false, 0, &l), -EOVERFLOW);
    assert_rc(kvp_chunk_layout(1u << 31, 1u << 31, 1, 1, false, 0, &l), 0);
    assert_int_equal(l.bytes, 1ull << 63);
}

static void test_max_bytes(void **state)
{
    (void)state;
    struct kvp_chunk_layout l;
    uint64_t bytes = 2ull * 4 * 16 * 64 * 2; /* 16 KiB */

    assert_rc(kvp_chunk_layout(4, 16, 64, 2, false, bytes, &l), 0);
    assert_int_equal(l.bytes, bytes);
    assert_rc(kvp_chunk_layout(4, 16, 64, 2, false, bytes - 1, &l), -EOVERFLOW);
    assert_rc(kvp_chunk_layout(4, 16, 64, 2, false, bytes + 1, &l), 0);
}

/* The chunk-range rule both sides apply (docs/PROTOCOL.md). */
static void test_chunk_range(void **state)
{
    (void)state;
    uint32_t first = 99, n = 99;
    char why[128];

    /* end is rounded down; an empty range is fine. */
    assert_int_equal(kvp_chunk_range(32, 100, 100, 16, 0, &first, &n, why, sizeof(why)), 0);
    assert_int_equal(first, 2);
    assert_int_equal(n, 4);
    assert_int_equal(kvp_chunk_range(16, 20, 20, 16, 0, &first, &n, NULL, 0), 0);
    assert_int_equal(n, 0);
    assert_int_equal(kvp_chunk_range(0, 0, 0, 16, 0, &first, &n, NULL, 0), 0);
    assert_int_equal(n, 0);

    assert_int_equal(kvp_chunk_range(8, 64, 64, 16, 0, &first, &n, why, sizeof(why)), -EINVAL);
    assert_string_equal(why, "start (8) is not a multiple of the chunk size (16 tokens)");
    assert_int_equal(kvp_chunk_range(0, 65, 64, 16, 0, &first, &n, why, sizeof(why)), -EINVAL);
    assert_string_equal(why, "end (65) is beyond the sequence's 64 tokens");
    assert_int_equal(kvp_chunk_range(32, 16, 64, 16, 0, &first, &n, why, sizeof(why)), -EINVAL);
    assert_string_equal(why, "end (16) is before start (32)");
    assert_int_equal(kvp_chunk_range(0, 64, 64, 0, 0, &first, &n, why, sizeof(why)), -EINVAL);

    /* The limit counts full chunks; 0 means none. */
    assert_int_equal(kvp_chunk_range(0, 64, 64, 16, 4, &first, &n, why, sizeof(why)), 0);
    assert_int_equal(kvp_chunk_range(0, 80, 80, 16, 4, &first, &n, why, sizeof(why)), -E2BIG);
    assert_string_equal(why, "range of 5 chunks exceeds the limit of 4");
    assert_int_equal(kvp_chunk_range(0, 80, 80, 16, 0, &first, &n, why, sizeof(why)), 0);
    assert_int_equal(n, 5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_sizes),       cmocka_unit_test(test_dtype_unknown),
        cmocka_unit_test(test_dtype_torch_names), cmocka_unit_test(test_shape_kv),
        cmocka_unit_test(test_shape_mla),         cmocka_unit_test(test_zero_dims),
        cmocka_unit_test(test_overflow),          cmocka_unit_test(test_max_bytes),
        cmocka_unit_test(test_chunk_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
