/*
 * test_store.c - the object store (src/server/core/store.h): reservation, commit, abort, lookup,
 * pins, LRU eviction and expiry of reservations.
 *
 * Every case builds a small store whose pool holds a known number of chunks, so that "full" and
 * "which object was evicted" are exact. Keys are 32-byte arrays derived from an index; pool usage
 * and object counts are read back through kvp_store_get_gauges().
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_assert.h"
#include "core/store.h"

#define PG ((uint64_t)KVP_POOL_PAGE)
#define CHUNK (2 * PG) /* bytes of one object */
#define POOL_BASE PG   /* the pool starts after the segment's header page */
#define MAXK 16

/* Key number i: distinct first 8 bytes (the bucket hash) and distinct tails. */
static void make_key(uint8_t *k, uint32_t i)
{
    memset(k, (int)(0xa5 ^ i), KVP_KEY_SIZE);
    memcpy(k, &i, sizeof(i));
}

/* Keys ids[0..n) packed one after another, as the store expects them. */
static uint8_t *keys_of(uint8_t *buf, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        make_key(buf + (size_t)i * KVP_KEY_SIZE, ids[i]);
    return buf;
}

/* A store whose pool holds exactly nchunks objects of CHUNK bytes. */
static void init_store(struct kvp_store *s, uint32_t nchunks)
{
    assert_rc(kvp_store_init(s, POOL_BASE, nchunks * CHUNK, nchunks * CHUNK), 0);
}

static struct kvp_store_gauges gauges(struct kvp_store *s)
{
    struct kvp_store_gauges g;
    kvp_store_get_gauges(s, &g);
    return g;
}

/* One prepare call, with results. */
struct prep {
    struct kvp_obj *objs[MAXK];
    uint32_t idx[MAXK];
    struct kvp_prepare_result res;
};

static void prepare(struct kvp_store *s, const uint32_t *ids, uint32_t n, uint64_t now,
                    struct prep *p)
{
    uint8_t keys[MAXK * KVP_KEY_SIZE];
    assert_true(n <= MAXK);
    memset(p, 0, sizeof(*p));
    assert_rc(kvp_store_prepare(s, keys_of(keys, ids, n), n, CHUNK, now, p->objs, p->idx, &p->res),
              0);
    /* Every chunk is accounted for exactly once. */
    assert_int_equal(p->res.cached + p->res.busy + p->res.no_space + p->res.nslots, n);
}

static void expect_result(const struct prep *p, uint32_t cached, uint32_t busy, uint32_t no_space,
                          uint32_t nslots)
{
    if (p->res.cached != cached || p->res.busy != busy || p->res.no_space != no_space ||
        p->res.nslots != nslots)
        fail_msg("prepare: cached %u busy %u no_space %u nslots %u, expected %u %u %u %u",
                 p->res.cached, p->res.busy, p->res.no_space, p->res.nslots, cached, busy, no_space,
                 nslots);
}

static uint32_t lookup(struct kvp_store *s, const uint32_t *ids, uint32_t n)
{
    uint8_t keys[MAXK * KVP_KEY_SIZE];
    assert_true(n <= MAXK);
    return kvp_store_lookup(s, keys_of(keys, ids, n), n);
}

static bool present(struct kvp_store *s, uint32_t id)
{
    return lookup(s, &id, 1) == 1;
}

/* Prepares and commits ids one by one, so that ids[n-1] is the most recently used. Records
 * each object's offset in offs[i] when offs is not NULL. */
static void store_each(struct kvp_store *s, const uint32_t *ids, uint32_t n, uint64_t *offs)
{
    for (uint32_t i = 0; i < n; i++) {
        struct prep p;
        prepare(s, &ids[i], 1, 0, &p);
        expect_result(&p, 0, 0, 0, 1);
        if (offs)
            offs[i] = p.objs[0]->offset;
        assert_rc(kvp_store_commit(s, p.objs, 1), 1);
    }
}

