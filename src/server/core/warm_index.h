/*
 * warm_index.h - the warm-restart index: what the pool segment holds, kept in a second shared
 * memory segment that only the daemon maps, so that the next kvpoold can adopt the pool of a
 * dead one (SIGKILL, OOM kill, planned restart) and find every committed chunk again with its
 * key, size, checksum and LRU order, and never a torn or wrong one.
 *
 * Layout (host byte order, offsets pinned below; the region is page-aligned):
 *
 *   [0, 4096)                 struct kvp_widx_header (with the pool segment's name), the rest
 *                             of the page zero
 *   [4096 + 64 i, + 64)       struct kvp_widx_record of the object whose FIRST page is pool
 *                             page i, for i < npages; the region is kvp_widx_bytes(npages) long
 *
 * Each object starts on a page of its own, so records never collide and need no allocation.
 * Only the records of live objects are ever written: on tmpfs the rest of the file stays a hole
 * (no memory), and kvp_widx_scan_fd() visits only the parts that hold data.
 *
 * A record is valid when its seal is not 0 and equals kvp_widx_seal_of() over its key, length,
 * data_sum and page index, seeded with the header's random generation: a record of another
 * index, of another page, or with any sealed field changed never validates. seq (the store's
 * recency clock) is outside the seal, so that a use updates it with one store.
 *
 * Crash safety: every write is an aligned 8-byte release store (kvp_widx_apply()), so a process
 * death leaves a prefix of the writes in program order. Sealing writes seal = 0, the fields,
 * then the seal; clearing is one store of seal = 0, which the store makes BEFORE it frees the
 * object's pages. Therefore after a death between any two writes every valid record describes
 * an object whose seal write completed and whose clear had not started, and whose pages no
 * other object was given. The chunk's bytes are not covered by this: workers can write them, so
 * data_sum (kvp_widx_data_sum() of the bytes at seal time) is checked when the chunk is first
 * read after adoption.
 *
 * Reservation marks: a record whose seal is 0 and whose seq is KVP_WIDX_RESERVED marks pages
 * handed to a store in progress (kvp_widx_mark()); a successor holds those pages back for a
 * while, since the store's worker may still write them. Marks are outside every seal: a torn one
 * only holds back pages nobody would have read.
 *
 * Threads: one writer (the store, under its lock) at a time; the scan runs at start-up before
 * anyone writes. Functions taking a base take the mapping of an index (at least
 * kvp_widx_bytes(npages) bytes) unless they also take its length, in which case they read
 * nothing beyond it.
 */
#ifndef KVP_WARM_INDEX_H
#define KVP_WARM_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/chunk_hash.h"

#define KVP_WIDX_HEADER 4096u            /* bytes of the header page; records start here */
#define KVP_WIDX_RECORD 64u              /* bytes of one record */
#define KVP_WIDX_MAGIC "KVPWIDX1"        /* 8 bytes, no NUL */
#define KVP_WIDX_VERSION 1u              /* of this layout; a daemon refuses any other */
#define KVP_WIDX_MAX_PAGES 0xffffffffull /* as the pool (pool.h): fewer than 2^32 pages */
#define KVP_WIDX_MAX_WRITES 9            /* writes of the longest plan (a seal) */
#define KVP_WIDX_SUFFIX ".idx"           /* index name = pool segment name + this */

#define KVP_WIDX_SEGMENT_NAME 128u /* bytes of the header's segment name, NUL included */

/* header flags: the daemon left on purpose (shutdown) for a successor to adopt. */
#define KVP_WIDX_CLEAN 1u

/* The daemon settings that must be equal for a successor to adopt the pool. */
struct kvp_widx_identity {
    uint64_t pool_size;     /* bytes of the pool as configured */
    uint32_t page_size;     /* bytes of a pool page (KVP_POOL_PAGE) */
    uint32_t chunk_tokens;  /* tokens per chunk */
    uint64_t settings_hash; /* any other identity-relevant settings, hashed by the caller */
};

