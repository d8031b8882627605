/*
 * restart.c - the "restart" section: what warm restart saves. A kvpoold whose pool is full of
 * chunks is killed (SIGKILL) and started again on the same socket; it adopts the pool, and its
 * chunks are served at once. Beside it, in the same run, what a cold start costs to get the
 * same chunks back.
 *
 * For each pool size (--restart-pools; default 1, 4 and 12 GiB, --quick 64 MiB) and each chunk
 * size (4 MiB, then 256 KiB), on CLOCK_MONOTONIC:
 *
 *   fill            a kvpoold of its own (posix segment: only a named one is adopted), its pool
 *                   reserved, is filled by one worker (shm, two-phase, 16 chunks a call) with as
 *                   many chunks as it holds, each one's first 16 bytes naming it;
 *   warm-first-hit  SIGKILL, then from just before the fork of the new kvpoold until a client
 *                   that connects, registers and looks up every millisecond finds the first
 *                   sequence (the whole of start-up, adoption included);
 *   adopt           what the new kvpoold's log line says: chunks, bytes and milliseconds of the
 *                   adoption itself (ops/s = chunks adopted per second);
 *   first-read      every adopted chunk retrieved over shm (prepare, copy out, commit), the
 *                   daemon checking each against its checksum on this first read;
 *   reread          the same again: nothing left to check. first-read / reread is the cost of
 *                   the verification; xxh3-64 (the checksum alone over the same bytes, in the
 *                   bench's process) and memcpy (the same bytes, rotating 256 MiB buffers,
 *                   second pass timed) are the physical limits measured in the same run;
 *   cold-ready      the pool freed (SIGTERM: a plain stop leaves nothing), a new kvpoold, from
 *                   the fork until its first answered ping;
 *   cold-reserved   the same until its whole pool is reserved (its statistic pool_reserved);
 *   store-again     then the worker stores the same chunks again (GB/s, ms): what warm restart
 *                   saves, at the least (a real worker would compute them again first);
 *   store-no-warm   the same stores into a kvpoold with --warm-restart off (pool reserved
 *                   first): what warm restart costs a store when nothing crashes (a checksum of
 *                   each chunk at its commit, and its record).
 *
 * Every retrieved chunk's first 16 bytes are checked (every 61st chunk in full); a chunk that
 * does not come back, or comes back wrong, makes the rows of its configuration invalid and is
 * said on stdout. A daemon that adopts nothing (an older kvpoold, or --warm-restart off) makes
 * the warm rows invalid, with the reason, and the section goes on. A pool is skipped, with a
 * note, when /dev/shm cannot hold it and 256 MiB more, or MemAvailable it and 2 GiB more.
 *
 * Single-threaded; the daemons are children of the bench (PR_SET_PDEATHSIG, daemon.c), one at a
 * time.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "bench.h"

#define SEQ_CHUNKS 16u            /* chunks per sequence, and per store/retrieve call */
#define NPATTERNS 8u              /* distinct chunk contents (after each chunk's 16-byte name) */
#define FULL_CHECK 61u            /* every FULL_CHECK-th chunk is compared in full */
#define ROTATE (256 * KVPB_MiB)   /* bytes of the rotating destination and memcpy buffers */
#define HIT_TIMEOUT_MS 300000     /* exec until the first hit */
#define RESERVE_TIMEOUT_MS 600000 /* a cold pool wholly reserved */

/* Stops the compiler from treating a baseline's result as dead. */
#define KVPB_CLOBBER() __asm__ volatile("" ::: "memory")

/* One configuration: a pool of pool bytes holding chunks of chunk bytes. */
struct cfgrun {
    const struct kvpb_config *cfg;
    const char *kvpoold;
    char socket[256], log[256], shm[64], l1[32], tokens[16];
    uint64_t pool, chunk;
    uint32_t nseq;  /* sequences of SEQ_CHUNKS chunks that fill the pool */
    uint32_t salt;  /* part of every token: runs never see each other's chunks */
    uint8_t **pat;  /* NPATTERNS chunk contents */
    uint8_t *dst;   /* ROTATE bytes, pre-faulted: where retrieves copy to */
    uint8_t *src;   /* ROTATE bytes, pre-faulted: the memcpy baseline's source */
    size_t dst_off; /* next chunk's place in dst */
    uint32_t *tok;  /* SEQ_CHUNKS * tokens of one sequence */
    struct kvpb_child ch;
};

