/*
 * lmcache.c - the "lmcache" section: kvpoold's LMCache front end against `lmcache server`, both
 * driven by the same real LMCache worker in the same run, and both against the worker's own copy
 * of the same bytes (the limit no server can beat).
 *
 * The worker is bench/lmcache_worker.py under the python of an LMCache virtual environment
 * (scripts/lmcache-env.sh BUILD 0.5.6: lmcache 0.5.6 and torch 2.13.0 CPU; --lmcache-venv). It
 * uses LMCache's own classes only (RequestClientFactory, EngineDrivenTransferContext, its
 * gather/scatter), as vLLM's LMCacheMPConnector does on a CPU worker in engine-driven mode; its
 * protocol is in the script's docstring. Without the venv the section says so and is skipped.
 *
 * Two phases, each with its own pair of servers (1 GiB pools, 256-token chunks, TCP on loopback,
 * free ports picked by the bench):
 *   shm     `lmcache server --supported-transfer-mode engine_driven --shm-name N
 *           --no-l1-use-lazy --eviction-policy LRU` (its log must say "Using shm non-GPU
 *           transfer strategy") and `kvpoold --lmcache tcp://...`; the worker must have mapped
 *           each server's segment (EngineDrivenContextShm). Limit: the worker's gather (store)
 *           and scatter (retrieve) between its paged KV cache and contiguous tensors, and a torch
 *           copy_ of the same bytes. Then the round trips of get_chunk_size and ping.
 *   pickle the same servers with --shm-name "" (no shared memory offered): the worker falls back
 *           to LMCache's pickle transport. Limit: what the worker does itself, gather +
 *           pickle.dumps before it sends a store, pickle.loads + scatter after it receives a
 *           retrieve.
 * Then the same two phases with LMCache 0.5.7 (--lmcache057-venv: its own `lmcache server`,
 * bench/lmcache_worker057.py, token_bytes keys, negotiate_chunk_size), whose servers log
 * "Using shm|safe inline engine-driven transfer strategy":
 *   0.5.7 shm       as shm above (no round trips);
 *   0.5.7 envelope  --shm-name "": the worker sends and receives a msgpack TensorEnvelope
 *                   (EngineDrivenContextInline). Limit: gather + encode_tensors for a store,
 *                   decode_tensors + scatter for a retrieve, the worker's own share.
 * A release whose venv is missing is skipped with a note. A kvpoold without --lmcache (its help
 * does not mention it) is left out with a note.
 *
 * Method, per chunk size (1, 4, 16, 32 MiB: bfloat16, 32 layers, 256 tokens, hidden 32-1024):
 * each server registers a fresh instance; at the first size the worker first stores 90% of a
 * pool's worth into each server, untimed but reported ("first-store"), so that every page of
 * each segment has been mapped by both processes and the pools are full: the measured
 * repetitions run in the steady state of a long-running server, evicting as they store.
 * Repetition r runs the cells (each server's stores then retrieves of the same fresh keys, the
 * limit) in an order rotated by r; a retrieve is preceded by the scheduler's lookup of its key
 * (untimed: LMCache's server reads only what a lookup locked). Repetition 0 is the warm-up, not
 * reported, and checks every retrieved byte. Ratios are paired by repetition before the median.
 *
 * kvpoold's own share: around each of its measured cells the bench reads the run time of its
 * LMCache thread (kvp-lmcache, /proc/PID/task/TID/schedstat), which serves every request and
 * makes every copy of the pickle transport; per operation, it is the time kvpoold itself adds
 * (a retrieve's includes the untimed lookup before it). A server whose own thread took no time
 * would answer that much sooner: lmcache server's p50 / (kvpoold's p50 - that time) is the
 * ratio no server over the same transport could beat ("vs_lmcache_free").
 *
 * A failed operation ends the run (kvpb_script_cmd): no ratio from a run that did not do what it
 * claims. Single-threaded; the servers and the script are children of the bench, stopped here.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench.h"

#ifndef KVPB_SOURCE_DIR
#define KVPB_SOURCE_DIR "."
#endif

#define LMC_TOKENS 256 /* --chunk-size of both servers: LMCache's default */
#define LMC_TOKENS_STR "256"
#define LMC_NSRV 2
#define LMC_NCELLS (LMC_NSRV + 1) /* the servers and the limit */

