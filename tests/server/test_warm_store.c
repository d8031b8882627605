/*
 * test_warm_store.c - the store and the operations under a warm-restart index
 * (src/server/core/store.h's index hook, kvp_store_adopt(), kvp_store_verified(), and the
 * checksums and checks of core/ops.c), without a daemon and without /dev/shm: the index is a
 * heap buffer formatted by warm_index.c, and a hook over it records every call.
 *
 *   - a sealing commit seals one record per chunk (key, length, checksum), a plain commit none;
 *   - whatever frees a recorded chunk's pages (eviction, clear, clear_older, a dropped chunk)
 *     clears its record first, while the pages are still used, before another chunk is sealed
 *     there; afterwards the index holds exactly the live chunks;
 *   - adopted chunks are found by lookup and pin, evicted oldest-adopted first, and refused when
 *     they overlap, repeat a key, or lie beyond the pool's reserved part or the pool;
 *   - verification: a verified chunk is counted once; a dropped one leaves the index at once, its
 *     record cleared, its pages freed at the last unpin;
 *   - through the operations: a commit's checksums are those of the bytes; after a "restart"
 *     (a second core over a copy of the segment and the index, adopting what the index says), a
 *     flipped byte of an adopted chunk is dropped at its first read (prepare-retrieve, the inline
 *     retrieve, the pinning lookup), counted, and the caller gets the good chunks before it.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/log.h"
#include "common/kvp_assert.h"
#include "common/seg_header.h"
#include "core/daemon.h"
#include "core/ops.h"
#include "core/owner.h"
#include "core/stats.h"
#include "core/store.h"
#include "core/warm_index.h"

#define PG ((uint64_t)KVP_POOL_PAGE)
#define CHUNK (2 * PG) /* bytes of one object of the store cases */
#define POOL_BASE PG   /* the pool starts after the segment's header page */
#define MAXK 16
#define MAXEV 256
#define GEN 0x0123456789abcdefull

/* ---- a recording index over a heap buffer ---- */

struct event {
    char op; /* 's' seal, 'c' clear */
    uint64_t page;
    bool used; /* clear: the object's first page was still used in the pool */
};

struct tindex {
    struct kvp_store *s;
    uint8_t *base;
    size_t len;
    struct kvp_store_index hook;
    struct event ev[MAXEV];
    unsigned nev;
};

static void note(struct tindex *t, char op, uint64_t page, bool used)
{
    if (t->nev == MAXEV)
        fail_msg("more than %d index events", MAXEV);
    t->ev[t->nev++] = (struct event){op, page, used};
}

static int t_seal(void *arg, uint64_t page, const uint8_t key[KVP_KEY_SIZE], uint64_t length,
                  uint64_t sum, uint64_t seq)
{
    struct tindex *t = arg;
    note(t, 's', page, true);
    return kvp_widx_seal(t->base, page, key, length, sum, seq);
}

static void t_clear(void *arg, uint64_t page)
{
    struct tindex *t = arg;
    /* Called under the store lock: the pool may be read. */
    note(t, 'c', page, kvp_pool_page_used(&t->s->pool, page));
    assert_rc(kvp_widx_clear(t->base, page), 0);
}

static void t_touch(void *arg, uint64_t page, uint64_t seq)
{
    struct tindex *t = arg;
    kvp_widx_touch(t->base, page, seq);
}

/* An index for a pool of pool_bytes, hooked into s. */
static void tindex_init(struct tindex *t, struct kvp_store *s, uint64_t pool_bytes)
{
    struct kvp_widx_identity id = {.pool_size = pool_bytes,
                                   .page_size = KVP_POOL_PAGE,
                                   .chunk_tokens = 16,
                                   .settings_hash = 1};
    memset(t, 0, sizeof(*t));
    t->s = s;
    t->len = kvp_widx_bytes(kvp_widx_npages(&id));
    t->base = calloc(1, t->len);
    assert_non_null(t->base);
    assert_rc(kvp_widx_format_named(t->base, t->len, &id, 1, 1, GEN, "kvpool_l1_pool_test"), 0);
    t->hook =
        (struct kvp_store_index){.seal = t_seal, .clear = t_clear, .touch = t_touch, .arg = t};
    if (s)
        kvp_store_set_index(s, &t->hook);
}

/* What a scan of the index adopts: pages, keys' first bytes, sums, seqs. */
struct seen {
    uint64_t page[MAXK], sum[MAXK], seq[MAXK], length[MAXK];
    uint32_t key[MAXK];
    unsigned n;
};