/* The tokens of sequence s, in r->tok. */
static kvp_tokens seq_tokens(struct cfgrun *r, uint32_t s)
{
    uint32_t ct = r->cfg->chunk_tokens;
    for (uint32_t i = 0; i < SEQ_CHUNKS * ct; i++)
        r->tok[i] = r->salt ^ (s * 2654435761u) ^ (i * 40503u + 1u);
    return (kvp_tokens){.ids = r->tok, .count = SEQ_CHUNKS * ct};
}

/* The 16-byte name of chunk c of sequence s. */
static void chunk_name(const struct cfgrun *r, uint32_t s, uint32_t c, uint8_t out[16])
{
    uint64_t a = ((uint64_t)s << 32) | c, b = (uint64_t)r->salt ^ 0x5eedc0de5eedc0deull ^ a;
    memcpy(out, &a, 8);
    memcpy(out + 8, &b, 8);
}

static void fill_chunk(const struct cfgrun *r, uint32_t s, uint32_t c, uint8_t *to)
{
    memcpy(to, r->pat[(s * SEQ_CHUNKS + c) % NPATTERNS], r->chunk);
    chunk_name(r, s, c, to);
}

/* True if p holds chunk c of sequence s (its name; all of it for every FULL_CHECK-th). */
static bool chunk_ok(const struct cfgrun *r, uint32_t s, uint32_t c, const uint8_t *p)
{
    uint8_t name[16];
    chunk_name(r, s, c, name);
    if (memcmp(p, name, 16) != 0)
        return false;
    if ((s * SEQ_CHUNKS + c) % FULL_CHECK == 0) {
        const uint8_t *want = r->pat[(s * SEQ_CHUNKS + c) % NPATTERNS];
        return memcmp(p + 16, want + 16, r->chunk - 16) == 0;
    }
    return true;
}

/* Starts the daemon (with --warm-restart off when warm is false), appending to r->log; 0 or a
 * negative errno. */
static int spawn(struct cfgrun *r, uint64_t *t0, bool warm)
{
    char *const argv[] = {
        (char *)r->kvpoold,
        "--socket",
        r->socket,
        "--l1-size",
        r->l1,
        "--chunk-size",
        r->tokens,
        "--shm-name",
        r->shm,
        "--log-level",
        "info",
        "--http",
        "off",
        "--warm-restart",
        warm ? "on" : "off",
        NULL,
    };
    *t0 = kvpb_now_ns();
    return kvpb_child_spawn(&r->ch, "kvpoold", argv, r->log);
}

static void kill_daemon(struct cfgrun *r)
{
    if (r->ch.pid > 0) {
        kill(r->ch.pid, SIGKILL);
        waitpid(r->ch.pid, NULL, 0);
        r->ch.pid = 0;
    }
}

/* A client registered on the shm transport for r's chunks; NULL with a note when it fails. */
static kvp_client *connect_worker(struct cfgrun *r, kvp_instance **inst, int timeout_ms)
{
    kvp_client *c = NULL;
    kvp_register_opts ro;
    kvp_opts o = {.socket_path = r->socket, .timeout_ms = timeout_ms};
    int rc = kvp_client_open(&o, &c);
    if (rc == 0 && (rc = kvpb_register_opts("bench-restart", r->chunk, r->cfg->chunk_tokens,
                                            KVP_TRANSPORT_SHM, &ro)) == 0)
        rc = kvp_register(c, &ro, inst);
    if (rc < 0) {
        kvp_client_close(c);
        return NULL;
    }
    return c;
}

/* Stores every sequence (two-phase, a sequence a call). Returns the chunks stored and the time
 * in *ms, or a negative error (said on stdout). */