static void test_prepare_reserves_new_keys(void **state)
{
    (void)state;
    struct kvp_store s;
    init_store(&s, 8);
    struct prep p;
    const uint32_t ids[] = {10, 11, 12};

    prepare(&s, ids, 3, 1000, &p);
    expect_result(&p, 0, 0, 0, 3);
    for (uint32_t k = 0; k < 3; k++) {
        uint8_t key[KVP_KEY_SIZE];
        make_key(key, ids[k]);
        assert_int_equal(p.idx[k], k);
        assert_non_null(p.objs[k]);
        assert_memory_equal(p.objs[k]->key, key, KVP_KEY_SIZE);
        assert_int_equal(p.objs[k]->length, CHUNK);
        assert_int_equal(p.objs[k]->state, KVP_OBJ_RESERVED);
        assert_int_equal(p.objs[k]->reserved_at_ms, 1000);
        /* Inside the pool, which starts at POOL_BASE. */
        assert_true(p.objs[k]->offset >= POOL_BASE);
        assert_true(p.objs[k]->offset + CHUNK <= POOL_BASE + 8 * CHUNK);
        for (uint32_t j = 0; j < k; j++)
            assert_int_not_equal(p.objs[k]->offset, p.objs[j]->offset);
    }
    struct kvp_store_gauges g = gauges(&s);
    assert_int_equal(g.pool_size, 8 * CHUNK);
    assert_int_equal(g.pool_used, 3 * CHUNK);
    assert_int_equal(g.reserved, 3);
    assert_int_equal(g.committed, 0);
    kvp_store_destroy(&s);
}

static void test_prepare_reports_cached(void **state)
{
    (void)state;
    struct kvp_store s;
    init_store(&s, 8);
    struct prep p;
    const uint32_t first[] = {1, 2};
    prepare(&s, first, 2, 0, &p);
    assert_rc(kvp_store_commit(&s, p.objs, 2), 2);

    /* Chunks 0 and 2 are cached; only chunks 1 and 3 get slots, with their positions. */
    const uint32_t ids[] = {1, 5, 2, 6};
    prepare(&s, ids, 4, 0, &p);
    expect_result(&p, 2, 0, 0, 2);
    assert_int_equal(p.idx[0], 1);
    assert_int_equal(p.idx[1], 3);
    struct kvp_store_gauges g = gauges(&s);
    assert_int_equal(g.committed, 2);
    assert_int_equal(g.reserved, 2);
    assert_int_equal(g.pool_used, 4 * CHUNK);
    kvp_store_destroy(&s);
}

static void test_reserved_invisible_until_commit(void **state)
{
    (void)state;
    struct kvp_store s;
    init_store(&s, 8);
    struct prep p;
    const uint32_t ids[] = {1, 2, 3};
    uint8_t keys[3 * KVP_KEY_SIZE];
    struct kvp_obj *pinned[3];

    prepare(&s, ids, 3, 0, &p);
    expect_result(&p, 0, 0, 0, 3);
    assert_int_equal(lookup(&s, ids, 3), 0);
    assert_int_equal(kvp_store_pin(&s, keys_of(keys, ids, 3), 3, pinned), 0);
    assert_int_equal(gauges(&s).pinned, 0);

    assert_rc(kvp_store_commit(&s, p.objs, 3), 3);
    for (uint32_t k = 0; k < 3; k++)
        assert_int_equal(p.objs[k]->state, KVP_OBJ_COMMITTED);
    assert_int_equal(lookup(&s, ids, 3), 3);
    assert_int_equal(kvp_store_pin(&s, keys, 3, pinned), 3);
    for (uint32_t k = 0; k < 3; k++) {
        assert_ptr_equal(pinned[k], p.objs[k]);
        assert_int_equal(pinned[k]->pins, 1);
    }
    struct kvp_store_gauges g = gauges(&s);
    assert_int_equal(g.committed, 3);
    assert_int_equal(g.reserved, 0);
    assert_int_equal(g.pinned, 3);
    kvp_store_unpin(&s, pinned, 3);
    assert_int_equal(gauges(&s).pinned, 0);

    /* A committed key is now cached for other stores. */
    prepare(&s, ids, 3, 0, &p);
    expect_result(&p, 3, 0, 0, 0);
    kvp_store_destroy(&s);
}