_Static_assert(offsetof(struct kvp_widx_identity, pool_size) == 0, "index identity layout");
_Static_assert(offsetof(struct kvp_widx_identity, page_size) == 8, "index identity layout");
_Static_assert(offsetof(struct kvp_widx_identity, chunk_tokens) == 12, "index identity layout");
_Static_assert(offsetof(struct kvp_widx_identity, settings_hash) == 16, "index identity layout");
_Static_assert(sizeof(struct kvp_widx_identity) == 24, "index identity layout");

struct kvp_widx_header {
    char magic[8];        /* KVP_WIDX_MAGIC, written last */
    uint32_t version;     /* KVP_WIDX_VERSION */
    uint32_t header_size; /* KVP_WIDX_HEADER */
    uint32_t record_size; /* KVP_WIDX_RECORD */
    uint32_t page_size;   /* bytes of the pool page a record stands for */
    uint64_t npages;      /* records: pool pages, identity.pool_size / page_size */
    uint64_t pool_bytes;  /* npages * page_size */
    struct kvp_widx_identity identity;
    uint64_t generation; /* random; seed of every record's seal */
    uint32_t pid;        /* the daemon writing it */
    uint32_t uid;        /* its euid */
    uint64_t flags;      /* KVP_WIDX_CLEAN, or zero; atomic */
    /* The pool segment's shm name without '/', NUL-terminated ("" when not said): how a
     * successor on the same socket finds the pool, whatever random name it was given. */
    char segment[KVP_WIDX_SEGMENT_NAME];
};

_Static_assert(offsetof(struct kvp_widx_header, magic) == 0, "index header layout");
_Static_assert(offsetof(struct kvp_widx_header, version) == 8, "index header layout");
_Static_assert(offsetof(struct kvp_widx_header, header_size) == 12, "index header layout");
_Static_assert(offsetof(struct kvp_widx_header, record_size) == 16, "index header layout");
_Static_assert(offsetof(struct kvp_widx_header, page_size) == 20, "index header layout");
_Static_assert(offsetof(struct kvp_widx_header, npages) == 24, "index header layout");
_Static_assert(offsetof(struct kvp_widx_header, pool_bytes) == 32, "index header layout");
_Static_assert(offsetof(struct kvp_widx_header, identity) == 40, "index header layout");
_Static_assert(offsetof(struct kvp_widx_header, generation) == 64, "index header layout");
_Static_assert(offsetof(struct kvp_widx_header, pid) == 72, "index header layout");
_Static_assert(offsetof(struct kvp_widx_header, uid) == 76, "index header layout");
_Static_assert(offsetof(struct kvp_widx_header, flags) == 80, "index header layout");
_Static_assert(offsetof(struct kvp_widx_header, segment) == 88, "index header layout");
_Static_assert(sizeof(struct kvp_widx_header) == 88 + KVP_WIDX_SEGMENT_NAME, "index header layout");
_Static_assert(sizeof(struct kvp_widx_header) <= KVP_WIDX_HEADER, "header fits its page");

struct kvp_widx_record {
    uint8_t key[KVP_KEY_SIZE]; /* sealed */
    uint64_t length;           /* bytes of the chunk; sealed */
    uint64_t data_sum;         /* kvp_widx_data_sum() of the chunk's bytes; sealed */
    uint64_t seq;              /* recency clock (LRU order); advisory, NOT sealed */
    uint64_t seal;             /* 0: empty; else kvp_widx_seal_of(), low bit 1 */
};

_Static_assert(offsetof(struct kvp_widx_record, key) == 0, "index record layout");
_Static_assert(offsetof(struct kvp_widx_record, length) == 32, "index record layout");
_Static_assert(offsetof(struct kvp_widx_record, data_sum) == 40, "index record layout");
_Static_assert(offsetof(struct kvp_widx_record, seq) == 48, "index record layout");
_Static_assert(offsetof(struct kvp_widx_record, seal) == 56, "index record layout");
_Static_assert(sizeof(struct kvp_widx_record) == KVP_WIDX_RECORD, "index record layout");

/* ---- Geometry, format, check ---- */

/* Bytes of an index of npages records: the header page and the records, rounded up to 4096.
 * 0 when npages exceeds KVP_WIDX_MAX_PAGES. */
