/*
 * fuzz_warm_index.c - the warm-restart index (src/server/core/warm_index.c): what a new daemon
 * reads from the file a dead one left, which may hold anything (damage, a bug, another format).
 *
 * Input: byte 0 sets npages = 1 + byte 0 (up to 256 records), byte 1 the mode (modulo 4), and
 *   0 RECORDS  the driver formats a header of npages pages, the rest of the input is the records
 *              (zero-filled or cut to npages). A record whose seal has bit 1 set gets the valid
 *              seal of its own fields, so the range and overlap rules meet valid seals of any
 *              length. The region is also copied into a memfd, its zero pages left as holes,
 *              for the scan that skips holes;
 *   1 SHORT    as RECORDS, then the region is cut short by 1 + byte 2 bytes (truncated index);
 *   2 WHOLE    the rest of the input is the whole region, header included, as it comes;
 *   3 OPS      3-byte operations on a formatted index through the API, against a model of each
 *              slot: seal, clear, touch, flip a bit of a record, a seal cut short by a death.
 * Every region lives in a heap block of exactly its length, so a read past it is an ASan error.
 *
 * Checked: the scan returns 0 or -EPROTO (and check 0, -EPROTO or -ESTALE with a reason; the
 * header's own settings pass the check); its counts add up to the records read (npages);
 * adopted records come in page order, lie within npages, never overlap, carry their record's
 * fields and a valid seal; the scan over the memfd adopts the same; after a scrub nothing is
 * rejected and the same records are adopted. In OPS mode the adopted records and every count
 * are exactly the model's.
 *
 * The seeds (fuzz/corpus/warm_index/) are small hand-made inputs of each mode.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/warm_index.h"
#include "fuzz.h"

#define GEN 0x9e3779b97f4a7c15ull
#define PG 4096u
#define MAXP 256u

struct adopted {
    uint64_t page, length, data_sum, seq;
    uint8_t key[KVP_KEY_SIZE];
};

/* What the callback saw (the first MAXP records: a WHOLE region may hold more, if the fuzzer
 * learns to forge seals), and what it needs to judge it. */
struct seen {
    const uint8_t *base;
    uint64_t npages, generation, next;
    uint64_t n;
    struct adopted a[MAXP];
};

/* The two scans adopted the same records. */
static bool same(const struct seen *x, const struct seen *y)
{
    return x->n == y->n && memcmp(x->a, y->a, (x->n < MAXP ? x->n : MAXP) * sizeof(x->a[0])) == 0;
}

static int on_adopt(void *arg, uint64_t page, const uint8_t key[KVP_KEY_SIZE], uint64_t length,
                    uint64_t data_sum, uint64_t seq)
{
    struct seen *s = arg;
    struct kvp_widx_record r;

    FUZZ_CHECK(page < s->npages && page >= s->next);
    FUZZ_CHECK(length > 0 && (length - 1) / PG < s->npages - page);
    memcpy(&r, s->base + KVP_WIDX_HEADER + page * KVP_WIDX_RECORD, sizeof(r));
    FUZZ_CHECK(memcmp(r.key, key, KVP_KEY_SIZE) == 0 && r.length == length &&
               r.data_sum == data_sum && r.seq == seq);
    FUZZ_CHECK(r.seal == kvp_widx_seal_of(s->generation, page, key, length, data_sum));
    s->next = page + (length - 1) / PG + 1;
    if (s->n < MAXP) {
        struct adopted *a = &s->a[s->n];
        *a = (struct adopted){.page = page, .length = length, .data_sum = data_sum, .seq = seq};
        memcpy(a->key, key, KVP_KEY_SIZE);
    }
    s->n++;
    return 0;
}

static void sums(const struct kvp_widx_scan_result *r)
{
    FUZZ_CHECK(r->records == r->empty + r->adopted + r->bad_seal + r->out_of_range + r->overlap);
}