static void test_abort_frees_space(void **state)
{
    (void)state;
    struct kvp_store s;
    init_store(&s, 8);
    struct prep p;
    const uint32_t old[] = {100};
    store_each(&s, old, 1, NULL);
    struct kvp_store_gauges base = gauges(&s);
    assert_int_equal(base.pool_used, CHUNK);

    const uint32_t ids[] = {1, 2, 3};
    prepare(&s, ids, 3, 0, &p);
    expect_result(&p, 0, 0, 0, 3);
    assert_int_equal(gauges(&s).pool_used, base.pool_used + 3 * CHUNK);

    assert_int_equal(kvp_store_abort(&s, p.objs, 3), 3);
    struct kvp_store_gauges g = gauges(&s);
    assert_int_equal(g.pool_used, base.pool_used);
    assert_int_equal(g.largest_free, base.largest_free);
    assert_int_equal(g.reserved, 0);
    assert_int_equal(g.committed, 1);
    assert_int_equal(lookup(&s, ids, 3), 0);

    /* The keys are free again: a new prepare reserves them (not busy). */
    prepare(&s, ids, 3, 0, &p);
    expect_result(&p, 0, 0, 0, 3);
    kvp_store_destroy(&s);
}

static void test_busy_while_reserved(void **state)
{
    (void)state;
    struct kvp_store s;
    init_store(&s, 8);
    struct prep a, b;
    const uint32_t ida[] = {1, 2};
    const uint32_t idb[] = {1, 2, 3};

    prepare(&s, ida, 2, 0, &a);
    expect_result(&a, 0, 0, 0, 2);
    prepare(&s, idb, 3, 0, &b);
    expect_result(&b, 0, 2, 0, 1);
    assert_int_equal(b.idx[0], 2);
    assert_int_equal(gauges(&s).reserved, 3);

    /* The same key twice in one request: the second occurrence is busy. */
    const uint32_t dup[] = {7, 7};
    struct prep c;
    prepare(&s, dup, 2, 0, &c);
    expect_result(&c, 0, 1, 0, 1);
    assert_int_equal(c.idx[0], 0);

    /* Once the first store commits, its keys are cached, not busy. */
    assert_rc(kvp_store_commit(&s, a.objs, 2), 2);
    struct prep d;
    prepare(&s, idb, 3, 0, &d);
    expect_result(&d, 2, 1, 0, 0);
    kvp_store_destroy(&s);
}

static void test_lru_eviction_order(void **state)
{
    (void)state;
    struct kvp_store s;
    uint64_t offs[4];
    init_store(&s, 4);
    const uint32_t ids[] = {0, 1, 2, 3};
    store_each(&s, ids, 4, offs); /* recency, oldest first: 0 1 2 3 */
    struct kvp_store_gauges g = gauges(&s);
    assert_int_equal(g.pool_used, g.pool_size);
    assert_int_equal(g.committed, 4);

    /* Touch 0 with a lookup: recency 1 2 3 0. */
    const uint32_t k0[] = {0};
    assert_int_equal(lookup(&s, k0, 1), 1);

    /* Object 1 is now the least recently used: it is evicted and its space reused. */
    struct prep p;
    const uint32_t k4[] = {4};
    prepare(&s, k4, 1, 0, &p);
    expect_result(&p, 0, 0, 0, 1);
    assert_int_equal(p.objs[0]->offset, offs[1]);
    assert_rc(kvp_store_commit(&s, p.objs, 1), 1); /* recency 2 3 0 4 */
    assert_int_equal(gauges(&s).committed, 4);

    /* A cached hit in prepare refreshes recency too: prepare [2] -> recency 3 0 4 2. */
    const uint32_t k2[] = {2};
    prepare(&s, k2, 1, 0, &p);
    expect_result(&p, 1, 0, 0, 0);

    /* Two more chunks evict 3, then 0, and reuse their space. */
    const uint32_t k56[] = {5, 6};
    prepare(&s, k56, 2, 0, &p);
    expect_result(&p, 0, 0, 0, 2);
    assert_int_equal(p.objs[0]->offset, offs[3]);
    assert_int_equal(p.objs[1]->offset, offs[0]);
    assert_rc(kvp_store_commit(&s, p.objs, 2), 2);

    assert_false(present(&s, 1));
    assert_false(present(&s, 3));
    assert_false(present(&s, 0));
    assert_true(present(&s, 2));
    assert_true(present(&s, 4));
    assert_true(present(&s, 5));
    assert_true(present(&s, 6));
    assert_int_equal(gauges(&s).committed, 4);
    kvp_store_destroy(&s);
}