uint64_t kvp_widx_bytes(uint64_t npages);

/* Records of an index for these settings: pool_size / page_size (0 for a page size of 0). */
uint64_t kvp_widx_npages(const struct kvp_widx_identity *id);

/*
 * Writes the header page of a new index at base (len bytes mapped, at least
 * kvp_widx_bytes(kvp_widx_npages(id))) for the settings id, written by pid and uid, with
 * records sealed under generation (random: pick it with a CSPRNG). Only the header page is
 * written (the magic first cleared, then the page zeroed, then the fields; the magic last,
 * behind a release fence); records of a region that is not fresh (zero) keep their bytes but
 * can no longer validate unless the generation is the old one. Returns 0, -EINVAL (page size 0,
 * no page, more than KVP_WIDX_MAX_PAGES) or -ENOSPC (len too small).
 */
int kvp_widx_format(void *base, size_t len, const struct kvp_widx_identity *id, uint32_t pid,
                    uint32_t uid, uint64_t generation);

/*
 * kvp_widx_format() of an index that also names its pool segment (segment: the shm name, with
 * or without its leading '/', at most KVP_WIDX_SEGMENT_NAME - 1 bytes after it), written with
 * the other fields, before the magic. Same returns, and -ENAMETOOLONG.
 */
int kvp_widx_format_named(void *base, size_t len, const struct kvp_widx_identity *id, uint32_t pid,
                          uint32_t uid, uint64_t generation, const char *segment);

/*
 * Judges whether the index at base (len readable bytes) can be adopted by a daemon of the
 * settings id. Returns 0; -EPROTO when it is not an index or is damaged or truncated; -ESTALE
 * when it is a sound index of another format version or other settings. why (may be NULL) gets
 * one line naming the first mismatch ("format version 2, this kvpoold reads 1", "pool of N
 * bytes, this kvpoold is configured for M", "truncated: N bytes, the header says M"...).
 * Never reads beyond len.
 */
int kvp_widx_check(const void *base, size_t len, const struct kvp_widx_identity *id, char *why,
                   size_t why_size);

/*
 * Copies the header of the index at base (len readable bytes) to *out when it is structurally
 * sound (magic, version, sizes, geometry, not truncated): what an adopter logs (the previous
 * pid, KVP_WIDX_CLEAN) and the segment it names (out->segment is then NUL-terminated, though
 * maybe "" or not a valid name: the caller judges it). Returns 0 or -EPROTO.
 */
int kvp_widx_header_read(const void *base, size_t len, struct kvp_widx_header *out);

/* The header's flags (acquire), and a release store of new ones (the one writer's call). */
uint64_t kvp_widx_flags(const void *base);
void kvp_widx_set_flags(void *base, uint64_t flags);
/* Records that pid/uid (an adopter) now writes the index. */
void kvp_widx_set_owner(void *base, uint32_t pid, uint32_t uid);

/* ---- Records: seal, clear, touch ---- */

/* XXH3-64 of a chunk's bytes: the data_sum to seal, and to compare on first read. */
uint64_t kvp_widx_data_sum(const void *data, size_t len);

/* The seal of a record: XXH3-64 seeded with generation over key, length, data_sum and page,
 * with the low bit set (never 0). */
uint64_t kvp_widx_seal_of(uint64_t generation, uint64_t page, const uint8_t key[KVP_KEY_SIZE],
                          uint64_t length, uint64_t data_sum);

/* One aligned 8-byte store: value at byte offset off of the index mapping. */
struct kvp_widx_write {
    uint64_t off;
    uint64_t value;
};

/*
 * The writes that seal the record of an object of length bytes whose first page is page, in
 * their order: seal = 0 (defensive: a slot is cleared before its pages are freed, so it should
 * already be 0), the key's four words, length, data_sum, seq, and last the seal. Reads the
 * generation and geometry from the header at base. Returns the number of writes
 * (KVP_WIDX_MAX_WRITES), or 0 when the object is refused: length 0, or pages past npages.
 */