/* Scans base (len bytes) and checks what any scan promises; fills *s and *r. Returns its rc. */
static int scan(const uint8_t *base, size_t len, struct seen *s, struct kvp_widx_scan_result *r)
{
    struct kvp_widx_header h;
    bool sound = kvp_widx_header_read(base, len, &h) == 0;

    memset(s, 0, sizeof(*s));
    s->base = base;
    if (sound) {
        s->npages = h.npages;
        s->generation = h.generation;
    }
    int rc = kvp_widx_scan(base, len, on_adopt, s, r);
    FUZZ_CHECK(rc == (sound ? 0 : -EPROTO));
    sums(r);
    if (rc) {
        FUZZ_CHECK(r->records == 0 && s->n == 0);
        return rc;
    }
    FUZZ_CHECK(r->records == h.npages && r->adopted == s->n && r->extents == 1);
    uint64_t pages = 0;
    for (uint64_t i = 0; i < s->n && i < MAXP; i++)
        pages += (s->a[i].length - 1) / PG + 1;
    FUZZ_CHECK(s->n > MAXP || pages == r->adopted_pages);

    /* The header's own settings pass the check; others are refused with a reason. */
    char why[256] = "";
    FUZZ_CHECK(kvp_widx_check(base, len, &h.identity, why, sizeof(why)) == 0);
    struct kvp_widx_identity other = h.identity;
    other.settings_hash ^= 1;
    FUZZ_CHECK(kvp_widx_check(base, len, &other, why, sizeof(why)) == -ESTALE && why[0]);
    return 0;
}

/* Judges a region that is not the driver's own: check and scan agree, nothing breaks. */
static void judge(const uint8_t *base, size_t len)
{
    struct kvp_widx_identity id = {.pool_size = 16 * PG, .page_size = PG, .chunk_tokens = 16};
    struct kvp_widx_scan_result r;
    struct seen *s = malloc(sizeof(*s));
    char why[256] = "";

    FUZZ_CHECK(s != NULL);
    int rc = kvp_widx_check(base, len, &id, why, sizeof(why));
    FUZZ_CHECK(rc == 0 || rc == -EPROTO || rc == -ESTALE);
    FUZZ_CHECK(rc == 0 || why[0] != '\0');
    int src = scan(base, len, s, &r);
    /* A check that passes implies a sound header. */
    FUZZ_CHECK(rc != 0 || src == 0);
    free(s);
}

/* The region in a memfd, zero 4 KiB pages left as holes: the scan that skips them adopts the
 * same records, reading no more of them. */
static void scan_holes(const uint8_t *region, size_t len, const struct seen *full,
                       const struct kvp_widx_scan_result *rfull)
{
    int fd = memfd_create("fuzz_warm_index", MFD_CLOEXEC);
    if (fd < 0)
        return;
    static const uint8_t zero[PG];
    struct kvp_widx_scan_result r;
    struct seen *s = NULL;
    uint8_t *m = MAP_FAILED;

    if (ftruncate(fd, (off_t)len) != 0)
        goto out;
    for (size_t off = 0; off < len; off += PG)
        if (memcmp(region + off, zero, PG) != 0 &&
            pwrite(fd, region + off, PG, (off_t)off) != (ssize_t)PG)
            goto out;
    m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    s = calloc(1, sizeof(*s));
    if (m == MAP_FAILED || !s)
        goto out;
    s->base = m;
    s->npages = full->npages;
    s->generation = full->generation;
    FUZZ_CHECK(kvp_widx_scan_fd(fd, m, len, on_adopt, s, &r) == 0);
    sums(&r);
    FUZZ_CHECK(r.records <= rfull->records && r.adopted == rfull->adopted);
    FUZZ_CHECK(same(s, full));
    FUZZ_CHECK(r.bad_seal == rfull->bad_seal && r.out_of_range == rfull->out_of_range &&
               r.overlap == rfull->overlap);
out:
    free(s);
    if (m != MAP_FAILED)
        munmap(m, len);
    close(fd);
}

