/*
 * warm_index.c - the warm-restart index (warm_index.h): a header page and one 64-byte record per
 * pool page, in a shared-memory file that only the daemon maps, written so that a death between
 * any two writes leaves an index whose valid records are exactly the committed objects.
 *
 * Why it is crash-safe. Every write is an aligned 8-byte release store (kvp_widx_apply()): the
 * CPU and the compiler keep them in program order, and a process death does not undo a store to
 * a shared mapping, so what survives a death is a prefix of the writes. A record validates only
 * when its seal, XXH3-64 seeded with the index's random generation over key, length, data_sum
 * and the page index, matches. Sealing writes seal = 0, then the fields, then the seal: a prefix
 * either leaves the seal 0 (the record is empty, even if the slot held an old seal) or is the
 * whole record. Clearing is one store of seal = 0, which the store makes before it frees the
 * object's pages: no valid record ever names pages given to another object, so valid records
 * never overlap. seq is outside the seal: a use updates it with one store, and a death mid-use
 * loses at most the order of the last uses. The generation makes a record of an earlier index
 * at the same name (same slot, same fields) invalid; including the page index makes a record
 * copied to another slot invalid.
 *
 * Adoption reads records it cannot trust (a damaged file, a bug, an old format): kvp_widx_scan()
 * accepts any bytes, checks every index against npages without overflow, and keeps "the first
 * page after the last adopted object" so that overlap costs O(1) per record (records are visited
 * in page order and objects extend forward). What it refuses is counted by reason.
 *
 * Sparseness. Only live objects' records are written, so on tmpfs most of the file is holes.
 * Reading a hole through a MAP_SHARED tmpfs mapping allocates it (a zero page per 64 records, the
 * whole index eventually), so kvp_widx_scan_fd() asks the file where its data is (SEEK_DATA,
 * SEEK_HOLE) and reads only there. Writing a record into a hole allocates a page, which on a full
 * tmpfs is SIGBUS: kvp_widx_reserve() fallocates record pages ahead (tmpfs still reports them as
 * holes until written, so the scan stays sparse).
 *
 * The header names the pool segment (the daemon finds the index by its socket, the pool by the
 * index); a reservation mark is a record with seal 0 and seq KVP_WIDX_RESERVED, written with
 * two ordered stores (length, then seq) and ended with one (seq = 0) before its pages are freed.
 *
 * Two more duties: kvp_widx_scrub() clears records the scan rejected, since a rejected record
 * with a valid seal (one found inside an adopted object) would be adopted by a later scan once
 * that object is cleared; and kvp_widx_header_read() lets an adopter log the previous owner.
 *
 * Threads: none of its own; the store's lock serialises writers, the scan runs before them.
 */
#include "core/warm_index.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/errors.h"
#include "common/fence.h"
#include "common/why.h"

#define PAGE_4K 4096u

uint64_t kvp_widx_bytes(uint64_t npages)
{
    if (npages > KVP_WIDX_MAX_PAGES)
        return 0;
    uint64_t b = KVP_WIDX_HEADER + npages * KVP_WIDX_RECORD;
    return (b + PAGE_4K - 1) / PAGE_4K * PAGE_4K;
}

uint64_t kvp_widx_npages(const struct kvp_widx_identity *id)
{
    return id->page_size ? id->pool_size / id->page_size : 0;
}

static uint64_t record_off(uint64_t page)
{
    return KVP_WIDX_HEADER + page * KVP_WIDX_RECORD;
}

/* Pages of an object of length bytes, without overflow. */
static uint64_t pages_of(uint64_t length, uint64_t page_size)
{
    return length / page_size + (length % page_size != 0);
}

/* ---- Header ---- */

int kvp_widx_format(void *base, size_t len, const struct kvp_widx_identity *id, uint32_t pid,
                    uint32_t uid, uint64_t generation)
{
    return kvp_widx_format_named(base, len, id, pid, uid, generation, "");
}