static void test_reserved_objects_not_evicted(void **state)
{
    (void)state;
    struct kvp_store s;
    init_store(&s, 3);
    struct prep a, b;
    const uint32_t ida[] = {1, 2, 3};
    prepare(&s, ida, 3, 0, &a);
    expect_result(&a, 0, 0, 0, 3);

    /* The pool is full of reservations: nothing is evictable. */
    const uint32_t idb[] = {4};
    prepare(&s, idb, 1, 0, &b);
    expect_result(&b, 0, 0, 1, 0);
    assert_int_equal(gauges(&s).reserved, 3);
    assert_rc(kvp_store_commit(&s, a.objs, 3), 3);
    assert_int_equal(lookup(&s, ida, 3), 3);
    kvp_store_destroy(&s);
}

static void test_pinned_never_evicted(void **state)
{
    (void)state;
    struct kvp_store s;
    uint64_t offs[4];
    init_store(&s, 4);
    const uint32_t ids[] = {0, 1, 2, 3};
    uint8_t keys[4 * KVP_KEY_SIZE];
    struct kvp_obj *pinned[4];
    store_each(&s, ids, 4, offs);

    /* Pin 0 and 1, then touch 2 and 3: recency 0 1 2 3, so 0 and 1 are the least recently
     * used objects, but pinned. */
    assert_int_equal(kvp_store_pin(&s, keys_of(keys, ids, 2), 2, pinned), 2);
    assert_int_equal(gauges(&s).pinned, 2);
    assert_int_equal(lookup(&s, ids + 2, 2), 2);

    /* Two new chunks skip the pinned objects and evict 2 and 3. */
    struct prep p;
    const uint32_t k45[] = {4, 5};
    prepare(&s, k45, 2, 0, &p);
    expect_result(&p, 0, 0, 0, 2);
    assert_int_equal(p.objs[0]->offset, offs[2]);
    assert_int_equal(p.objs[1]->offset, offs[3]);
    assert_rc(kvp_store_commit(&s, p.objs, 2), 2);
    assert_false(present(&s, 2));
    assert_false(present(&s, 3));

    /* Pin the rest: everything is pinned, so no new chunk finds space. */
    struct kvp_obj *pinned2[2];
    assert_int_equal(kvp_store_pin(&s, keys_of(keys, k45, 2), 2, pinned2), 2);
    assert_int_equal(gauges(&s).pinned, 4);
    const uint32_t k678[] = {6, 7, 8};
    prepare(&s, k678, 3, 0, &p);
    expect_result(&p, 0, 0, 3, 0);
    struct kvp_store_gauges g = gauges(&s);
    assert_int_equal(g.committed, 4);
    assert_int_equal(g.reserved, 0);
    assert_int_equal(g.pool_used, g.pool_size);
    const uint32_t all[] = {0, 1, 4, 5};
    assert_int_equal(lookup(&s, all, 4), 4);

    /* Unpinning object 0 makes it (alone) evictable: exactly one chunk fits, and every chunk
     * after the first that found no space counts as no_space. */
    kvp_store_unpin(&s, pinned, 1);
    assert_int_equal(gauges(&s).pinned, 3);
    prepare(&s, k678, 3, 0, &p);
    expect_result(&p, 0, 0, 2, 1);
    assert_int_equal(p.idx[0], 0);
    assert_int_equal(p.objs[0]->offset, offs[0]);
    assert_false(present(&s, 0));
    assert_true(present(&s, 1));
    assert_true(present(&s, 4));
    assert_true(present(&s, 5));
    kvp_store_unpin(&s, pinned + 1, 1);
    kvp_store_unpin(&s, pinned2, 2);
    assert_int_equal(gauges(&s).pinned, 0);
    kvp_store_destroy(&s);
}

