/*
 * fuzz_header.c - the frame header decoder (kvp_header_decode), which both sides run on the
 * first 32 bytes of every frame they receive.
 *
 * Input: at least 32 bytes, the header (the rest is ignored). An accepted header must satisfy
 * what the decoder promises (magic, version, known opcode, opcode 0 only as a reply, body within
 * KVP_MAX_BODY) and re-encode to exactly the same 32 bytes.
 */
#include <errno.h>
#include <string.h>

#include "common/wire.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvp_header h;
    uint8_t again[KVP_HEADER_SIZE];

    if (size < KVP_HEADER_SIZE)
        return 0;
    int rc = kvp_header_decode(data, &h);
    FUZZ_CHECK(rc == 0 || rc == -EPROTO || rc == -EPROTONOSUPPORT);
    FUZZ_CHECK(kvp_opcode_name(h.opcode) != NULL);

    /* Every field is filled even when the header is refused (error messages print them). */
    kvp_header_encode(&h, again);
    FUZZ_CHECK(memcmp(again, data, KVP_HEADER_SIZE) == 0);
    if (rc != 0)
        return 0;

    uint16_t op = h.opcode & (uint16_t)~KVP_REPLY_FLAG;
    FUZZ_CHECK(h.magic == KVP_MAGIC);
    FUZZ_CHECK(h.version == KVP_PROTO_VERSION);
    FUZZ_CHECK(op < KVP_OP_MAX_);
    FUZZ_CHECK(op != 0 || (h.opcode & KVP_REPLY_FLAG));
    FUZZ_CHECK(h.body_len <= KVP_MAX_BODY);
    FUZZ_CHECK(strcmp(kvp_opcode_name(h.opcode), "?") != 0 || op == 0);
    return 0;
}
