/*
 * test_faults.c - fault injection with real processes.
 *
 * A worker is SIGKILLed at every phase of a transfer: after a prepare-store on shm with its slots
 * half-written, in the middle of an inline upload (or it just closes there), holding the pins of
 * a prepare-retrieve, and in the middle of an inline download that it never reads. Each time a
 * second worker (the "bystander", another process) keeps storing and retrieving on both
 * transports, byte-exact, with short timeouts. Afterwards the daemon still answers, nothing
 * half-written is visible, the committed data around the victim's range is intact, and every
 * reservation, pin and pool page the victim held is released (only the close can release them:
 * --io-timeout is far longer than the waits).
 *
 * Also: a slow consumer of a large inline retrieve does not hold anybody else up, costs the daemon
 * no per-connection buffering, and is dropped after --io-timeout once it stops reading; and a
 * daemon SIGKILLed and restarted on the same socket and segment name while a client is connected
 * (the client reconnects; its plan from before the restart is refused; test_reconnect.c has the
 * rest of that story).
 *
 * Forked children never call cmocka: they report through exit codes and pipes, and they die
 * with the test process (PR_SET_PDEATHSIG).
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/msg.h"
#include "common/wire.h"
#include "harness.h"

#define C 16
#define MIB (1u << 20)

#if defined(__SANITIZE_THREAD__)
#define KVPT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVPT_TSAN 1
#endif
#endif
#ifndef KVPT_TSAN
#define KVPT_TSAN 0
#endif

/* --io-timeout far beyond every wait below: whatever is released was released by the close. */
static const char *const fault_args[] = {"--l1-size", "64MiB", "--chunk-size", "16", "--io-timeout",
                                         "60000",     NULL};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* 1 MiB chunks (2 x 8 layers x 16 tokens x 1024 x float32): few chunks make a large transfer. */
static kvp_register_opts big_layout(const char *id, uint32_t transport)
{
    kvp_register_opts o = kvpt_layout(id, transport);
    o.model_name = "big-model";
    o.num_layers = 8;
    o.hidden_dim = 1024;
    o.dtype = "float32";
    return o;
}

/* Polls a statistic on an open client until it equals want (up to timeout_ms). Unlike
 * kvpt_stat_wait() it opens no connection of its own, so "connections" can be polled too. */
static uint64_t stat_poll(kvp_client *c, const char *name, uint64_t want, int timeout_ms)
{
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms, v;
    while ((v = kvpt_stat(c, name)) != want && now_ms() < deadline)
        sleep_ms(20);
    return v;
}

/* Polls until a statistic reaches at least want. */
static uint64_t stat_poll_min(kvp_client *c, const char *name, uint64_t want, int timeout_ms)
{
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms, v;
    while ((v = kvpt_stat(c, name)) < want && now_ms() < deadline)
        sleep_ms(20);
    return v;
}

static void assert_daemon_serves(const struct kvpt_daemon *d)
{
    kvp_client *c = kvpt_connect(d);
    assert_int_equal(kvp_ping(c), 0);
    kvp_client_close(c);
}

/* Forks a child that dies with the test process. */
static pid_t fork_child(void)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0 && (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent))
        _exit(125);
    return pid;
}

static void kill_and_reap(pid_t pid)
{
    int st;
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGKILL);
}

