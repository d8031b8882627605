/*
 * test_warm_hostile.c - a pool that was written to after its daemon died, as any process of the
 * daemon's uid could (a worker maps the pool read-write): the next kvpoold adopts only what
 * validates and never serves a wrong byte.
 *
 *   - Chunk bytes, one damaged chunk per sequence so that the first read reaching it finds it:
 *     random bytes (the first chunk of an shm sequence), every byte + 1 (an inline one), one bit
 *     (the last 1 MiB chunk of a sequence), the bytes of another stored chunk (plausible, of the
 *     wrong key). Each retrieve serves exactly the chunks before the damaged one, byte-exact,
 *     and the damaged ones are counted once (warm_restart_corrupt_chunks), however often read.
 *   - Index records (their layout: src/server/core/warm_index.h): a key byte, a length, two
 *     records swapped (each sealed for the other's page), a seal cleared, the recency clock
 *     changed (outside the seal: still adopted). The adoption line says "dropped 4: 4 bad seal,
 *     0 out of range, 0 overlap", the status the same, and lookups find exactly the chunks
 *     before the first dropped record.
 *   - Each field of the index header in turn, then random bytes anywhere in its first 64 KiB:
 *     the daemon starts (adopting or refusing, at most one line of either), serves only exact
 *     bytes, stores and stops cleanly.
 *
 *   - A worker that prepared a store before the crash and writes its slots after the new
 *     daemon started, before its own next call (which would detach its old mapping): the pages
 *     of that plan were never committed, so the new daemon gives them to another worker's
 *     chunks; those must still be served byte-exact (a cold restart gets this for free: its
 *     segment is a new file).
 *
 * Every chunk's page is found from the sealed records and the pool's bytes (each stored chunk
 * must have exactly one). KVPOOL_WARM_SEED replays the random part (the seed is printed).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/seg_header.h"
#include "warm_fixture.h"

#define C KVPW_C

/* ---------------------------------------------------------------------------------------- */
/* (e) Hostile contents                                                                      */

/* Where each chunk of the data set lies: its page, found by its bytes. */
struct placed {
    uint32_t seq, chunk;
    int inst;
    uint64_t page;
    size_t bytes;
};

#define MAX_PLACED 64

/*
 * Finds the page of every chunk of the data set from the index's sealed records and the pool's
 * bytes, as anyone who can map both can. Fails when a committed chunk has no sealed record, or
 * two.
 */
static size_t place_data_set(const struct kvpw_map *pool, const struct kvpw_map *idx,
                             struct placed *out)
{
    const struct kvp_widx_header *h = kvpw_widx_header(idx);
    size_t n = 0;
    assert_int_equal(h->page_size, 4096);
    for (size_t s = 0; s < KVPW_NDATA; s++) {
        for (uint32_t c = 0; c < kvpw_data_set[s].n; c++) {
            size_t bytes = kvpw_data_set[s].inst == 2 ? KVPW_BIG : KVPW_SMALL;
            uint8_t *want = malloc(bytes);
            assert_non_null(want);
            kvpt_fill(want, bytes, kvpw_data_set[s].seq, c);
            int found = 0;
            for (uint64_t p = 0; p < h->npages; p++) {
                const struct kvp_widx_record *r = kvpw_widx_record(idx, p);
                size_t off = KVP_SEG_HEADER + (size_t)p * h->page_size;
                if (r->seal == 0 || r->length != bytes || off + bytes > pool->len ||
                    memcmp(pool->p + off, want, bytes) != 0)
                    continue;
                assert_true(n < MAX_PLACED);
                out[n++] = (struct placed){kvpw_data_set[s].seq, c, kvpw_data_set[s].inst, p,
                                           bytes};
                found++;
            }
            free(want);
            if (found != 1)
                fail_msg("chunk %u of sequence %u has %d sealed records", c, kvpw_data_set[s].seq,
                         found);
        }
    }
    return n;
}

static const struct placed *find_placed(const struct placed *pl, size_t n, uint32_t seq,
                                        uint32_t chunk)
{
    for (size_t i = 0; i < n; i++)
        if (pl[i].seq == seq && pl[i].chunk == chunk)
            return &pl[i];
    fail_msg("chunk %u of sequence %u was not placed", chunk, seq);
    return NULL;
}