enum { SRV_LMCACHE, SRV_KVPOOL };

struct lmc_server {
    const char *name; /* as the worker names it */
    int transport;
    struct kvpb_child ch;
    char url[64];
    char socket[256]; /* kvpoold's own socket */
    bool up;          /* started and connected by the worker */
};

/* What tells one phase from another: LMCache's release and transport. */
struct lmc_kind {
    const char *detail;   /* the rows' detail (KVPB_D_LMC_*) */
    const char *tag;      /* in the names of the phase's logs, sockets and segments */
    const char *script;   /* the worker, in bench/ */
    const char *answer;   /* the transport its "setup" must answer */
    const char *strategy; /* the line both servers' logs must have */
    const char *lstore;   /* the worker's own copy of a store's bytes ("local" command) */
    const char *lretrieve;
    bool shm;  /* shared memory offered, else --shm-name "" */
    bool v057; /* LMCache 0.5.7 (its own server, worker and envelope) */
};

static const struct lmc_kind lmc_kinds[] = {
    {KVPB_D_LMC_SHM, "shm", "lmcache_worker.py", "shm", "Using shm non-GPU transfer strategy",
     "gather", "scatter", true, false},
    {KVPB_D_LMC_PICKLE, "pickle", "lmcache_worker.py", "pickle",
     "Using pickle non-GPU transfer strategy", "pickle-store", "pickle-retrieve", false, false},
    {KVPB_D_LMC057_SHM, "057-shm", "lmcache_worker057.py", "shm",
     "Using shm engine-driven transfer strategy", "gather", "scatter", true, true},
    {KVPB_D_LMC057_ENV, "057-envelope", "lmcache_worker057.py", "envelope",
     "Using safe inline engine-driven transfer strategy", "envelope-store", "envelope-retrieve",
     false, true},
};

struct lmc_phase {
    const struct kvpb_config *cfg;
    const char *dir;
    const struct lmc_kind *k;
    bool shm; /* the phase's transport: shm, else pickle or the envelope (k->shm) */
    const char *detail;
    struct lmc_server srv[LMC_NSRV];
    struct kvpb_script w;
    struct kvpb_rows *rows;
    uint64_t seq; /* next unused key number */
    double *lat;  /* KVPB_MAX_SAMPLES latencies of one command */
};

/* A loopback TCP port nobody listens on now (the server binds it a moment later). */
int kvpb_free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int port = -1;

    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* True when the file at path contains needle (server logs are small). */
static bool log_has(const char *path, const char *needle)
{
    char line[4096];
    bool found = false;
    FILE *f = fopen(path, "re");

    while (f && !found && fgets(line, sizeof(line), f))
        found = strstr(line, needle) != NULL;
    if (f)
        fclose(f);
    return found;
}

/* True when `kvpoold --help` mentions --lmcache: a build with the LMCache front end. */
bool kvpb_kvpoold_has_lmcache(const char *kvpoold)
{
    char cmd[600], line[512];
    bool found = false;

    snprintf(cmd, sizeof(cmd), "'%s' --help 2>&1", kvpoold);
    FILE *f = popen(cmd, "r");
    while (f && fgets(line, sizeof(line), f))
        found |= strstr(line, "--lmcache") != NULL;
    if (f)
        pclose(f);
    return found;
}

static int start_lmcache_server(struct lmc_phase *p, const char *venv, struct lmc_server *s)
{
    char exe[512], port[16], http[16], gb[32], shm[64], log[256];
    int zp = kvpb_free_port(), hp = kvpb_free_port();

    if (zp < 0 || hp < 0 || zp == hp)
        return -EADDRINUSE;
    snprintf(exe, sizeof(exe), "%s/bin/lmcache", venv);
    snprintf(port, sizeof(port), "%d", zp);
    snprintf(http, sizeof(http), "%d", hp);
    snprintf(gb, sizeof(gb), "%.6f", (double)p->cfg->l1_size / (double)KVPB_GiB);
    snprintf(shm, sizeof(shm), p->shm ? "lmcache_bench_%d_%s" : "", (int)getpid(), p->k->tag);
    snprintf(log, sizeof(log), "%s/lmcache-server-%s.log", p->dir, p->k->tag);
    snprintf(s->url, sizeof(s->url), "tcp://127.0.0.1:%d", zp);
    char *const argv[] = {exe,
                          "server",
                          "--host",
                          "127.0.0.1",
                          "--port",
                          port,
                          "--http-host",
                          "127.0.0.1",
                          "--http-port",
                          http,
                          "--chunk-size",
                          LMC_TOKENS_STR,
                          "--l1-size-gb",
                          gb,
                          "--no-l1-use-lazy",
                          "--eviction-policy",
                          "LRU",
                          "--supported-transfer-mode",
                          "engine_driven",
                          "--shm-name",
                          shm,
                          NULL};
    return kvpb_child_spawn(&s->ch, "lmcache server", argv, log);
}