static int seen_fn(void *arg, uint64_t page, const uint8_t key[KVP_KEY_SIZE], uint64_t length,
                   uint64_t sum, uint64_t seq)
{
    struct seen *v = arg;
    if (v->n == MAXK)
        fail_msg("more than %d records", MAXK);
    v->page[v->n] = page;
    v->sum[v->n] = sum;
    v->seq[v->n] = seq;
    v->length[v->n] = length;
    memcpy(&v->key[v->n], key, sizeof(uint32_t));
    v->n++;
    return 0;
}

static struct seen scan(const struct tindex *t)
{
    struct seen v = {.n = 0};
    struct kvp_widx_scan_result r;
    assert_rc(kvp_widx_scan(t->base, t->len, seen_fn, &v, &r), 0);
    assert_int_equal(r.bad_seal + r.out_of_range + r.overlap, 0);
    return v;
}

/* True when the index holds a record at page. */
static bool recorded(const struct tindex *t, uint64_t page)
{
    struct seen v = scan(t);
    for (unsigned i = 0; i < v.n; i++)
        if (v.page[i] == page)
            return true;
    return false;
}

/* ---- store helpers (as test_store.c's) ---- */

static void make_key(uint8_t *k, uint32_t i)
{
    memset(k, (int)(0xa5 ^ i), KVP_KEY_SIZE);
    memcpy(k, &i, sizeof(i));
}

static uint8_t *keys_of(uint8_t *buf, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        make_key(buf + (size_t)i * KVP_KEY_SIZE, ids[i]);
    return buf;
}

static uint64_t page_of(uint64_t offset)
{
    return (offset - POOL_BASE) / PG;
}

struct prep {
    struct kvp_obj *objs[MAXK];
    uint32_t idx[MAXK];
    struct kvp_prepare_result res;
};

static void prepare(struct kvp_store *s, const uint32_t *ids, uint32_t n, uint64_t now,
                    struct prep *p)
{
    uint8_t keys[MAXK * KVP_KEY_SIZE];
    memset(p, 0, sizeof(*p));
    assert_rc(kvp_store_prepare(s, keys_of(keys, ids, n), n, CHUNK, now, p->objs, p->idx, &p->res),
              0);
}

/* Stores ids one by one with sealing commits (sum 1000 + id); offsets into offs if not NULL. */
static void store_sealed(struct kvp_store *s, const uint32_t *ids, uint32_t n, uint64_t now,
                         uint64_t *offs)
{
    for (uint32_t i = 0; i < n; i++) {
        struct prep p;
        prepare(s, &ids[i], 1, now, &p);
        assert_int_equal(p.res.nslots, 1);
        p.objs[0]->sum = 1000 + ids[i];
        if (offs)
            offs[i] = p.objs[0]->offset;
        assert_rc(kvp_store_commit_sealed(s, p.objs, 1), 1);
    }
}

static bool present(struct kvp_store *s, uint32_t id)
{
    uint8_t key[KVP_KEY_SIZE];
    make_key(key, id);
    return kvp_store_lookup(s, key, 1) == 1;
}

static struct kvp_store_gauges gauges(struct kvp_store *s)
{
    struct kvp_store_gauges g;
    kvp_store_get_gauges(s, &g);
    return g;
}

static uint64_t counter(const char *name)
{
    uint64_t v[KVP_NCOUNTERS];
    kvp_counters_read(v);
    for (unsigned i = 0; i < KVP_NCOUNTERS; i++)
        if (strcmp(kvp_counter_desc[i].name, name) == 0)
            return v[i];
    fail_msg("no counter %s", name);
    return 0;
}

/* Every clear of the index happened while its page was still used in the pool. */
static void expect_clears_before_free(const struct tindex *t)
{
    for (unsigned i = 0; i < t->nev; i++)
        if (t->ev[i].op == 'c' && !t->ev[i].used)
            fail_msg("the record of page %llu was cleared after its pages were freed",
                     (unsigned long long)t->ev[i].page);
}

/* The index of event op at page, from event from on; -1 when none. */
static int find_event(const struct tindex *t, char op, uint64_t page, unsigned from)
{
    for (unsigned i = from; i < t->nev; i++)
        if (t->ev[i].op == op && t->ev[i].page == page)
            return (int)i;
    return -1;
}

/* ---- the store ---- */