static int64_t store_all(struct cfgrun *r, kvp_instance *inst, double *ms)
{
    uint32_t ct = r->cfg->chunk_tokens;
    int64_t stored = 0;
    uint64_t t0 = kvpb_now_ns();
    for (uint32_t s = 0; s < r->nseq; s++) {
        kvp_tokens t = seq_tokens(r, s);
        kvp_store_plan p;
        int rc = kvp_prepare_store(inst, &t, 0, SEQ_CHUNKS * ct, &p);
        if (rc < 0) {
            printf("  store of sequence %u: %s\n", s, kvp_strerror(rc));
            return rc;
        }
        for (uint32_t i = 0; i < p.nslots; i++)
            fill_chunk(r, s, p.slots[i].chunk_index, p.slots[i].data);
        uint32_t n = p.nslots;
        if ((rc = kvp_commit_store(inst, &p)) < 0) {
            printf("  commit of sequence %u: %s\n", s, kvp_strerror(rc));
            return rc;
        }
        stored += n;
    }
    /* A round trip makes the last pipelined commit visible (and reports its failure). */
    kvp_tokens t = seq_tokens(r, r->nseq - 1);
    int rc = kvp_lookup(inst, &t);
    *ms = (double)(kvpb_now_ns() - t0) / 1e6;
    if (rc != (int)SEQ_CHUNKS) {
        printf("  after storing, the last sequence has %d of %u chunks\n", rc, SEQ_CHUNKS);
        return rc < 0 ? rc : -EIO;
    }
    return stored;
}

/* Retrieves every sequence (two-phase: pins, copies out, releases), checking each chunk.
 * Returns 0 with the time in *ms, or a negative error (said on stdout). */
static int read_all(struct cfgrun *r, kvp_instance *inst, double *ms)
{
    uint32_t ct = r->cfg->chunk_tokens;
    uint64_t t0 = kvpb_now_ns();
    for (uint32_t s = 0; s < r->nseq; s++) {
        kvp_tokens t = seq_tokens(r, s);
        kvp_retrieve_plan p;
        int rc = kvp_prepare_retrieve(inst, &t, 0, SEQ_CHUNKS * ct, &p);
        if (rc != (int)SEQ_CHUNKS) {
            printf("  retrieve of sequence %u: %d of %u chunks (%s)\n", s, rc, SEQ_CHUNKS,
                   rc < 0 ? kvp_strerror(rc) : "a miss");
            if (rc > 0)
                kvp_commit_retrieve(inst, &p);
            return rc < 0 ? rc : -EIO;
        }
        bool ok = true;
        for (uint32_t i = 0; i < p.nslots; i++) {
            if (r->dst_off + r->chunk > ROTATE)
                r->dst_off = 0;
            uint8_t *to = r->dst + r->dst_off;
            memcpy(to, p.slots[i].data, r->chunk);
            r->dst_off += r->chunk;
            ok &= chunk_ok(r, s, i, to);
        }
        if ((rc = kvp_commit_retrieve(inst, &p)) < 0 || !ok) {
            printf("  sequence %u: %s\n", s, ok ? kvp_strerror(rc) : "a chunk came back wrong");
            return rc < 0 ? rc : -EIO;
        }
    }
    *ms = (double)(kvpb_now_ns() - t0) / 1e6;
    return 0;
}

/* memcpy of bytes from r->src to r->dst, rotating, chunk by chunk (a first pass untimed):
 * GB/s. */
static double memcpy_gbps(const struct cfgrun *r, uint64_t bytes)
{
    double gbps = NAN;
    for (int pass = 0; pass < 2; pass++) {
        uint64_t t0 = kvpb_now_ns(), left = bytes;
        size_t off = 0;
        while (left) {
            size_t n = left < r->chunk ? (size_t)left : (size_t)r->chunk;
            if (off + n > ROTATE)
                off = 0;
            memcpy(r->dst + off, r->src + off, n);
            off += n;
            left -= n;
        }
        KVPB_CLOBBER();
        gbps = (double)bytes / (double)(kvpb_now_ns() - t0);
    }
    return gbps;
}