int kvp_widx_format_named(void *base, size_t len, const struct kvp_widx_identity *id, uint32_t pid,
                          uint32_t uid, uint64_t generation, const char *segment)
{
    struct kvp_widx_header *h = base;
    uint64_t npages = kvp_widx_npages(id);

    if (segment[0] == '/')
        segment++;
    if (npages == 0 || npages > KVP_WIDX_MAX_PAGES)
        return -EINVAL;
    if (strlen(segment) >= KVP_WIDX_SEGMENT_NAME)
        return -ENAMETOOLONG;
    if (len < kvp_widx_bytes(npages))
        return -ENOSPC;
    /* The old magic goes first, and the fence keeps every later write after it: a death while
     * the page is rewritten leaves no index, never old and new fields under a valid magic. */
    memset(h->magic, 0, sizeof(h->magic));
    kvp_shared_fence(memory_order_seq_cst);
    memset((uint8_t *)base + sizeof(h->magic), 0, KVP_WIDX_HEADER - sizeof(h->magic));
    h->version = KVP_WIDX_VERSION;
    h->header_size = KVP_WIDX_HEADER;
    h->record_size = KVP_WIDX_RECORD;
    h->page_size = id->page_size;
    h->npages = npages;
    h->pool_bytes = npages * id->page_size;
    h->identity = *id;
    h->generation = generation;
    h->pid = pid;
    h->uid = uid;
    memcpy(h->segment, segment, strlen(segment) + 1);
    /* Orders the fields above before the magic: whoever sees the magic sees a whole header. */
    kvp_shared_fence(memory_order_release);
    memcpy(h->magic, KVP_WIDX_MAGIC, sizeof(h->magic));
    return 0;
}

/* Copies the header at base into *h once its magic, version and sizes are this format's. */
static int read_header(const void *base, size_t len, struct kvp_widx_header *h, char *why,
                       size_t why_size)
{
    size_t core = offsetof(struct kvp_widx_header, segment);
    if (len < core || memcmp(base, KVP_WIDX_MAGIC, sizeof(h->magic)) != 0)
        return kvp_why(why, why_size, -EPROTO, "not a kvpool index");
    /* The fields before the segment's name say how long the index must be: a shorter one is
     * "truncated" (check_geometry()), whether or not the name fits in it. */
    memset(h, 0, sizeof(*h));
    memcpy(h, base, len < sizeof(*h) ? len : sizeof(*h));
    /* Pairs with kvp_widx_format()'s release fence: the fields are read after the magic. */
    kvp_shared_fence(memory_order_acquire);
    if (h->version != KVP_WIDX_VERSION)
        return kvp_why(why, why_size, -ESTALE, "format version %" PRIu32 ", this kvpoold reads %u",
                       h->version, KVP_WIDX_VERSION);
    if (h->header_size != KVP_WIDX_HEADER || h->record_size != KVP_WIDX_RECORD)
        return kvp_why(why, why_size, -EPROTO,
                       "damaged: a %" PRIu32 "-byte header and %" PRIu32
                       "-byte records, this format has %u and %u",
                       h->header_size, h->record_size, KVP_WIDX_HEADER, KVP_WIDX_RECORD);
    return 0;
}

/* The header's geometry agrees with itself, and the len bytes hold every record. */
static int check_geometry(const struct kvp_widx_header *h, size_t len, char *why, size_t why_size)
{
    if (h->page_size == 0 || h->page_size != h->identity.page_size ||
        h->npages != kvp_widx_npages(&h->identity) || h->npages == 0 ||
        h->npages > KVP_WIDX_MAX_PAGES || h->pool_bytes != h->npages * h->page_size)
        return kvp_why(why, why_size, -EPROTO,
                       "damaged header: %" PRIu64 " pages of %" PRIu32
                       " bytes for a pool of %" PRIu64 " bytes",
                       h->npages, h->page_size, h->identity.pool_size);
    uint64_t need = kvp_widx_bytes(h->npages);
    if ((uint64_t)len < need)
        return kvp_why(why, why_size, -EPROTO, "truncated: %zu bytes, the header says %" PRIu64,
                       len, need);
    return 0;
}