static void test_commit_seals(void **state)
{
    (void)state;
    struct kvp_store s;
    struct tindex t;
    struct prep p;
    uint32_t ids[] = {1, 2};

    assert_rc(kvp_store_init(&s, POOL_BASE, 4 * CHUNK, 4 * CHUNK), 0);
    tindex_init(&t, &s, 4 * CHUNK);
    assert_true(kvp_store_indexed(&s));
    prepare(&s, ids, 2, 0, &p);
    assert_int_equal(p.res.nslots, 2);
    p.objs[0]->sum = 111;
    p.objs[1]->sum = 222;
    assert_rc(kvp_store_commit_sealed(&s, p.objs, 2), 2);

    struct seen v = scan(&t);
    assert_int_equal(v.n, 2);
    for (unsigned i = 0; i < 2; i++) {
        unsigned k = v.page[i] == page_of(p.objs[0]->offset) ? 0 : 1;
        assert_int_equal(v.page[i], page_of(p.objs[k]->offset));
        assert_int_equal(v.key[i], ids[k]);
        assert_int_equal(v.sum[i], k ? 222 : 111);
        assert_int_equal(v.length[i], CHUNK);
    }
    assert_int_equal(gauges(&s).indexed, 2);
    assert_int_equal(gauges(&s).indexed_bytes, 2 * CHUNK);

    /* A plain commit (chunks loaded from L2) records nothing. */
    uint32_t three = 3;
    prepare(&s, &three, 1, 0, &p);
    assert_rc(kvp_store_commit(&s, p.objs, 1), 1);
    assert_int_equal(scan(&t).n, 2);
    assert_int_equal(gauges(&s).indexed, 2);
    assert_true(present(&s, 3));

    /* Reservations that end without a commit were never recorded: nothing to clear. */
    uint32_t four = 4;
    unsigned before = t.nev;
    prepare(&s, &four, 1, 0, &p);
    assert_int_equal(kvp_store_abort(&s, p.objs, 1), 1);
    assert_int_equal(t.nev, before);
    kvp_store_destroy(&s);
    free(t.base);
}

/* An eviction clears the victim's record while its pages are still used, before the chunk that
 * takes them is sealed there. */
static void test_evict_clears_before_reuse(void **state)
{
    (void)state;
    struct kvp_store s;
    struct tindex t;
    uint32_t ids[] = {0, 1, 2, 3};
    uint64_t offs[4];
    struct prep p;

    assert_rc(kvp_store_init(&s, POOL_BASE, 4 * CHUNK, 4 * CHUNK), 0);
    tindex_init(&t, &s, 4 * CHUNK);
    store_sealed(&s, ids, 4, 0, offs);
    assert_int_equal(scan(&t).n, 4);

    uint32_t fresh = 9;
    unsigned mark = t.nev;
    prepare(&s, &fresh, 1, 0, &p);
    assert_int_equal(p.res.nslots, 1);
    assert_int_equal(p.objs[0]->offset, offs[0]); /* the LRU victim's pages */
    assert_false(present(&s, 0));
    /* Reserved but not committed: the old record is gone already, no new one yet. */
    int c = find_event(&t, 'c', page_of(offs[0]), mark);
    assert_true(c >= 0);
    assert_false(recorded(&t, page_of(offs[0])));
    assert_int_equal(scan(&t).n, 3);

    p.objs[0]->sum = 999;
    assert_rc(kvp_store_commit_sealed(&s, p.objs, 1), 1);
    int sealed = find_event(&t, 's', page_of(offs[0]), mark);
    assert_true(sealed > c);
    struct seen v = scan(&t);
    assert_int_equal(v.n, 4);
    for (unsigned i = 0; i < v.n; i++)
        if (v.page[i] == page_of(offs[0]))
            assert_int_equal(v.key[i], fresh);
    expect_clears_before_free(&t);
    kvp_store_destroy(&s);
    free(t.base);
}