static uint8_t *chunk_bytes(const struct kvpw_map *pool, const struct placed *p)
{
    return pool->p + KVP_SEG_HEADER + (size_t)p->page * 4096;
}

/*
 * Retrieves every sequence of the data set and checks what comes back: exactly the chunks
 * before the first damaged one (first[s], n when none), byte-exact; a lookup afterwards finds
 * no more than that.
 */
static void check_served(const struct kvpw_workers *w, const uint32_t *first)
{
    for (size_t s = 0; s < KVPW_NDATA; s++) {
        kvp_instance *inst = kvpw_inst(w, kvpw_data_set[s].inst);
        uint32_t n = kvpw_data_set[s].n, seq = kvpw_data_set[s].seq;
        size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
        uint32_t *tok = kvpt_tokens(seq, n * C);
        kvp_tokens t = {.ids = tok, .count = n * C};
        void *bufs[16];
        assert_true(n <= 16);
        for (uint32_t i = 0; i < n; i++) {
            bufs[i] = calloc(1, bytes);
            assert_non_null(bufs[i]);
        }
        int got = kvp_retrieve(inst, &t, 0, n * C, bufs);
        if (got < 0)
            fail_msg("retrieve of sequence %u: %s: %s", seq, kvp_strerror(got),
                     kvp_last_error(w->c));
        for (int i = 0; i < got; i++)
            if (!kvpt_check(bufs[i], bytes, seq, (uint32_t)i))
                fail_msg("chunk %d of sequence %u was served with wrong bytes", i, seq);
        if ((uint32_t)got != first[s])
            fail_msg("retrieve of sequence %u served %d chunks, expected the %u before the "
                     "first damaged one",
                     seq, got, first[s]);
        int hit = kvp_lookup(inst, &t);
        assert_true(hit >= 0 && hit <= (int)first[s]);
        for (uint32_t i = 0; i < n; i++)
            free(bufs[i]);
        free(tok);
    }
}