static void test_nested_pins(void **state)
{
    (void)state;
    struct kvp_store s;
    init_store(&s, 1);
    const uint32_t k0[] = {0};
    uint8_t key[KVP_KEY_SIZE];
    struct kvp_obj *a, *b;
    store_each(&s, k0, 1, NULL);
    make_key(key, 0);

    /* Two readers pin the same object; it stays until both have unpinned. */
    assert_int_equal(kvp_store_pin(&s, key, 1, &a), 1);
    assert_int_equal(kvp_store_pin(&s, key, 1, &b), 1);
    assert_ptr_equal(a, b);
    assert_int_equal(gauges(&s).pinned, 1);
    kvp_store_unpin(&s, &a, 1);
    assert_int_equal(gauges(&s).pinned, 1);

    struct prep p;
    const uint32_t k1[] = {1};
    prepare(&s, k1, 1, 0, &p);
    expect_result(&p, 0, 0, 1, 0);
    kvp_store_unpin(&s, &b, 1);
    assert_int_equal(gauges(&s).pinned, 0);
    prepare(&s, k1, 1, 0, &p);
    expect_result(&p, 0, 0, 0, 1);
    assert_false(present(&s, 0));
    kvp_store_destroy(&s);
}

static void test_expire_then_commit(void **state)
{
    (void)state;
    struct kvp_store s;
    init_store(&s, 8);
    struct prep old, fresh;
    const uint32_t ids[] = {1, 2};

    prepare(&s, ids, 2, 1000, &old);
    expect_result(&old, 0, 0, 0, 2);

    /* Not old enough yet. */
    assert_int_equal(kvp_store_expire(&s, 1500, 1000), 0);
    assert_int_equal(gauges(&s).reserved, 2);

    assert_int_equal(kvp_store_expire(&s, 2500, 1000), 2);
    struct kvp_store_gauges g = gauges(&s);
    assert_int_equal(g.reserved, 0);
    assert_int_equal(g.expired, 2);
    /* The memory stays with the late writer. */
    assert_int_equal(g.pool_used, 2 * CHUNK);
    /* Expiring again finds nothing new. */
    assert_int_equal(kvp_store_expire(&s, 9000, 1000), 0);

    /* The keys are free for a new store (not busy). */
    prepare(&s, ids, 2, 2500, &fresh);
    expect_result(&fresh, 0, 0, 0, 2);
    for (uint32_t k = 0; k < 2; k++)
        for (uint32_t j = 0; j < 2; j++)
            assert_int_not_equal(fresh.objs[k]->offset, old.objs[j]->offset);
    assert_int_equal(gauges(&s).pool_used, 4 * CHUNK);

    /* The late commit fails and frees the old memory; nothing of it becomes visible. */
    assert_rc(kvp_store_commit(&s, old.objs, 2), -ETIMEDOUT);
    g = gauges(&s);
    assert_int_equal(g.expired, 0);
    assert_int_equal(g.committed, 0);
    assert_int_equal(g.reserved, 2);
    assert_int_equal(g.pool_used, 2 * CHUNK);
    assert_int_equal(lookup(&s, ids, 2), 0);

    /* The new reservation is unaffected. */
    assert_rc(kvp_store_commit(&s, fresh.objs, 2), 2);
    assert_int_equal(lookup(&s, ids, 2), 2);
    kvp_store_destroy(&s);
}