unsigned kvp_widx_plan_seal(const void *base, uint64_t page, const uint8_t key[KVP_KEY_SIZE],
                            uint64_t length, uint64_t data_sum, uint64_t seq,
                            struct kvp_widx_write out[KVP_WIDX_MAX_WRITES]);

/* The one write that clears page's record (seal = 0): 1, or 0 when page >= npages. */
unsigned kvp_widx_plan_clear(const void *base, uint64_t page,
                             struct kvp_widx_write out[KVP_WIDX_MAX_WRITES]);

/*
 * Makes the writes w[0..n), in order, each a release store: a death leaves a prefix of them.
 * The writes come from a plan for the same index (offsets aligned and within it).
 */
void kvp_widx_apply(void *base, const struct kvp_widx_write *w, unsigned n);

/* Plan and apply: returns 0, or -ERANGE when the plan refuses the object (see above). */
int kvp_widx_seal(void *base, uint64_t page, const uint8_t key[KVP_KEY_SIZE], uint64_t length,
                  uint64_t data_sum, uint64_t seq);
/* Clears page's record: call it BEFORE the object's pages are freed. 0 or -ERANGE. */
int kvp_widx_clear(void *base, uint64_t page);

/* Records a use of the object at page: one store of seq (relaxed; advisory). Pages past npages
 * are ignored. */
void kvp_widx_touch(void *base, uint64_t page, uint64_t seq);

/* ---- Reservation marks ---- */

/*
 * The seq of a record whose seal is 0 that marks pages handed to a store in progress: a worker
 * may write them until its next call, even after the daemon died, so a successor holds them
 * back for a while instead of giving them to new chunks. Never a recency clock value.
 */
#define KVP_WIDX_RESERVED UINT64_MAX

/*
 * Marks the record of page as a reservation of length bytes (pages [page, page +
 * ceil(length / page_size)) ): length, then seq = KVP_WIDX_RESERVED, the seal left at 0 (the
 * record of a free page is empty: records are cleared before their pages are freed). A sealing
 * plan of the same page later overwrites the mark. Returns 0, or -ERANGE (length 0, pages past
 * npages).
 */
int kvp_widx_mark(void *base, uint64_t page, uint64_t length);

/* Ends page's mark (seq = 0, one store): call it before the reservation's pages are freed. 0 or
 * -ERANGE. */
int kvp_widx_unmark(void *base, uint64_t page);

/* Called for each reservation mark a scan finds, in page order: its page and length (checked:
 * length > 0, pages within npages). 0 to go on, or a negative errno that stops the scan. */
typedef int (*kvp_widx_mark_fn)(void *arg, uint64_t page, uint64_t length);

/*
 * Visits the reservation marks of the index whose file is fd and mapping base (as
 * kvp_widx_scan_fd(): only the data extents when fd can say). Returns the marks found (>= 0), or
 * -EPROTO, or the callback's negative errno.
 */
int64_t kvp_widx_scan_marks(int fd, const void *base, size_t len, kvp_widx_mark_fn fn, void *arg);

/* ---- Adoption: scan ---- */

/*
 * Called for each adopted record, in page order, with a copy of its fields: the callback may
 * clear the record itself (kvp_widx_clear) when it does not take the object. Returns 0 to go
 * on, or a negative errno that stops the scan, which returns it.
 */
typedef int (*kvp_widx_adopt_fn)(void *arg, uint64_t page, const uint8_t key[KVP_KEY_SIZE],
                                 uint64_t length, uint64_t data_sum, uint64_t seq);

/* What a scan saw. records == empty + adopted + bad_seal + out_of_range + overlap. */
struct kvp_widx_scan_result {
    uint64_t records;       /* records read (a scan that skips holes reads fewer than npages) */
    uint64_t empty;         /* seal 0 */
    uint64_t adopted;       /* given to the callback */
    uint64_t adopted_pages; /* pool pages of the adopted objects */
    uint64_t bad_seal;      /* seal not 0 and not the seal of the record's fields */
    uint64_t out_of_range;  /* sealed, but length 0 or pages past npages */
    uint64_t overlap;       /* sealed, but starts inside an object adopted before it */
    uint64_t extents;       /* stretches of the file read (1 for a scan of the whole region) */
};