/* A formatted index of npages records, the records taken from data. */
static uint8_t *records_region(uint64_t npages, const uint8_t *data, size_t size, size_t *lenp)
{
    struct kvp_widx_identity id = {.pool_size = npages * PG + 7,
                                   .page_size = PG,
                                   .chunk_tokens = 256,
                                   .settings_hash = 42};
    size_t len = kvp_widx_bytes(npages);
    uint8_t *b = calloc(1, len);
    FUZZ_CHECK(b != NULL);
    FUZZ_CHECK(kvp_widx_format(b, len, &id, 1, 1, GEN) == 0);
    size_t n = npages * KVP_WIDX_RECORD;
    memcpy(b + KVP_WIDX_HEADER, data, size < n ? size : n);
    for (uint64_t i = 0; i < npages; i++) {
        struct kvp_widx_record r;
        uint8_t *p = b + KVP_WIDX_HEADER + i * KVP_WIDX_RECORD;
        memcpy(&r, p, sizeof(r));
        if (r.seal & 2) {
            r.seal = kvp_widx_seal_of(GEN, i, r.key, r.length, r.data_sum);
            memcpy(p, &r, sizeof(r));
        }
    }
    *lenp = len;
    return b;
}

static void mode_records(uint64_t npages, const uint8_t *data, size_t size)
{
    size_t len;
    uint8_t *b = records_region(npages, data, size, &len);
    struct kvp_widx_scan_result r, r2;
    struct seen *s = malloc(sizeof(*s)), *s2 = malloc(sizeof(*s2));

    FUZZ_CHECK(s && s2);
    FUZZ_CHECK(scan(b, len, s, &r) == 0);
    scan_holes(b, len, s, &r);
    /* The scrub clears every reject and nothing else. */
    struct kvp_widx_scan_result rs;
    FUZZ_CHECK(kvp_widx_scrub(-1, b, len, &rs) == 0);
    FUZZ_CHECK(rs.adopted == r.adopted && rs.bad_seal == r.bad_seal &&
               rs.out_of_range == r.out_of_range && rs.overlap == r.overlap);
    FUZZ_CHECK(scan(b, len, s2, &r2) == 0);
    FUZZ_CHECK(r2.bad_seal + r2.out_of_range + r2.overlap == 0);
    FUZZ_CHECK(same(s2, s));
    free(s2);
    free(s);
    free(b);
}

static void mode_short(uint64_t npages, uint8_t cut, const uint8_t *data, size_t size)
{
    size_t len;
    uint8_t *full = records_region(npages, data, size, &len);
    size_t short_len = len - 1 - cut;
    uint8_t *b = malloc(short_len);
    struct kvp_widx_scan_result r;
    char why[256] = "";

    FUZZ_CHECK(b != NULL);
    memcpy(b, full, short_len);
    struct kvp_widx_header h;
    memcpy(&h, full, sizeof(h));
    FUZZ_CHECK(kvp_widx_check(b, short_len, &h.identity, why, sizeof(why)) == -EPROTO);
    FUZZ_CHECK(strncmp(why, "truncated: ", 11) == 0);
    FUZZ_CHECK(kvp_widx_scan(b, short_len, NULL, NULL, &r) == -EPROTO && r.records == 0);
    free(b);
    free(full);
}

/* ---- OPS: the API against a model of each slot ---- */

struct slot {
    bool sealed;       /* the last seal's plan completed, and no clear since */
    uint64_t seal_val; /* the seal field's value */
    uint8_t mask[64];  /* bits flipped since the last seal */
    struct adopted f;  /* the fields sealed (seq: current) */
};

static bool slot_valid(const struct slot *sl)
{
    static const uint8_t zero[64];
    return sl->sealed && memcmp(sl->mask, zero, sizeof(zero)) == 0;
}