/* XXH3-64 of bytes of chunks (the patterns, in turn): GB/s. */
static double xxh3_gbps(const struct cfgrun *r, uint64_t bytes)
{
    volatile uint64_t sink = 0;
    uint64_t t0 = kvpb_now_ns();
    for (uint64_t done = 0, i = 0; done < bytes; done += r->chunk, i++)
        sink ^= XXH3_64bits(r->pat[i % NPATTERNS], r->chunk);
    (void)sink;
    return (double)bytes / (double)(kvpb_now_ns() - t0);
}

/* The last "Adopted the pool of kvpoold pid" line of the log: chunks, bytes, ms. */
static bool adopted_from_log(const struct cfgrun *r, uint64_t *chunks, uint64_t *bytes, double *ms)
{
    static const char mark[] = "Adopted the pool of kvpoold pid ";
    char line[2048];
    bool found = false;
    FILE *f = fopen(r->log, "r");
    while (f && fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, mark), *q = p ? strstr(p, "): ") : NULL;
        unsigned long long n, b, t;
        if (q && sscanf(q, "): %llu chunks, %llu bytes in %llu ms", &n, &b, &t) == 3) {
            *chunks = n;
            *bytes = b;
            *ms = (double)t;
            found = true;
        }
    }
    if (f)
        fclose(f);
    return found;
}

/* Connects, registers and looks up sequence 0 every millisecond until it is found. Returns the
 * client (and *inst) with *ms from t0, or NULL (said on stdout). */
static kvp_client *first_hit(struct cfgrun *r, uint64_t t0, kvp_instance **inst, double *ms)
{
    for (;;) {
        kvp_client *c = connect_worker(r, inst, 60000);
        if (c) {
            kvp_tokens t = seq_tokens(r, 0);
            int rc = kvp_lookup(*inst, &t);
            if (rc > 0) {
                *ms = (double)(kvpb_now_ns() - t0) / 1e6;
                return c;
            }
            kvp_client_close(c);
            if (rc == 0) {
                printf("  the new kvpoold serves, but without the chunks of the old one (it did "
                       "not adopt its pool: --warm-restart off, or a kvpoold without it)\n");
                return NULL;
            }
        }
        if (!kvpb_child_alive(&r->ch)) {
            printf("  the new kvpoold exited during start-up (log below)\n");
            kvpb_child_print_log(&r->ch, 20);
            return NULL;
        }
        if (kvpb_now_ns() - t0 > (uint64_t)HIT_TIMEOUT_MS * 1000000) {
            printf("  no hit within %d s\n", HIT_TIMEOUT_MS / 1000);
            return NULL;
        }
        kvpb_sleep_ms(1);
    }
}

