/*
 * shm_map.h - the client's view of the daemon's shared-memory pool.
 *
 * Internal to libkvpool. One mapping per kvp_client, used under the client's mutex (mapping and
 * unmapping) or by any thread holding a slot pointer (copies). The segment's header page is
 * defined once, for the daemon and for us, in src/common/seg_header.h.
 */
#ifndef KVP_CLIENT_SHM_MAP_H
#define KVP_CLIENT_SHM_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "common/msg.h"
#include "common/seg_header.h"

/* The pool starts after the header page: no slot may point into it. */
#define KVP_SHM_HEADER_SIZE KVP_SEG_HEADER

struct kvp_prefault;

struct kvp_shm_map {
    uint8_t *base;                 /* NULL when not mapped */
    struct kvp_prefault *prefault; /* the thread mapping its pages ahead of use, or NULL */
    uint64_t size;                 /* bytes mapped: the whole segment */
    char name[KVP_MAX_NAME + 1];   /* without the leading '/' */
};

/*
 * Maps segment `name` (as announced by HELLO, without '/') of `size` bytes read-write and checks
 * that its header page holds the magic and `nonce`. Returns 0, or a negative error with a
 * human-readable reason in reason[0..reason_size) (used as the inline fallback reason):
 * -EINVAL for an unusable name or size, the errno of shm_open/fstat/mmap, KVP_ENOSHM when the
 * segment is too small or is not this daemon's.
 */
int kvp_shm_map_open(struct kvp_shm_map *m, const char *name, uint64_t size,
                     const uint8_t nonce[KVP_NONCE_SIZE], char *reason, size_t reason_size);

/*
 * Maps an already open segment descriptor (the memfd backend's, received over the socket) with
 * the same checks; label names it in reasons. fd stays the caller's to close.
 */
int kvp_shm_map_fd(struct kvp_shm_map *m, int fd, uint64_t size,
                   const uint8_t nonce[KVP_NONCE_SIZE], const char *label, char *reason,
                   size_t reason_size);

/* Waits until the pre-fault thread has finished by itself (it stops at the end of what the
 * daemon reserved, once the header says the reservation has ended). Returns at once without
 * one. For tests. */
void kvp_shm_map_prefault_wait(struct kvp_shm_map *m);

/* Stops the pre-fault thread, unmaps. Safe on a zeroed, never-mapped map. */
void kvp_shm_map_close(struct kvp_shm_map *m);

/*
 * Cuts the mapping off from the segment without giving up its addresses: the pages become
 * private anonymous memory (reads see zeros, writes land in this process only), so a pointer
 * into it stays safe to use while it can no longer reach the segment. Returns 0, or a negative
 * errno when the kernel refused (the caller then keeps the mapping as it is).
 */
int kvp_shm_map_detach(struct kvp_shm_map *m);

/*
 * Checks a slot the daemon sent: header page excluded, length == chunk_bytes, inside the mapping
 * without overflow. Returns a pointer to the slot's bytes, or NULL (caller: KVP_EBADSLOT).
 */
uint8_t *kvp_shm_slot(const struct kvp_shm_map *m, uint64_t offset, uint64_t length,
                      uint64_t chunk_bytes);

#endif /* KVP_CLIENT_SHM_MAP_H */