static void mode_ops(uint64_t npages, const uint8_t *data, size_t size)
{
    struct kvp_widx_identity id = {.pool_size = npages * PG, .page_size = PG, .chunk_tokens = 16};
    size_t len = kvp_widx_bytes(npages);
    uint8_t *b = calloc(1, len);
    struct slot *sl = calloc(npages, sizeof(*sl));
    struct seen *s = malloc(sizeof(*s));
    struct kvp_widx_scan_result r;

    FUZZ_CHECK(b && sl && s);
    FUZZ_CHECK(kvp_widx_format(b, len, &id, 1, 1, GEN) == 0);
    for (size_t o = 0; o + 3 <= size; o += 3) {
        uint8_t op = data[o], arg = data[o + 2];
        uint64_t page = data[o + 1] % npages, seq = o + 1;
        uint8_t *rec = b + KVP_WIDX_HEADER + page * KVP_WIDX_RECORD;
        struct slot *t = &sl[page];
        struct kvp_widx_write w[KVP_WIDX_MAX_WRITES];
        uint8_t key[KVP_KEY_SIZE];
        memset(key, op ^ arg, sizeof(key));
        memcpy(key, &o, sizeof(o));
        uint64_t length = op & 8 ? (uint64_t)(arg % 8 + 1) * PG : 1 + (uint64_t)arg * 97;
        uint64_t sum = o * 0x100000001b3ull;

        switch (op % 5) {
        case 0: /* seal */
        case 4: /* seal cut short after arg % 9 writes (a death) */ {
            unsigned n = kvp_widx_plan_seal(b, page, key, length, sum, seq, w);
            FUZZ_CHECK(n == 0 || n == KVP_WIDX_MAX_WRITES);
            FUZZ_CHECK((n == 0) == (page + (length - 1) / PG + 1 > npages));
            if (n == 0)
                break;
            unsigned k = op % 5 == 4 ? arg % (n + 1) : n;
            kvp_widx_apply(b, w, k);
            if (k == 0)
                break;
            if (k < n) {
                /* The seal was zeroed first; the fields may be half new. */
                t->sealed = false;
                t->seal_val = 0;
                break;
            }
            memset(t, 0, sizeof(*t));
            t->sealed = true;
            t->seal_val = w[n - 1].value;
            t->f = (struct adopted){.page = page, .length = length, .data_sum = sum, .seq = seq};
            memcpy(t->f.key, key, KVP_KEY_SIZE);
            break;
        }
        case 1:
            FUZZ_CHECK(kvp_widx_clear(b, page) == 0);
            t->sealed = false;
            t->seal_val = 0;
            memset(t->mask + 56, 0, 8);
            break;
        case 2:
            kvp_widx_touch(b, page, arg);
            t->f.seq = arg;
            break;
        case 3: {
            unsigned bit = arg + (op & 0x80 ? 256u : 0u), byte = bit / 8;
            uint8_t m = (uint8_t)(1u << (bit % 8));
            /* The bit of its 8-byte field that flips, on a little-endian host. */
            uint64_t field_bit = 1ull << (bit % 64);
            rec[byte] ^= m;
            if (byte >= 56) {
                t->seal_val ^= field_bit;
                t->mask[byte] ^= m;
            } else if (byte >= 48) {
                t->f.seq ^= field_bit; /* advisory: no mask */
            } else {
                t->mask[byte] ^= m;
            }
            break;
        }
        }
    }

    /* The model's verdict, page by page, as the scan must give it. */
    struct kvp_widx_scan_result want = {.records = npages, .extents = 1};
    struct adopted *exp = calloc(npages, sizeof(*exp));
    unsigned nexp = 0;
    uint64_t next = 0;
    FUZZ_CHECK(exp != NULL);
    for (uint64_t i = 0; i < npages; i++) {
        const struct slot *t = &sl[i];
        if (t->seal_val == 0) {
            want.empty++;
        } else if (!slot_valid(t)) {
            want.bad_seal++;
        } else if (i < next) {
            want.overlap++;
        } else {
            uint64_t pages = (t->f.length - 1) / PG + 1;
            next = i + pages;
            want.adopted++;
            want.adopted_pages += pages;
            exp[nexp++] = t->f;
        }
    }
    FUZZ_CHECK(scan(b, len, s, &r) == 0);
    FUZZ_CHECK(memcmp(&r, &want, sizeof(r)) == 0);
    FUZZ_CHECK(s->n == nexp && memcmp(s->a, exp, nexp * sizeof(exp[0])) == 0);
    free(exp);
    free(s);
    free(sl);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    uint64_t npages = 1 + (uint64_t)data[0];
    switch (data[1] % 4) {
    case 0:
        mode_records(npages, data + 2, size - 2);
        break;
    case 1:
        if (size >= 3)
            mode_short(npages, data[2], data + 3, size - 3);
        break;
    case 2: {
        /* An exact-size copy: the input buffer may have slack after it. */
        uint8_t *b = malloc(size - 2 ? size - 2 : 1);
        FUZZ_CHECK(b != NULL);
        memcpy(b, data + 2, size - 2);
        judge(b, size - 2);
        free(b);
        break;
    }
    default:
        mode_ops(npages, data + 2, size - 2);
    }
    return 0;
}