static int start_kvpoold(struct lmc_phase *p, const char *kvpoold, struct lmc_server *s)
{
    char l1[32], shm[64], log[256], listen[64];
    int zp = kvpb_free_port();

    if (zp < 0)
        return -EADDRINUSE;
    snprintf(s->url, sizeof(s->url), "tcp://127.0.0.1:%d", zp);
    snprintf(listen, sizeof(listen), "%s", s->url);
    snprintf(l1, sizeof(l1), "%" PRIu64, p->cfg->l1_size);
    snprintf(shm, sizeof(shm), p->shm ? "bench_lmc_%d_%s" : "", (int)getpid(), p->k->tag);
    snprintf(s->socket, sizeof(s->socket), "%s/kvpoold-lmcache-%s.sock", p->dir, p->k->tag);
    snprintf(log, sizeof(log), "%s/kvpoold-lmcache-%s.log", p->dir, p->k->tag);
    char *const argv[] = {
        (char *)kvpoold, "--socket",   s->socket, "--l1-size",   l1,     "--chunk-size",
        LMC_TOKENS_STR,  "--shm-name", shm,       "--log-level", "info", "--http",
        "off",           "--lmcache",  listen,    NULL};
    int rc = kvpb_child_spawn(&s->ch, "kvpoold", argv, log);
    if (rc < 0)
        return rc;
    rc = kvpb_wait_kvpoold(s->socket, &s->ch, 120000);
    if (rc < 0)
        return rc;
    /* Measurements start on a pool that is wholly reserved, as a long-running daemon's is. */
    kvp_client *c = NULL;
    kvp_opts o = {.socket_path = s->socket, .timeout_ms = 60000};
    double waited;
    if ((rc = kvp_client_open(&o, &c)) == 0) {
        rc = kvpb_wait_pool_reserved(c, 600000, &waited);
        kvp_client_close(c);
    }
    return rc < 0 ? rc : 0;
}

/*
 * Run time so far of kvpoold's LMCache thread (the one named kvp-lmcache), nanoseconds: the first
 * field of /proc/PID/task/TID/schedstat. 0 when there is no such thread or file.
 */