static void test_clear_clears_records(void **state)
{
    (void)state;
    struct kvp_store s;
    struct tindex t;
    uint32_t ids[] = {0, 1, 2};
    uint64_t offs[3];
    struct kvp_clear_result r;
    struct kvp_obj *pinned;
    uint8_t key[KVP_KEY_SIZE];

    assert_rc(kvp_store_init(&s, POOL_BASE, 8 * CHUNK, 8 * CHUNK), 0);
    tindex_init(&t, &s, 8 * CHUNK);
    store_sealed(&s, ids, 3, 100, offs);
    assert_int_equal(kvp_store_pin(&s, keys_of(key, &ids[1], 1), 1, &pinned), 1);
    kvp_store_clear(&s, &r);
    assert_int_equal(r.dropped, 2);
    assert_int_equal(r.pinned, 1);
    /* The pinned chunk stays, recorded; the others' records went first. */
    struct seen v = scan(&t);
    assert_int_equal(v.n, 1);
    assert_int_equal(v.page[0], page_of(offs[1]));
    expect_clears_before_free(&t);
    kvp_store_unpin(&s, &pinned, 1);

    /* clear_older: the chunks reserved before the cut go, with their records. */
    uint32_t late[] = {5, 6};
    store_sealed(&s, late, 2, 900, NULL);
    kvp_store_clear_older(&s, 500, &r);
    assert_int_equal(r.dropped, 1); /* id 1, reserved at 100 */
    v = scan(&t);
    assert_int_equal(v.n, 2);
    assert_int_equal(gauges(&s).indexed, 2);
    kvp_store_clear(&s, &r);
    assert_int_equal(scan(&t).n, 0);
    assert_int_equal(gauges(&s).indexed, 0);
    assert_int_equal(gauges(&s).indexed_bytes, 0);
    expect_clears_before_free(&t);
    kvp_store_destroy(&s);
    free(t.base);
}

/* Adopted objects are visible at once, pinned like any other, and evicted oldest-adopted first;
 * the index's seqs follow the new clock. */
static void test_adopt_lru_order(void **state)
{
    (void)state;
    struct kvp_store s;
    struct tindex t;
    uint8_t key[KVP_KEY_SIZE];
    struct prep p;

    assert_rc(kvp_store_init(&s, POOL_BASE, 4 * CHUNK, 4 * CHUNK), 0);
    tindex_init(&t, &s, 4 * CHUNK);
    /* Adopted oldest first, in another order than their pages: 12, 10, 13, 11. */
    static const uint32_t order[] = {12, 10, 13, 11};
    static const uint64_t slot[] = {2, 0, 3, 1};
    for (unsigned i = 0; i < 4; i++) {
        make_key(key, order[i]);
        assert_rc(kvp_widx_seal(t.base, slot[i] * 2, key, CHUNK, 500 + order[i], 7), 0);
        assert_rc(kvp_store_adopt(&s, POOL_BASE + slot[i] * CHUNK, key, CHUNK, 500 + order[i]), 0);
    }
    struct kvp_store_gauges g = gauges(&s);
    assert_int_equal(g.committed, 4);
    assert_int_equal(g.unverified, 4);
    assert_int_equal(g.indexed, 4);
    assert_int_equal(g.pool_used, 4 * CHUNK);
    assert_int_equal(kvp_store_unverified(&s), 4);

    /* The records' seqs now follow the adoption order. */
    struct seen v = scan(&t);
    assert_int_equal(v.n, 4);
    uint64_t seq_of[4] = {0};
    for (unsigned i = 0; i < v.n; i++)
        seq_of[v.page[i] / 2] = v.seq[i];
    for (unsigned i = 1; i < 4; i++)
        assert_true(seq_of[slot[i]] > seq_of[slot[i - 1]]);

    /* The first adopted is the first evicted, then the next. */
    uint32_t fresh = 20;
    prepare(&s, &fresh, 1, 0, &p);
    assert_int_equal(p.res.nslots, 1);
    assert_int_equal(p.objs[0]->offset, POOL_BASE + 2 * CHUNK);
    p.objs[0]->sum = 1;
    assert_rc(kvp_store_commit_sealed(&s, p.objs, 1), 1);
    assert_false(present(&s, 12));
    assert_int_equal(kvp_store_unverified(&s), 3); /* the evicted one needs no check */
    /* A pin finds adopted objects (and refreshes them: 13 and 11 are now older than 10). */
    struct kvp_obj *o;
    make_key(key, 10);
    assert_int_equal(kvp_store_pin(&s, key, 1, &o), 1);
    assert_true(kvp_obj_unverified(o));
    assert_int_equal(o->sum, 510);
    kvp_store_unpin(&s, &o, 1);
    fresh = 21;
    prepare(&s, &fresh, 1, 0, &p);
    assert_int_equal(p.objs[0]->offset, POOL_BASE + 3 * CHUNK); /* 13 */
    assert_rc(kvp_store_abort(&s, p.objs, 1), 1);
    assert_true(present(&s, 10));
    assert_true(present(&s, 11));
    assert_false(present(&s, 13));
    expect_clears_before_free(&t);
    kvp_store_destroy(&s);
    free(t.base);
}

