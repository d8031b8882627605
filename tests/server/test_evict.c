/*
 * test_evict.c - the store's targeted eviction over a fragmented pool (src/server/core/store.c):
 * which window of objects a chunk of another size evicts, that pinned and guarded objects are
 * never part of it, that a chunk that cannot get space is refused at once, and that the cost of
 * a large chunk over a pool of one-page objects is bounded, counted in allocator steps
 * (kvp_store_alloc_steps), never timed.
 *
 * A randomized case then mixes chunk sizes, pins, lookups, aborts and clears over a small pool
 * and checks the store's accounting after every step against what the test keeps: every object
 * it holds pinned is still there, used pages equal the committed and reserved objects' pages,
 * and nothing overlaps.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_assert.h"
#include "core/store.h"

#define PG ((uint64_t)KVP_POOL_PAGE)
#define BASE PG /* the pool starts after the segment's header page */

static void make_key(uint8_t *k, uint32_t i)
{
    memset(k, (int)(0x5a ^ i), KVP_KEY_SIZE);
    memcpy(k, &i, sizeof(i));
}

static void init_pages(struct kvp_store *s, uint64_t npages)
{
    assert_rc(kvp_store_init(s, BASE, npages * PG, npages * PG), 0);
}

static struct kvp_store_gauges gauges(struct kvp_store *s)
{
    struct kvp_store_gauges g;
    kvp_store_get_gauges(s, &g);
    return g;
}

/* Prepares key id as one chunk of pages pages. Returns the object, or NULL for no space. */
static struct kvp_obj *reserve(struct kvp_store *s, uint32_t id, uint64_t pages)
{
    uint8_t key[KVP_KEY_SIZE];
    struct kvp_obj *obj[1];
    uint32_t idx[1];
    struct kvp_prepare_result r;
    make_key(key, id);
    assert_rc(kvp_store_prepare(s, key, 1, pages * PG, 0, obj, idx, &r), 0);
    assert_int_equal(r.cached + r.busy, 0);
    return r.nslots ? obj[0] : NULL;
}

/* Stores key id as one committed chunk of pages pages; returns its first page. */
static uint64_t put(struct kvp_store *s, uint32_t id, uint64_t pages)
{
    struct kvp_obj *o = reserve(s, id, pages);
    if (!o)
        fail_msg("no space for key %u (%llu pages)", id, (unsigned long long)pages);
    uint64_t page = (o->offset - BASE) / PG;
    assert_rc(kvp_store_commit(s, &o, 1), 1);
    return page;
}

static bool present(struct kvp_store *s, uint32_t id)
{
    uint8_t key[KVP_KEY_SIZE];
    make_key(key, id);
    return kvp_store_lookup(s, key, 1) == 1;
}

static struct kvp_obj *pin(struct kvp_store *s, uint32_t id)
{
    uint8_t key[KVP_KEY_SIZE];
    struct kvp_obj *o = NULL;
    make_key(key, id);
    assert_int_equal(kvp_store_pin(s, key, 1, &o), 1);
    return o;
}

/* Eight one-page objects 0..7 at pages 0..7, then lookups that make the recency, oldest first,
 * 2 3 0 1 4 6 7 5. */
static void eight_pages(struct kvp_store *s)
{
    init_pages(s, 8);
    for (uint32_t i = 0; i < 8; i++)
        assert_int_equal(put(s, i, 1), i);
    static const uint32_t touch[] = {0, 1, 4, 6, 7, 5};
    for (size_t i = 0; i < sizeof(touch) / sizeof(touch[0]); i++)
        assert_true(present(s, touch[i]));
}

/* A two-page chunk takes the oldest object (2) and its older neighbour (3, not 1): exactly the
 * two least recently used, as a byte LRU would. */
static void test_window_takes_older_neighbour(void **state)
{
    (void)state;
    struct kvp_store s;
    eight_pages(&s);
    struct kvp_obj *o = reserve(&s, 100, 2);
    assert_non_null(o);
    assert_int_equal((o->offset - BASE) / PG, 2);
    assert_rc(kvp_store_commit(&s, &o, 1), 1);
    static const bool kept[8] = {true, true, false, false, true, true, true, true};
    for (uint32_t i = 0; i < 8; i++)
        assert_int_equal(present(&s, i), kept[i]);
    assert_int_equal(gauges(&s).committed, 7);
    kvp_store_destroy(&s);
}