int kvp_widx_check(const void *base, size_t len, const struct kvp_widx_identity *id, char *why,
                   size_t why_size)
{
    struct kvp_widx_header h;
    const struct kvp_widx_identity *old = &h.identity;

    int rc = read_header(base, len, &h, why, why_size);
    if (rc)
        return rc;
    /* The settings first: after a reconfiguration they are what the operator wants to read. */
    if (old->pool_size != id->pool_size)
        return kvp_why(why, why_size, -ESTALE,
                       "pool of %" PRIu64 " bytes, this kvpoold is configured for %" PRIu64,
                       old->pool_size, id->pool_size);
    if (old->page_size != id->page_size)
        return kvp_why(why, why_size, -ESTALE, "page size %" PRIu32 ", this kvpoold uses %" PRIu32,
                       old->page_size, id->page_size);
    if (old->chunk_tokens != id->chunk_tokens)
        return kvp_why(why, why_size, -ESTALE,
                       "chunk size %" PRIu32 " tokens, this kvpoold is configured for %" PRIu32,
                       old->chunk_tokens, id->chunk_tokens);
    if (old->settings_hash != id->settings_hash)
        return kvp_why(why, why_size, -ESTALE,
                       "settings differ (model layout, salt or another setting that names chunks)");
    return check_geometry(&h, len, why, why_size);
}

int kvp_widx_header_read(const void *base, size_t len, struct kvp_widx_header *out)
{
    struct kvp_widx_header h;
    int rc = read_header(base, len, &h, NULL, 0);
    if (rc == 0)
        rc = check_geometry(&h, len, NULL, 0);
    if (rc)
        return -EPROTO;
    /* The name is the caller's to judge, but always a string. */
    h.segment[KVP_WIDX_SEGMENT_NAME - 1] = '\0';
    *out = h;
    return 0;
}

uint64_t kvp_widx_flags(const void *base)
{
    const struct kvp_widx_header *h = base;
    return __atomic_load_n(&h->flags, __ATOMIC_ACQUIRE);
}

void kvp_widx_set_flags(void *base, uint64_t flags)
{
    struct kvp_widx_header *h = base;
    __atomic_store_n(&h->flags, flags, __ATOMIC_RELEASE);
}

void kvp_widx_set_owner(void *base, uint32_t pid, uint32_t uid)
{
    struct kvp_widx_header *h = base;
    __atomic_store_n(&h->pid, pid, __ATOMIC_RELEASE);
    __atomic_store_n(&h->uid, uid, __ATOMIC_RELEASE);
}

/* ---- Records ---- */

uint64_t kvp_widx_data_sum(const void *data, size_t len)
{
    return XXH3_64bits(data, len);
}

uint64_t kvp_widx_seal_of(uint64_t generation, uint64_t page, const uint8_t key[KVP_KEY_SIZE],
                          uint64_t length, uint64_t data_sum)
{
    uint8_t buf[KVP_KEY_SIZE + 3 * sizeof(uint64_t)];

    memcpy(buf, key, KVP_KEY_SIZE);
    memcpy(buf + KVP_KEY_SIZE, &length, sizeof(length));
    memcpy(buf + KVP_KEY_SIZE + 8, &data_sum, sizeof(data_sum));
    memcpy(buf + KVP_KEY_SIZE + 16, &page, sizeof(page));
    return XXH3_64bits_withSeed(buf, sizeof(buf), generation) | 1u;
}

unsigned kvp_widx_plan_seal(const void *base, uint64_t page, const uint8_t key[KVP_KEY_SIZE],
                            uint64_t length, uint64_t data_sum, uint64_t seq,
                            struct kvp_widx_write out[KVP_WIDX_MAX_WRITES])
{
    const struct kvp_widx_header *h = base;
    uint64_t npages = h->npages, rec = record_off(page);
    unsigned n = 0;

