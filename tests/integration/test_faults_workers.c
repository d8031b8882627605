/*
 * test_faults_workers.c - fault injection with real processes: a worker is SIGKILLed at every
 * phase of a transfer: after a prepare-store on shm with its slots half-written, in the middle
 * of an inline upload (or it just closes there), holding the pins of a prepare-retrieve, and in
 * the middle of an inline download that it never reads. Each time a second worker (the
 * "bystander", another process) keeps storing and retrieving on both transports, byte-exact,
 * with short timeouts. Afterwards the daemon still answers, nothing half-written is visible, the
 * committed data around the victim's range is intact, and every reservation, pin and pool page
 * the victim held is released (only the close can release them: --io-timeout is far longer
 * than the waits). The pins of a prepare-retrieve also keep their chunks through eviction
 * pressure until their holder dies.
 *
 * A slow consumer: test_faults_slow_consumer.c; the daemon restarted under a client:
 * test_faults_restart.c.
 *
 * Forked children never call cmocka: they report through exit codes and pipes, and they die
 * with the test process (PR_SET_PDEATHSIG).
 */
#include <errno.h>
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
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/msg.h"
#include "common/wire.h"
#include "harness.h"

#define C 16
#define MIB (1u << 20)

/* --io-timeout far beyond every wait below: whatever is released was released by the close. */
static const char *const fault_args[] = {"--l1-size", "64MiB", "--chunk-size", "16", "--io-timeout",
                                         "60000",     NULL};

/* Polls until a statistic reaches at least want. */
static uint64_t stat_poll_min(kvp_client *c, const char *name, uint64_t want, int timeout_ms)
{
    uint64_t deadline = kvpt_now_ms() + (uint64_t)timeout_ms, v;
    while ((v = kvpt_stat(c, name)) < want && kvpt_now_ms() < deadline)
        kvpt_sleep_ms(20);
    return v;
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
    uint64_t deadline = kvpt_now_ms() + 30000;
    while (atomic_load(&b->rounds) < from + more) {
        if (atomic_load(&b->failed_line))
            fail_msg("bystander failed at line %d (rc %d)", atomic_load(&b->failed_line),
                     b->failed_rc);
        int st;
        if (waitpid(b->pid, &st, WNOHANG) == b->pid)
            fail_msg("bystander exited (status 0x%x, failed at line %d, rc %d)", st,
                     atomic_load(&b->failed_line), b->failed_rc);
        if (kvpt_now_ms() > deadline)
            fail_msg("bystander made no progress in 30 s (%u rounds)", atomic_load(&b->rounds));
        kvpt_sleep_ms(5);
    }
}

/* Starts the bystander and waits until all its sequences are stored. */
static struct bystander *bystander_start(const struct kvpt_daemon *d)
{
    int shared = MAP_SHARED | MAP_ANONYMOUS;
    /* cppcheck-suppress invalidFunctionArg ; an anonymous mapping takes fd -1 */
    struct bystander *b = mmap(NULL, sizeof(*b), PROT_READ | PROT_WRITE, shared, -1, 0);
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
    kvp_register_opts o = kvpt_layout_big("owner", KVP_TRANSPORT_AUTO);
    kvp_register_opts oi = kvpt_layout_big("owner-inline", KVP_TRANSPORT_INLINE);

    memset(s, 0, sizeof(*s));
    kvpt_daemon_start(&s->d, fault_args);
    s->c = kvpt_connect(&s->d);
    assert_int_equal(kvpt_stat(s->c, "shm_enabled"), 1);
    assert_int_equal(kvp_register(s->c, &o, &s->big), 0);
    assert_int_equal(kvp_instance_get_info(s->big)->transport, KVP_TRANSPORT_SHM);
    assert_int_equal(kvp_instance_get_info(s->big)->chunk_bytes, MIB);
    assert_int_equal(kvp_register(s->c, &oi, &s->big_inline), 0);
    if (committed)
        kvpt_store_seq(s->big, seq, committed);
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
    kvpt_assert_serves(&s->d);
    /* Polling until 0 is sound despite the bystander's own short-lived holds: a leaked hold
     * never goes away. */
    assert_int_equal(kvpt_stat_poll(s->c, "objects_reserved", 0, 5000), 0);
    assert_int_equal(kvpt_stat_poll(s->c, "objects_pinned", 0, 5000), 0);
    bystander_wait(s->b, r0, 20);
    bystander_stop(s->b);