static void one_config(struct cfgrun *r, struct kvpb_rows *rows)
{
    char sz[32], cs[32];
    uint64_t t0;
    double ms, load;
    kvp_instance *inst = NULL;
    kvp_client *c = NULL, *stats = NULL;
    struct kvpb_row hit = kvpb_row_blank(KVPB_T_KVPOOL, KVPB_OP_WARM_HIT, KVPB_D_RESTART);
    struct kvpb_row adopt = kvpb_row_blank(KVPB_T_KVPOOL, KVPB_OP_ADOPT, KVPB_D_RESTART);
    struct kvpb_row first = kvpb_row_blank(KVPB_T_SHM, KVPB_OP_FIRST_READ, KVPB_D_RESTART);
    struct kvpb_row again = kvpb_row_blank(KVPB_T_SHM, KVPB_OP_REREAD, KVPB_D_RESTART);
    struct kvpb_row xxh = kvpb_row_blank(KVPB_T_HASH, KVPB_OP_CHECKSUM, KVPB_D_RESTART);
    struct kvpb_row mc = kvpb_row_blank(KVPB_T_MEMCPY, KVPB_OP_COPY, KVPB_D_RESTART);
    struct kvpb_row ready = kvpb_row_blank(KVPB_T_KVPOOL, KVPB_OP_COLD_READY, KVPB_D_RESTART);
    struct kvpb_row resv = kvpb_row_blank(KVPB_T_KVPOOL, KVPB_OP_COLD_RESERVE, KVPB_D_RESTART);
    struct kvpb_row store = kvpb_row_blank(KVPB_T_SHM, KVPB_OP_STORE_AGAIN, KVPB_D_RESTART);
    struct kvpb_row nowarm = kvpb_row_blank(KVPB_T_SHM, KVPB_OP_STORE_NOWARM, KVPB_D_RESTART);
    struct kvpb_row *all[] = {&hit, &adopt, &first, &again, &xxh,
                              &mc,  &ready, &resv,  &store, &nowarm};
    const size_t nall = sizeof(all) / sizeof(all[0]);
    bool warm_ok = false, cold_ok = false, nowarm_ok = false;

    for (size_t i = 0; i < nall; i++) {
        all[i]->pool_bytes = r->pool;
        all[i]->chunk_bytes = r->chunk;
        all[i]->samples = 1;
    }
    kvpb_fmt_size(r->pool, sz, sizeof(sz));
    kvpb_fmt_size(r->chunk, cs, sizeof(cs));
    printf("restart: %s pool of %s chunks ...\n", sz, cs);
    fflush(stdout);

    /* The full pool. */
    if (spawn(r, &t0, true) < 0 || kvpb_wait_kvpoold(r->socket, &r->ch, 120000) < 0)
        goto out;
    c = connect_worker(r, &inst, 120000);
    if (!c || kvpb_wait_pool_reserved(c, RESERVE_TIMEOUT_MS, &ms) < 0) {
        printf("  cannot register, or the pool is never reserved\n");
        goto out;
    }
    int64_t n = store_all(r, inst, &ms);
    if (n != (int64_t)r->nseq * SEQ_CHUNKS)
        goto out;
    uint64_t bytes = (uint64_t)n * r->chunk;
    printf("  filled with %" PRId64 " chunks in %.0f ms (%.2f GB/s)\n", n, ms,
           (double)bytes / (ms * 1e6));
    kvp_client_close(c);
    c = NULL;

    /* A crash, and the daemon again on the same socket. */
    kill_daemon(r);
    if (spawn(r, &t0, true) < 0)
        goto out;
    c = first_hit(r, t0, &inst, &hit.ms);
    if (!c)
        goto out;
    uint64_t achunks = 0, abytes = 0;
    if (!adopted_from_log(r, &achunks, &abytes, &adopt.ms) || achunks != (uint64_t)n) {
        printf("  the new kvpoold's log says it adopted %" PRIu64 " of %" PRId64 " chunks\n",
               achunks, n);
        goto out;
    }
    adopt.samples = achunks;
    adopt.ops_per_s = adopt.ms > 0 ? (double)achunks / (adopt.ms / 1e3) : NAN;
    adopt.gb_per_s = adopt.ms > 0 ? (double)abytes / (adopt.ms * 1e6) : NAN;
    /* Reads measured on a daemon that no longer reserves anything. */
    if (kvpb_wait_pool_reserved(c, RESERVE_TIMEOUT_MS, &ms) < 0 ||
        read_all(r, inst, &first.ms) < 0 || read_all(r, inst, &again.ms) < 0)
        goto out;
    first.gb_per_s = (double)bytes / (first.ms * 1e6);
    again.gb_per_s = (double)bytes / (again.ms * 1e6);
    first.ratio_to_limit = first.gb_per_s / again.gb_per_s;
    uint64_t base = bytes < 4 * KVPB_GiB ? bytes : 4 * KVPB_GiB;
    xxh.gb_per_s = xxh3_gbps(r, base);
    mc.gb_per_s = memcpy_gbps(r, base);
    first.ratio_to_memcpy = first.gb_per_s / mc.gb_per_s;
    again.ratio_to_memcpy = again.gb_per_s / mc.gb_per_s;
    kvp_stat st[256];
    int ns = kvp_stats(c, st, 256);
    for (int i = 0; i < ns && i < 256; i++)
        if (strcmp(st[i].name, "warm_restart_corrupt_chunks") == 0 && st[i].value)
            printf("  note: the daemon counted %" PRIu64 " corrupt chunks\n", st[i].value);
    warm_ok = true;
    kvp_client_close(c);
    c = NULL;

    /* A plain stop frees the pool; a cold start, and the worker stores it all again. */
    if (kvpb_child_stop(&r->ch, 60000) != 0)
        printf("  note: kvpoold did not stop cleanly\n");
    if (spawn(r, &t0, true) < 0 || kvpb_wait_kvpoold(r->socket, &r->ch, 120000) < 0)
        goto out;
    ready.ms = (double)(kvpb_now_ns() - t0) / 1e6;
    kvp_opts o = {.socket_path = r->socket, .timeout_ms = 60000};
    if (kvp_client_open(&o, &stats) < 0 ||
        kvpb_wait_pool_reserved(stats, RESERVE_TIMEOUT_MS, &ms) < 0)
        goto out;
    resv.ms = (double)(kvpb_now_ns() - t0) / 1e6;
    c = connect_worker(r, &inst, 120000);
    if (!c || store_all(r, inst, &store.ms) != n)
        goto out;
    store.gb_per_s = (double)bytes / (store.ms * 1e6);
    store.ratio_to_memcpy = store.gb_per_s / mc.gb_per_s;
    hit.speedup = (resv.ms + store.ms) / hit.ms;
    cold_ok = true;
    kvp_client_close(c);
    kvp_client_close(stats);
    c = stats = NULL;

    /* What warm restart costs a store when nothing crashes: a checksum of every chunk at its
     * commit, and a record. The same stores into a daemon without it. */
    if (kvpb_child_stop(&r->ch, 60000) != 0)
        printf("  note: kvpoold did not stop cleanly\n");
    if (spawn(r, &t0, false) < 0 || kvpb_wait_kvpoold(r->socket, &r->ch, 120000) < 0)
        goto out;
    c = connect_worker(r, &inst, 120000);
    if (c && kvpb_wait_pool_reserved(c, RESERVE_TIMEOUT_MS, &ms) >= 0 &&
        store_all(r, inst, &nowarm.ms) == n) {
        nowarm.gb_per_s = (double)bytes / (nowarm.ms * 1e6);
        nowarm.ratio_to_memcpy = nowarm.gb_per_s / mc.gb_per_s;
        store.ratio_to_limit = store.gb_per_s / nowarm.gb_per_s;
        nowarm_ok = true;
    }
out:
    if (cold_ok)
        printf("  first hit %.0f ms after exec (adoption %.0f ms, %" PRIu64 " chunks); cold: "
               "ready %.0f ms, reserved %.0f ms, stored again in %.0f ms (%.0f ms without warm "
               "restart)\n",
               hit.ms, adopt.ms, adopt.samples, ready.ms, resv.ms, store.ms, nowarm.ms);
    kvp_client_close(c);
    kvp_client_close(stats);
    if (kvpb_child_stop(&r->ch, 60000) != 0)
        printf("  note: kvpoold did not stop cleanly (log: %s)\n", r->log);
    for (size_t i = 0; i < nall; i++) {
        bool warm = all[i] != &ready && all[i] != &resv && all[i] != &store && all[i] != &nowarm;
        bool ok = all[i] == &nowarm ? nowarm_ok : warm ? warm_ok : cold_ok;
        if (!ok) {
            all[i]->invalid = true;
            all[i]->ms = all[i]->gb_per_s = all[i]->ops_per_s = NAN;
        }
        if (getloadavg(&load, 1) == 1)
            all[i]->load1 = load;
        kvpb_rows_push(rows, all[i]);
    }
    if (!warm_ok || !cold_ok || !nowarm_ok)
        printf("  (rows of this configuration that did not complete are invalid)\n");
    fflush(stdout);
}