static void test_adopt_refusals(void **state)
{
    (void)state;
    struct kvp_store s;
    uint8_t key[KVP_KEY_SIZE];

    /* A pool of 4 chunks, of which 2 are reserved so far. */
    assert_rc(kvp_store_init(&s, POOL_BASE, 4 * CHUNK, 2 * CHUNK), 0);
    make_key(key, 1);
    assert_rc(kvp_store_adopt(&s, POOL_BASE, key, CHUNK, 1), 0);
    /* Overlaps: the same pages, or one of them; the same key elsewhere. */
    make_key(key, 2);
    assert_rc(kvp_store_adopt(&s, POOL_BASE, key, CHUNK, 2), -EEXIST);
    assert_rc(kvp_store_adopt(&s, POOL_BASE + PG, key, CHUNK, 2), -EEXIST);
    make_key(key, 1);
    assert_rc(kvp_store_adopt(&s, POOL_BASE + CHUNK, key, CHUNK, 1), -EEXIST);
    /* Beyond the reserved part, beyond the pool, lengths that overflow. */
    make_key(key, 3);
    assert_rc(kvp_store_adopt(&s, POOL_BASE + 2 * CHUNK, key, CHUNK, 3), -ERANGE);
    assert_rc(kvp_store_adopt(&s, POOL_BASE + CHUNK, key, 2 * CHUNK, 3), -ERANGE);
    assert_rc(kvp_store_adopt(&s, POOL_BASE + 64 * CHUNK, key, CHUNK, 3), -ERANGE);
    assert_rc(kvp_store_adopt(&s, POOL_BASE + CHUNK, key, UINT64_MAX - PG, 3), -ERANGE);
    /* Not the start of a pool page, before the pool, nothing. */
    assert_rc(kvp_store_adopt(&s, POOL_BASE + CHUNK + 8, key, CHUNK, 3), -EINVAL);
    assert_rc(kvp_store_adopt(&s, 0, key, CHUNK, 3), -EINVAL);
    assert_rc(kvp_store_adopt(&s, POOL_BASE + CHUNK, key, 0, 3), -EINVAL);
    /* Nothing of the refusals stayed: one object, its pages. */
    struct kvp_store_gauges g = gauges(&s);
    assert_int_equal(g.committed, 1);
    assert_int_equal(g.pool_used, CHUNK);
    assert_int_equal(g.unverified, 1);
    assert_int_equal(g.indexed, 0); /* no index: nothing recorded */
    /* Once the warm-up reserved more, the pages beyond are adoptable. */
    kvp_store_extend(&s, 4 * CHUNK);
    assert_rc(kvp_store_adopt(&s, POOL_BASE + 2 * CHUNK, key, CHUNK, 3), 0);
    assert_true(present(&s, 3));
    kvp_store_destroy(&s);
}

/* The verdicts: verified once and counted once; dropped at once, its record first, its pages
 * at its last unpin. */
static void test_verify_and_drop(void **state)
{
    (void)state;
    struct kvp_store s;
    struct tindex t;
    uint8_t keys[2 * KVP_KEY_SIZE];
    uint32_t ids[] = {40, 41};
    struct kvp_obj *o[2], *again;
    struct prep p;

    assert_rc(kvp_store_init(&s, POOL_BASE, 4 * CHUNK, 4 * CHUNK), 0);
    tindex_init(&t, &s, 4 * CHUNK);
    keys_of(keys, ids, 2);
    for (unsigned i = 0; i < 2; i++) {
        assert_rc(kvp_widx_seal(t.base, i * 2, keys + i * KVP_KEY_SIZE, CHUNK, 7, 1), 0);
        assert_rc(kvp_store_adopt(&s, POOL_BASE + i * CHUNK, keys + i * KVP_KEY_SIZE, CHUNK, 7), 0);
    }
    uint64_t verified = counter("warm_restart_verified_chunks");
    uint64_t corrupt = counter("warm_restart_corrupt_chunks");

    assert_int_equal(kvp_store_pin(&s, keys, 2, o), 2);
    assert_true(kvp_obj_unverified(o[0]));
    assert_true(kvp_store_verified(&s, o[0], true));
    assert_false(kvp_obj_unverified(o[0]));
    assert_false(kvp_store_verified(&s, o[0], true)); /* once */
    assert_int_equal(counter("warm_restart_verified_chunks"), verified + 1);

    /* A second pinner of the bad one. */
    assert_int_equal(kvp_store_pin(&s, keys + KVP_KEY_SIZE, 1, &again), 1);
    assert_true(again == o[1]);
    assert_true(kvp_store_verified(&s, o[1], false));
    assert_false(kvp_store_verified(&s, again, false)); /* already dropped */
    assert_false(kvp_store_verified(&s, again, true));  /* and never verified after */
    assert_int_equal(counter("warm_restart_corrupt_chunks"), corrupt + 1);
    /* Gone from lookups and from the index at once; its pages used until the last unpin. */
    assert_int_equal(kvp_store_lookup(&s, keys, 2), 1);
    assert_false(recorded(&t, 2));
    assert_true(recorded(&t, 0));
    struct kvp_store_gauges g = gauges(&s);
    assert_int_equal(g.committed, 1);
    assert_int_equal(g.unverified, 0);
    assert_int_equal(g.pool_used, 2 * CHUNK);
    assert_int_equal(g.indexed, 1);
    kvp_store_unpin(&s, o, 2);
    assert_int_equal(gauges(&s).pool_used, 2 * CHUNK);
    assert_int_equal(gauges(&s).pinned, 1);
    kvp_store_unpin(&s, &again, 1);
    g = gauges(&s);
    assert_int_equal(g.pool_used, CHUNK);
    assert_int_equal(g.pinned, 0);
    expect_clears_before_free(&t);

    /* The key is free for a new store, which may land on the dropped one's pages. */
    prepare(&s, &ids[1], 1, 0, &p);
    assert_int_equal(p.res.busy + p.res.cached, 0);
    assert_int_equal(p.res.nslots, 1);
    assert_rc(kvp_store_commit_sealed(&s, p.objs, 1), 1);
    assert_int_equal(kvp_store_lookup(&s, keys, 2), 2);
    kvp_store_destroy(&s);
    free(t.base);
}