uint64_t kvpb_lmc_thread_ns(pid_t pid)
{
    char path[96], comm[32];
    unsigned long long ns = 0;
    struct dirent *e;

    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *dir = opendir(path);
    /* cppcheck-suppress readdirCalled ; readdir_r is deprecated, and dir is private to this call */
    while (dir && ns == 0 && (e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%.16s/comm", (int)pid, e->d_name);
        FILE *f = fopen(path, "re");
        bool ours = f && fgets(comm, sizeof(comm), f) && strcmp(comm, "kvp-lmcache\n") == 0;
        if (f)
            fclose(f);
        if (!ours)
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%.16s/schedstat", (int)pid, e->d_name);
        f = fopen(path, "re");
        if (!f || fscanf(f, "%llu", &ns) != 1)
            ns = 0;
        if (f)
            fclose(f);
        break;
    }
    if (dir)
        closedir(dir);
    return ns;
}

/* "connect NAME URL": the worker waits for the server's first answer. */
static bool connect_server(struct lmc_phase *p, struct lmc_server *s)
{
    char cmd[160];
    size_t len = (size_t)snprintf(cmd, sizeof(cmd), "connect %s %s\n", s->name, s->url);
    int rc = write(p->w.in, cmd, len) == (ssize_t)len ? kvpb_script_read(&p->w) : -EPIPE;

    if (rc == 0 && strncmp(p->w.line, "ok ", 3) == 0) {
        if (atoi(p->w.line + 3) != LMC_TOKENS) {
            printf("lmcache: %s has %s-token chunks, not %d: left out\n", s->name, p->w.line + 3,
                   LMC_TOKENS);
            return false;
        }
        return true;
    }
    printf("lmcache: %s at %s did not answer (%s): left out\n", s->ch.name, s->url,
           rc < 0 ? strerror(-rc) : p->w.line);
    kvpb_child_print_log(&s->ch, 20);
    if (rc < 0) {
        kvpb_child_print_log(&p->w.ch, 20);
        exit(1);
    }
    return false;
}

/* "setup NAME CHUNK": a fresh instance; true when LMCache chose the phase's transport. */
static bool setup_server(struct lmc_phase *p, struct lmc_server *s, uint64_t chunk)
{
    char cmd[160], sz[32];
    snprintf(cmd, sizeof(cmd), "setup %s %" PRIu64 "\n", s->name, chunk);
    const char *t = kvpb_script_cmd(&p->w, cmd);
    if (t[0] != ' ' || strcmp(t + 1, p->k->answer) != 0) {
        /* 0.5.6's phases keep the words "lmcache: " that bench/smoke_lmcache.sh reads. */
        printf("%s: %s %s: the worker registered on%s, not %s%s: left out\n",
               p->k->v057 ? p->detail : "lmcache", s->name, kvpb_fmt_size(chunk, sz, sizeof(sz)), t,
               p->k->answer,
               strstr(t, "-refused") ? " (a probe chunk was not stored and retrieved: see the "
                                       "server's log)"
                                     : "");
        return false;
    }
    return true;
}

/* A timed command of the worker into cell c (NULL: the warm-up). */
static void timed(struct lmc_phase *p, const char *cmd, uint32_t nops, uint64_t bytes,
                  struct kvpb_cell *c)
{
    double ns;
    kvpb_script_timed(&p->w, cmd, nops, bytes, &ns, p->lat);
    if (c)
        kvpb_cell_add(c, ns, bytes, nops, p->lat);
}

static void xfer(struct lmc_phase *p, const struct lmc_server *s, const char *op, uint64_t chunk,
                 uint32_t nops, uint64_t seq, bool verify, struct kvpb_cell *c)
{
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "%s %s %" PRIu64 " %u %" PRIu64 " %d\n", op, s->name, chunk, nops,
             seq, verify);
    timed(p, cmd, nops, (uint64_t)nops * chunk, c);
}

static void local(struct lmc_phase *p, const char *op, uint64_t chunk, uint32_t nops,
                  struct kvpb_cell *c)
{
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "%s %" PRIu64 " %u\n", op, chunk, nops);
    timed(p, cmd, nops, (uint64_t)nops * chunk, c);
}

/* Median of a/b over repetitions, paired; NAN when either cell is missing. */
static double paired(const struct kvpb_cell *a, const struct kvpb_cell *b)
{
    if (!a->gbps.n || a->gbps.n != b->gbps.n)
        return NAN;
    return kvpb_paired_ratio(a->gbps.v, b->gbps.v, a->gbps.n);
}

/* own: kvpoold's {server_us, vs_lmcache_free}, or NULL. */
static void push(struct lmc_phase *p, int transport, int op, uint64_t chunk, struct kvpb_cell *c,
                 double to_limit, double vs_lmcache, const double *own)
{
    struct kvpb_row r = kvpb_row_blank(transport, op, p->detail);

    if (!c->lat.n)
        return;
    r.chunk_bytes = chunk;
    r.ratio_to_limit = to_limit;
    r.vs_lmcache = vs_lmcache;
    if (own) {
        r.server_us = own[0];
        r.vs_lmcache_free = own[1];
    }
    kvpb_cell_push(p->rows, &r, c);
}

/* "clear NAME": every chunk the server holds is freed (untimed, between cells). */
static void clear(struct lmc_phase *p, const struct lmc_server *s)
{
    char cmd[64];
    snprintf(cmd, sizeof(cmd), "clear %s\n", s->name);
    kvpb_script_cmd(&p->w, cmd);
}

/* The first pass at the first size: 75% of a pool's worth into each server (below LMCache's
 * eviction watermark, 80%), then a clear. */
