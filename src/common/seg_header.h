/*
 * seg_header.h - the header page of the shared pool segment: one layout for the daemon that
 * writes it (src/server/core/segment.c) and the worker that checks it before using a mapping
 * (src/client/shm_map.c).
 *
 * Layout: the segment is one KVP_SEG_HEADER-byte header page, then the pool. The page starts
 * with struct kvp_seg_header; the rest is zero. Both sides are processes of one host, so the
 * fields are in the host's byte order; their offsets are pinned below. All fields but flags and
 * reserved_bytes are written once, before anyone is told the segment exists; those two change
 * while the daemon reserves the pool, and are read and written atomically (8-byte aligned:
 * the page is).
 */
#ifndef KVP_SEG_HEADER_H
#define KVP_SEG_HEADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVP_SEG_HEADER 4096u     /* bytes of the header page; the pool starts here */
#define KVP_SEG_MAGIC "KVPOOLSG" /* 8 bytes, no NUL */
#define KVP_SEG_VERSION 1u       /* of this layout; a worker refuses any other */
#define KVP_SEG_NONCE_SIZE 16

struct kvp_seg_header {
    char magic[8];                     /* KVP_SEG_MAGIC, written last */
    uint32_t version;                  /* KVP_SEG_VERSION */
    uint32_t header_size;              /* KVP_SEG_HEADER */
    uint8_t nonce[KVP_SEG_NONCE_SIZE]; /* random; HELLO announces the same bytes */
    uint64_t size;                     /* bytes of the whole segment: header + pool */
    uint32_t owner_pid;                /* the daemon that created it */
    uint32_t flags;                    /* KVP_SEG_RESERVE_DONE, or zero */
    /* Bytes [0, reserved_bytes) of the segment are allocated (posix_fallocate): only they may
     * be touched by anyone. Grows while the daemon reserves the rest of the pool in the
     * background; zero in the segments of daemons that do not say (earlier versions). */
    uint64_t reserved_bytes;
};

/* flags: the daemon has stopped reserving (whole segment, or what it could): reserved_bytes is
 * final. */
#define KVP_SEG_RESERVE_DONE 1u

_Static_assert(offsetof(struct kvp_seg_header, magic) == 0, "segment header layout");
_Static_assert(offsetof(struct kvp_seg_header, version) == 8, "segment header layout");
_Static_assert(offsetof(struct kvp_seg_header, header_size) == 12, "segment header layout");
_Static_assert(offsetof(struct kvp_seg_header, nonce) == 16, "segment header layout");
_Static_assert(offsetof(struct kvp_seg_header, size) == 32, "segment header layout");
_Static_assert(offsetof(struct kvp_seg_header, owner_pid) == 40, "segment header layout");
_Static_assert(offsetof(struct kvp_seg_header, flags) == 44, "segment header layout");
_Static_assert(offsetof(struct kvp_seg_header, reserved_bytes) == 48, "segment header layout");
_Static_assert(sizeof(struct kvp_seg_header) == 56, "segment header layout");
_Static_assert(sizeof(struct kvp_seg_header) <= KVP_SEG_HEADER, "header fits its page");

/*
 * Writes the header page at base (KVP_SEG_HEADER bytes, zeroed first) for a segment of size
 * bytes created by pid. The magic goes last, behind a release fence: a reader that sees it sees
 * every other field.
 */
void kvp_seg_header_write(void *base, const uint8_t nonce[KVP_SEG_NONCE_SIZE], uint64_t size,
                          uint32_t pid);

/*
 * Checks a header page against what HELLO announced: magic, layout version, header size, the
 * segment size (the size the caller mapped) and the nonce. len is the number of readable bytes
 * at h (at least sizeof(struct kvp_seg_header) for a pass). Returns 0, or -EPROTO with why (may
 * be NULL) saying which check failed, naming label (the segment, for messages).
 */
int kvp_seg_header_check(const void *h, size_t len, uint64_t size,
                         const uint8_t nonce[KVP_SEG_NONCE_SIZE], const char *label, char *why,
                         size_t why_size);

/*
 * Publishes in the header page at base (mapped, written by kvp_seg_header_write()) that bytes
 * [0, reserved) of the segment are reserved, and with done that this is final. Release order:
 * a reader that sees the value may touch those pages. Only the daemon calls it, from one thread
 * at a time.
 */
void kvp_seg_header_publish_reserved(void *base, uint64_t reserved, bool done);

/*
 * What the header page at base (a mapping of a checked segment) says is reserved: returns the
 * bytes (0: the daemon does not say, an earlier version), and *done whether that is final.
 * Acquire order, pairing with kvp_seg_header_publish_reserved().
 */
uint64_t kvp_seg_header_reserved(const void *base, bool *done);

/* The owner pid of a header whose magic is valid, else 0 (len readable bytes at h). */
uint32_t kvp_seg_header_pid(const void *h, size_t len);

/* True when the len bytes at h start with the magic. */
bool kvp_seg_header_has_magic(const void *h, size_t len);

#endif /* KVP_SEG_HEADER_H */