    if (length == 0 || h->page_size == 0 || page >= npages ||
        pages_of(length, h->page_size) > npages - page)
        return 0;
    /* Defensive: a slot is cleared before its pages are freed, so its seal should be 0 already;
     * if not, the old seal must go before any field changes under it. */
    out[n++] = (struct kvp_widx_write){rec + offsetof(struct kvp_widx_record, seal), 0};
    for (unsigned i = 0; i < KVP_KEY_SIZE / 8; i++) {
        uint64_t word;
        memcpy(&word, key + 8 * i, sizeof(word));
        out[n++] = (struct kvp_widx_write){rec + offsetof(struct kvp_widx_record, key) + 8 * i,
                                           word};
    }
    out[n++] = (struct kvp_widx_write){rec + offsetof(struct kvp_widx_record, length), length};
    out[n++] = (struct kvp_widx_write){rec + offsetof(struct kvp_widx_record, data_sum), data_sum};
    out[n++] = (struct kvp_widx_write){rec + offsetof(struct kvp_widx_record, seq), seq};
    out[n++] = (struct kvp_widx_write){rec + offsetof(struct kvp_widx_record, seal),
                                       kvp_widx_seal_of(h->generation, page, key, length,
                                                        data_sum)};
    return n;
}

unsigned kvp_widx_plan_clear(const void *base, uint64_t page,
                             struct kvp_widx_write out[KVP_WIDX_MAX_WRITES])
{
    const struct kvp_widx_header *h = base;
    if (page >= h->npages)
        return 0;
    out[0] = (struct kvp_widx_write){record_off(page) + offsetof(struct kvp_widx_record, seal), 0};
    return 1;
}

void kvp_widx_apply(void *base, const struct kvp_widx_write *w, unsigned n)
{
    /* Release on every store, not only the seal's: each is then ordered after all the earlier
     * ones, so a death leaves exactly a prefix of the plan (one barrier per write: a commit
     * makes nine, next to the chunk's megabytes). */
    for (unsigned i = 0; i < n; i++)
        __atomic_store_n((uint64_t *)((uint8_t *)base + w[i].off), w[i].value, __ATOMIC_RELEASE);
}

int kvp_widx_seal(void *base, uint64_t page, const uint8_t key[KVP_KEY_SIZE], uint64_t length,
                  uint64_t data_sum, uint64_t seq)
{
    struct kvp_widx_write w[KVP_WIDX_MAX_WRITES];
    unsigned n = kvp_widx_plan_seal(base, page, key, length, data_sum, seq, w);
    if (n == 0)
        return -ERANGE;
    kvp_widx_apply(base, w, n);
    return 0;
}

int kvp_widx_clear(void *base, uint64_t page)
{
    struct kvp_widx_write w[KVP_WIDX_MAX_WRITES];
    unsigned n = kvp_widx_plan_clear(base, page, w);
    if (n == 0)
        return -ERANGE;
    kvp_widx_apply(base, w, n);
    return 0;
}

void kvp_widx_touch(void *base, uint64_t page, uint64_t seq)
{
    const struct kvp_widx_header *h = base;
    if (page >= h->npages)
        return;
    uint64_t off = record_off(page) + offsetof(struct kvp_widx_record, seq);
    __atomic_store_n((uint64_t *)((uint8_t *)base + off), seq, __ATOMIC_RELAXED);
}

/* ---- Reservation marks ---- */

int kvp_widx_mark(void *base, uint64_t page, uint64_t length)
{
    const struct kvp_widx_header *h = base;
    if (length == 0 || h->page_size == 0 || page >= h->npages ||
        pages_of(length, h->page_size) > h->npages - page)
        return -ERANGE;
    uint64_t rec = record_off(page);
    const struct kvp_widx_write w[] = {
        {rec + offsetof(struct kvp_widx_record, length), length},
        {rec + offsetof(struct kvp_widx_record, seq), KVP_WIDX_RESERVED},
    };
    kvp_widx_apply(base, w, 2);
    return 0;
}