/* Stores chunks [0, n) of seq with the content kvpt_fill(seq, i); some may be cached already. */
static void store_seq(kvp_instance *inst, uint32_t seq, uint32_t n)
{
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
    uint32_t *tok = kvpt_tokens(seq, n * C);
    kvp_tokens t = {.ids = tok, .count = n * C};
    void **bufs = calloc(n, sizeof(*bufs));
    kvp_store_result r;
    for (uint32_t i = 0; i < n; i++) {
        bufs[i] = malloc(bytes);
        kvpt_fill(bufs[i], bytes, seq, i);
    }
    int rc = kvp_store(inst, &t, 0, n * C, (const void *const *)bufs, &r);
    assert_true(rc >= 0);
    assert_int_equal(r.stored + r.cached, n);
    for (uint32_t i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(tok);
}

/* Asserts that exactly the first n chunks of seq (out of total) are cached, byte-exact. */
static void assert_seq(kvp_instance *inst, uint32_t seq, uint32_t n, uint32_t total)
{
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
    uint32_t *tok = kvpt_tokens(seq, total * C);
    kvp_tokens t = {.ids = tok, .count = total * C};
    void **bufs = calloc(total, sizeof(*bufs));
    assert_int_equal(kvp_lookup(inst, &t), (int)n);
    for (uint32_t i = 0; i < total; i++)
        bufs[i] = calloc(1, bytes);
    assert_int_equal(kvp_retrieve(inst, &t, 0, total * C, bufs), (int)n);
    for (uint32_t i = 0; i < total; i++) {
        if (i < n && !kvpt_check(bufs[i], bytes, seq, i))
            fail_msg("chunk %u of sequence %u is not what was stored", i, seq);
        free(bufs[i]);
    }
    free(bufs);
    free(tok);
}

/* ---------------------------------------------------------------------------------------- */
/* The bystander: another worker process that must not notice anything.                    */

#define BYST_SEQS 8
#define BYST_CHUNKS 4

struct bystander {
    _Atomic uint32_t rounds;
    _Atomic int stop;
    _Atomic int failed_line; /* 0, or the line of the first failure */
    int failed_rc;
    pid_t pid;
};

#define BYST_CHECK(b, cond, rc)                        \
    do {                                               \
        if (!(cond)) {                                 \
            (b)->failed_rc = (rc);                     \
            atomic_store(&(b)->failed_line, __LINE__); \
            return 1;                                  \
        }                                              \
    } while (0)

/*
 * Every round: store BYST_CHUNKS chunks of one of BYST_SEQS sequences (on shm and inline
 * instances in turn), retrieve them into zeroed buffers and check every byte, then reserve two
 * fresh chunks and abort them. After the first BYST_SEQS rounds its pool footprint is constant.
 */
static int bystander_main(const struct kvpt_daemon *d, struct bystander *b)
{
    kvp_client *c = NULL;
    kvp_instance *shm = NULL, *inl = NULL;
    kvp_opts o = {.socket_path = d->socket, .timeout_ms = 5000};
    kvp_register_opts os = kvpt_layout("bystander-shm", KVP_TRANSPORT_AUTO);
    kvp_register_opts oi = kvpt_layout("bystander-inline", KVP_TRANSPORT_INLINE);
    int rc;

    BYST_CHECK(b, (rc = kvp_client_open(&o, &c)) == 0, rc);
    BYST_CHECK(b, (rc = kvp_register(c, &os, &shm)) == 0, rc);
    BYST_CHECK(b, (rc = kvp_register(c, &oi, &inl)) == 0, rc);
    BYST_CHECK(b, kvp_instance_get_info(shm)->transport == KVP_TRANSPORT_SHM, 0);
    size_t bytes = kvp_instance_get_info(shm)->chunk_bytes;
    void *bufs[BYST_CHUNKS];
    for (int i = 0; i < BYST_CHUNKS; i++)
        bufs[i] = malloc(bytes);

    for (uint32_t r = 0; !atomic_load(&b->stop); r++) {
        kvp_instance *inst = r % 2 ? inl : shm;
        uint32_t seq = 7000 + r % BYST_SEQS;
        uint32_t *tok = kvpt_tokens(seq, BYST_CHUNKS * C);
        kvp_tokens t = {.ids = tok, .count = BYST_CHUNKS * C};
        kvp_store_result sr;
        for (uint32_t i = 0; i < BYST_CHUNKS; i++)
            kvpt_fill(bufs[i], bytes, seq, i);
        rc = kvp_store(inst, &t, 0, BYST_CHUNKS * C, (const void *const *)bufs, &sr);
        BYST_CHECK(b, rc >= 0, rc);
        BYST_CHECK(b, sr.stored + sr.cached == BYST_CHUNKS, (int)sr.no_space);
        for (uint32_t i = 0; i < BYST_CHUNKS; i++)
            memset(bufs[i], 0, bytes);
        rc = kvp_retrieve(inst, &t, 0, BYST_CHUNKS * C, bufs);
        BYST_CHECK(b, rc == BYST_CHUNKS, rc);
        for (uint32_t i = 0; i < BYST_CHUNKS; i++)
            BYST_CHECK(b, kvpt_check(bufs[i], bytes, seq, i), (int)i);
        free(tok);

        /* Reservation traffic that leaves nothing behind. */
        tok = kvpt_tokens(9000000 + r, 2 * C);
        t = (kvp_tokens){.ids = tok, .count = 2 * C};
        kvp_store_plan sp;
        rc = kvp_prepare_store(inst, &t, 0, 2 * C, &sp);
        BYST_CHECK(b, rc == 2, rc);
        BYST_CHECK(b, (rc = kvp_abort_store(inst, &sp)) == 0, rc);
        free(tok);
        atomic_fetch_add(&b->rounds, 1);
    }
    for (int i = 0; i < BYST_CHUNKS; i++)
        free(bufs[i]);
    kvp_client_close(c);
    return 0;
}

/* Waits until the bystander has completed `more` rounds beyond `from`; fails if it stopped. */
static void bystander_wait(struct bystander *b, uint32_t from, uint32_t more)
{
    uint64_t deadline = now_ms() + 30000;
    while (atomic_load(&b->rounds) < from + more) {
        if (atomic_load(&b->failed_line))
            fail_msg("bystander failed at line %d (rc %d)", atomic_load(&b->failed_line),
                     b->failed_rc);
        int st;
        if (waitpid(b->pid, &st, WNOHANG) == b->pid)
            fail_msg("bystander exited (status 0x%x, failed at line %d, rc %d)", st,
                     atomic_load(&b->failed_line), b->failed_rc);
        if (now_ms() > deadline)
            fail_msg("bystander made no progress in 30 s (%u rounds)", atomic_load(&b->rounds));
        sleep_ms(5);
    }
}

/* Starts the bystander and waits until all its sequences are stored. */
static struct bystander *bystander_start(const struct kvpt_daemon *d)
{
    struct bystander *b = mmap(NULL, sizeof(*b), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                               -1, 0);
    assert_true(b != MAP_FAILED);
    memset(b, 0, sizeof(*b));
    /* b is shared: only the parent may write the pid into it. */
    pid_t pid = fork_child();
    if (pid == 0)
        _exit(bystander_main(d, b));
    b->pid = pid;
    bystander_wait(b, 0, BYST_SEQS);
    return b;
}

/* Stops the bystander; asserts that it never saw an error or a wrong byte. */
static void bystander_stop(struct bystander *b)
{
    int st;
    atomic_store(&b->stop, 1);
    assert_int_equal(waitpid(b->pid, &st, 0), b->pid);
    if (atomic_load(&b->failed_line))
        fail_msg("bystander failed at line %d (rc %d)", atomic_load(&b->failed_line), b->failed_rc);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    munmap(b, sizeof(*b));
}

/* ---------------------------------------------------------------------------------------- */
/* One fault scenario: daemon, owner of the committed data, bystander, victim, checks.       */

struct scenario {
    struct kvpt_daemon d;
    kvp_client *c;            /* the test's own client (stats, checks) */
    kvp_instance *big;        /* big layout, shm */
    kvp_instance *big_inline; /* big layout, inline */
    uint64_t baseline_used;   /* pool_used expected once the victim is gone */
    uint64_t baseline_conns;
    struct bystander *b;
};

/* Starts the daemon, stores `committed` big chunks of seq, starts the bystander. */
static void scenario_start(struct scenario *s, uint32_t seq, uint32_t committed)
{
    kvp_register_opts o = big_layout("owner", KVP_TRANSPORT_AUTO);
    kvp_register_opts oi = big_layout("owner-inline", KVP_TRANSPORT_INLINE);

    memset(s, 0, sizeof(*s));
    kvpt_daemon_start(&s->d, fault_args);
    s->c = kvpt_connect(&s->d);
    assert_int_equal(kvpt_stat(s->c, "shm_enabled"), 1);
    assert_int_equal(kvp_register(s->c, &o, &s->big), 0);
    assert_int_equal(kvp_instance_get_info(s->big)->transport, KVP_TRANSPORT_SHM);
    assert_int_equal(kvp_instance_get_info(s->big)->chunk_bytes, MIB);
    assert_int_equal(kvp_register(s->c, &oi, &s->big_inline), 0);
    if (committed)
        store_seq(s->big, seq, committed);
    s->baseline_conns = kvpt_stat(s->c, "connections");
    uint64_t used = kvpt_stat(s->c, "pool_used");
    s->b = bystander_start(&s->d);
    /* The small layout's chunks are 8 KiB, whole pages: the bystander's footprint is exact. */
    s->baseline_used = used + (uint64_t)BYST_SEQS * BYST_CHUNKS * 8192;
}

/*
 * After the victim is dead: the daemon answers at once, every hold is released, the bystander
 * keeps going and saw nothing wrong, and once it has left the pool is back to the baseline.
 */
static void scenario_finish(struct scenario *s)
{
    uint32_t r0 = atomic_load(&s->b->rounds);
    assert_daemon_serves(&s->d);
    /* Polling until 0 is sound despite the bystander's own short-lived holds: a leaked hold
     * never goes away. */
    assert_int_equal(stat_poll(s->c, "objects_reserved", 0, 5000), 0);
    assert_int_equal(stat_poll(s->c, "objects_pinned", 0, 5000), 0);
    bystander_wait(s->b, r0, 20);
    bystander_stop(s->b);

    assert_int_equal(stat_poll(s->c, "connections", s->baseline_conns, 5000), s->baseline_conns);
    assert_int_equal(kvpt_stat(s->c, "objects_reserved"), 0);
    assert_int_equal(kvpt_stat(s->c, "objects_pinned"), 0);
    assert_int_equal(kvpt_stat(s->c, "objects_expired"), 0);
    assert_int_equal(kvpt_stat(s->c, "pool_used"), s->baseline_used);
    assert_int_equal(kvpt_stat(s->c, "instances"), 2); /* owner and owner-inline */
    assert_int_equal(kvpt_stat(s->c, "evictions"), 0); /* so the baseline arithmetic holds */
}

static void scenario_stop(struct scenario *s)
{
    kvp_client_close(s->c);
    kvpt_daemon_stop(&s->d);
}

/* Child -> parent: one byte once the victim is in position ('r'), or an error code. */
static void victim_ready(int fd, char what)
{
    if (write(fd, &what, 1) != 1)
        _exit(99);
}

static void wait_victim(int fd)
{
    char ch = 0;
    struct timeval tv = {.tv_sec = 30};
    fd_set set;
    FD_ZERO(&set);
    FD_SET(fd, &set);
    assert_int_equal(select(fd + 1, &set, NULL, NULL, &tv), 1);
    assert_int_equal(read(fd, &ch, 1), 1);
    if (ch != 'r')
        fail_msg("victim failed before the fault (code '%c')", ch);
}

/* ---------------------------------------------------------------------------------------- */
/* Victim 1: prepare-store on shm, some slots written, one half-written.                     */

static void victim_prepare_store(const struct kvpt_daemon *d, int fd, uint32_t seq)
{
    kvp_client *c = NULL;
    kvp_instance *inst = NULL;
    kvp_opts o = {.socket_path = d->socket, .timeout_ms = 5000};
    kvp_register_opts ro = big_layout("victim-shm", KVP_TRANSPORT_SHM);
    kvp_store_plan sp;
    uint32_t *tok = kvpt_tokens(seq, 12 * C);
    kvp_tokens t = {.ids = tok, .count = 12 * C};

    if (kvp_client_open(&o, &c) || kvp_register(c, &ro, &inst))
        victim_ready(fd, 'a');
    /* Chunks 0-3 are committed: 8 slots for chunks 4-11. */
    if (kvp_prepare_store(inst, &t, 0, 12 * C, &sp) != 8 || sp.cached != 4)
        victim_ready(fd, 'b');
    for (uint32_t i = 0; i < 4; i++)
        memset(sp.slots[i].data, 0xab, sp.slots[i].length);
    memset(sp.slots[4].data, 0xcd, sp.slots[4].length / 2);
    victim_ready(fd, 'r');
    for (;;)
        pause();
}

static void test_kill_after_prepare_store(void **state)
{
    (void)state;
    struct scenario s;
    int p[2];
    scenario_start(&s, 100, 4);
    assert_int_equal(pipe(p), 0);
    pid_t v = fork_child();
    if (v == 0) {
        close(p[0]);
        victim_prepare_store(&s.d, p[1], 100);
    }
    close(p[1]);
    wait_victim(p[0]);
    close(p[0]);

    assert_true(kvpt_stat(s.c, "objects_reserved") >= 8);
    assert_true(kvpt_stat(s.c, "pool_used") >= s.baseline_used + 8 * MIB);
    assert_seq(s.big, 100, 4, 12); /* reserved chunks are invisible */
    kill_and_reap(v);
    assert_true(kvpt_log_wait(&s.d, "Instance victim-shm unregistered (connection closed)", 5000));

    scenario_finish(&s);
    /* The committed prefix is intact, nothing of the victim is visible on either transport. */
    assert_seq(s.big, 100, 4, 12);
    assert_seq(s.big_inline, 100, 4, 12);
    /* The keys are free again. */
    store_seq(s.big, 100, 12);
    assert_seq(s.big_inline, 100, 12, 12);
    scenario_stop(&s);
}

/* ---------------------------------------------------------------------------------------- */
/* Victim 2: a raw inline upload stopped part-way, then SIGKILLed (or closed).               */

static void victim_inline_upload(const struct kvpt_daemon *d, int fd, uint32_t seq,
                                 bool close_early)
{
    kvp_register_opts ro = big_layout("victim-upload", KVP_TRANSPORT_INLINE);
    static struct kvp_wire_slot slots[KVP_MAX_CHUNKS];
    struct kvp_slots_reply sr = {.slots = slots};
    struct kvpt_reply r;
    struct kvp_wbuf w;
    uint32_t handle;
    uint64_t chunk_bytes;
    uint32_t *tok = kvpt_tokens(seq, 12 * C);

    int s = kvpt_raw_connect(d);
    if (s < 0 || kvpt_raw_register(s, &ro, &handle, &chunk_bytes) != 0)
        victim_ready(fd, 'a');
    kvp_wbuf_init(&w);
    kvp_encode_key_req(&w, handle, 0, 12 * C, tok, 12 * C, NULL, 0);
    if (kvpt_raw_call(s, KVP_OP_PREPARE_STORE, w.data, (uint32_t)w.len, &r) != 0 ||
        kvp_decode_slots_reply(r.body, r.body_len, &sr) != 0 || sr.nslots != 8 || sr.cached != 4)
        victim_ready(fd, 'b');
    free(r.body);

    /* STORE_INLINE announcing 8 MiB, then 3.5 MiB of it: the daemon is receiving into the
     * reserved slots when the victim dies. */
    kvp_wbuf_reset(&w);
    struct kvp_ref_req ref = {.handle = handle, .id = sr.id};
    kvp_encode_ref_req(&w, &ref);
    if (kvpt_raw_send(s, KVP_OP_STORE_INLINE, w.data, (uint32_t)w.len, 8 * chunk_bytes) != 0)
        victim_ready(fd, 'c');
    size_t part = 3 * chunk_bytes + chunk_bytes / 2;
    uint8_t *junk = malloc(part);
    memset(junk, 0xee, part);
    for (size_t off = 0; off < part;) {
        ssize_t n = send(s, junk + off, part - off, MSG_NOSIGNAL);
        if (n <= 0)
            victim_ready(fd, 'd');
        off += (size_t)n;
    }
    if (close_early)
        close(s);
    victim_ready(fd, 'r');
    for (;;)
        pause();
}

static void inline_upload_case(bool close_early)
{
    struct scenario s;
    int p[2];
    scenario_start(&s, 101, 4);
    uint64_t in0 = kvpt_stat(s.c, "inline_bytes_in");
    assert_int_equal(pipe(p), 0);
    pid_t v = fork_child();
    if (v == 0) {
        close(p[0]);
        victim_inline_upload(&s.d, p[1], 101, close_early);
    }
    close(p[1]);
    wait_victim(p[0]);
    close(p[0]);

    if (!close_early) {
        /* Mid-upload: the reservation is held, nothing of it is visible. */
        assert_true(kvpt_stat(s.c, "objects_reserved") >= 8);
        assert_seq(s.big_inline, 101, 4, 12);
    }
    kill_and_reap(v);

    scenario_finish(&s);
    assert_true(
        kvpt_log_wait(&s.d, "Instance victim-upload unregistered (connection closed)", 5000));
    /* The bystander's stores are all cache hits by now: no upload completed, the victim's
     * bytes were never counted as received. */
    assert_int_equal(kvpt_stat(s.c, "inline_bytes_in"), in0);
    assert_seq(s.big, 101, 4, 12);
    assert_seq(s.big_inline, 101, 4, 12);
    store_seq(s.big_inline, 101, 12);
    assert_seq(s.big, 101, 12, 12);
    scenario_stop(&s);
}

static void test_kill_mid_inline_upload(void **state)
{
    (void)state;
    inline_upload_case(false);
}

static void test_close_mid_inline_upload(void **state)
{
    (void)state;
    inline_upload_case(true);
}

/* ---------------------------------------------------------------------------------------- */
/* Victim 3: holds the pins of a prepare-retrieve on shm.                                    */

static void victim_prepare_retrieve(const struct kvpt_daemon *d, int fd, uint32_t seq)
{
    kvp_client *c = NULL;
    kvp_instance *inst = NULL;
    kvp_opts o = {.socket_path = d->socket, .timeout_ms = 5000};
    kvp_register_opts ro = big_layout("victim-reader", KVP_TRANSPORT_SHM);
    kvp_retrieve_plan rp;
    uint32_t *tok = kvpt_tokens(seq, 8 * C);
    kvp_tokens t = {.ids = tok, .count = 8 * C};

    if (kvp_client_open(&o, &c) || kvp_register(c, &ro, &inst))
        victim_ready(fd, 'a');
    if (kvp_prepare_retrieve(inst, &t, 0, 8 * C, &rp) != 8)
        victim_ready(fd, 'b');
    /* Reads through the pinned slots are exact, as a real worker's would be. */
    for (uint32_t i = 0; i < rp.nslots; i++)
        if (!kvpt_check(rp.slots[i].data, rp.slots[i].length, seq, i))
            victim_ready(fd, 'c');
    victim_ready(fd, 'r');
    for (;;)
        pause();
}

static void test_kill_after_prepare_retrieve(void **state)
{
    (void)state;
    struct scenario s;
    int p[2];
    scenario_start(&s, 102, 8);
    assert_int_equal(pipe(p), 0);
    pid_t v = fork_child();
    if (v == 0) {
        close(p[0]);
        victim_prepare_retrieve(&s.d, p[1], 102);
    }
    close(p[1]);
    wait_victim(p[0]);
    close(p[0]);

    assert_true(kvpt_stat(s.c, "objects_pinned") >= 8);
    /* Pinned data stays readable by others. */
    assert_seq(s.big_inline, 102, 8, 8);
    kill_and_reap(v);

    scenario_finish(&s);
    assert_seq(s.big, 102, 8, 8);
    assert_seq(s.big_inline, 102, 8, 8);
    scenario_stop(&s);
}

/*
 * The pins of a prepare-retrieve are what keeps chunks in a full pool, and they end with the
 * victim: while it lives, 2.5 pools' worth of other stores evict everything else but not its
 * chunks; once it is SIGKILLed the same pressure evicts them too.
 */
static uint32_t pressure(kvp_instance *inst, uint32_t seq0, uint32_t nseq)
{
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
    void *bufs[8];
    uint32_t stored = 0;
    for (uint32_t i = 0; i < 8; i++)
        bufs[i] = malloc(bytes);
    for (uint32_t s = seq0; s < seq0 + nseq; s++) {
        uint32_t *tok = kvpt_tokens(s, 8 * C);
        kvp_tokens t = {.ids = tok, .count = 8 * C};
        for (uint32_t i = 0; i < 8; i++)
            kvpt_fill(bufs[i], bytes, s, i);
        int rc = kvp_store(inst, &t, 0, 8 * C, (const void *const *)bufs, NULL);
        assert_true(rc >= 0);
        stored += (uint32_t)rc;
        free(tok);
    }
    for (uint32_t i = 0; i < 8; i++)
        free(bufs[i]);
    return stored;
}

static void test_pins_hold_until_kill(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    int p[2];
    kvpt_daemon_start(&d, fault_args);
    kvp_client *c = kvpt_connect(&d);
    kvp_instance *inst = NULL;
    kvp_register_opts o = big_layout("presser", KVP_TRANSPORT_AUTO);
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    store_seq(inst, 102, 8);

    assert_int_equal(pipe(p), 0);
    pid_t v = fork_child();
    if (v == 0) {
        close(p[0]);
        victim_prepare_retrieve(&d, p[1], 102);
    }
    close(p[1]);
    wait_victim(p[0]);
    close(p[0]);

    uint64_t ev0 = kvpt_stat(c, "evictions");
    assert_true(pressure(inst, 1000, 20) >= 150); /* 160 MiB through a 64 MiB pool */
    assert_true(kvpt_stat(c, "evictions") - ev0 >= 100);
    assert_seq(inst, 102, 8, 8);

    kill_and_reap(v);
    assert_int_equal(stat_poll(c, "objects_pinned", 0, 5000), 0);
    pressure(inst, 2000, 20);
    uint32_t *tok = kvpt_tokens(102, 8 * C);
    kvp_tokens t = {.ids = tok, .count = 8 * C};
    assert_int_equal(kvp_lookup(inst, &t), 0);
    free(tok);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

/* ---------------------------------------------------------------------------------------- */
/* Victim 4: asks for a large inline download and never reads it.                            */

static void victim_inline_download(const struct kvpt_daemon *d, int fd, uint32_t seq)
{
    kvp_register_opts ro = big_layout("victim-download", KVP_TRANSPORT_INLINE);
    struct kvp_wbuf w;
    uint32_t handle;
    uint32_t *tok = kvpt_tokens(seq, 16 * C);
    int small = 4096;

    int s = kvpt_raw_connect(d);
    if (s < 0 || kvpt_raw_register(s, &ro, &handle, NULL) != 0)
        victim_ready(fd, 'a');
    setsockopt(s, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    kvp_wbuf_init(&w);
    kvp_encode_key_req(&w, handle, 0, 16 * C, tok, 16 * C, NULL, 0);
    if (kvpt_raw_send(s, KVP_OP_RETRIEVE_INLINE, w.data, (uint32_t)w.len, 0) != 0)
        victim_ready(fd, 'c');
    victim_ready(fd, 'r');
    for (;;)
        pause();
}

static void test_kill_mid_inline_download(void **state)
{
    (void)state;
    struct scenario s;
    int p[2];
    scenario_start(&s, 103, 16);
    assert_int_equal(pipe(p), 0);
    pid_t v = fork_child();
    if (v == 0) {
        close(p[0]);
        victim_inline_download(&s.d, p[1], 103);
    }
    close(p[1]);
    wait_victim(p[0]);
    close(p[0]);

    /* The daemon pins the 16 chunks and blocks sending them. */
    assert_true(stat_poll_min(s.c, "objects_pinned", 16, 10000) >= 16);
    /* Meanwhile another worker downloads the same chunks inline (sharing the pins). */
    assert_seq(s.big_inline, 103, 16, 16);
    assert_true(kvpt_stat(s.c, "objects_pinned") >= 16); /* the victim is still stuck */
    kill_and_reap(v);

    scenario_finish(&s);
    assert_true(
        kvpt_log_wait(&s.d, "Instance victim-download unregistered (connection closed)", 5000));
    assert_seq(s.big, 103, 16, 16);
    scenario_stop(&s);
}

/* ---------------------------------------------------------------------------------------- */
/* Slow consumer.                                                                            */

#define SLOW_CHUNKS 40

struct trickle {
    int fd;
    _Atomic int stop;
    uint64_t received;
};

/* Reads a little every 50 ms: slow enough to keep the daemon's send blocked most of the time,
 * fast enough that it never stalls for a whole --io-timeout. */
static void *trickle_main(void *arg)
{
    struct trickle *t = arg;
    static uint8_t buf[16384];
    while (!atomic_load(&t->stop)) {
        ssize_t n = recv(t->fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0)
            t->received += (uint64_t)n;
        else if (n == 0 || (errno != EAGAIN && errno != EINTR))
            break;
        sleep_ms(50);
    }
    return NULL;
}

/* One round of another worker's traffic: ping, small store + retrieve, big inline retrieve. */
static void other_worker_round(kvp_client *c, kvp_instance *small, kvp_instance *big,
                               uint32_t round)
{
    size_t bytes = kvp_instance_get_info(small)->chunk_bytes;
    uint32_t seq = 500 + round % 16;
    uint32_t *tok = kvpt_tokens(seq, 2 * C);
    kvp_tokens t = {.ids = tok, .count = 2 * C};
    void *bufs[2] = {malloc(bytes), malloc(bytes)};

    assert_int_equal(kvp_ping(c), 0);
    kvpt_fill(bufs[0], bytes, seq, 0);
    kvpt_fill(bufs[1], bytes, seq, 1);
    assert_true(kvp_store(small, &t, 0, 2 * C, (const void *const *)bufs, NULL) >= 0);
    memset(bufs[0], 0, bytes);
    memset(bufs[1], 0, bytes);
    assert_int_equal(kvp_retrieve(small, &t, 0, 2 * C, bufs), 2);
    assert_true(kvpt_check(bufs[0], bytes, seq, 0));
    assert_true(kvpt_check(bufs[1], bytes, seq, 1));
    free(bufs[0]);
    free(bufs[1]);
    free(tok);

    /* Two of the chunks the slow consumer is being sent, over the socket too. */
    size_t big_bytes = kvp_instance_get_info(big)->chunk_bytes;
    uint32_t first = round % (SLOW_CHUNKS / 2);
    tok = kvpt_tokens(200, SLOW_CHUNKS * C);
    t = (kvp_tokens){.ids = tok, .count = SLOW_CHUNKS * C};
    void *out[2] = {malloc(big_bytes), malloc(big_bytes)};
    assert_int_equal(kvp_retrieve(big, &t, first * C, (first + 2) * C, out), 2);
    assert_true(kvpt_check(out[0], big_bytes, 200, first));
    assert_true(kvpt_check(out[1], big_bytes, 200, first + 1));
    free(out[0]);
    free(out[1]);
    free(tok);
}

static void test_slow_consumer(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "64MiB", "--chunk-size", "16", "--io-timeout", "1000", NULL};
    kvpt_daemon_start(&d, args);
    kvp_opts o = {.socket_path = d.socket, .timeout_ms = 3000};
    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts ol = big_layout("loader", KVP_TRANSPORT_AUTO);
    kvp_instance *loader = NULL;
    assert_int_equal(kvp_register(c, &ol, &loader), 0);
    store_seq(loader, 200, SLOW_CHUNKS);

    /* Other workers, with timeouts shorter than the time the consumer will be stuck. */
    kvp_client *w[2];
    kvp_instance *small[2], *big[2];
    for (int i = 0; i < 2; i++) {
        char id[32];
        assert_int_equal(kvp_client_open(&o, &w[i]), 0);
        snprintf(id, sizeof(id), "other-small-%d", i);
        kvp_register_opts os = kvpt_layout(id, i ? KVP_TRANSPORT_INLINE : KVP_TRANSPORT_AUTO);
        assert_int_equal(kvp_register(w[i], &os, &small[i]), 0);
        snprintf(id, sizeof(id), "other-big-%d", i);
        kvp_register_opts ob = big_layout(id, KVP_TRANSPORT_INLINE);
        assert_int_equal(kvp_register(w[i], &ob, &big[i]), 0);
        other_worker_round(w[i], small[i], big[i], 0); /* warm up thread and buffers */
    }
    uint64_t rss0 = kvpt_rss_kib(d.pid), rss_max = rss0;

    /* The slow consumer: a 40 MiB inline retrieve through a small receive buffer. */
    kvp_register_opts oc = big_layout("slow-consumer", KVP_TRANSPORT_INLINE);
    uint32_t handle;
    int fd = kvpt_raw_connect(&d);
    assert_true(fd >= 0);
    assert_int_equal(kvpt_raw_register(fd, &oc, &handle, NULL), 0);
    int rcvbuf = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    uint32_t *tok = kvpt_tokens(200, SLOW_CHUNKS * C);
    struct kvp_wbuf wb;
    kvp_wbuf_init(&wb);
    kvp_encode_key_req(&wb, handle, 0, SLOW_CHUNKS * C, tok, SLOW_CHUNKS * C, NULL, 0);
    assert_int_equal(kvpt_raw_send(fd, KVP_OP_RETRIEVE_INLINE, wb.data, (uint32_t)wb.len, 0), 0);
    assert_int_equal(stat_poll(c, "objects_pinned", SLOW_CHUNKS, 10000), SLOW_CHUNKS);

    /* Phase 1: it reads slowly for 4 s (four times --io-timeout, longer than the others' 3 s
     * timeouts); the others are served all along. */
    struct trickle tr = {.fd = fd};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, trickle_main, &tr), 0);
    uint64_t end = now_ms() + 4000;
    uint32_t rounds = 0;
    while (now_ms() < end) {
        for (int i = 0; i < 2; i++)
            other_worker_round(w[i], small[i], big[i], rounds);
        rounds++;
        uint64_t rss = kvpt_rss_kib(d.pid);
        rss_max = rss > rss_max ? rss : rss_max;
        sleep_ms(50);
    }
    atomic_store(&tr.stop, 1);
    pthread_join(th, NULL);
    /* Still being served (not dropped), and far from done. */
    assert_int_equal(kvpt_stat(c, "objects_pinned"), SLOW_CHUNKS);
    assert_true(tr.received > 0);
    assert_true(tr.received < (uint64_t)SLOW_CHUNKS * MIB / 2);

    /* Phase 2: it stops reading. It is dropped after --io-timeout (1 s) and its pins go. */
    uint64_t t0 = now_ms();
    assert_true(kvpt_log_wait(&d, "stalled mid-frame", 10000));
    assert_int_equal(stat_poll(c, "objects_pinned", 0, 10000), 0);
    uint64_t dropped_after = now_ms() - t0;
    for (int i = 0; i < 2; i++)
        other_worker_round(w[i], small[i], big[i], rounds);
    uint64_t rss = kvpt_rss_kib(d.pid);
    rss_max = rss > rss_max ? rss : rss_max;

    /* The consumer sees the end of the stream before the end of its 40 MiB. */
    uint64_t got = tr.received;
    static uint8_t buf[65536];
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) {
            assert_true(n == 0 || errno == ECONNRESET);
            break;
        }
        got += (uint64_t)n;
    }
    assert_true(got < (uint64_t)SLOW_CHUNKS * MIB);
    close(fd);

    /*
     * Bounded buffering: the pool is mapped and touched at start-up, so the daemon's RSS grows
     * only by what it allocates. Buffering the stuck reply would cost 40 MiB; threads, stacks
     * and per-connection buffers cost well under 16 MiB.
     */
    print_message("slow consumer: %u rounds of other traffic, dropped %llu ms after it stopped "
                  "reading, daemon RSS %llu -> max %llu KiB\n",
                  rounds, (unsigned long long)dropped_after, (unsigned long long)rss0,
                  (unsigned long long)rss_max);
