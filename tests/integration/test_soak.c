/*
 * test_soak.c - random operations from several worker processes against one daemon whose pool is
 * far too small for the working set, so that eviction runs all the time.
 *
 * Every worker registers the same model and rank, so all of them share every chunk. A chunk's
 * content is a function of its key alone, so any worker can check any chunk it retrieves:
 *
 *   sequence s belongs to family f = s % FAMILIES and shares its first shared(s) chunks (1 to 3)
 *   with the other sequences of its family: their tokens come from the family, the tokens of
 *   later chunks from s itself. Chunk c of s holds kvpt_fill(seed, c) with seed = the family's
 *   for a shared chunk, s's otherwise, and a different seed under the cache salt (so a salt that
 *   did not separate keys would show up as wrong bytes).
 *
 * Workers store (one call or two-phase, committing, aborting or abandoning the reservation),
 * retrieve (one call, or through pinned shm slots, sometimes holding the pins for a while), look
 * up, unregister and re-register, disconnect and reconnect, on both transports, for
 * KVPOOL_SOAK_SECONDS (default 20) seconds. Any error, any wrong byte or any worker exit other
 * than 0 fails the test. Afterwards nothing may be reserved, pinned or registered, the pool's
 * pages must be exactly those of the committed chunks, the daemon must be the one that started
 * (same pid, one start-up line), and evictions must be > 0. KVPOOL_SOAK_SEED replays a run (the
 * seed is printed).
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define C 16
#define WORKERS 5
#define NSEQ 40
#define FAMILIES 8
#define SEQ_CHUNKS 12
#define CHUNK_BYTES 8192 /* kvpt_layout(): 2 x 2 layers x 16 tokens x 64 x float16 */

static const char salt[] = "tenant-b";

/* ---------------------------------------------------------------------------------------- */
/* The data model: tokens and content as functions of (sequence, chunk, salted).            */

static uint32_t shared_chunks(uint32_t s)
{
    return 1 + (s / FAMILIES) % 3;
}

/* Tokens of sequence s: SEQ_CHUNKS full chunks and a partial tail, which is never cached. */
static uint32_t seq_len(uint32_t s)
{
    return SEQ_CHUNKS * C + s % C;
}

static void seq_tokens(uint32_t s, uint32_t *out)
{
    uint32_t f = s % FAMILIES;
    for (uint32_t i = 0; i < seq_len(s); i++) {
        uint32_t c = i / C;
        out[i] = c < shared_chunks(s) ? 0x40000000u + f * 100000u + i
                                      : 0x80000000u + s * 100000u + i;
    }
}

static uint32_t chunk_seed(uint32_t s, uint32_t c, bool salted)
{
    uint32_t seed = c < shared_chunks(s) ? 0x10000u + s % FAMILIES : 0x20000u + s;
    return salted ? seed ^ 0x5a000000u : seed;
}

/* ---------------------------------------------------------------------------------------- */
/* Workers.                                                                                  */

struct report {
    uint64_t ops, stores, stored_chunks, retrieves, verified_chunks, lookups, reregisters,
        reconnects, abandoned, aborted;
    int failed_line;
    int failed_rc;
    char what[200];
};

struct worker {
    int id;
    uint64_t rng;
    const struct kvpt_daemon *d;
    kvp_client *c;
    kvp_instance *inst;
    uint32_t generation;
    struct report *rep;
    uint32_t tokens[SEQ_CHUNKS * C + C];
    void *bufs[SEQ_CHUNKS];
};

static uint64_t rnd(struct worker *w)
{
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return w->rng;
}

static uint32_t below(struct worker *w, uint32_t n)
{
    return (uint32_t)(rnd(w) % n);
}

#define W_FAIL(w, rc, ...)                                             \
    do {                                                               \
        (w)->rep->failed_line = __LINE__;                              \
        (w)->rep->failed_rc = (rc);                                    \
        snprintf((w)->rep->what, sizeof((w)->rep->what), __VA_ARGS__); \
        return -1;                                                     \
    } while (0)