static void test_expire_then_abort(void **state)
{
    (void)state;
    struct kvp_store s;
    init_store(&s, 8);
    struct kvp_store_gauges base = gauges(&s);
    struct prep p;
    const uint32_t ids[] = {1, 2, 3};

    prepare(&s, ids, 3, 0, &p);
    assert_int_equal(kvp_store_expire(&s, 600000, 600000), 3);
    assert_int_equal(gauges(&s).expired, 3);
    /* Nothing was still reserved: the expiry already counted them. */
    assert_int_equal(kvp_store_abort(&s, p.objs, 3), 0);
    struct kvp_store_gauges g = gauges(&s);
    assert_int_equal(g.expired, 0);
    assert_int_equal(g.reserved, 0);
    assert_int_equal(g.pool_used, base.pool_used);
    assert_int_equal(g.largest_free, base.largest_free);
    kvp_store_destroy(&s);
}

static void test_expire_only_old_reservations(void **state)
{
    (void)state;
    struct kvp_store s;
    init_store(&s, 8);
    struct prep a, b, c;
    const uint32_t ida[] = {1}, idb[] = {2}, idc[] = {3};

    prepare(&s, ida, 1, 0, &a);
    prepare(&s, idb, 1, 5000, &b);
    prepare(&s, idc, 1, 0, &c);
    assert_rc(kvp_store_commit(&s, c.objs, 1), 1);

    /* At t=6000 with a 2000 ms timeout only a (reserved at 0) is too old; the committed c is
     * never expired. */
    assert_int_equal(kvp_store_expire(&s, 6000, 2000), 1);
    assert_int_equal(a.objs[0]->state, KVP_OBJ_EXPIRED);
    assert_int_equal(b.objs[0]->state, KVP_OBJ_RESERVED);
    assert_true(present(&s, 3));

    /* Commit is all or nothing: one expired object drops the whole set. */
    struct kvp_obj *both[2] = {a.objs[0], b.objs[0]};
    assert_rc(kvp_store_commit(&s, both, 2), -ETIMEDOUT);
    struct kvp_store_gauges g = gauges(&s);
    assert_int_equal(g.reserved, 0);
    assert_int_equal(g.expired, 0);
    assert_int_equal(g.committed, 1);
    assert_int_equal(g.pool_used, CHUNK);
    assert_false(present(&s, 2));
    /* Key 2 was dropped from the index too: a new store is not busy. */
    struct prep d;
    prepare(&s, idb, 1, 6000, &d);
    expect_result(&d, 0, 0, 0, 1);
    kvp_store_destroy(&s);
}

/*
 * The expiry pass reads the clock before it waits for the store lock, so a prepare can reserve
 * with a later clock than the pass holds. Such a reservation is new, never expired (the
 * difference must not wrap around).
 */
static void test_expire_reservation_newer_than_clock(void **state)
{
    (void)state;
    struct kvp_store s;
    init_store(&s, 8);
    struct prep p;
    const uint32_t ids[] = {1, 2};

    prepare(&s, ids, 2, 700000, &p);
    assert_int_equal(kvp_store_expire(&s, 699999, 600000), 0);
    assert_int_equal(p.objs[0]->state, KVP_OBJ_RESERVED);
    assert_int_equal(gauges(&s).reserved, 2);
    assert_rc(kvp_store_commit(&s, p.objs, 2), 2);
    assert_int_equal(lookup(&s, ids, 2), 2);
    kvp_store_destroy(&s);
}

static void test_lookup_leading_run(void **state)
{
    (void)state;
    struct kvp_store s;
    init_store(&s, 8);
    const uint32_t have[] = {0, 1, 3, 4};
    store_each(&s, have, 4, NULL);

    const uint32_t seq[] = {0, 1, 2, 3, 4};
    assert_int_equal(lookup(&s, seq, 5), 2);
    assert_int_equal(lookup(&s, seq + 2, 3), 0);
    assert_int_equal(lookup(&s, seq + 3, 2), 2);
    assert_int_equal(lookup(&s, seq, 0), 0);

    /* A reservation in the gap does not fill it. */
    struct prep p;
    prepare(&s, seq + 2, 1, 0, &p);
    expect_result(&p, 0, 0, 0, 1);
    assert_int_equal(lookup(&s, seq, 5), 2);

    /* Pin stops at the same place. */
    uint8_t keys[5 * KVP_KEY_SIZE];
    struct kvp_obj *pinned[5];
    assert_int_equal(kvp_store_pin(&s, keys_of(keys, seq, 5), 5, pinned), 2);
    kvp_store_unpin(&s, pinned, 2);

    /* Once the gap is committed the whole run is visible. */
    assert_rc(kvp_store_commit(&s, p.objs, 1), 1);
    assert_int_equal(lookup(&s, seq, 5), 5);
    kvp_store_destroy(&s);
}