void kvpb_restart_phase(const struct kvpb_config *cfg, const char *kvpoold, const char *dir,
                        struct kvpb_rows *rows)
{
    static const uint64_t chunks[] = {4 * KVPB_MiB, 256 * KVPB_KiB};
    struct cfgrun r = {.cfg = cfg, .kvpoold = kvpoold};
    char sz[32];

    printf("restart: pools filled, SIGKILLed and adopted, against a cold start (posix segment, "
           "%u pool size(s))\n",
           cfg->nrestart_pools);
    r.salt = (uint32_t)(kvpb_now_ns() ^ (uint64_t)getpid());
    r.pat = calloc(NPATTERNS, sizeof(*r.pat));
    r.tok = calloc((size_t)SEQ_CHUNKS * cfg->chunk_tokens, sizeof(*r.tok));
    /* cppcheck-suppress invalidFunctionArg ; an anonymous mapping takes fd -1 */
    r.dst = mmap(NULL, ROTATE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    /* cppcheck-suppress invalidFunctionArg ; an anonymous mapping takes fd -1 */
    r.src = mmap(NULL, ROTATE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (!r.pat || !r.tok || r.dst == MAP_FAILED || r.src == MAP_FAILED) {
        printf("restart: no memory for the section's buffers: skipped\n");
        goto out;
    }
    memset(r.dst, 0x11, ROTATE);
    memset(r.src, 0x22, ROTATE);
    snprintf(r.socket, sizeof(r.socket), "%s/restart.sock", dir);
    snprintf(r.log, sizeof(r.log), "%s/kvpoold-restart.log", dir);
    snprintf(r.shm, sizeof(r.shm), "bench_restart_%d", (int)getpid());
    snprintf(r.tokens, sizeof(r.tokens), "%u", cfg->chunk_tokens);
    for (size_t k = 0; k < sizeof(chunks) / sizeof(chunks[0]); k++) {
        r.chunk = chunks[k];
        for (uint32_t i = 0; i < NPATTERNS; i++) {
            free(r.pat[i]);
            r.pat[i] = malloc(r.chunk);
            if (!r.pat[i]) {
                printf("restart: no memory for the chunk contents: skipped\n");
                goto out;
            }
            for (uint64_t b = 0; b < r.chunk; b += 8) {
                uint64_t v = XXH3_64bits_withSeed(&b, sizeof(b), i + 1 + r.salt);
                memcpy(r.pat[i] + b, &v, 8);
            }
        }
        for (uint32_t p = 0; p < cfg->nrestart_pools; p++) {
            r.pool = cfg->restart_pools[p];
            r.nseq = (uint32_t)(r.pool / (r.chunk * SEQ_CHUNKS));
            kvpb_fmt_size(r.pool, sz, sizeof(sz));
            if (r.nseq == 0) {
                printf("restart: %s pool skipped: it holds less than a sequence of %u chunks\n", sz,
                       SEQ_CHUNKS);
                continue;
            }
            uint64_t shm = kvpb_free_devshm(), avail = kvpb_mem_available();
            if (shm < r.pool + 256 * KVPB_MiB || avail < r.pool + 2 * KVPB_GiB) {
                printf("restart: %s pool skipped: /dev/shm has %.1f GiB free (it needs the pool "
                       "and 256 MiB), MemAvailable %.1f GiB (the pool and 2 GiB)\n",
                       sz, (double)shm / (double)KVPB_GiB, (double)avail / (double)KVPB_GiB);
                continue;
            }
            snprintf(r.l1, sizeof(r.l1), "%" PRIu64, r.pool);
            unlink(r.socket);
            one_config(&r, rows);
        }
    }
out:
    for (uint32_t i = 0; r.pat && i < NPATTERNS; i++)
        free(r.pat[i]);
    free(r.pat);
    free(r.tok);
    if (r.dst && r.dst != MAP_FAILED)
        munmap(r.dst, ROTATE);
    if (r.src && r.src != MAP_FAILED)
        munmap(r.src, ROTATE);
}
