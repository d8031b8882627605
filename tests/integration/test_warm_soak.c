/*
 * test_warm_soak.c - twenty crashes under load: four worker processes store and read chunks
 * while kvpoold is SIGKILLed and started again on the same socket at random moments, each new
 * daemon adopting what the dead one held.
 *
 * Every worker registers the same model and rank, so they share every chunk, and a chunk's bytes
 * are a function of its key alone (sequence s, chunk c: kvpt_fill(s, c)), so any worker checks
 * every byte of everything it reads, whichever worker stored it and whichever daemon adopted it.
 * Workers store (kvp_store, or prepare, copy and commit), retrieve (kvp_retrieve, or pinned shm
 * slots) and look up, on the shm and the inline transport, in a pool far smaller than their
 * working set (eviction all the time). A call that fails because the daemon died or is not back
 * yet (the errors README.md lists for a restart: -EPIPE, -ECONNRESET, -ETIMEDOUT, -ENOENT,
 * -ECONNREFUSED, -ESTALE for a plan of the dead daemon, KVP_EPIPELINED, -ENOTCONN while the
 * connection is being made again) is counted and the worker goes on; any other error, and any
 * wrong byte, fails the test.
 *
 * The test process kills the daemon 20 times, each after a random 150-900 ms of load, and starts
 * it again at once (sometimes after a pause). After each start it prints what the new daemon
 * adopted (its log line) and asserts exactly one adoption per restart (never a refusal: the
 * settings do not change). Before each kill it reads the daemon's warm_restart_corrupt_chunks,
 * which must stay 0: nothing writes a chunk behind the daemon's back here, so a checksum that
 * does not match would mean that a torn or misplaced chunk was adopted. At the end: some reads
 * after restarts hit adopted chunks, every chunk still cached is exact, and a plain stop leaves
 * nothing in /dev/shm. KVPOOL_WARM_SOAK_SEED replays the random choices (printed).
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

#include "warm_fixture.h"

#define C KVPW_C
#define WORKERS 4
#define RESTARTS 20
#define NSEQ 48
#define SEQ_CHUNKS 6
#define CHUNK_BYTES KVPW_SMALL

/* --l1-size 2MiB: 256 chunks of 8 KiB against a working set of 288. */
static const char *const soak_args[] = {"--l1-size", "2MiB", "--chunk-size", "16", "--log-level",
                                        "info",      NULL};

/* What a worker did, in memory shared with the test process. */
struct report {
    uint64_t ops, stored_chunks, read_chunks, restart_errors;
    volatile uint64_t stop;      /* set by the test process */
    uint64_t hits_after_restart; /* chunks read by the first read of each sequence after a
                                  * restart: adopted ones (or stored again since) */
    int failed_line, failed_rc;
    char what[200];
};