/*
 * A chunk that prepare reports as cached must survive that same prepare: the worker skips it,
 * so evicting it to make room for a later chunk would leave the sequence with a hole.
 */
static void test_cached_chunk_not_evicted_by_same_request(void **state)
{
    (void)state;
    struct kvp_store s;
    init_store(&s, 2);
    const uint32_t old[] = {9, 0};
    store_each(&s, old, 2, NULL); /* 9 is the LRU victim, then 0 */

    const uint32_t seq[] = {0, 1, 2};
    struct prep p;
    prepare(&s, seq, 3, 0, &p);
    /* 0 cached; 1 gets 9's space; 2 has nowhere to go but 0, which is protected. */
    expect_result(&p, 1, 0, 1, 1);
    assert_int_equal(p.idx[0], 1);
    assert_true(present(&s, 0));
    assert_false(present(&s, 9));
    assert_rc(kvp_store_commit(&s, p.objs, 1), 1);
    assert_int_equal(lookup(&s, seq, 3), 2);
    kvp_store_destroy(&s);
}

/* CLEAR frees committed, unpinned objects only: pinned ones stay visible, reservations stay
 * reserved and can still be committed. */
/*
 * A clear of many objects lets the lock go every slice, as an evicting prepare does: the lock is
 * taken again during the clear (counted, not timed: 50,000 objects take far longer than a
 * slice on any machine), and everything is still dropped.
 */
static void test_clear_is_sliced(void **state)
{
    (void)state;
    enum { N = 50000 };
    struct kvp_store s;
    struct kvp_clear_result r;
    uint32_t *ids = malloc(N * sizeof(*ids));
    assert_non_null(ids);
    for (uint32_t i = 0; i < N; i++)
        ids[i] = i;
    init_store(&s, N);
    store_each(&s, ids, N, NULL);
    unsigned long long before = atomic_load(&s.acquired);
    kvp_store_clear(&s, &r);
    assert_true(atomic_load(&s.acquired) - before > 1);
    assert_int_equal(r.dropped, N);
    assert_int_equal(r.bytes, (uint64_t)N * CHUNK);
    struct kvp_store_gauges g = gauges(&s);
    assert_int_equal(g.committed, 0);
    assert_int_equal(g.pool_used, 0);
    free(ids);
    kvp_store_destroy(&s);
}