static void fill(struct lmc_phase *p, uint64_t chunk, const bool *on)
{
    uint64_t n = p->cfg->l1_size / 4 * 3 / chunk;
    uint32_t nops = (uint32_t)(n > KVPB_MAX_SAMPLES ? KVPB_MAX_SAMPLES : n ? n : 1);
    char sz[32];

    for (int i = 0; i < LMC_NSRV; i++) {
        struct kvpb_cell c = {0};
        if (!on[i])
            continue;
        printf("%s: first pass, %u stores of %s into %s ...", p->detail, nops,
               kvpb_fmt_size(chunk, sz, sizeof(sz)), p->srv[i].name);
        fflush(stdout);
        uint64_t t0 = kvpb_now_ns();
        xfer(p, &p->srv[i], "store", chunk, nops, p->seq, false, &c);
        p->seq += nops;
        printf(" %.1f s\n", (double)(kvpb_now_ns() - t0) / 1e9);
        clear(p, &p->srv[i]);
        push(p, p->srv[i].transport, KVPB_OP_COLD, chunk, &c, NAN, NAN, NULL);
        kvpb_cell_free(&c);
    }
}

static void run_size(struct lmc_phase *p, uint64_t chunk, bool first)
{
    const struct kvpb_config *cfg = p->cfg;
    struct kvpb_cell st[LMC_NSRV] = {0}, rt[LMC_NSRV] = {0}, ls = {0}, lr = {0}, cp = {0};
    bool on[LMC_NSRV];
    char sz[32];
    uint64_t bytes = cfg->rep_bytes;
    uint64_t own_ns[2] = {0, 0}, own_ops = 0; /* kvpoold's LMCache thread: store, retrieve */

    /* Everything a repetition stores stays in the pool until it is retrieved. The pickle
     * transport and the envelope are 5-20 times slower: a quarter of the bytes keeps their
     * phases as long. */
    if (bytes > cfg->l1_size / 4)
        bytes = cfg->l1_size / 4;
    if (!p->shm)
        bytes /= 4;
    uint64_t n = bytes / chunk;
    uint32_t nops = (uint32_t)(n < 2 ? 2 : n > KVPB_MAX_SAMPLES ? KVPB_MAX_SAMPLES : n);
    for (int i = 0; i < LMC_NSRV; i++)
        on[i] = p->srv[i].up && setup_server(p, &p->srv[i], chunk);
    if (first) {
        for (int i = 0; i < LMC_NSRV; i++) {
            const char *want = p->k->strategy;
            if (on[i])
                printf("%s: %s log %s \"%s\"\n", p->detail, p->srv[i].name,
                       log_has(p->srv[i].ch.log, want) ? "says" : "does not say", want);
        }
        fill(p, chunk, on);
    }
    printf("%s %s: %u operations per cell and repetition ...", p->detail,
           kvpb_fmt_size(chunk, sz, sizeof(sz)), nops);
    fflush(stdout);
    uint64_t t0 = kvpb_now_ns();
    for (uint32_t rep = 0; rep <= cfg->reps; rep++) {
        bool m = rep > 0;
        for (uint32_t k = 0; k < LMC_NCELLS; k++) {
            uint32_t c = (k + rep) % LMC_NCELLS;
            if (c < LMC_NSRV && on[c]) {
                pid_t pid = m && c == SRV_KVPOOL ? p->srv[c].ch.pid : 0;
                uint64_t ns0 = pid ? kvpb_lmc_thread_ns(pid) : 0;
                xfer(p, &p->srv[c], "store", chunk, nops, p->seq, false, m ? &st[c] : NULL);
                uint64_t ns1 = pid ? kvpb_lmc_thread_ns(pid) : 0;
                xfer(p, &p->srv[c], "retrieve", chunk, nops, p->seq, !m, m ? &rt[c] : NULL);
                uint64_t ns2 = pid ? kvpb_lmc_thread_ns(pid) : 0;
                if (ns0 && ns1 >= ns0 && ns2 >= ns1) {
                    own_ns[0] += ns1 - ns0;
                    own_ns[1] += ns2 - ns1;
                    own_ops += nops;
                }
                clear(p, &p->srv[c]);
                p->seq += nops;
            } else if (c == LMC_NSRV) {
                local(p, p->k->lstore, chunk, nops, m ? &ls : NULL);
                local(p, p->k->lretrieve, chunk, nops, m ? &lr : NULL);
                if (p->shm)
                    local(p, "copy", chunk, nops, m ? &cp : NULL);
            }
        }
    }
    printf(" %.1f s\n", (double)(kvpb_now_ns() - t0) / 1e9);
    fflush(stdout);

    /* Ratios first: kvpb_cell_push sorts the cells. */
    double to_lim_s[LMC_NSRV], to_lim_r[LMC_NSRV];
    for (int i = 0; i < LMC_NSRV; i++) {
        to_lim_s[i] = paired(&st[i], &ls);
        to_lim_r[i] = paired(&rt[i], &lr);
    }
    double vs_s = paired(&st[SRV_KVPOOL], &st[SRV_LMCACHE]);
    double vs_r = paired(&rt[SRV_KVPOOL], &rt[SRV_LMCACHE]);
    /* kvpoold's own time per operation, and lmcache server's p50 against kvpoold's without it. */
    double own[2][2] = {{NAN, NAN}, {NAN, NAN}};
    struct kvpb_cell *kc[2] = {&st[SRV_KVPOOL], &rt[SRV_KVPOOL]};
    struct kvpb_cell *lc[2] = {&st[SRV_LMCACHE], &rt[SRV_LMCACHE]};
    for (int j = 0; j < 2 && own_ops; j++) {
        own[j][0] = (double)own_ns[j] / 1e3 / (double)own_ops;
        double kp = kvpb_percentile(kc[j]->lat.v, kc[j]->lat.n, 50.0);
        double lp = kvpb_percentile(lc[j]->lat.v, lc[j]->lat.n, 50.0);
        if (kp > own[j][0])
            own[j][1] = lp / (kp - own[j][0]);
    }
    for (int i = 0; i < LMC_NSRV; i++) {
        int t = p->srv[i].transport;
        bool k = i == SRV_KVPOOL;
        push(p, t, KVPB_OP_STORE, chunk, &st[i], to_lim_s[i], k ? vs_s : NAN, k ? own[0] : NULL);
        push(p, t, KVPB_OP_RETRIEVE, chunk, &rt[i], to_lim_r[i], k ? vs_r : NAN, k ? own[1] : NULL);
        kvpb_cell_free(&st[i]);
        kvpb_cell_free(&rt[i]);
    }
    push(p, KVPB_T_LMC_WORKER, p->shm ? KVPB_OP_GATHER : KVPB_OP_STORE, chunk, &ls, NAN, NAN, NULL);
    push(p, KVPB_T_LMC_WORKER, p->shm ? KVPB_OP_SCATTER : KVPB_OP_RETRIEVE, chunk, &lr, NAN, NAN,
         NULL);
    push(p, KVPB_T_LMC_WORKER, KVPB_OP_TORCH_COPY, chunk, &cp, NAN, NAN, NULL);
    kvpb_cell_free(&ls);
    kvpb_cell_free(&lr);
    kvpb_cell_free(&cp);
}