/* ---- through the operations ---- */

#define C 16u                        /* tokens per chunk */
#define OPOOL (1u << 20)             /* 1 MiB: 128 chunks of 8 KiB */
#define OCHUNK (2u * 2 * C * 64 * 2) /* K and V, 2 layers, hidden 64, float16 */

static char msg[KVP_MAX_ERRMSG + 1];
#define M msg, sizeof(msg)

struct core {
    struct kvp_server *s;
    struct tindex t;
};

/* A daemon core without sockets over a heap segment and a heap index (as test_ops.c's). With
 * from (another core), the segment's and the index's bytes are a copy of from's, and the index's
 * records are adopted into the store: a restart after a crash. */
static void core_new(struct core *c, const struct core *from)
{
    struct kvp_server *s = calloc(1, sizeof(*s));
    assert_non_null(s);
    kvp_log_threshold = KVP_LOG_ERROR;
    kvp_config_defaults(&s->cfg);
    s->cfg.chunk_tokens = C;
    s->cfg.l1_size = OPOOL;
    s->seg = (struct kvp_segment)KVP_SEGMENT_INIT;
    s->seg.size = KVP_SEG_HEADER + OPOOL;
    s->seg.base = calloc(1, s->seg.size);
    s->seg.shared = true;
    assert_non_null(s->seg.base);
    assert_rc(kvp_store_init(&s->store, KVP_SEG_HEADER, OPOOL, OPOOL), 0);
    struct kvp_offer offer = {.shm_enabled = true,
                              .shm_name = "",
                              .shm_reason = "",
                              .pool_size = OPOOL,
                              .chunk_tokens = C};
    kvp_registry_init(&s->registry, &offer);
    kvp_owners_init(&s->owners);
    c->s = s;
    tindex_init(&c->t, &s->store, OPOOL);
    if (!from)
        return;
    memcpy(s->seg.base, from->s->seg.base, s->seg.size);
    memcpy(c->t.base, from->t.base, c->t.len);
    struct seen v = scan(&c->t);
    for (unsigned i = 0; i < v.n; i++) {
        const struct kvp_widx_record *r = (const void *)(c->t.base + KVP_WIDX_HEADER +
                                                         v.page[i] * KVP_WIDX_RECORD);
        assert_rc(kvp_store_adopt(&s->store, KVP_SEG_HEADER + v.page[i] * PG, r->key, r->length,
                                  r->data_sum),
                  0);
    }
}

static void core_free(struct core *c)
{
    kvp_owners_destroy(&c->s->owners);
    kvp_registry_destroy(&c->s->registry);
    kvp_store_destroy(&c->s->store);
    free(c->s->seg.base);
    free(c->s);
    free(c->t.base);
}