int kvp_widx_unmark(void *base, uint64_t page)
{
    const struct kvp_widx_header *h = base;
    if (page >= h->npages)
        return -ERANGE;
    const struct kvp_widx_write w = {record_off(page) + offsetof(struct kvp_widx_record, seq), 0};
    kvp_widx_apply(base, &w, 1);
    return 0;
}

/* ---- Scan ---- */

/* One pass over the records: the header's geometry, the callback, what was seen so far. */
struct walk {
    const uint8_t *base;
    uint8_t *scrub; /* the same mapping, writable, when rejects are to be cleared; else NULL */
    uint64_t npages, page_size, generation;
    uint64_t next_free; /* the first page after the last adopted object */
    kvp_widx_adopt_fn fn;
    void *arg;
    struct kvp_widx_scan_result *res;
    kvp_widx_mark_fn mark_fn; /* a scan of reservation marks: only they are reported */
    int64_t marks;
};

/* Judges records [first, end) (end <= npages, first >= every page judged before). */
static int walk_range(struct walk *w, uint64_t first, uint64_t end)
{
    struct kvp_widx_scan_result *res = w->res;

    res->extents++;
    for (uint64_t i = first; i < end; i++) {
        struct kvp_widx_record r;
        uint64_t *counter;

        /* A copy: the verdict and the callback see the same bytes, whatever the mapping does. */
        memcpy(&r, w->base + record_off(i), sizeof(r));
        res->records++;
        if (r.seal == 0) {
            res->empty++;
            /* A mark: checked as a record's extent is (no overflow: i < npages). */
            if (w->mark_fn && r.seq == KVP_WIDX_RESERVED && r.length &&
                pages_of(r.length, w->page_size) <= w->npages - i) {
                w->marks++;
                int rc = w->mark_fn(w->arg, i, r.length);
                if (rc < 0)
                    return rc;
            }
            continue;
        }
        if (w->mark_fn)
            continue; /* sealed records are the other scans' business */
        /* The low bit first: it costs nothing and every real seal has it. */
        if (!(r.seal & 1) ||
            r.seal != kvp_widx_seal_of(w->generation, i, r.key, r.length, r.data_sum)) {
            counter = &res->bad_seal;
        } else if (r.length == 0 || pages_of(r.length, w->page_size) > w->npages - i) {
            /* npages - i: no overflow, i < npages. Such a record can only be forged or come
             * from a bug, since the plan refuses it: it must not move next_free. */
            counter = &res->out_of_range;
        } else if (i < w->next_free) {
            /* Only adopted objects move next_free: a reject never hides a later record. */
            counter = &res->overlap;
        } else {
            uint64_t pages = pages_of(r.length, w->page_size);
            w->next_free = i + pages;
            res->adopted++;
            res->adopted_pages += pages;
            if (w->fn) {
                int rc = w->fn(w->arg, i, r.key, r.length, r.data_sum, r.seq);
                if (rc < 0)
                    return rc;
            }
            continue;
        }
        (*counter)++;
        /* Scrub: one store, as a clear, so a death during the scrub leaves a scrubbed prefix. */
        if (w->scrub) {
            uint64_t *seal = (uint64_t *)(w->scrub + record_off(i) +
                                          offsetof(struct kvp_widx_record, seal));
            __atomic_store_n(seal, 0, __ATOMIC_RELEASE);
        }
    }
    return 0;
}