/* get_chunk_size and ping(instance id), each server in turn, repetitions interleaved. */
static void run_rtt(struct lmc_phase *p)
{
    static const char *const what[] = {"chunk-size", "ping"};
    static const int ops[] = {KVPB_OP_CHUNK_SIZE, KVPB_OP_PING};
    const struct kvpb_config *cfg = p->cfg;
    struct kvpb_cell c[LMC_NSRV][2] = {0};
    uint32_t n = cfg->rtt_count / cfg->reps;
    char cmd[128];

    n = n < 20 ? 20 : n;
    printf("lmcache round trips: %u per request, server and repetition ...", n);
    fflush(stdout);
    uint64_t t0 = kvpb_now_ns();
    for (uint32_t rep = 0; rep <= cfg->reps; rep++) {
        for (int k = 0; k < LMC_NSRV; k++) {
            int i = (k + (int)rep) % LMC_NSRV;
            if (!p->srv[i].up)
                continue;
            for (int j = 0; j < 2; j++) {
                snprintf(cmd, sizeof(cmd), "rtt %s %s %u\n", p->srv[i].name, what[j], n);
                timed(p, cmd, n, 0, rep > 0 ? &c[i][j] : NULL);
            }
        }
    }
    printf(" %.1f s\n", (double)(kvpb_now_ns() - t0) / 1e9);
    for (int j = 0; j < 2; j++) {
        double vs = NAN;
        if (c[SRV_KVPOOL][j].lat.n && c[SRV_LMCACHE][j].lat.n) {
            struct kvpb_samples a = {0}, b = {0};
            kvpb_samples_append(&a, c[SRV_LMCACHE][j].lat.v, c[SRV_LMCACHE][j].lat.n);
            kvpb_samples_append(&b, c[SRV_KVPOOL][j].lat.v, c[SRV_KVPOOL][j].lat.n);
            vs = kvpb_percentile(a.v, a.n, 50.0) / kvpb_percentile(b.v, b.n, 50.0);
            kvpb_samples_free(&a);
            kvpb_samples_free(&b);
        }
        for (int i = 0; i < LMC_NSRV; i++) {
            struct kvpb_cell *x = &c[i][j];
            struct kvpb_row r = kvpb_row_blank(p->srv[i].transport, ops[j], p->detail);
            if (x->lat.n) {
                kvpb_row_summarise(&r, x->gbps.v, x->ops.v, x->ops.n, x->lat.v, x->lat.n);
                r.gb_per_s = r.gb_min = r.gb_max = NAN; /* no payload */
                r.vs_lmcache = i == SRV_KVPOOL ? vs : NAN;
                kvpb_rows_push(p->rows, &r);
            }
            kvpb_cell_free(x);
        }
    }
}