#if KVPT_TSAN
    /* ThreadSanitizer's interceptors shadow every byte the daemon hands to sendmsg(): its own
     * memory, not the daemon's. */
    print_message("slow consumer: RSS bound not checked under ThreadSanitizer\n");
#else
    assert_true(rss_max < rss0 + 16 * 1024);
#endif
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 0);
    assert_seq(loader, 200, SLOW_CHUNKS, SLOW_CHUNKS);

    kvp_wbuf_free(&wb);
    free(tok);
    for (int i = 0; i < 2; i++)
        kvp_client_close(w[i]);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

/* ---------------------------------------------------------------------------------------- */
/* Daemon SIGKILL and restart under a connected client.                                      */

static bool shm_exists(const char *name)
{
    char path[160];
    struct stat st;
    snprintf(path, sizeof(path), "/dev/shm/%s", name);
    return stat(path, &st) == 0;
}

static void test_daemon_restart_under_client(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    kvpt_daemon_start(&d, fault_args);

    /* The old client: shm, committed data, and an open reservation with slot pointers. */
    kvp_opts o = {.socket_path = d.socket, .timeout_ms = 3000};
    kvp_client *old = NULL;
    kvp_instance *oi = NULL;
    kvp_register_opts ro = kvpt_layout("before-crash", KVP_TRANSPORT_SHM);
    assert_int_equal(kvp_client_open(&o, &old), 0);
    assert_int_equal(kvp_register(old, &ro, &oi), 0);
    size_t bytes = kvp_instance_get_info(oi)->chunk_bytes;
    store_seq(oi, 300, 4);
    uint32_t *tok = kvpt_tokens(301, 8 * C);
    kvp_tokens t = {.ids = tok, .count = 8 * C};
    kvp_store_plan sp;
    assert_int_equal(kvp_prepare_store(oi, &t, 0, 8 * C, &sp), 8);

    assert_int_equal(kvpt_daemon_signal_wait(&d, SIGKILL), 128 + SIGKILL);
    assert_true(shm_exists(d.shm_name));
    kvpt_daemon_restart(&d, fault_args);
    assert_true(kvpt_log_wait(&d, "Replacing stale segment", 5000));

    /* The old client notices at its next call and reconnects to the new daemon, registering
     * its instance again: no error, no timeout, and the old pool's data is not resurrected. */
    uint64_t t0 = now_ms();
    int rc = kvp_ping(old);
    if (rc != 0)
        fail_msg("ping after the daemon restarted: %d (%s): %s", rc, kvp_strerror(rc),
                 kvp_last_error(old));
    assert_int_equal(kvp_lookup(oi, &t), 0);
    assert_seq(oi, 300, 0, 4);
    assert_int_equal(kvp_instance_get_info(oi)->transport, KVP_TRANSPORT_SHM);
    assert_true(now_ms() - t0 < 3000); /* no call waited for its timeout */

    /* A new client works against the new daemon, on shm, with a fresh pool. */
    kvp_client *c = kvpt_connect(&d);
    kvp_instance *ni = NULL, *nl = NULL;
    kvp_register_opts rn = kvpt_layout("after-restart", KVP_TRANSPORT_SHM);
    kvp_register_opts rl = kvpt_layout("after-restart-inline", KVP_TRANSPORT_INLINE);
    assert_int_equal(kvp_register(c, &rn, &ni), 0);
    assert_int_equal(kvp_register(c, &rl, &nl), 0);
    assert_int_equal(kvp_instance_get_info(ni)->transport, KVP_TRANSPORT_SHM);
    assert_seq(ni, 300, 0, 4); /* the old pool's data is gone, not resurrected */
    store_seq(ni, 301, 8);
    store_seq(nl, 302, 4);

    /*
     * The old client's plan still has slot pointers into the old mapping, which the reconnect
     * kept in place but cut off from any segment. Writing through them (they cover the same
     * offsets the new chunks got) changes nothing that is stored now, and the plan cannot be
     * committed on the new connection.
     */
    assert_int_equal(sp.nslots, 8);
    for (uint32_t i = 0; i < sp.nslots; i++)
        memset(sp.slots[i].data, 0xab, bytes);
    assert_seq(ni, 301, 8, 8);
    assert_seq(nl, 301, 8, 8);
    assert_seq(ni, 302, 4, 4);
    assert_int_equal(kvp_commit_store(oi, &sp), -ESTALE);
    assert_null(sp.slots);
    assert_seq(oi, 301, 8, 8);
    kvp_client_close(c);
    kvp_client_close(old);
    free(tok);

    char name[96];
    snprintf(name, sizeof(name), "%s", d.shm_name);
    kvpt_daemon_stop(&d);
    assert_false(shm_exists(name));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_after_prepare_store),
        cmocka_unit_test(test_kill_mid_inline_upload),
        cmocka_unit_test(test_close_mid_inline_upload),
        cmocka_unit_test(test_kill_after_prepare_retrieve),
        cmocka_unit_test(test_pins_hold_until_kill),
        cmocka_unit_test(test_kill_mid_inline_download),
        cmocka_unit_test(test_slow_consumer),
        cmocka_unit_test(test_daemon_restart_under_client),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