/* Walks the records that hold data in the file fd (all of them when fd cannot say). */
static int walk_extents(struct walk *w, int fd)
{
    uint64_t cur = 0; /* the next record to judge */

    if (fd < 0)
        return walk_range(w, 0, w->npages);
    while (cur < w->npages) {
        off_t data = lseek(fd, (off_t)record_off(cur), SEEK_DATA);
        if (data < 0) {
            /* ENXIO: nothing but holes from here on. Anything else: this file system cannot
             * say where its data is, so read the rest. */
            return errno == ENXIO ? 0 : walk_range(w, cur, w->npages);
        }
        off_t hole = lseek(fd, data, SEEK_HOLE);
        uint64_t first = ((uint64_t)data - KVP_WIDX_HEADER) / KVP_WIDX_RECORD, last = w->npages;
        /* A hole after the data moves us forward; a nonsensical one means "read the rest". */
        if (hole > data)
            last = ((uint64_t)hole - KVP_WIDX_HEADER + KVP_WIDX_RECORD - 1) / KVP_WIDX_RECORD;
        if (first < cur)
            first = cur;
        if (last > w->npages)
            last = w->npages;
        if (first >= last)
            break;
        int rc = walk_range(w, first, last);
        if (rc)
            return rc;
        cur = last;
    }
    return 0;
}

static int walk(int fd, const void *base, void *scrub, size_t len, kvp_widx_adopt_fn fn, void *arg,
                struct kvp_widx_scan_result *res, kvp_widx_mark_fn mark_fn, int64_t *marks)
{
    struct kvp_widx_header h;

    /* Filled in any case, so that a refused index reads as "nothing seen". */
    memset(res, 0, sizeof(*res));
    int rc = read_header(base, len, &h, NULL, 0);
    if (rc == 0)
        rc = check_geometry(&h, len, NULL, 0);
    if (rc)
        return -EPROTO;
    struct walk w = {
        .base = base,
        .scrub = scrub,
        .npages = h.npages,
        .page_size = h.page_size,
        .generation = h.generation,
        .fn = fn,
        .arg = arg,
        .res = res,
        .mark_fn = mark_fn,
    };
    rc = walk_extents(&w, fd);
    if (marks)
        *marks = w.marks;
    return rc;
}

int kvp_widx_scan(const void *base, size_t len, kvp_widx_adopt_fn fn, void *arg,
                  struct kvp_widx_scan_result *res)
{
    return walk(-1, base, NULL, len, fn, arg, res, NULL, NULL);
}

int kvp_widx_scan_fd(int fd, const void *base, size_t len, kvp_widx_adopt_fn fn, void *arg,
                     struct kvp_widx_scan_result *res)
{
    return walk(fd, base, NULL, len, fn, arg, res, NULL, NULL);
}

int kvp_widx_scrub(int fd, void *base, size_t len, struct kvp_widx_scan_result *res)
{
    return walk(fd, base, base, len, NULL, NULL, res, NULL, NULL);
}

int64_t kvp_widx_scan_marks(int fd, const void *base, size_t len, kvp_widx_mark_fn fn, void *arg)
{
    struct kvp_widx_scan_result res;
    int64_t marks = 0;
    int rc = walk(fd, base, NULL, len, NULL, arg, &res, fn, &marks);
    return rc ? rc : marks;
}

/* ---- The segment ---- */

int kvp_widx_name(const char *seg_name, char *out, size_t size)
{
    if (seg_name[0] == '/')
        seg_name++;
    size_t n = strlen(seg_name);
    if (n == 0 || strchr(seg_name, '/') != NULL)
        return -EINVAL;
    /* The file in /dev/shm is the name without its '/': at most NAME_MAX bytes. */
    if (n + strlen(KVP_WIDX_SUFFIX) > NAME_MAX || 1 + n + strlen(KVP_WIDX_SUFFIX) >= size)
        return -ENAMETOOLONG;
    out[0] = '/';
    memcpy(out + 1, seg_name, n);
    memcpy(out + 1 + n, KVP_WIDX_SUFFIX, sizeof(KVP_WIDX_SUFFIX));
    return 0;
}