static void test_clear_keeps_pinned_and_reserved(void **state)
{
    (void)state;
    struct kvp_store s;
    init_store(&s, 8);
    const uint32_t ids[] = {0, 1, 2, 3, 4};
    uint8_t keys[2 * KVP_KEY_SIZE];
    struct kvp_obj *pinned[2];
    struct kvp_clear_result r;
    store_each(&s, ids, 5, NULL);
    const uint32_t pin_ids[] = {1, 3};
    assert_int_equal(kvp_store_pin(&s, keys_of(keys, pin_ids, 1), 1, pinned), 1);
    assert_int_equal(kvp_store_pin(&s, keys_of(keys, pin_ids + 1, 1), 1, pinned + 1), 1);
    struct prep p;
    const uint32_t k7[] = {7};
    prepare(&s, k7, 1, 0, &p);
    expect_result(&p, 0, 0, 0, 1);

    kvp_store_clear(&s, &r);
    assert_int_equal(r.dropped, 3);
    assert_int_equal(r.bytes, 3 * CHUNK);
    assert_int_equal(r.pinned, 2);
    struct kvp_store_gauges g = gauges(&s);
    assert_int_equal(g.committed, 2);
    assert_int_equal(g.pinned, 2);
    assert_int_equal(g.reserved, 1);
    assert_int_equal(g.pool_used, 3 * CHUNK);
    assert_false(present(&s, 0));
    assert_true(present(&s, 1));
    assert_false(present(&s, 2));
    assert_true(present(&s, 3));
    assert_false(present(&s, 4));
    assert_false(present(&s, 7));
    assert_rc(kvp_store_commit(&s, p.objs, 1), 1);
    assert_true(present(&s, 7));

    /* Once unpinned, the survivors go with the next clear; an empty store clears nothing. */
    kvp_store_unpin(&s, pinned, 2);
    kvp_store_clear(&s, &r);
    assert_int_equal(r.dropped, 3);
    assert_int_equal(r.pinned, 0);
    kvp_store_clear(&s, &r);
    assert_int_equal(r.dropped, 0);
    g = gauges(&s);
    assert_int_equal(g.committed, 0);
    assert_int_equal(g.pool_used, 0);
    /* The freed space is usable again. */
    const uint32_t all8[] = {10, 11, 12, 13, 14, 15, 16, 17};
    prepare(&s, all8, 8, 0, &p);
    expect_result(&p, 0, 0, 0, 8);
    kvp_store_abort(&s, p.objs, 8);
    kvp_store_destroy(&s);
}

/* A clear of what was reserved before a moment keeps what was stored since, however recently
 * each was used, and the walk ends although the kept objects go to the LRU's front. */
static void test_clear_older(void **state)
{
    (void)state;
    struct kvp_store s;
    struct kvp_clear_result r;
    struct prep p;
    init_store(&s, 8);
    const uint32_t old_ids[] = {0, 1, 2}, new_ids[] = {3, 4};
    store_each(&s, old_ids, 3, NULL); /* reserved at 0 */
    for (uint32_t i = 0; i < 2; i++) {
        prepare(&s, &new_ids[i], 1, 500, &p);
        assert_rc(kvp_store_commit(&s, p.objs, 1), 1);
    }
    /* The old ones used last: the walk meets the new ones first. */
    assert_true(present(&s, 0) && present(&s, 1) && present(&s, 2));

    kvp_store_clear_older(&s, 500, &r);
    assert_int_equal(r.dropped, 3);
    assert_int_equal(r.bytes, 3 * CHUNK);
    for (uint32_t id = 0; id < 3; id++)
        assert_false(present(&s, id));
    assert_true(present(&s, 3) && present(&s, 4));
    assert_int_equal(gauges(&s).committed, 2);
    /* Nothing left that old: a second one drops nothing; a plain clear drops the rest. */
    kvp_store_clear_older(&s, 500, &r);
    assert_int_equal(r.dropped, 0);
    kvp_store_clear(&s, &r);
    assert_int_equal(r.dropped, 2);
    kvp_store_destroy(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prepare_reserves_new_keys),
        cmocka_unit_test(test_prepare_reports_cached),
        cmocka_unit_test(test_reserved_invisible_until_commit),
        cmocka_unit_test(test_abort_frees_space),
        cmocka_unit_test(test_busy_while_reserved),
        cmocka_unit_test(test_lru_eviction_order),
        cmocka_unit_test(test_reserved_objects_not_evicted),
        cmocka_unit_test(test_pinned_never_evicted),
        cmocka_unit_test(test_nested_pins),
        cmocka_unit_test(test_expire_then_commit),
        cmocka_unit_test(test_expire_then_abort),
        cmocka_unit_test(test_expire_only_old_reservations),
        cmocka_unit_test(test_expire_reservation_newer_than_clock),
        cmocka_unit_test(test_lookup_leading_run),
        cmocka_unit_test(test_cached_chunk_not_evicted_by_same_request),
        cmocka_unit_test(test_clear_keeps_pinned_and_reserved),
        cmocka_unit_test(test_clear_is_sliced),
        cmocka_unit_test(test_clear_older),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