#define W_CHECK_RC(w, rc, op)                                  \
    do {                                                       \
        if ((rc) < 0)                                          \
            W_FAIL(w, rc, "%s: %s (%s)", op, kvp_strerror(rc), \
                   (w)->c ? kvp_last_error((w)->c) : "");      \
    } while (0)

static int w_register(struct worker *w)
{
    char id[48];
    snprintf(id, sizeof(id), "soak-%d-%u", w->id, w->generation++);
    kvp_register_opts o = kvpt_layout(id, below(w, 2) ? KVP_TRANSPORT_INLINE : KVP_TRANSPORT_AUTO);
    int rc = kvp_register(w->c, &o, &w->inst);
    W_CHECK_RC(w, rc, "register");
    if (kvp_instance_get_info(w->inst)->chunk_bytes != CHUNK_BYTES)
        W_FAIL(w, 0, "chunk_bytes %llu",
               (unsigned long long)kvp_instance_get_info(w->inst)->chunk_bytes);
    return 0;
}

static int w_connect(struct worker *w)
{
    kvp_opts o = {.socket_path = w->d->socket, .timeout_ms = 15000};
    int rc = kvp_client_open(&o, &w->c);
    W_CHECK_RC(w, rc, "open");
    return w_register(w);
}

static bool on_shm(const struct worker *w)
{
    return kvp_instance_get_info(w->inst)->transport == KVP_TRANSPORT_SHM;
}

/* A random sequence and chunk range [*a, *e) of it, salted or not. */
static kvp_tokens pick(struct worker *w, uint32_t *s, uint32_t *a, uint32_t *e, bool *salted)
{
    *s = below(w, NSEQ);
    *a = below(w, SEQ_CHUNKS);
    *e = *a + 1 + below(w, SEQ_CHUNKS - *a);
    /* Mostly from the start of the sequence, as real prefixes are. */
    if (below(w, 2))
        *a = 0;
    *salted = below(w, 4) == 0;
    seq_tokens(*s, w->tokens);
    return (kvp_tokens){.ids = w->tokens,
                        .count = seq_len(*s),
                        .salt_len = *salted ? (uint32_t)strlen(salt) : 0,
                        .salt = *salted ? salt : NULL};
}

static int check_chunk(struct worker *w, const void *buf, uint32_t s, uint32_t c, bool salted,
                       const char *how)
{
    if (!kvpt_check(buf, CHUNK_BYTES, chunk_seed(s, c, salted), c))
        W_FAIL(w, 0, "corrupt chunk: sequence %u chunk %u salted %d via %s (%s)", s, c, salted, how,
               on_shm(w) ? "shm" : "inline");
    w->rep->verified_chunks++;
    return 0;
}

/* What to do with a prepared store plan. */
enum finish { FINISH_COMMIT, FINISH_ABORT, FINISH_ABANDON };

static int op_store(struct worker *w, enum finish *abandoned)
{
    uint32_t s, a, e;
    bool salted;
    kvp_tokens t = pick(w, &s, &a, &e, &salted);
    uint32_t n = e - a;
    int rc;

    *abandoned = FINISH_COMMIT;
    w->rep->stores++;
    for (uint32_t i = 0; i < n; i++)
        kvpt_fill(w->bufs[i], CHUNK_BYTES, chunk_seed(s, a + i, salted), a + i);

    if (below(w, 2)) {
        kvp_store_result r;
        rc = kvp_store(w->inst, &t, a * C, e * C, (const void *const *)w->bufs, &r);
        W_CHECK_RC(w, rc, "store");
        if (r.nchunks != n || r.stored + r.cached + r.busy + r.no_space != n ||
            (uint32_t)rc != r.stored)
            W_FAIL(w, rc, "store result %u/%u/%u/%u of %u", r.stored, r.cached, r.busy, r.no_space,
                   r.nchunks);
        w->rep->stored_chunks += r.stored;
        return 0;
    }

    /* Two-phase. */
    kvp_store_plan p;
    rc = kvp_prepare_store(w->inst, &t, a * C, e * C, &p);
    W_CHECK_RC(w, rc, "prepare_store");
    if (p.nchunks != n || p.nslots + p.cached + p.busy + p.no_space != n)
        W_FAIL(w, rc, "prepare result");
    if (on_shm(w))
        for (uint32_t i = 0; i < p.nslots; i++)
            memcpy(p.slots[i].data, w->bufs[p.slots[i].chunk_index], CHUNK_BYTES);
    uint32_t dice = below(w, 10);
    if (dice == 0 && p.nslots) {
        /* Left open: the next unregister or disconnect must release it. */
        free(p.slots);
        w->rep->abandoned++;
        *abandoned = FINISH_ABANDON;
        return 0;
    }
    if (dice <= 2) {
        rc = kvp_abort_store(w->inst, &p);
        W_CHECK_RC(w, rc, "abort_store");
        w->rep->aborted++;
        return 0;
    }
    uint32_t want = p.nslots;
    if (on_shm(w) && below(w, 2))
        rc = kvp_commit_store(w->inst, &p);
    else
        rc = kvp_store_inline(w->inst, &p, (const void *const *)w->bufs);
    W_CHECK_RC(w, rc, "commit");
    if ((uint32_t)rc != want)
        W_FAIL(w, rc, "committed %d of %u", rc, want);
    w->rep->stored_chunks += want;
    return 0;
}

