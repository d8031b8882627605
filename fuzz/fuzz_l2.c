/*
 * fuzz_l2.c - what the L2 tier parses: the --l2 URL (from the command line, the environment or
 * a configuration file) and values read back from Redis, which anyone with access to Redis can
 * write (l2_url.c, l2_value.c).
 *
 * Input: a mode byte, then
 *   0: a URL. An accepted one names at least one node with a port (or a socket path), and its
 *      masked form shows "***" in place of a password it has;
 *   1: a value read back for a fixed key and a 64-byte layout. The verdict is a known one; an
 *      accepted value re-encodes to the same header from its data;
 *   2: data to store: its encoded value is accepted, and stays refused after any one bit of
 *      it is flipped (the next two bytes choose the bit).
 */
#include <errno.h>
#include <string.h>

#include "base/l2_url.h"
#include "fuzz.h"
#include "l2/l2_value.h"

static void url(const uint8_t *data, size_t size)
{
    char s[KVP_L2_MAX_URL + 2], why[256], masked[KVP_L2_MAX_URL + 512];
    struct kvp_l2_target t;
    size_t n = size < sizeof(s) - 1 ? size : sizeof(s) - 1;
    memcpy(s, data, n);
    s[n] = '\0';
    int rc = kvp_l2_url_parse(s, &t, why, sizeof(why));
    FUZZ_CHECK(rc == 0 || rc == -EINVAL);
    if (rc)
        return;
    FUZZ_CHECK(t.scheme == KVP_L2_REDIS_UNIX ? t.path[0] == '/' : t.nnodes >= 1);
    for (uint32_t i = 0; t.scheme != KVP_L2_REDIS_UNIX && i < t.nnodes; i++)
        FUZZ_CHECK(t.nodes[i].host[0] && t.nodes[i].port > 0);
    kvp_l2_url_masked(&t, masked, sizeof(masked));
    FUZZ_CHECK(!t.password[0] || strstr(masked, ":***@") != NULL);
}

static const struct kvp_l2_layout lay = {.ndim = 4,
                                         .shape = {2, 1, 4, 2},
                                         .dtype = "float32",
                                         .bytes = 64};

static void value(const uint8_t *data, size_t size)
{
    uint8_t key[KVP_KEY_SIZE] = {1, 2, 3}, hdr[KVP_L2_HEADER_SIZE];
    enum kvp_l2_verdict v = kvp_l2_value_check(data, size, key, &lay);
    FUZZ_CHECK(v >= KVP_L2_VALUE_OK && v <= KVP_L2_VALUE_CHECKSUM);
    FUZZ_CHECK(strcmp(kvp_l2_verdict_name(v), "unknown") != 0);
    if (v != KVP_L2_VALUE_OK)
        return;
    FUZZ_CHECK(size == KVP_L2_HEADER_SIZE + lay.bytes);
    kvp_l2_header_encode(hdr, key, &lay, data + KVP_L2_HEADER_SIZE);
    FUZZ_CHECK(memcmp(hdr, data, sizeof(hdr)) == 0);
}

static void flip(const uint8_t *data, size_t size)
{
    uint8_t key[KVP_KEY_SIZE] = {9}, v[KVP_L2_HEADER_SIZE + 4096];
    if (size < 2)
        return;
    size_t pick = (size_t)data[0] | (size_t)data[1] << 8, n = size - 2;
    if (n > 4096)
        n = 4096;
    struct kvp_l2_layout l = {.ndim = 3, .shape = {1, 1, (uint32_t)n}, .dtype = "uint8"};
    l.bytes = n;
    memcpy(v + KVP_L2_HEADER_SIZE, data + 2, n);
    kvp_l2_header_encode(v, key, &l, v + KVP_L2_HEADER_SIZE);
    size_t len = KVP_L2_HEADER_SIZE + n;
    FUZZ_CHECK(kvp_l2_value_check(v, len, key, &l) == KVP_L2_VALUE_OK);
    size_t bit = pick % (len * 8);
    v[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    FUZZ_CHECK(kvp_l2_value_check(v, len, key, &l) != KVP_L2_VALUE_OK);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    switch (data[0] % 3) {
    case 0:
        url(data + 1, size - 1);
        break;
    case 1:
        value(data + 1, size - 1);
        break;
    default:
        flip(data + 1, size - 1);
    }
    return 0;
}