/*
 * Visits the records of the index at base (len readable bytes) in page order and adopts those
 * that are valid: seal not 0 and right, length > 0, pages [i, i + ceil(length / page_size))
 * within npages, not starting inside an object adopted earlier in the scan. Robust against any
 * bytes (only the header's structure is checked: kvp_widx_check() first to judge the
 * settings), reads nothing beyond len, and costs O(npages). *res is filled in any case.
 * Returns 0, -EPROTO (no sound header, or truncated), or the callback's negative errno.
 */
int kvp_widx_scan(const void *base, size_t len, kvp_widx_adopt_fn fn, void *arg,
                  struct kvp_widx_scan_result *res);

/*
 * kvp_widx_scan() of the index whose file is fd and mapping base, reading only the records in
 * the file's data extents (lseek SEEK_DATA / SEEK_HOLE): holes are empty records. On tmpfs this
 * costs O(records written) instead of O(npages), and never allocates the file's holes, as reading
 * them through the mapping would. Falls back to reading everything when the file system cannot
 * say (or fd is -1). Same results and returns.
 */
int kvp_widx_scan_fd(int fd, const void *base, size_t len, kvp_widx_adopt_fn fn, void *arg,
                     struct kvp_widx_scan_result *res);

/*
 * Clears (seal = 0) every sealed record that the scan rejects (bad seal, out of range,
 * overlap), so that afterwards every sealed record is an adopted object: a stale record inside
 * an adopted object could otherwise validate once that object is gone. Run it after the scan
 * and before anything is written. fd as for kvp_widx_scan_fd() (-1: read everything). *res
 * gets what the scan saw (rejects are those cleared). Returns 0 or -EPROTO.
 */
int kvp_widx_scrub(int fd, void *base, size_t len, struct kvp_widx_scan_result *res);

/* ---- The index segment ---- */

/*
 * The index's shm name for the pool segment seg_name (with or without its leading '/'):
 * "/<seg_name>.idx". Returns 0, -EINVAL (empty, or a '/' inside) or -ENAMETOOLONG (longer than
 * NAME_MAX, or than size).
 */
int kvp_widx_name(const char *seg_name, char *out, size_t size);

/*
 * Opens the index segment name (a kvp_widx_name()) read-write and maps it (MAP_SHARED):
 * create: creates it with mode 0600 when missing, and in any case truncates it to a fresh,
 *         sparse, zero file of kvp_widx_bytes(npages) bytes (format it next);
 * else:   opens an existing one (-ENOENT when there is none) and maps its whole size, whatever
 *         it is (at least one header page): kvp_widx_check() judges it.
 * Refuses (-EPERM) a file that is not regular, not owned by this euid, or whose mode lets
 * anyone else in, since then someone else may have written it. Call it while holding the pool
 * segment's liveness lock (segment.c): then no live daemon uses the name. On success *fd
 * (O_CLOEXEC), *base and *len are the caller's: kvp_widx_close(). Otherwise a negative errno, why
 * filled, nothing left open.
 */
int kvp_widx_open(const char *name, bool create, uint64_t npages, int *fd, void **base, size_t *len,
                  char *why, size_t why_size);

/*
 * Reserves (posix_fallocate) the bytes of the records of pages [first, first + n) in the file
 * fd, rounded out to whole pages: a later write there can never fail for lack of memory (a
 * write into a hole of a full tmpfs is SIGBUS). Reserved but unwritten pages still read as
 * holes for kvp_widx_scan_fd(). Returns 0 or a negative errno (-ENOSPC).
 */
int kvp_widx_reserve(int fd, uint64_t first, uint64_t n);

/* Unmaps and closes what kvp_widx_open() returned; fd -1 and base NULL are skipped. */
void kvp_widx_close(int fd, void *base, size_t len);

/* Removes the index segment name: 0 or a negative errno (-ENOENT). */
int kvp_widx_unlink(const char *name);

#endif /* KVP_WARM_INDEX_H */