static void stop_servers(struct lmc_phase *p)
{
    for (int i = 0; i < LMC_NSRV; i++) {
        if (p->srv[i].ch.pid <= 0)
            continue;
        int st = kvpb_child_stop(&p->srv[i].ch, 20000);
        /* lmcache server ends on SIGTERM with the signal's status; kvpoold exits 0. */
        if (i == SRV_KVPOOL && st != 0) {
            fprintf(stderr, "kvpool-bench: kvpoold (--lmcache) exited with status %d\n", st);
            kvpb_child_print_log(&p->srv[i].ch, 20);
        }
    }
}

static void run_phase(struct lmc_phase *p, const char *venv, const char *kvpoold, bool with_kvpoold)
{
    static const uint64_t sizes[] = {KVPB_MiB, 4 * KVPB_MiB, 16 * KVPB_MiB, 32 * KVPB_MiB};
    static const uint64_t quick[] = {KVPB_MiB};
    const uint64_t *s = p->cfg->quick ? quick : sizes;
    size_t nsizes = p->cfg->quick ? 1 : sizeof(sizes) / sizeof(sizes[0]);
    char script[512], log[256], foot[64], run[48], python[512];
    int rc;

    p->srv[SRV_LMCACHE] = (struct lmc_server){.name = "lmcache", .transport = KVPB_T_LMC_SERVER};
    p->srv[SRV_KVPOOL] = (struct lmc_server){.name = "kvpoold", .transport = KVPB_T_LMC_KVPOOL};
    printf("%s: starting lmcache server%s (pools %s, %d-token chunks, %s)\n", p->detail,
           with_kvpoold ? " and kvpoold --lmcache" : "",
           kvpb_fmt_size(p->cfg->l1_size, foot, sizeof(foot)), LMC_TOKENS,
           p->shm ? "shared memory" : "no shared memory: --shm-name \"\"");
    fflush(stdout);
    if ((rc = start_lmcache_server(p, venv, &p->srv[SRV_LMCACHE])) < 0)
        printf("lmcache: cannot start lmcache server: %s\n", strerror(-rc));
    if (with_kvpoold && (rc = start_kvpoold(p, kvpoold, &p->srv[SRV_KVPOOL])) < 0) {
        printf("lmcache: kvpoold --lmcache did not start (%s): left out\n", strerror(-rc));
        kvpb_child_stop(&p->srv[SRV_KVPOOL].ch, 5000);
    }

    snprintf(python, sizeof(python), "%s/bin/python", venv);
    snprintf(script, sizeof(script), "%s/bench/%s", KVPB_SOURCE_DIR, p->k->script);
    snprintf(log, sizeof(log), "%s/lmcache_worker-%s.log", p->dir, p->k->tag);
    snprintf(foot, sizeof(foot), "KVPB_FOOTPRINT=%" PRIu64, p->cfg->footprint);
    snprintf(run, sizeof(run), "KVPB_RUN_ID=%u", (unsigned)(p->seq ^ (uint64_t)getpid()));
    char *const argv[] = {python, script, NULL};
    /* The worker at LMCache's INFO level logs every gather and scatter: only warnings. */
    char *const env[] = {foot, run, "LMCACHE_LOG_LEVEL=WARNING", NULL};
    if ((rc = kvpb_script_start(&p->w, p->k->script, argv, env, log)) < 0) {
        printf("%s: skipped: cannot start %s: %s\n", p->detail, script, strerror(-rc));
        stop_servers(p);
        return;
    }
    if (kvpb_script_read(&p->w) < 0 || strncmp(p->w.line, "ready ", 6) != 0) {
        printf("%s: skipped: %s did not start: %s\n", p->detail, script, p->w.line);
        kvpb_child_print_log(&p->w.ch, 20);
        kvpb_script_stop(&p->w);
        stop_servers(p);
        return;
    }
    char pyv[32] = "?", lmv[32] = "?", tv[32] = "?";
    sscanf(p->w.line, "ready %31s %31s %31s", pyv, lmv, tv);
    printf("%s: worker: Python %s, lmcache %s, torch %s; %u+1 repetitions per size\n", p->detail,
           pyv, lmv, tv, p->cfg->reps);
    for (int i = 0; i < LMC_NSRV; i++)
        if (p->srv[i].ch.pid > 0)
            p->srv[i].up = connect_server(p, &p->srv[i]);
    if (p->srv[SRV_LMCACHE].up || p->srv[SRV_KVPOOL].up) {
        for (size_t i = 0; i < nsizes; i++)
            run_size(p, s[i], i == 0);
        if (p->shm && !p->k->v057)
            run_rtt(p);
    }
    kvpb_script_stop(&p->w);
    stop_servers(p);
}

