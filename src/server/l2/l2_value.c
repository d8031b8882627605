/*
 * l2_value.c - key names and the value header of the L2 tier (format in l2_value.h).
 *
 * The header is encoded field by field in little-endian order rather than by copying a C
 * struct, so the format does not depend on the compiler's padding or the host's byte order:
 * daemons on different machines read each other's values. The checksum is XXH3-64 (libxxhash):
 * at tens of GB/s it costs little next to a network copy, and it catches truncation, bit flips
 * and a header glued to another chunk's data. It is not a defence against a writer who wants to
 * forge a value: whoever can write to the Redis server can write a matching checksum; access to
 * Redis has to be controlled there (AUTH, ACLs, network).
 *
 * Pure functions; any thread.
 */
#include "l2/l2_value.h"

#include <string.h>

#include <xxhash.h>

#include "common/le.h"

#define OFF_MAGIC 0
#define OFF_VERSION 8
#define OFF_HSIZE 10
#define OFF_NDIM 12
#define OFF_SHAPE 16
#define OFF_DTYPE 32
#define OFF_KEY 48
#define OFF_LENGTH 80
#define OFF_CHECKSUM 88
#define OFF_RESERVED 96

_Static_assert(OFF_DTYPE + KVP_L2_DTYPE_MAX == OFF_KEY, "dtype field overlaps the key");
_Static_assert(OFF_KEY + KVP_KEY_SIZE == OFF_LENGTH, "key field overlaps the length");
_Static_assert(OFF_RESERVED + 32 == KVP_L2_HEADER_SIZE, "header size");

static const char magic[8] = {'K', 'V', 'P', 'L', '2', 'V', 'A', 'L'};

/* Hex rather than the raw bytes: a key is then readable in redis-cli and safe in any log. */
void kvp_l2_key_name(const uint8_t key[KVP_KEY_SIZE], char out[KVP_L2_KEY_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    size_t n = sizeof(KVP_L2_KEY_PREFIX) - 1;
    memcpy(out, KVP_L2_KEY_PREFIX, n);
    for (int i = 0; i < KVP_KEY_SIZE; i++) {
        out[n++] = hex[key[i] >> 4];
        out[n++] = hex[key[i] & 15];
    }
    out[n] = '\0';
}

/* The fields before the checksum, as the reader would see them: what the seed covers. */
static void encode_fields(uint8_t *out, const uint8_t key[KVP_KEY_SIZE],
                          const struct kvp_l2_layout *lay)
{
    memset(out, 0, KVP_L2_HEADER_SIZE);
    memcpy(out + OFF_MAGIC, magic, sizeof(magic));
    kvp_put_le16(out + OFF_VERSION, KVP_L2_FORMAT);
    kvp_put_le16(out + OFF_HSIZE, KVP_L2_HEADER_SIZE);
    kvp_put_le32(out + OFF_NDIM, lay->ndim);
    for (int i = 0; i < 4; i++)
        kvp_put_le32(out + OFF_SHAPE + 4 * i, lay->shape[i]);
    /* strnlen: a name of exactly 16 bytes fills the field without a NUL. */
    memcpy(out + OFF_DTYPE, lay->dtype, strnlen(lay->dtype, KVP_L2_DTYPE_MAX));
    memcpy(out + OFF_KEY, key, KVP_KEY_SIZE);
    kvp_put_le64(out + OFF_LENGTH, lay->bytes);
}

/* The header's fields seed the hash of the data, so one number covers both: a header glued to
 * another chunk's data, or one field changed, fails as surely as a flipped data bit. */
static uint64_t checksum(const uint8_t *header, const void *data, size_t len)
{
    XXH64_hash_t seed = XXH3_64bits(header, OFF_CHECKSUM);
    return XXH3_64bits_withSeed(data, len, seed);
}

void kvp_l2_header_encode(uint8_t out[KVP_L2_HEADER_SIZE], const uint8_t key[KVP_KEY_SIZE],
                          const struct kvp_l2_layout *lay, const void *data)
{
    encode_fields(out, key, lay);
    kvp_put_le64(out + OFF_CHECKSUM, checksum(out, data, lay->bytes));
}

enum kvp_l2_verdict kvp_l2_value_check_parts(const uint8_t *hdr, const uint8_t *data, size_t len,
                                             const uint8_t key[KVP_KEY_SIZE],
                                             const struct kvp_l2_layout *lay)
{
    uint8_t want[KVP_L2_HEADER_SIZE];

    if (len < KVP_L2_HEADER_SIZE)
        return KVP_L2_VALUE_SHORT;
    if (memcmp(hdr + OFF_MAGIC, magic, sizeof(magic)) != 0)
        return KVP_L2_VALUE_MAGIC;
    if (kvp_get_le16(hdr + OFF_VERSION) != KVP_L2_FORMAT ||
        kvp_get_le16(hdr + OFF_HSIZE) != KVP_L2_HEADER_SIZE)
        return KVP_L2_VALUE_VERSION;
    uint64_t length = kvp_get_le64(hdr + OFF_LENGTH);
    /* The length is checked against the bytes present before anything trusts it. */
    if (len - KVP_L2_HEADER_SIZE < length)
        return KVP_L2_VALUE_SHORT;
    if (len - KVP_L2_HEADER_SIZE > length)
        return KVP_L2_VALUE_LONG;
    encode_fields(want, key, lay);
    if (memcmp(hdr + OFF_KEY, want + OFF_KEY, KVP_KEY_SIZE) != 0)
        return KVP_L2_VALUE_KEY;
    /* With the layout's length equal to the header's, data holds all `length` bytes. */
    if (memcmp(hdr, want, OFF_CHECKSUM) != 0 ||
        memcmp(hdr + OFF_RESERVED, want + OFF_RESERVED, KVP_L2_HEADER_SIZE - OFF_RESERVED))
        return KVP_L2_VALUE_LAYOUT;
    if (kvp_get_le64(hdr + OFF_CHECKSUM) != checksum(hdr, data, length))
        return KVP_L2_VALUE_CHECKSUM;
    return KVP_L2_VALUE_OK;
}

enum kvp_l2_verdict kvp_l2_value_check(const uint8_t *value, size_t len,
                                       const uint8_t key[KVP_KEY_SIZE],
                                       const struct kvp_l2_layout *lay)
{
    return kvp_l2_value_check_parts(value, value + KVP_L2_HEADER_SIZE, len, key, lay);
}

const char *kvp_l2_verdict_name(enum kvp_l2_verdict v)
{
    switch (v) {
    case KVP_L2_VALUE_OK:
        return "valid";
    case KVP_L2_VALUE_SHORT:
        return "truncated";
    case KVP_L2_VALUE_LONG:
        return "longer than its header says";
    case KVP_L2_VALUE_MAGIC:
        return "not a kvpool value";
    case KVP_L2_VALUE_VERSION:
        return "another format version";
    case KVP_L2_VALUE_LAYOUT:
        return "stored under another layout";
    case KVP_L2_VALUE_KEY:
        return "stored under another key";
    case KVP_L2_VALUE_CHECKSUM:
        return "checksum mismatch";
    }
    return "unknown";
}