/* With 3 pinned, the window around 2 can only grow left: 1 and 2 go, 3 stays. */
static void test_window_skips_pinned(void **state)
{
    (void)state;
    struct kvp_store s;
    eight_pages(&s);
    struct kvp_obj *p3 = pin(&s, 3);
    struct kvp_obj *o = reserve(&s, 100, 2);
    assert_non_null(o);
    assert_int_equal((o->offset - BASE) / PG, 1);
    assert_rc(kvp_store_commit(&s, &o, 1), 1);
    assert_true(present(&s, 3));
    assert_false(present(&s, 1));
    assert_false(present(&s, 2));
    assert_true(present(&s, 0));
    kvp_store_unpin(&s, &p3, 1);
    kvp_store_destroy(&s);
}

/* A chunk smaller than the oldest object takes that object's first pages; the rest is free. */
static void test_small_chunk_in_larger_victim(void **state)
{
    (void)state;
    struct kvp_store s;
    init_pages(&s, 8);
    assert_int_equal(put(&s, 0, 4), 0); /* oldest */
    assert_int_equal(put(&s, 1, 4), 4);
    struct kvp_obj *o = reserve(&s, 2, 2);
    assert_non_null(o);
    assert_int_equal((o->offset - BASE) / PG, 0);
    assert_false(present(&s, 0));
    assert_true(present(&s, 1));
    assert_int_equal(gauges(&s).pool_used, 6 * PG);
    assert_int_equal(gauges(&s).largest_free, 2 * PG);
    kvp_store_abort(&s, &o, 1);
    kvp_store_destroy(&s);
}

/* A chunk larger than any free run whose neighbours are all pinned: pins split the pool into
 * one-page holes, so no window can be planned; nothing is evicted. */
static void test_pinned_split_pool_refuses(void **state)
{
    (void)state;
    struct kvp_store s;
    struct kvp_obj *pins[32];
    init_pages(&s, 64);
    for (uint32_t i = 0; i < 64; i++)
        put(&s, i, 1);
    for (uint32_t i = 0; i < 32; i++)
        pins[i] = pin(&s, 2 * i + 1); /* every odd page */
    uint64_t before = kvp_store_alloc_steps(&s);
    assert_null(reserve(&s, 100, 2));
    uint64_t steps = kvp_store_alloc_steps(&s) - before;
    /* Bounded by the candidates tried (16), whatever the pool holds. */
    if (steps > 64)
        fail_msg("refusing took %llu steps", (unsigned long long)steps);
    assert_int_equal(gauges(&s).committed, 64);
    /* One page still fits: the oldest even object goes. */
    assert_non_null(reserve(&s, 101, 1));
    assert_false(present(&s, 0));
    for (uint32_t i = 0; i < 32; i++)
        kvp_store_unpin(&s, &pins[i], 1);
    kvp_store_destroy(&s);
}

/*
 * A reservation that could only be satisfied by evicting pinned chunks fails with ENOSPC at
 * once: free and evictable pages together are too few, which the store knows without looking
 * at any object (one step: the allocator's root). The same holds for a pool 16 times larger.
 */
static void check_enospc_at_once(uint64_t npages)
{
    struct kvp_store s;
    struct kvp_obj **pins = calloc(npages, sizeof(*pins));
    assert_non_null(pins);
    init_pages(&s, npages);
    for (uint32_t i = 0; i < npages; i++)
        put(&s, i, 1);
    for (uint32_t i = 1; i < npages; i++)
        pins[i] = pin(&s, i); /* all but page 0 */
    uint64_t before = kvp_store_alloc_steps(&s);
    assert_null(reserve(&s, (uint32_t)npages, 2));
    assert_int_equal(kvp_store_alloc_steps(&s) - before, 1);
    assert_true(present(&s, 0));
    assert_int_equal(gauges(&s).pinned, npages - 1);
    for (uint32_t i = 1; i < npages; i++)
        kvp_store_unpin(&s, &pins[i], 1);
    kvp_store_destroy(&s);
    free(pins);
}

static void test_enospc_at_once_when_pinned(void **state)
{
    (void)state;
    check_enospc_at_once(256);
    check_enospc_at_once(4096);
}

/*
 * The case that used to stall every worker: a pool full of one-page chunks whose LRU order does
 * not follow their addresses (lookups refresh every other one), then one 8 MiB (2048-page)
 * chunk. It must get its space (evicting at least 2048 objects), and the steps it takes must
 * not grow with the pool: the old allocator rescanned the bitmap from page 0 after each of the
 * 2048 evictions (millions of steps at 64K pages, quadrupling with each doubling).
 */
/* A store of npages one-page chunks, every other one refreshed (LRU order != addresses). */
static void fill_fragmented(struct kvp_store *s, uint64_t npages)
{
    init_pages(s, npages);
    for (uint32_t i = 0; i < npages; i++)
        put(s, i, 1);
    for (uint32_t i = 0; i < npages; i += 2)
        assert_true(present(s, i));
}