void kvpb_lmcache_phase(const struct kvpb_config *cfg, const char *kvpoold, const char *dir,
                        uint32_t run_id, struct kvpb_rows *rows)
{
    static const char *const release[2] = {"0.5.6", "0.5.7rc2"};
    const char *venv[2] = {cfg->lmcache_venv, cfg->lmcache057_venv};
    static const char *const opt[2] = {"--lmcache-venv", "--lmcache057-venv"};
    bool have[2];
    char path[600];
    uint64_t t0 = kvpb_now_ns();

    for (int v = 0; v < 2; v++) {
        snprintf(path, sizeof(path), "%s/bin/lmcache", venv[v]);
        have[v] = access(path, X_OK) == 0;
        if (!have[v])
            printf("lmcache: LMCache %s rows skipped: no LMCache virtual environment at %s "
                   "(scripts/lmcache-env.sh BUILD_DIR %s creates it; %s DIR)\n",
                   release[v], venv[v], release[v], opt[v]);
    }
    if (!have[0] && !have[1]) {
        printf("lmcache section skipped: no LMCache virtual environment\n");
        return;
    }
    bool with_kvpoold = kvpb_kvpoold_has_lmcache(kvpoold);
    if (!with_kvpoold)
        printf("lmcache: %s has no LMCache front end (no --lmcache): only lmcache server and the "
               "worker's limits are measured\n",
               kvpoold);
    double *lat = malloc(sizeof(double) * KVPB_MAX_SAMPLES);
    if (!lat)
        exit(1);
    for (size_t i = 0; i < sizeof(lmc_kinds) / sizeof(lmc_kinds[0]); i++) {
        const struct lmc_kind *k = &lmc_kinds[i];
        if (!have[k->v057])
            continue;
        struct lmc_phase p = {.cfg = cfg,
                              .dir = dir,
                              .k = k,
                              .shm = k->shm,
                              .detail = k->detail,
                              .rows = rows,
                              .seq = (uint64_t)run_id << 24 | (uint64_t)i << 21,
                              .lat = lat};
        run_phase(&p, venv[k->v057], kvpoold, with_kvpoold);
    }
    free(lat);
    printf("lmcache: %.1f s\n", (double)(kvpb_now_ns() - t0) / 1e9);
}