    assert_int_equal(kvpt_stat_poll(s->c, "connections", s->baseline_conns, 5000),
                     s->baseline_conns);
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
    kvp_register_opts ro = kvpt_layout_big("victim-shm", KVP_TRANSPORT_SHM);
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
    kvpt_assert_seq(s.big, 100, 4, 12); /* reserved chunks are invisible */
    kill_and_reap(v);
    assert_true(kvpt_log_wait(&s.d, "Instance victim-shm unregistered (connection closed)", 5000));

    scenario_finish(&s);
    /* The committed prefix is intact, nothing of the victim is visible on either transport. */
    kvpt_assert_seq(s.big, 100, 4, 12);
    kvpt_assert_seq(s.big_inline, 100, 4, 12);
    /* The keys are free again. */
    kvpt_store_seq(s.big, 100, 12);
    kvpt_assert_seq(s.big_inline, 100, 12, 12);
    scenario_stop(&s);
}

/* ---------------------------------------------------------------------------------------- */
/* Victim 2: a raw inline upload stopped part-way, then SIGKILLed (or closed).               */

static void victim_inline_upload(const struct kvpt_daemon *d, int fd, uint32_t seq,
                                 bool close_early)
{
    kvp_register_opts ro = kvpt_layout_big("victim-upload", KVP_TRANSPORT_INLINE);
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
        kvpt_assert_seq(s.big_inline, 101, 4, 12);
    }
    kill_and_reap(v);

    scenario_finish(&s);
    assert_true(
        kvpt_log_wait(&s.d, "Instance victim-upload unregistered (connection closed)", 5000));
    /* The bystander's stores are all cache hits by now: no upload completed, the victim's
     * bytes were never counted as received. */
    assert_int_equal(kvpt_stat(s.c, "inline_bytes_in"), in0);
    kvpt_assert_seq(s.big, 101, 4, 12);
    kvpt_assert_seq(s.big_inline, 101, 4, 12);
    kvpt_store_seq(s.big_inline, 101, 12);
    kvpt_assert_seq(s.big, 101, 12, 12);
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
    kvp_register_opts ro = kvpt_layout_big("victim-reader", KVP_TRANSPORT_SHM);
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
    kvpt_assert_seq(s.big_inline, 102, 8, 8);
    kill_and_reap(v);

    scenario_finish(&s);
    kvpt_assert_seq(s.big, 102, 8, 8);
    kvpt_assert_seq(s.big_inline, 102, 8, 8);
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
    kvp_register_opts o = kvpt_layout_big("presser", KVP_TRANSPORT_AUTO);
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    kvpt_store_seq(inst, 102, 8);

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
    kvpt_assert_seq(inst, 102, 8, 8);

    kill_and_reap(v);
    assert_int_equal(kvpt_stat_poll(c, "objects_pinned", 0, 5000), 0);
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
    kvp_register_opts ro = kvpt_layout_big("victim-download", KVP_TRANSPORT_INLINE);
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
    kvpt_assert_seq(s.big_inline, 103, 16, 16);
    assert_true(kvpt_stat(s.c, "objects_pinned") >= 16); /* the victim is still stuck */
    kill_and_reap(v);

    scenario_finish(&s);
    assert_true(
        kvpt_log_wait(&s.d, "Instance victim-download unregistered (connection closed)", 5000));
    kvpt_assert_seq(s.big, 103, 16, 16);
    scenario_stop(&s);
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