struct worker {
    int id;
    uint64_t rng;
    const struct kvpt_daemon *d;
    kvp_client *c;
    kvp_instance *inst;
    struct report *rep;
    volatile uint64_t *generation; /* bumped by the test process at every restart */
    uint64_t seen_generation;
    uint8_t fresh[NSEQ]; /* not read since the last restart */
    uint32_t tokens[SEQ_CHUNKS * C];
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

/* The errors a restart of the daemon may cause (README.md, "Daemon restarts"). */
static bool restart_error(int rc)
{
    return rc == -EPIPE || rc == -ECONNRESET || rc == -ETIMEDOUT || rc == -ENOENT ||
           rc == -ECONNREFUSED || rc == -ESTALE || rc == KVP_EPIPELINED || rc == -ENOTCONN;
}

/* After a call: an error of a restart is counted and ends the operation (its function returns
 * 0, after a millisecond); any other error fails the worker. */
#define W_RC(w, rc, op)                                                                     \
    do {                                                                                    \
        if ((rc) < 0) {                                                                     \
            if (!restart_error(rc))                                                         \
                W_FAIL(w, rc, "%s: %s (%s)", op, kvp_strerror(rc), kvp_last_error((w)->c)); \
            (w)->rep->restart_errors++;                                                     \
            kvpt_sleep_ms(1); /* no busy loop while nobody answers */                       \
            return 0;                                                                       \
        }                                                                                   \
    } while (0)

static kvp_tokens seq_tokens(struct worker *w, uint32_t s)
{
    for (uint32_t i = 0; i < SEQ_CHUNKS * C; i++)
        w->tokens[i] = s * 1000003u + i * 7u + 1u; /* kvpt_tokens() */
    return (kvp_tokens){.ids = w->tokens, .count = SEQ_CHUNKS * C};
}

static int check(struct worker *w, const void *buf, uint32_t s, uint32_t c, const char *how)
{
    if (!kvpt_check(buf, CHUNK_BYTES, s, c))
        W_FAIL(w, 0, "wrong bytes served: sequence %u chunk %u via %s", s, c, how);
    w->rep->read_chunks++;
    return 0;
}

static bool on_shm(const struct worker *w)
{
    return kvp_instance_get_info(w->inst)->transport == KVP_TRANSPORT_SHM;
}

static int op_store(struct worker *w)
{
    uint32_t s = below(w, NSEQ), n = 1 + below(w, SEQ_CHUNKS);
    kvp_tokens t = seq_tokens(w, s);
    int rc;
    for (uint32_t i = 0; i < n; i++)
        kvpt_fill(w->bufs[i], CHUNK_BYTES, s, i);
    if (below(w, 2) || !on_shm(w)) {
        kvp_store_result r;
        rc = kvp_store(w->inst, &t, 0, n * C, (const void *const *)w->bufs, &r);
        W_RC(w, rc, "store");
        w->rep->stored_chunks += r.stored;
        return 0;
    }
    kvp_store_plan p;
    rc = kvp_prepare_store(w->inst, &t, 0, n * C, &p);
    W_RC(w, rc, "prepare_store");
    for (uint32_t i = 0; i < p.nslots; i++)
        memcpy(p.slots[i].data, w->bufs[p.slots[i].chunk_index], CHUNK_BYTES);
    uint32_t want = p.nslots;
    rc = kvp_commit_store(w->inst, &p);
    W_RC(w, rc, "commit_store");
    w->rep->stored_chunks += want;
    return 0;
}

static int op_retrieve(struct worker *w)
{
    uint32_t s = below(w, NSEQ);
    kvp_tokens t = seq_tokens(w, s);
    bool first = w->fresh[s];
    int rc;

    if (on_shm(w) && below(w, 2)) {
        kvp_retrieve_plan p;
        rc = kvp_prepare_retrieve(w->inst, &t, 0, SEQ_CHUNKS * C, &p);
        W_RC(w, rc, "prepare_retrieve");
        if ((uint32_t)rc > SEQ_CHUNKS || p.nslots != (uint32_t)rc)
            W_FAIL(w, rc, "prepare_retrieve count %d", rc);
        for (uint32_t i = 0; i < p.nslots; i++)
            if (check(w, p.slots[i].data, s, i, "pinned shm slot"))
                return -1;
        rc = kvp_commit_retrieve(w->inst, &p);
        if (first)
            w->rep->hits_after_restart += p.nslots;
        W_RC(w, rc, "commit_retrieve");
    } else {
        for (uint32_t i = 0; i < SEQ_CHUNKS; i++)
            memset(w->bufs[i], 0, CHUNK_BYTES);
        rc = kvp_retrieve(w->inst, &t, 0, SEQ_CHUNKS * C, w->bufs);
        W_RC(w, rc, "retrieve");
        if (rc > SEQ_CHUNKS)
            W_FAIL(w, rc, "retrieve count %d", rc);
        for (int i = 0; i < rc; i++)
            if (check(w, w->bufs[i], s, (uint32_t)i, on_shm(w) ? "retrieve (shm)" : "inline"))
                return -1;
        if (first)
            w->rep->hits_after_restart += (uint64_t)rc;
    }
    w->fresh[s] = 0;
    return 0;
}

static int worker_main(struct worker *w)
{
    int rc;
    kvp_opts o = {.socket_path = w->d->socket, .timeout_ms = 5000};
    char id[32];
    snprintf(id, sizeof(id), "soak-%d", w->id);
    kvp_register_opts ro = kvpt_layout(id, w->id % 2 ? KVP_TRANSPORT_INLINE : KVP_TRANSPORT_AUTO);

    for (int i = 0; i < SEQ_CHUNKS; i++)
        w->bufs[i] = malloc(CHUNK_BYTES);
    if ((rc = kvp_client_open(&o, &w->c)) < 0)
        W_FAIL(w, rc, "open: %s", kvp_strerror(rc));
    /* The first registration, while a restart may be going on: tried until it works. */
    while ((rc = kvp_register(w->c, &ro, &w->inst)) < 0) {
        if (!restart_error(rc))
            W_FAIL(w, rc, "register: %s (%s)", kvp_strerror(rc), kvp_last_error(w->c));
        kvpt_sleep_ms(20);
    }
    while (!w->rep->stop) {
        if (*w->generation != w->seen_generation) {
            w->seen_generation = *w->generation;
            memset(w->fresh, 1, sizeof(w->fresh));
        }
        uint32_t dice = below(w, 100);
        w->rep->ops++;
        if (dice < 40)
            rc = op_store(w);
        else if (dice < 85)
            rc = op_retrieve(w);
        else {
            kvp_tokens t = seq_tokens(w, below(w, NSEQ));
            int n = kvp_lookup(w->inst, &t);
            if (n < 0 && !restart_error(n))
                W_FAIL(w, n, "lookup: %s (%s)", kvp_strerror(n), kvp_last_error(w->c));
            if (n > SEQ_CHUNKS)
                W_FAIL(w, n, "lookup beyond the sequence: %d", n);
            rc = 0;
        }
        if (rc)
            return 2;
    }
    kvp_client_close(w->c);
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

static void test_warm_soak(void **state)
{
    (void)state;
    unsigned seed = env_uint("KVPOOL_WARM_SOAK_SEED", (unsigned)time(NULL));
    print_message("warm soak: %d workers, %d crashes, KVPOOL_WARM_SOAK_SEED=%u\n", WORKERS,
                  RESTARTS, seed);
    srand(seed);

    struct kvpt_daemon *d = kvpw_fresh_daemon();
    char widx[96], line[2048];
    kvpt_daemon_start(d, soak_args);
    kvpw_widx_name(d->socket, widx, sizeof(widx));

    int shared = MAP_SHARED | MAP_ANONYMOUS;
    size_t bytes = sizeof(struct report) * WORKERS + sizeof(uint64_t);
    /* cppcheck-suppress invalidFunctionArg ; an anonymous mapping takes fd -1 */
    struct report *reps = mmap(NULL, bytes, PROT_READ | PROT_WRITE, shared, -1, 0);
    assert_true(reps != MAP_FAILED);
    memset(reps, 0, bytes);
    volatile uint64_t *generation = (volatile uint64_t *)(void *)(reps + WORKERS);
    pid_t pids[WORKERS], parent = getpid();
    for (int i = 0; i < WORKERS; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
                _exit(125);
            static struct worker w;
            w = (struct worker){.id = i,
                                .d = d,
                                .rep = &reps[i],
                                .generation = generation,
                                .rng = 0x9e3779b97f4a7c15ull * (uint64_t)(seed + 1) + (uint64_t)i};
            _exit(worker_main(&w));
        }
    }

    uint64_t adopted_total = 0, restart_ms_max = 0;
    for (int r = 0; r < RESTARTS; r++) {
        kvpt_sleep_ms(150 + rand() % 750);
        /* Nothing adopted by this daemon (or stored by it) failed its checksum. */
        kvp_client *c = kvpt_connect(d);
        uint64_t corrupt = kvpt_stat(c, "warm_restart_corrupt_chunks");
        uint64_t verified = kvpt_stat(c, "warm_restart_verified_chunks");
        kvp_client_close(c);
        if (corrupt != 0)
            fail_msg("daemon %d found %llu corrupt adopted chunks (%llu verified)", r,
                     (unsigned long long)corrupt, (unsigned long long)verified);
        int dead = (int)d->pid;
        assert_int_equal(kvpt_daemon_signal_wait(d, SIGKILL), 128 + SIGKILL);
        if (rand() % 4 == 0)
            kvpt_sleep_ms(rand() % 300); /* the workers meet a socket nobody answers */
        uint64_t t0 = kvpt_now_ms();
        kvpt_daemon_restart(d, soak_args);
        uint64_t took = kvpt_now_ms() - t0;
        restart_ms_max = took > restart_ms_max ? took : restart_ms_max;
        (*generation)++;
        int pid;
        const char *kind;
        unsigned long long chunks, nbytes;
        kvpw_assert_log_count(d, KVPW_ADOPTED, r + 1);
        kvpw_assert_log_count(d, KVPW_REFUSED, 0);
        kvpw_adopted_line(d, &pid, &kind, &chunks, &nbytes, line, sizeof(line));
        assert_int_equal(pid, dead);
        assert_string_equal(kind, "crash");
        print_message("restart %2d: adopted %llu chunks (%llu bytes) of pid %d, %llu verified "
                      "and 0 corrupt before the crash; serving after %llu ms\n",
                      r + 1, chunks, nbytes, dead, (unsigned long long)verified,
                      (unsigned long long)took);
        adopted_total += chunks;
    }
    kvpt_sleep_ms(300);
    for (int i = 0; i < WORKERS; i++)
        reps[i].stop = 1;

    bool ok = true;
    struct report sum = {0};
    for (int i = 0; i < WORKERS; i++) {
        int st = 0;
        if (!kvpt_reap(pids[i], 60000, &st)) {
            print_error("worker %d did not stop within 60 s\n", i);
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
        sum.stored_chunks += p->stored_chunks;
        sum.read_chunks += p->read_chunks;
        sum.restart_errors += p->restart_errors;
        sum.hits_after_restart += p->hits_after_restart;
    }
    print_message("warm soak: %llu operations, %llu chunks stored, %llu read and checked, %llu "
                  "calls failed by a restart; %llu chunks adopted over %d restarts, %llu read by "
                  "the first read of a sequence after a restart; the slowest restart served "
                  "after %llu ms\n",
                  (unsigned long long)sum.ops, (unsigned long long)sum.stored_chunks,
                  (unsigned long long)sum.read_chunks, (unsigned long long)sum.restart_errors,
                  (unsigned long long)adopted_total, RESTARTS,
                  (unsigned long long)sum.hits_after_restart, (unsigned long long)restart_ms_max);
    assert_true(ok);
    assert_true(sum.read_chunks > 0);
    assert_true(adopted_total > 0);
    assert_true(sum.hits_after_restart > 0);

    /* What the last daemon holds is exact, and none of it was corrupt. */
    kvp_client *c = kvpt_connect(d);
    kvp_register_opts o = kvpt_layout("final", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = kvpw_register(c, o);
    void *bufs[SEQ_CHUNKS];
    for (int i = 0; i < SEQ_CHUNKS; i++)
        bufs[i] = malloc(CHUNK_BYTES);
    uint64_t cached = 0;
    for (uint32_t s = 0; s < NSEQ; s++) {
        uint32_t *tok = kvpt_tokens(s, SEQ_CHUNKS * C);
        kvp_tokens t = {.ids = tok, .count = SEQ_CHUNKS * C};
        int n = kvp_retrieve(inst, &t, 0, SEQ_CHUNKS * C, bufs);
        assert_true(n >= 0 && n <= SEQ_CHUNKS);
        for (int i = 0; i < n; i++)
            if (!kvpt_check(bufs[i], CHUNK_BYTES, s, (uint32_t)i))
                fail_msg("sequence %u chunk %d wrong after the soak", s, i);
        cached += (uint64_t)n;
        free(tok);
    }
    for (int i = 0; i < SEQ_CHUNKS; i++)
        free(bufs[i]);
    print_message("warm soak: %llu chunks cached and exact at the end\n",
                  (unsigned long long)cached);
    assert_int_equal(kvpt_stat(c, "warm_restart_corrupt_chunks"), 0);
    kvp_client_close(c);
    munmap(reps, bytes);
    kvpt_daemon_stop(d);
    assert_false(kvpt_shm_exists(d->shm_name));
    assert_false(kvpt_shm_exists(widx));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_warm_soak, kvpw_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