static int op_retrieve(struct worker *w)
{
    uint32_t s, a, e;
    bool salted;
    kvp_tokens t = pick(w, &s, &a, &e, &salted);
    int rc;

    w->rep->retrieves++;
    if (on_shm(w) && below(w, 2)) {
        kvp_retrieve_plan p;
        rc = kvp_prepare_retrieve(w->inst, &t, a * C, e * C, &p);
        W_CHECK_RC(w, rc, "prepare_retrieve");
        if ((uint32_t)rc > e - a || p.nslots != (uint32_t)rc)
            W_FAIL(w, rc, "prepare_retrieve count");
        for (uint32_t i = 0; i < p.nslots; i++)
            if (check_chunk(w, p.slots[i].data, s, a + i, salted, "pinned slot"))
                return -1;
        /* Sometimes a slow reader: while it holds the pins, eviction (several chunks a
         * millisecond) must pass its chunks by, or the second reading shows other bytes. */
        if (p.nslots && below(w, 8) == 0) {
            kvpt_sleep_ms(20 + (int)below(w, 30));
            for (uint32_t i = 0; i < p.nslots; i++)
                if (check_chunk(w, p.slots[i].data, s, a + i, salted, "slot pinned for long"))
                    return -1;
        }
        rc = kvp_commit_retrieve(w->inst, &p);
        W_CHECK_RC(w, rc, "commit_retrieve");
        return 0;
    }
    for (uint32_t i = 0; i < e - a; i++)
        memset(w->bufs[i], 0, CHUNK_BYTES);
    rc = kvp_retrieve(w->inst, &t, a * C, e * C, w->bufs);
    W_CHECK_RC(w, rc, "retrieve");
    if ((uint32_t)rc > e - a)
        W_FAIL(w, rc, "retrieve count");
    for (uint32_t i = 0; i < (uint32_t)rc; i++)
        if (check_chunk(w, w->bufs[i], s, a + i, salted, "retrieve"))
            return -1;
    return 0;
}

static int op_lookup(struct worker *w)
{
    uint32_t s, a, e;
    bool salted;
    kvp_tokens t = pick(w, &s, &a, &e, &salted);
    int rc = kvp_lookup(w->inst, &t);
    W_CHECK_RC(w, rc, "lookup");
    if (rc > SEQ_CHUNKS)
        W_FAIL(w, rc, "lookup beyond the full chunks");
    w->rep->lookups++;
    return 0;
}

