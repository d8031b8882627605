/*
 * l2_value.h - what a chunk looks like in the L2 tier: its key name and its value (a header,
 * then the chunk's bytes).
 *
 * Key: "kvpool:v1:" followed by the 64 hex digits of the chunk key the daemon computes (it
 * covers model, world size, rank, dtype, shape and salt), so daemons with the same layout share
 * chunks and different layouts never collide.
 *
 * Value: a 128-byte header, little-endian, then `length` bytes of chunk data:
 *
 *   offset size field
 *        0    8 magic "KVPL2VAL"
 *        8    2 format version (1)
 *       10    2 header size (128)
 *       12    4 ndim
 *       16   16 shape[4]
 *       32   16 dtype name, NUL-padded
 *       48   32 the chunk key (a value renamed to another key is refused)
 *       80    8 length of the chunk data
 *       88    8 checksum: XXH3-64 of the data, seeded with XXH3-64 of header bytes [0, 88)
 *       96   32 reserved, zero
 *
 * A value is served only if every field matches what the reader expects (its own layout and
 * key) and the checksum is right; anything else (truncated, another format, another layout,
 * flipped bits) is refused with a reason.
 */
#ifndef KVP_L2_VALUE_H
#define KVP_L2_VALUE_H

#include <stddef.h>
#include <stdint.h>

#include "common/chunk_hash.h"

#define KVP_L2_HEADER_SIZE 128
#define KVP_L2_FORMAT 1
#define KVP_L2_KEY_PREFIX "kvpool:v1:"
/* The prefix and two hex digits per key byte. */
#define KVP_L2_KEY_LEN (sizeof(KVP_L2_KEY_PREFIX) - 1 + 2 * KVP_KEY_SIZE)
#define KVP_L2_DTYPE_MAX 16

/* The layout a chunk is stored under: what a reader must match. */
struct kvp_l2_layout {
    uint32_t ndim;
    uint32_t shape[4];
    char dtype[KVP_L2_DTYPE_MAX]; /* NUL-padded */
    uint64_t bytes;               /* chunk bytes, the value's data length */
};

/* Why a value was refused (0: it is good). */
enum kvp_l2_verdict {
    KVP_L2_VALUE_OK = 0,
    KVP_L2_VALUE_SHORT,    /* shorter than its header, or than header + length */
    KVP_L2_VALUE_LONG,     /* bytes after header + length */
    KVP_L2_VALUE_MAGIC,    /* not a kvpool value */
    KVP_L2_VALUE_VERSION,  /* another format version or header size */
    KVP_L2_VALUE_LAYOUT,   /* stored under another layout (or length) */
    KVP_L2_VALUE_KEY,      /* stored under another key */
    KVP_L2_VALUE_CHECKSUM, /* the data or the header changed */
};

/* Writes the key's name (KVP_L2_KEY_LEN bytes and a NUL) into out. */
void kvp_l2_key_name(const uint8_t key[KVP_KEY_SIZE], char out[KVP_L2_KEY_LEN + 1]);

/* Writes the header of a value holding lay->bytes bytes of data under key into out (the
 * checksum reads all of data). */
void kvp_l2_header_encode(uint8_t out[KVP_L2_HEADER_SIZE], const uint8_t key[KVP_KEY_SIZE],
                          const struct kvp_l2_layout *lay, const void *data);

/* Checks a whole value (len bytes at value) read back for key by a reader with layout lay.
 * Returns KVP_L2_VALUE_OK or the first reason to refuse it. */
enum kvp_l2_verdict kvp_l2_value_check(const uint8_t *value, size_t len,
                                       const uint8_t key[KVP_KEY_SIZE],
                                       const struct kvp_l2_layout *lay);

/* The same check for a value read in two parts (l2_backend.h, read): its first
 * KVP_L2_HEADER_SIZE bytes at hdr (all of it when it is shorter), the rest at data, len bytes in
 * all; data holds at least min(len - KVP_L2_HEADER_SIZE, lay->bytes) bytes. */
enum kvp_l2_verdict kvp_l2_value_check_parts(const uint8_t *hdr, const uint8_t *data, size_t len,
                                             const uint8_t key[KVP_KEY_SIZE],
                                             const struct kvp_l2_layout *lay);

/* A short lower-case phrase for a verdict ("checksum mismatch"), for logs. */
const char *kvp_l2_verdict_name(enum kvp_l2_verdict v);

#endif /* KVP_L2_VALUE_H */