static uint32_t reg(struct kvp_owner *o)
{
    struct kvp_reg_spec q;
    struct kvp_registration inst;
    bool existing = true;
    memset(&q, 0, sizeof(q));
    snprintf(q.instance_id, sizeof(q.instance_id), "warm");
    snprintf(q.model_name, sizeof(q.model_name), "warm-model");
    snprintf(q.dtype, sizeof(q.dtype), "float16");
    q.world_size = 1;
    q.block_size = 16;
    q.num_layers = 2;
    q.hidden_dim = 64;
    q.transport = KVP_REG_SHM;
    assert_rc(kvp_op_register(o, &q, NULL, &inst, &existing, M), 0);
    assert_int_equal(inst.layout.bytes, OCHUNK);
    return inst.handle;
}

static uint8_t toks[16 * C * 4];
static struct kvp_key_src tokens(uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++)
            toks[i * 4 + (uint32_t)b] = (uint8_t)((7000u + i) >> (8 * b));
    return (struct kvp_key_src){.tokens_le = toks, .ntokens = n, .start = 0, .end = n};
}

/* Commits through shared memory: chunk i's bytes are 0x40 + i. Returns the slots' offsets. */
static void store_chunks(struct kvp_owner *o, uint32_t h, uint32_t n, uint64_t *offs)
{
    struct kvp_key_src src = tokens(n * C);
    struct kvp_op_slots res;
    assert_rc(kvp_op_prepare_store(o, h, &src, &res, M), 0);
    assert_int_equal(res.nslots, n);
    for (uint32_t i = 0; i < n; i++) {
        memset(o->srv->seg.base + res.objs[i]->offset, 0x40 + (int)res.idx[i], OCHUNK);
        offs[res.idx[i]] = res.objs[i]->offset;
    }
    assert_rc(kvp_op_commit_store(o, h, res.id, KVP_VIA_SHM, M), (int)n);
}

/* A core that stored 3 chunks, and a second one that adopted them ("restart"), with a byte of
 * chunk bad flipped in the second's segment. */
static void restarted(struct core *a, struct core *b, uint64_t offs[3], uint32_t bad)
{
    struct kvp_owner o;
    core_new(a, NULL);
    kvp_owner_init(&o, a->s, "kvpool", 1, 1);
    store_chunks(&o, reg(&o), 3, offs);
    kvp_owner_destroy(&o);

    /* Each record carries the checksum of its chunk's bytes. */
    struct seen v = scan(&a->t);
    assert_int_equal(v.n, 3);
    for (unsigned i = 0; i < v.n; i++)
        assert_int_equal(v.sum[i],
                         kvp_widx_data_sum(a->s->seg.base + KVP_SEG_HEADER + v.page[i] * PG,
                                           OCHUNK));
    core_new(b, a);
    assert_int_equal(kvp_store_unverified(&b->s->store), 3);
    b->s->seg.base[offs[bad] + OCHUNK / 2] ^= 0x10;
}

static void test_ops_flipped_byte_prepare_retrieve(void **state)
{
    (void)state;
    struct core a, b;
    struct kvp_owner o;
    struct kvp_op_slots res;
    uint64_t offs[3];

    restarted(&a, &b, offs, 1);
    uint64_t verified = counter("warm_restart_verified_chunks");
    uint64_t corrupt = counter("warm_restart_corrupt_chunks");
    kvp_owner_init(&o, b.s, "kvpool", 2, 1);
    uint32_t h = reg(&o);
    struct kvp_key_src src = tokens(3 * C);
    /* A lookup still sees all three: nothing was read yet. */
    assert_rc(kvp_op_lookup(&o, h, &src, 0, &res, M), 0);
    assert_int_equal(res.cached, 3);

    src = tokens(3 * C);
    assert_rc(kvp_op_prepare_retrieve(&o, h, &src, &res, M), 0);
    assert_int_equal(res.nslots, 1); /* the good run before the bad chunk */
    assert_int_equal(res.objs[0]->offset, offs[0]);
    assert_int_equal(counter("warm_restart_verified_chunks"), verified + 1);
    assert_int_equal(counter("warm_restart_corrupt_chunks"), corrupt + 1);
    /* Chunk 2 was pinned after the bad one: unpinned unread, still to verify. */
    assert_int_equal(kvp_store_unverified(&b.s->store), 1);
    assert_int_equal(gauges(&b.s->store).pinned, 1);
    assert_rc(kvp_op_commit_retrieve(&o, h, res.id, M), 1);
    assert_int_equal(gauges(&b.s->store).pinned, 0);

    /* The bad chunk is gone for everybody, its record too; the pages are free again. */
    src = tokens(3 * C);
    assert_rc(kvp_op_lookup(&o, h, &src, 0, &res, M), 0);
    assert_int_equal(res.cached, 1);
    assert_false(recorded(&b.t, page_of(offs[1]))); /* POOL_BASE is KVP_SEG_HEADER */
    assert_int_equal(gauges(&b.s->store).pool_used, 2 * OCHUNK);
    assert_int_equal(counter("warm_restart_corrupt_chunks"), corrupt + 1);
    kvp_owner_destroy(&o);
    core_free(&a);
    core_free(&b);
}