static uint64_t steps_of_large_prepare(uint64_t npages, uint64_t need)
{
    struct kvp_store s;
    fill_fragmented(&s, npages);
    uint64_t before = kvp_store_alloc_steps(&s);
    struct kvp_obj *o = reserve(&s, (uint32_t)npages, need);
    uint64_t steps = kvp_store_alloc_steps(&s) - before;
    assert_non_null(o);
    assert_int_equal(gauges(&s).committed, npages - need);
    /* The chunk's own pages are not in any object that is still there. */
    assert_int_equal(gauges(&s).pool_used, npages * PG);
    assert_rc(kvp_store_commit(&s, &o, 1), 1);
    kvp_store_destroy(&s);
    return steps;
}

static void test_large_prepare_over_fragmented_pool(void **state)
{
    (void)state;
    const uint64_t need = 2048;
    uint64_t small = steps_of_large_prepare(16384, need);
    uint64_t large = steps_of_large_prepare(65536, need);
    /* Planning (two windows' worth), the victims, the words of the window: a few per page. */
    if (small > 6 * need + 200 || large > 6 * need + 200 || large > small + small / 8)
        fail_msg("an 8 MiB prepare took %llu steps over 16K pages and %llu over 64K pages",
                 (unsigned long long)small, (unsigned long long)large);
}

/*
 * No hold is long, planning included: with the slice at zero, a hold ends at every eighth point
 * where one may (as it would after 100 us on a real clock), and the most steps taken in one hold
 * stay a handful, though planning the 2048-page window alone takes thousands (counted, never
 * timed). A window planned across a let-go lock is checked when it is evicted, so the prepare
 * still gets its space and leaves the store consistent.
 */
static void test_large_prepare_holds_are_short(void **state)
{
    (void)state;
    const uint64_t npages = 16384, need = 2048;
    struct kvp_store s;
    fill_fragmented(&s, npages);
    s.slice_ns = 0;
    s.max_hold_steps = 0;
    struct kvp_obj *o = reserve(&s, (uint32_t)npages, need);
    assert_non_null(o);
    if (s.max_hold_steps > 64)
        fail_msg("a hold took %llu allocator steps", (unsigned long long)s.max_hold_steps);
    assert_int_equal(gauges(&s).committed, npages - need);
    assert_int_equal(gauges(&s).pool_used, npages * PG);
    assert_rc(kvp_store_commit(&s, &o, 1), 1);
    kvp_store_destroy(&s);
}

/* A chunk that another prepare's cached answer protects: a later chunk of the same request
 * cannot take it even when its neighbours alone are too small. */
static void test_guarded_object_not_in_window(void **state)
{
    (void)state;
    struct kvp_store s;
    init_pages(&s, 4);
    put(&s, 0, 2); /* pages 0-1, oldest */
    put(&s, 1, 2); /* pages 2-3 */
    uint8_t keys[2 * KVP_KEY_SIZE];
    struct kvp_obj *objs[2];
    uint32_t idx[2];
    struct kvp_prepare_result r;
    make_key(keys, 0);
    make_key(keys + KVP_KEY_SIZE, 7);
    /* Key 0 is cached (and refreshed); key 7 needs 4 pages: only with 0's, which it may not. */
    assert_rc(kvp_store_prepare(&s, keys, 2, 4 * PG, 0, objs, idx, &r), 0);
    assert_int_equal(r.cached, 1);
    assert_int_equal(r.no_space, 1);
    assert_true(present(&s, 0));
    /* The guard ends with the request: now 4 pages can be had. */
    make_key(keys, 8);
    assert_rc(kvp_store_prepare(&s, keys, 1, 4 * PG, 0, objs, idx, &r), 0);
    assert_int_equal(r.nslots, 1);
    assert_false(present(&s, 0));
    assert_false(present(&s, 1));
    kvp_store_abort(&s, objs, 1);
    kvp_store_destroy(&s);
}

/* ---- randomized mix of sizes, pins and lookups against the test's own books ---- */

static uint64_t rng_state;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

#define RKEYS 400

struct book {
    struct kvp_obj *pinned[RKEYS]; /* held pins, one per key at most */
    struct kvp_obj *reserved[RKEYS];
};

/* Every pinned or reserved object is where it was, nothing overlaps, and the pool's used
 * pages are exactly the live objects' pages (a window's claim never outlives its prepare). */