static void test_hostile_chunks_and_records(void **state)
{
    (void)state;
    struct kvpt_daemon *d = kvpw_fresh_daemon();
    struct kvpw_workers w;
    struct placed pl[MAX_PLACED];
    struct kvpw_map pool, idx;
    char name[96], line[2048];

    kvpt_daemon_start(d, kvpw_args64);
    kvpw_widx_name(d->socket, name, sizeof(name));
    kvpw_workers_open(d, &w);
    kvpw_store_data_set(&w);
    /* Two more sequences for the record damage, stored in their own calls. */
    static const uint32_t rec_seq[] = {105, 106, 107, 108};
    for (int i = 0; i < 4; i++)
        assert_int_equal(kvpt_store_seq(w.shm, rec_seq[i], 3), 3);
    assert_int_equal(kvpt_daemon_signal_wait(d, SIGKILL), 128 + SIGKILL);

    kvpw_map_shm(d->shm_name, &pool);
    kvpw_map_shm(name, &idx);
    size_t np = place_data_set(&pool, &idx, pl);
    assert_int_equal(np, kvpw_data_set_chunks());
    /* The records of the sequences 105-108 (3 chunks of 8 KiB each), found the same way. */
    uint64_t rec_page[4][3];
    const struct kvp_widx_header *h = kvpw_widx_header(&idx);
    for (int i = 0; i < 4; i++) {
        for (uint32_t c = 0; c < 3; c++) {
            uint8_t want[KVPW_SMALL];
            kvpt_fill(want, KVPW_SMALL, rec_seq[i], c);
            int found = 0;
            for (uint64_t p = 0; p < h->npages; p++)
                if (kvpw_widx_record(&idx, p)->seal &&
                    memcmp(pool.p + KVP_SEG_HEADER + p * 4096, want, KVPW_SMALL) == 0) {
                    rec_page[i][c] = p;
                    found++;
                }
            assert_int_equal(found, 1);
        }
    }

    /* Chunk bytes, as a worker with the mapping could write them: one damaged chunk per
     * sequence, so that each is found by the first read that reaches it. */
    uint8_t *b;
    b = chunk_bytes(&pool, find_placed(pl, np, 101, 0)); /* shm, first chunk: random */
    for (size_t i = 0; i < KVPW_SMALL; i++)
        b[i] = (uint8_t)rand();
    b = chunk_bytes(&pool, find_placed(pl, np, 102, 2)); /* inline, middle: +1 */
    for (size_t i = 0; i < KVPW_SMALL; i++)
        b[i]++;
    b = chunk_bytes(&pool, find_placed(pl, np, 103, 3)); /* 1 MiB, last chunk: one bit */
    b[KVPW_BIG / 2 + 7] ^= 0x10;
    {
        /* Sequence 104: chunk 1 gets the bytes of chunk 1 of sequence 101, which stays
         * intact: a plausible chunk, of the wrong key. */
        uint8_t *dst = chunk_bytes(&pool, find_placed(pl, np, 104, 1));
        memcpy(dst, chunk_bytes(&pool, find_placed(pl, np, 101, 1)), KVPW_SMALL);
    }
    const uint32_t first[KVPW_NDATA] = {0, 2, 3, 1};
    const uint64_t corrupt = 4;

    /* Index records. 105: a key byte of its first chunk (bad seal); 106: the length of its
     * second chunk (bad seal); 107: its first two records swapped (each sealed for the other
     * page: two bad seals); 108: its last chunk's seal cleared (an empty record: not a drop)
     * and the recency clock of its first changed (outside the seal: still adopted). */
    kvpw_widx_record(&idx, rec_page[0][0])->key[5] ^= 1;
    kvpw_widx_record(&idx, rec_page[1][1])->length += 4096;
    {
        struct kvp_widx_record tmp = *kvpw_widx_record(&idx, rec_page[2][0]);
        *kvpw_widx_record(&idx, rec_page[2][0]) = *kvpw_widx_record(&idx, rec_page[2][1]);
        *kvpw_widx_record(&idx, rec_page[2][1]) = tmp;
    }
    kvpw_widx_record(&idx, rec_page[3][2])->seal = 0;
    kvpw_widx_record(&idx, rec_page[3][0])->seq += 1000000;
    const uint32_t rec_first[4] = {0, 1, 0, 2};
    const uint64_t bad_seal = 4, empty = 1;
    kvpw_unmap_shm(&idx);
    kvpw_unmap_shm(&pool);

    kvpt_daemon_restart(d, kvpw_args64);
    int pid;
    const char *kind;
    unsigned long long chunks, bytes;
    kvpw_adopted_line(d, &pid, &kind, &chunks, &bytes, line, sizeof(line));
    print_message("%s\n", line);
    uint64_t all = kvpw_data_set_chunks() + 4 * 3;
    assert_int_equal(chunks, all - bad_seal - empty);
    char want[160];
    snprintf(want, sizeof(want), "; dropped %llu: %llu bad seal, 0 out of range, 0 overlap",
             (unsigned long long)bad_seal, (unsigned long long)bad_seal);
    if (!strstr(line, want))
        fail_msg("the adoption line does not say '%s': %s", want, line);
    assert_int_equal(kvp_ping(w.c), 0);
    json_t *doc = kvpw_status(w.c);
    json_t *warm = kvpw_warm_of(doc);
    assert_int_equal(kvpw_jint(warm, "dropped_chunks"), bad_seal);
    assert_int_equal(kvpw_jint(json_object_get(warm, "dropped"), "bad_seal"), bad_seal);
    assert_int_equal(kvpw_jint(json_object_get(warm, "dropped"), "out_of_range"), 0);
    assert_int_equal(kvpw_jint(json_object_get(warm, "dropped"), "overlap"), 0);
    json_decref(doc);

    /* Never a wrong byte: each retrieve stops before the damaged chunk. */
    check_served(&w, first);
    for (int i = 0; i < 4; i++) {
        uint32_t *tok = kvpt_tokens(rec_seq[i], 3 * C);
        kvp_tokens t = {.ids = tok, .count = 3 * C};
        assert_int_equal(kvp_lookup(w.shm, &t), (int)rec_first[i]);
        free(tok);
        kvpt_assert_seq(w.inl, rec_seq[i], rec_first[i], 3);
    }
    assert_int_equal(kvpt_stat(w.c, "warm_restart_corrupt_chunks"), corrupt);
    /* Found once: reading them again neither serves them nor counts them again. */
    check_served(&w, first);
    assert_int_equal(kvpt_stat(w.c, "warm_restart_corrupt_chunks"), corrupt);
    uint64_t verified = kvpt_stat(w.c, "warm_restart_verified_chunks");
    uint64_t unverified = kvpt_stat(w.c, "warm_restart_unverified_chunks");
    print_message("adopted %llu: %llu verified, %llu corrupt, %llu not read\n", chunks,
                  (unsigned long long)verified, (unsigned long long)corrupt,
                  (unsigned long long)unverified);
    assert_int_equal(verified + corrupt + unverified, chunks);
    /* What was dropped can be stored again, and then is served; the rest was still there. */
    assert_int_equal(kvpt_store_seq(w.shm, 101, 8), 1);
    kvpt_assert_seq(w.inl, 101, 8, 8);
    kvp_client_close(w.c);
    kvpt_daemon_stop(d);
}