static void test_ops_flipped_byte_inline_and_pinning_lookup(void **state)
{
    (void)state;
    struct core a, b;
    struct kvp_owner o;
    struct kvp_op_slots res;
    uint64_t offs[3];

    /* The inline retrieve: the first chunk is bad, nothing is sent. */
    restarted(&a, &b, offs, 0);
    uint64_t corrupt = counter("warm_restart_corrupt_chunks");
    kvp_owner_init(&o, b.s, "kvpool", 2, 1);
    uint32_t h = reg(&o);
    struct kvp_key_src src = tokens(3 * C);
    assert_rc(kvp_op_retrieve_inline_begin(&o, h, &src, &res, M), 0);
    assert_int_equal(res.nslots, 0);
    kvp_op_retrieve_inline_end(&o, h, &res, true);
    assert_int_equal(counter("warm_restart_corrupt_chunks"), corrupt + 1);
    assert_int_equal(gauges(&b.s->store).pinned, 0);
    kvp_owner_destroy(&o);
    core_free(&a);
    core_free(&b);

    /* The pinning lookup (LMCache's retrieves): the last chunk is bad, two are pinned; the
     * good ones are verified, and served as such by the next retrieve without a new check. */
    restarted(&a, &b, offs, 2);
    uint64_t verified = counter("warm_restart_verified_chunks");
    kvp_owner_init(&o, b.s, "lmcache", -1, 0);
    h = reg(&o);
    src = tokens(3 * C);
    assert_rc(kvp_op_lookup(&o, h, &src, KVP_LOOKUP_PIN, &res, M), 0);
    assert_int_equal(res.cached, 2);
    assert_int_equal(res.nslots, 2);
    assert_int_equal(counter("warm_restart_verified_chunks"), verified + 2);
    assert_int_equal(counter("warm_restart_corrupt_chunks"), corrupt + 2);
    assert_int_equal(kvp_store_unverified(&b.s->store), 0);
    assert_rc(kvp_op_commit_retrieve(&o, h, res.id, M), 2);
    src = tokens(3 * C);
    assert_rc(kvp_op_retrieve_inline_begin(&o, h, &src, &res, M), 0);
    assert_int_equal(res.nslots, 2);
    for (uint32_t i = 0; i < 2; i++)
        assert_int_equal(((uint8_t *)res.iov[i].iov_base)[0], 0x40 + i);
    kvp_op_retrieve_inline_end(&o, h, &res, true);
    assert_int_equal(counter("warm_restart_verified_chunks"), verified + 2);
    kvp_owner_destroy(&o);
    core_free(&a);
    core_free(&b);
}

/* Without an index a commit computes no checksum: the slot's sum stays 0. */
static void test_ops_no_index_no_sum(void **state)
{
    (void)state;
    struct core a;
    struct kvp_owner o;
    uint64_t offs[3];

    core_new(&a, NULL);
    kvp_store_set_index(&a.s->store, NULL);
    assert_false(kvp_store_indexed(&a.s->store));
    kvp_owner_init(&o, a.s, "kvpool", 1, 1);
    store_chunks(&o, reg(&o), 3, offs);
    assert_int_equal(scan(&a.t).n, 0);
    /* A committed object of the three: the most recent on the LRU list. */
    const struct kvp_obj *obj = a.s->store.lru.next;
    assert_int_equal(obj->state, KVP_OBJ_COMMITTED);
    assert_int_equal(obj->sum, 0);
    assert_int_equal(gauges(&a.s->store).indexed, 0);
    kvp_owner_destroy(&o);
    core_free(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_commit_seals),
        cmocka_unit_test(test_evict_clears_before_reuse),
        cmocka_unit_test(test_clear_clears_records),
        cmocka_unit_test(test_adopt_lru_order),
        cmocka_unit_test(test_adopt_refusals),
        cmocka_unit_test(test_verify_and_drop),
        cmocka_unit_test(test_ops_flipped_byte_prepare_retrieve),
        cmocka_unit_test(test_ops_flipped_byte_inline_and_pinning_lookup),
        cmocka_unit_test(test_ops_no_index_no_sum),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
