/*
 * seg_header.c - write and check the pool segment's header page (see seg_header.h).
 *
 * The daemon writes the header once, after it holds the segment's liveness lock; the sweep of
 * dead daemons' leftovers reads the owner pid of segments it did not create; a worker checks the
 * whole header before it uses a mapping, because a namesake segment of another daemon (another
 * IPC namespace, a stale leftover) may answer to the same name, and reads how much of the
 * segment is reserved before pre-faulting it. No locking: the page is written before anyone is
 * told the segment exists, and afterwards only the reservation's progress changes, in two
 * atomic fields (the byte count, then the flag that it is final).
 */
#include "common/seg_header.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "common/fence.h"
#include "common/why.h"

void kvp_seg_header_write(void *base, const uint8_t nonce[KVP_SEG_NONCE_SIZE], uint64_t size,
                          uint32_t pid)
{
    struct kvp_seg_header *h = base;

    memset(base, 0, KVP_SEG_HEADER);
    h->version = KVP_SEG_VERSION;
    h->header_size = KVP_SEG_HEADER;
    memcpy(h->nonce, nonce, KVP_SEG_NONCE_SIZE);
    h->size = size;
    h->owner_pid = pid;
    /* Orders the fields above before the magic: whoever sees the magic sees a whole header. */
    kvp_shared_fence(memory_order_release);
    memcpy(h->magic, KVP_SEG_MAGIC, sizeof(h->magic));
}

bool kvp_seg_header_has_magic(const void *h, size_t len)
{
    return len >= sizeof(struct kvp_seg_header) &&
           memcmp(((const struct kvp_seg_header *)h)->magic, KVP_SEG_MAGIC, 8) == 0;
}

int kvp_seg_header_check(const void *h, size_t len, uint64_t size,
                         const uint8_t nonce[KVP_SEG_NONCE_SIZE], const char *label, char *why,
                         size_t why_size)
{
    struct kvp_seg_header hdr;

    if (!kvp_seg_header_has_magic(h, len))
        return kvp_why(why, why_size, -EPROTO, "segment %s has no kvpool header", label);
    /* A copy: the mapping may not be aligned for the wider fields in every caller's view. */
    memcpy(&hdr, h, sizeof(hdr));
    kvp_shared_fence(memory_order_acquire);
    if (hdr.version != KVP_SEG_VERSION)
        return kvp_why(why, why_size, -EPROTO, "segment %s has header version %" PRIu32 ", not %u",
                       label, hdr.version, KVP_SEG_VERSION);
    if (hdr.header_size != KVP_SEG_HEADER)
        return kvp_why(why, why_size, -EPROTO, "segment %s has a %" PRIu32 "-byte header, not %u",
                       label, hdr.header_size, KVP_SEG_HEADER);
    if (hdr.size != size)
        return kvp_why(why, why_size, -EPROTO,
                       "segment %s says it is %" PRIu64 " bytes, the daemon announced %" PRIu64,
                       label, hdr.size, size);
    if (memcmp(hdr.nonce, nonce, KVP_SEG_NONCE_SIZE) != 0)
        return kvp_why(why, why_size, -EPROTO, "segment nonce mismatch: not this daemon's pool");
    return 0;
}

/* Atomics on fields of a page shared between processes: the GCC builtins work on the plain
 * fields of the layout struct, which other processes read with the same builtins. */
void kvp_seg_header_publish_reserved(void *base, uint64_t reserved, bool done)
{
    struct kvp_seg_header *h = base;
    __atomic_store_n(&h->reserved_bytes, reserved, __ATOMIC_RELEASE);
    if (done)
        __atomic_store_n(&h->flags, KVP_SEG_RESERVE_DONE, __ATOMIC_RELEASE);
}

uint64_t kvp_seg_header_reserved(const void *base, bool *done)
{
    const struct kvp_seg_header *h = base;
    /* The flag first: once it is seen, the byte count read after it is the final one. */
    *done = __atomic_load_n(&h->flags, __ATOMIC_ACQUIRE) & KVP_SEG_RESERVE_DONE;
    return __atomic_load_n(&h->reserved_bytes, __ATOMIC_ACQUIRE);
}

uint32_t kvp_seg_header_pid(const void *h, size_t len)
{
    struct kvp_seg_header hdr;

    if (!kvp_seg_header_has_magic(h, len))
        return 0;
    memcpy(&hdr, h, sizeof(hdr));
    return hdr.owner_pid;
}