/* One run of the header damage: the index's header field at off (of len bytes) is xored with
 * pattern before the restart. The daemon must start, serve only exact bytes, and stop. */
static void header_field_run(const char *what, size_t off, size_t len, uint64_t pattern)
{
    struct kvpt_daemon *d = kvpw_fresh_daemon();
    struct kvpw_workers w;
    char name[96];
    kvpw_crashed_with_data(d);
    kvpw_widx_name(d->socket, name, sizeof(name));
    struct kvpw_map idx;
    kvpw_map_shm(name, &idx);
    for (size_t i = 0; i < len; i++)
        idx.p[off + i] ^= (uint8_t)(pattern >> (8 * (i % 8)));
    kvpw_unmap_shm(&idx);
    kvpt_daemon_restart(d, kvpw_args64);
    int adopted = kvpt_log_count(d, KVPW_ADOPTED), refused = kvpt_log_count(d, KVPW_REFUSED);
    print_message("index damaged (%s): %s\n", what,
                  adopted   ? "adopted"
                  : refused ? "refused"
                            : "neither adopted nor refused");
    assert_true(adopted + refused <= 1);
    kvpw_workers_open(d, &w);
    /* Whatever is served is exact: a lookup's chunks are retrieved byte-exact, or fewer. */
    for (size_t s = 0; s < KVPW_NDATA; s++) {
        kvp_instance *inst = kvpw_inst(&w, kvpw_data_set[s].inst);
        uint32_t n = kvpw_data_set[s].n;
        size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
        uint32_t *tok = kvpt_tokens(kvpw_data_set[s].seq, n * C);
        kvp_tokens t = {.ids = tok, .count = n * C};
        void *bufs[16];
        int hit = kvp_lookup(inst, &t);
        assert_true(hit >= 0 && hit <= (int)n);
        for (uint32_t i = 0; i < n; i++)
            bufs[i] = calloc(1, bytes);
        int got = kvp_retrieve(inst, &t, 0, n * C, bufs);
        assert_true(got >= 0 && got <= hit);
        for (int i = 0; i < got; i++)
            if (!kvpt_check(bufs[i], bytes, kvpw_data_set[s].seq, (uint32_t)i))
                fail_msg("%s damaged: chunk %d of sequence %u served with wrong bytes", what, i,
                         kvpw_data_set[s].seq);
        for (uint32_t i = 0; i < n; i++)
            free(bufs[i]);
        free(tok);
    }
    assert_int_equal(kvpt_store_seq(w.shm, 950, 2), 2);
    kvpt_assert_seq(w.inl, 950, 2, 2);
    kvp_client_close(w.c);
    kvpt_daemon_stop(d);
    assert_false(kvpt_shm_exists(name));
}

static void test_hostile_header_fields(void **state)
{
    (void)state;
#define FIELD(f, pattern)                                                     \
    header_field_run("header field " #f, offsetof(struct kvp_widx_header, f), \
                     sizeof(((struct kvp_widx_header *)0)->f), pattern)
    FIELD(magic, 0x0100000000000000ull);
    FIELD(version, 0xffffffffull);
    FIELD(header_size, 0x1000ull);
    FIELD(record_size, 0x40ull);
    FIELD(page_size, 0x1000ull);
    FIELD(npages, 0x4000ull);
    FIELD(npages, 0xffffffffff000000ull);
    FIELD(pool_bytes, 0x4000000ull);
    FIELD(identity.pool_size, 0x4000000ull);
    FIELD(identity.page_size, 0x3000ull);
    FIELD(identity.chunk_tokens, 0x30ull);
    FIELD(identity.settings_hash, 0x5a5a5a5a5a5a5a5aull);
    FIELD(generation, 0x1ull);
    FIELD(pid, 0x7fff0000ull);
    FIELD(uid, 0x12345ull);
    FIELD(flags, 0xfffffffffffffffeull);
    FIELD(segment, 0x2020202020202020ull); /* the pool segment's name it records */
#undef FIELD
}