static int worker_main(struct worker *w, uint64_t deadline)
{
    for (int i = 0; i < SEQ_CHUNKS; i++)
        w->bufs[i] = malloc(CHUNK_BYTES);
    if (w_connect(w))
        return 1;
    while (kvpt_now_ms() < deadline) {
        uint32_t dice = below(w, 100);
        enum finish fin = FINISH_COMMIT;
        int rc = 0;
        w->rep->ops++;
        if (dice < 35) {
            rc = op_store(w, &fin);
        } else if (dice < 75) {
            rc = op_retrieve(w);
        } else if (dice < 88) {
            rc = op_lookup(w);
        } else if (dice < 93) {
            rc = kvp_ping(w->c);
            W_CHECK_RC(w, rc, "ping");
        } else if (dice < 97) {
            rc = kvp_unregister(w->inst);
            w->inst = NULL;
            W_CHECK_RC(w, rc, "unregister");
            w->rep->reregisters++;
            rc = w_register(w);
        } else {
            kvp_client_close(w->c);
            w->c = NULL;
            w->inst = NULL;
            w->rep->reconnects++;
            rc = w_connect(w);
        }
        if (rc)
            return 2;
        /* An abandoned reservation is released by the daemon at the next unregister or
         * disconnect; make one of those follow soon, sometimes at once. */
        if (fin == FINISH_ABANDON && below(w, 2)) {
            if (below(w, 2)) {
                rc = kvp_unregister(w->inst);
                w->inst = NULL;
                W_CHECK_RC(w, rc, "unregister");
                if (w_register(w))
                    return 2;
            } else {
                kvp_client_close(w->c);
                w->c = NULL;
                if (w_connect(w))
                    return 2;
            }
        }
    }
    kvp_client_close(w->c);
    for (int i = 0; i < SEQ_CHUNKS; i++)
        free(w->bufs[i]);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */

static unsigned env_uint(const char *name, unsigned def)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    char *end;
    unsigned long x = strtoul(v, &end, 10);
    return *end ? def : (unsigned)x;
}