/* Refuses a file someone else may have written: not regular, another owner, a lax mode. */
static int check_owner(const struct stat *st, const char *name, char *why, size_t why_size)
{
    if (!S_ISREG(st->st_mode))
        return kvp_why(why, why_size, -EPERM, "index /dev/shm%s is not a regular file", name);
    if (st->st_uid != geteuid())
        return kvp_why(why, why_size, -EPERM,
                       "index /dev/shm%s belongs to uid %u, not to this kvpoold's uid %u", name,
                       (unsigned)st->st_uid, (unsigned)geteuid());
    if (st->st_mode & 077)
        return kvp_why(why, why_size, -EPERM,
                       "index /dev/shm%s has mode %03o: other users could have written it", name,
                       (unsigned)(st->st_mode & 0777));
    return 0;
}

int kvp_widx_open(const char *name, bool create, uint64_t npages, int *fdp, void **basep,
                  size_t *lenp, char *why, size_t why_size)
{
    uint64_t size = kvp_widx_bytes(npages);
    struct stat st;
    void *base;
    int fd, rc;

    /* The out-parameters say "nothing open" until the very end, whatever fails. */
    *fdp = -1;
    *basep = NULL;
    *lenp = 0;
    if (create && (npages == 0 || size == 0))
        return kvp_why(why, why_size, -EINVAL, "an index of %" PRIu64 " pages", npages);
    fd = shm_open(name, O_RDWR | O_NOFOLLOW | O_CLOEXEC | (create ? O_CREAT : 0), 0600);
    if (fd < 0) {
        rc = -errno;
        return kvp_why(why, why_size, rc, "cannot %s index /dev/shm%s: %s",
                       create ? "create" : "open", name, kvp_strerror(rc));
    }
    if (fstat(fd, &st) != 0) {
        rc = -errno;
        kvp_why(why, why_size, rc, "cannot inspect index /dev/shm%s: %s", name, kvp_strerror(rc));
        goto out_close;
    }
    rc = check_owner(&st, name, why, why_size);
    if (rc)
        goto out_close;
    if (create) {
        /* Emptied first: a fresh file is all holes, whatever the name held before. */
        if (ftruncate(fd, 0) != 0 || ftruncate(fd, (off_t)size) != 0) {
            rc = -errno;
            kvp_why(why, why_size, rc, "cannot size index /dev/shm%s to %" PRIu64 " bytes: %s",
                    name, size, kvp_strerror(rc));
            goto out_unlink;
        }
    } else {
        size = (uint64_t)st.st_size;
        if (size < KVP_WIDX_HEADER || size > kvp_widx_bytes(KVP_WIDX_MAX_PAGES)) {
            rc = kvp_why(why, why_size, -EPROTO, "index /dev/shm%s of %" PRIu64 " bytes: %s", name,
                         size, size < KVP_WIDX_HEADER ? "truncated" : "too large");
            goto out_close;
        }
    }
    base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        rc = -errno;
        kvp_why(why, why_size, rc, "cannot map index /dev/shm%s: %s", name, kvp_strerror(rc));
        if (create)
            goto out_unlink;
        goto out_close;
    }
    *fdp = fd;
    *basep = base;
    *lenp = (size_t)size;
    return 0;

out_unlink:
    shm_unlink(name);
out_close:
    close(fd);
    return rc;
}

int kvp_widx_reserve(int fd, uint64_t first, uint64_t n)
{
    if (first > KVP_WIDX_MAX_PAGES || n > KVP_WIDX_MAX_PAGES - first)
        return -EINVAL;
    if (n == 0)
        return 0;
    uint64_t from = record_off(first) / PAGE_4K * PAGE_4K;
    uint64_t to = (record_off(first + n) + PAGE_4K - 1) / PAGE_4K * PAGE_4K;
    int rc;
    /* posix_fallocate returns the error; tmpfs may be interrupted by a signal. */
    do
        rc = posix_fallocate(fd, (off_t)from, (off_t)(to - from));
    while (rc == EINTR);
    return -rc;
}

void kvp_widx_close(int fd, void *base, size_t len)
{
    if (base)
        munmap(base, len);
    if (fd >= 0)
        close(fd);
}

int kvp_widx_unlink(const char *name)
{
    return shm_unlink(name) == 0 ? 0 : -errno;
}