/* Random bytes at random places of the index (the header page and the records of the pool's
 * first pages), several rounds: no crash, nothing wrong served. */
static void test_hostile_random_index(void **state)
{
    (void)state;
    for (int round = 0; round < 4; round++) {
        char what[96];
        /* The first 64 KiB: the header page and the records of the data set's pages. */
        size_t off = (size_t)rand() % (KVP_WIDX_HEADER + 16 * 4096 - 64);
        size_t len = 1 + (size_t)rand() % 64;
        uint64_t pattern = ((uint64_t)rand() << 32) ^ (uint64_t)rand() ^ 1u;
        snprintf(what, sizeof(what), "%zu random bytes at %zu, round %d", len, off, round);
        header_field_run(what, off, len, pattern);
    }
}

/*
 * A plan from before the crash, written after the restart. Worker A stores 4 chunks (pages
 * 0-7 of a fresh pool) and prepares 8 more (pages 8-23, reserved, never committed); the daemon
 * is SIGKILLed and started again: it adopts A's 4 chunks, and pages 8-23 are free. Worker B
 * stores 8 chunks: they take pages 8-23 (first fit). Then A, which has made no call since the
 * crash, copies into its stale slots, as a worker still gathering its KV into them would.
 * B's chunks must come back exact.
 */
static void test_stale_plan_written_after_restart(void **state)
{
    (void)state;
    struct kvpt_daemon *d = kvpw_fresh_daemon();
    kvpt_daemon_start(d, kvpw_args64);
    kvp_opts o = {.socket_path = d->socket, .timeout_ms = 10000};
    kvp_client *a = NULL;
    assert_int_equal(kvp_client_open(&o, &a), 0);
    kvp_instance *ai = kvpw_register(a, kvpt_layout("stale-a", KVP_TRANSPORT_SHM));
    assert_int_equal(kvpt_store_seq(ai, 300, 4), 4);
    uint32_t *tok = kvpt_tokens(301, 8 * C);
    kvp_tokens t = {.ids = tok, .count = 8 * C};
    kvp_store_plan sp;
    assert_int_equal(kvp_prepare_store(ai, &t, 0, 8 * C, &sp), 8);
    assert_int_equal(kvpt_daemon_signal_wait(d, SIGKILL), 128 + SIGKILL);
    kvpt_daemon_restart(d, kvpw_args64);
    kvpw_assert_log_count(d, KVPW_ADOPTED, 1);

    kvp_client *b = kvpt_connect(d);
    kvp_instance *bi = kvpw_register(b, kvpt_layout("stale-b", KVP_TRANSPORT_SHM));
    kvp_instance *bl = kvpw_register(b, kvpt_layout("stale-b-inline", KVP_TRANSPORT_INLINE));
    assert_int_equal(kvpt_store_seq(bi, 302, 8), 8);
    /* A, unaware of the crash, fills its slots. */
    for (uint32_t i = 0; i < sp.nslots; i++)
        memset(sp.slots[i].data, 0xab, KVPW_SMALL);
    kvpt_assert_seq(bi, 302, 8, 8);
    kvpt_assert_seq(bl, 302, 8, 8);
    kvpt_assert_seq(bl, 300, 4, 4);
    /* A's next call finds the restart; its plan is refused and publishes nothing. */
    assert_int_equal(kvp_commit_store(ai, &sp), -ESTALE);
    kvpt_assert_seq(bl, 301, 0, 8);
    kvpt_assert_seq(bl, 302, 8, 8);
    free(tok);
    kvp_client_close(a);
    kvp_client_close(b);
    kvpt_daemon_stop(d);
}

int main(void)
{
    const char *env = getenv("KVPOOL_WARM_SEED");
    unsigned seed = env && *env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
    print_message("KVPOOL_WARM_SEED=%u\n", seed);
    srand(seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_hostile_chunks_and_records, kvpw_teardown),
        cmocka_unit_test_teardown(test_hostile_header_fields, kvpw_teardown),
        cmocka_unit_test_teardown(test_hostile_random_index, kvpw_teardown),
        cmocka_unit_test_teardown(test_stale_plan_written_after_restart, kvpw_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