static void test_random_soak(void **state)
{
    (void)state;
    unsigned seconds = env_uint("KVPOOL_SOAK_SECONDS", 20);
    unsigned seed = env_uint("KVPOOL_SOAK_SEED", (unsigned)time(NULL));
    if (seconds == 0)
        seconds = 1;
    print_message("soak: %u workers, %u s, KVPOOL_SOAK_SEED=%u\n", WORKERS, seconds, seed);

    /* 256 chunks of 8 KiB for a working set of about 420 distinct chunks, and as many salted. */
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "2MiB", "--chunk-size", "16", "--log-level", "info", NULL};
    kvpt_daemon_start(&d, args);
    kvp_client *c = kvpt_connect(&d);
    /* The baseline is this test's own connection alone: the harness's readiness probe has
     * closed its own, but the daemon may not have seen that close yet. */
    uint64_t conns0 = kvpt_stat_poll(c, "connections", 1, 10000);
    assert_int_equal(conns0, 1);

    int shared = MAP_SHARED | MAP_ANONYMOUS;
    /* cppcheck-suppress invalidFunctionArg ; an anonymous mapping takes fd -1 */
    struct report *reps = mmap(NULL, sizeof(*reps) * WORKERS, PROT_READ | PROT_WRITE, shared, -1,
                               0);
    assert_true(reps != MAP_FAILED);
    memset(reps, 0, sizeof(*reps) * WORKERS);
    uint64_t deadline = kvpt_now_ms() + (uint64_t)seconds * 1000;
    pid_t pids[WORKERS];
    pid_t parent = getpid();
    for (int i = 0; i < WORKERS; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
                _exit(125);
            static struct worker w;
            w = (struct worker){.id = i,
                                .d = &d,
                                .rep = &reps[i],
                                .rng = 0x9e3779b97f4a7c15ull * (uint64_t)(seed + 1) + (uint64_t)i};
            _exit(worker_main(&w, deadline));
        }
    }

    /* Meanwhile, the daemon must answer the test too. */
    while (kvpt_now_ms() < deadline) {
        assert_int_equal(kvp_ping(c), 0);
        kvpt_sleep_ms(200);
    }

    bool ok = true;
    struct report sum = {0};
    for (int i = 0; i < WORKERS; i++) {
        int st = 0;
        if (!kvpt_reap(pids[i], 60000, &st)) {
            print_error("worker %d did not finish within 60 s of the deadline\n", i);
            ok = false;
            continue;
        }
        const struct report *p = &reps[i];
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            print_error("worker %d: status 0x%x, line %d, rc %d: %s\n", i, st, p->failed_line,
                        p->failed_rc, p->what);
            ok = false;
        }
        sum.ops += p->ops;
        sum.stores += p->stores;
        sum.stored_chunks += p->stored_chunks;
        sum.retrieves += p->retrieves;
        sum.verified_chunks += p->verified_chunks;
        sum.lookups += p->lookups;
        sum.reregisters += p->reregisters;
        sum.reconnects += p->reconnects;
        sum.abandoned += p->abandoned;
        sum.aborted += p->aborted;
    }
    print_message("soak: %llu ops, %llu stores (%llu chunks), %llu retrieves (%llu chunks "
                  "verified), %llu lookups, %llu re-registrations, %llu reconnects, %llu "
                  "abandoned and %llu aborted reservations\n",
                  (unsigned long long)sum.ops, (unsigned long long)sum.stores,
                  (unsigned long long)sum.stored_chunks, (unsigned long long)sum.retrieves,
                  (unsigned long long)sum.verified_chunks, (unsigned long long)sum.lookups,
                  (unsigned long long)sum.reregisters, (unsigned long long)sum.reconnects,
                  (unsigned long long)sum.abandoned, (unsigned long long)sum.aborted);
    assert_true(ok);
    assert_true(sum.verified_chunks > 0);
    assert_true(sum.stored_chunks > 0);

    /* Everything the workers held is released once their connections are gone. */
    assert_int_equal(kvpt_stat_poll(c, "connections", conns0, 10000), conns0);
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 0);
    assert_int_equal(kvpt_stat(c, "objects_pinned"), 0);
    assert_int_equal(kvpt_stat(c, "objects_expired"), 0);
    assert_int_equal(kvpt_stat(c, "instances"), 0);
    /* Every used page belongs to a committed chunk: no reserved or aborted chunk leaked. */
    assert_int_equal(kvpt_stat(c, "pool_used"), kvpt_stat(c, "objects_committed") * CHUNK_BYTES);
    uint64_t evictions = kvpt_stat(c, "evictions");
    print_message("soak: %llu evictions, %llu chunks committed at the end\n",
                  (unsigned long long)evictions,
                  (unsigned long long)kvpt_stat(c, "objects_committed"));
    assert_true(evictions > 0);

    /* The same daemon all along. */
    assert_int_equal(waitpid(d.pid, NULL, WNOHANG), 0);
    assert_int_equal(kill(d.pid, 0), 0);
    assert_int_equal(kvp_ping(c), 0);
    assert_int_equal(kvpt_log_count(&d, " ready: "), 1);

    /* What survived is exact, read by a fresh worker on each transport. */
    for (uint32_t tr = 0; tr < 2; tr++) {
        kvp_register_opts o = kvpt_layout(tr ? "final-inline" : "final-shm",
                                          tr ? KVP_TRANSPORT_INLINE : KVP_TRANSPORT_AUTO);
        kvp_instance *inst = NULL;
        uint32_t tok[SEQ_CHUNKS * C + C];
        void *bufs[SEQ_CHUNKS];
        assert_int_equal(kvp_register(c, &o, &inst), 0);
        for (int i = 0; i < SEQ_CHUNKS; i++)
            bufs[i] = malloc(CHUNK_BYTES);
        for (uint32_t s = 0; s < NSEQ; s++) {
            for (int salted = 0; salted < 2; salted++) {
                seq_tokens(s, tok);
                kvp_tokens t = {.ids = tok,
                                .count = seq_len(s),
                                .salt_len = salted ? (uint32_t)strlen(salt) : 0,
                                .salt = salted ? salt : NULL};
                int n = kvp_retrieve(inst, &t, 0, SEQ_CHUNKS * C, bufs);
                assert_true(n >= 0 && n <= SEQ_CHUNKS);
                for (int i = 0; i < n; i++)
                    if (!kvpt_check(bufs[i], CHUNK_BYTES, chunk_seed(s, (uint32_t)i, salted),
                                    (uint32_t)i))
                        fail_msg("sequence %u chunk %d salted %d corrupt after the soak", s, i,
                                 salted);
            }
        }
        for (int i = 0; i < SEQ_CHUNKS; i++)
            free(bufs[i]);
        assert_int_equal(kvp_unregister(inst), 0);
    }

    munmap(reps, sizeof(*reps) * WORKERS);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_soak),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