static void check_books(struct kvp_store *s, const struct book *b, uint64_t npages, int step)
{
    uint8_t *owner = calloc(npages, 1);
    uint64_t pages = 0, nobj = 0;
    assert_non_null(owner);
    pthread_mutex_lock(&s->lock);
    struct kvp_obj *heads[] = {&s->lru, &s->held, &s->pending};
    for (size_t h = 0; h < 3; h++) {
        for (struct kvp_obj *o = heads[h]->next; o != heads[h]; o = o->next) {
            uint64_t f = (o->offset - BASE) / PG, n = (o->length + PG - 1) / PG;
            for (uint64_t i = f; i < f + n; i++) {
                if (owner[i])
                    fail_msg("step %d: page %llu is in two objects", step, (unsigned long long)i);
                owner[i] = 1;
            }
            pages += n;
            nobj++;
            if (h == 0 && (o->pins || o->guard))
                fail_msg("step %d: a pinned object is on the LRU list", step);
        }
    }
    if (pages * PG != kvp_pool_used(&s->pool))
        fail_msg("step %d: objects hold %llu pages, the pool says %llu used", step,
                 (unsigned long long)pages, (unsigned long long)(kvp_pool_used(&s->pool) / PG));
    assert_int_equal(nobj, s->ncommitted + s->nreserved + s->nexpired);
    pthread_mutex_unlock(&s->lock);
    for (uint32_t k = 0; k < RKEYS; k++) {
        if (b->pinned[k] && b->pinned[k]->state != KVP_OBJ_COMMITTED)
            fail_msg("step %d: pinned key %u is gone", step, k);
    }
    free(owner);
}

static void test_random_mixed_sizes(void **state)
{
    (void)state;
    const uint64_t npages = 512;
    static const uint64_t sizes[] = {1, 1, 2, 3, 4, 8, 16, 33, 64, 100};
    struct kvp_store s;
    struct book b;
    memset(&b, 0, sizeof(b));
    init_pages(&s, npages);
    rng_state = 0x243f6a8885a308d3ull;

    for (int step = 0; step < 20000; step++) {
        uint32_t k = (uint32_t)(rng() % RKEYS);
        /* Chunk sizes drift: the mix changes every 4000 steps. */
        uint64_t pages = sizes[(rng() % 5 + (uint64_t)step / 4000) % 10];
        int op = (int)(rng() % 100);
        uint8_t key[KVP_KEY_SIZE];
        make_key(key, k);
        if (op < 50 && !b.reserved[k]) {
            struct kvp_obj *o[1];
            uint32_t idx[1];
            struct kvp_prepare_result r;
            assert_rc(kvp_store_prepare(&s, key, 1, pages * PG, 0, o, idx, &r), 0);
            if (r.nslots) {
                if (rng() % 4)
                    assert_rc(kvp_store_commit(&s, o, 1), 1);
                else
                    b.reserved[k] = o[0];
            }
        } else if (op < 60 && b.reserved[k]) {
            if (rng() % 2)
                assert_rc(kvp_store_commit(&s, &b.reserved[k], 1), 1);
            else
                assert_int_equal(kvp_store_abort(&s, &b.reserved[k], 1), 1);
            b.reserved[k] = NULL;
        } else if (op < 75) {
            if (b.pinned[k]) {
                kvp_store_unpin(&s, &b.pinned[k], 1);
                b.pinned[k] = NULL;
            } else if (rng() % 3 == 0) {
                kvp_store_pin(&s, key, 1, &b.pinned[k]);
            }
        } else if (op < 99) {
            kvp_store_lookup(&s, key, 1);
        } else {
            struct kvp_clear_result cr;
            kvp_store_clear(&s, &cr);
        }
        check_books(&s, &b, npages, step);
    }
    for (uint32_t k = 0; k < RKEYS; k++) {
        if (b.pinned[k])
            kvp_store_unpin(&s, &b.pinned[k], 1);
        if (b.reserved[k])
            kvp_store_abort(&s, &b.reserved[k], 1);
    }
    assert_int_equal(gauges(&s).pinned, 0);
    assert_int_equal(gauges(&s).reserved, 0);
    kvp_store_destroy(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_takes_older_neighbour),
        cmocka_unit_test(test_window_skips_pinned),
        cmocka_unit_test(test_small_chunk_in_larger_victim),
        cmocka_unit_test(test_pinned_split_pool_refuses),
        cmocka_unit_test(test_enospc_at_once_when_pinned),
        cmocka_unit_test(test_large_prepare_over_fragmented_pool),
        cmocka_unit_test(test_large_prepare_holds_are_short),
        cmocka_unit_test(test_guarded_object_not_in_window),
        cmocka_unit_test(test_random_mixed_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
