/*
 * python.c - the "python" section: the Python binding's store and retrieve on numpy arrays
 * against the C library's, same chunks, same bytes, same daemon.
 *
 * The Python side is bench/python_path.py, run by Debian's /usr/bin/python3 (the interpreter
 * that has numpy; without it the section is skipped with a note) in its --serve mode: it takes
 * one command per line on stdin and answers one line on stdout (the protocol is in the
 * script's docstring). The binding is the checkout's (PYTHONPATH=<source>/python) and the
 * library the one this bench is linked with (KVPOOL_LIB, found with dladdr), so both paths run
 * the same libkvpool.
 *
 * The C side is worker 0 of the run's worker pool doing kvp_store() / kvp_retrieve() (the
 * calls ctx.store() / ctx.retrieve() make; cmd.plain), on the shm transport. Both copy between
 * the pool and rotating buffers of the same --footprint, chunk i in slot i % (footprint /
 * chunk), so neither copies cache-hot memory. For each chunk size (4 and 16 MiB), repetition r
 * runs the C store and retrieve then the Python ones, or the other way round for odd r, each
 * moving the same bytes; "x C" is the median over repetitions of (Python / C of the same
 * repetition). Repetition 0 is the warm-up: not reported, every retrieved byte checked.
 *
 * A failed operation on either side ends the run with its message (and the tail of the
 * script's stderr, kept in the bench's directory): no ratio from a run that did not do what it
 * claims. Single-threaded; the script is a child of the bench (PR_SET_PDEATHSIG).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#ifndef KVPB_SOURCE_DIR
#define KVPB_SOURCE_DIR "."
#endif

#define PYTHON "/usr/bin/python3"

/* Runs /usr/bin/python3 -c "import numpy" quietly. Returns 0, or a note on why not. */
static const char *numpy_missing(void)
{
    if (access(PYTHON, X_OK) != 0)
        return "python section skipped: " PYTHON " not found";
    pid_t pid = fork();
    if (pid < 0)
        return "python section skipped: fork failed";
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        execl(PYTHON, "python3", "-c", "import numpy", (char *)NULL);
        _exit(127);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return "python section skipped: " PYTHON " has no numpy (apt-get install python3-numpy)";
    return NULL;
}

/* The libkvpool.so this program runs, for the script's KVPOOL_LIB. */
static const char *library_path(void)
{
    Dl_info info;
    if (dladdr((void *)(uintptr_t)kvp_version, &info) && info.dli_fname && info.dli_fname[0])
        return info.dli_fname;
    return NULL;
}

static int py_start(struct kvpb_script *p, const char *socket, const char *dir, uint64_t footprint,
                    uint32_t run_id)
{
    char script[512], foot[32], run[16], log[256], env_path[1100], env_lib[600];
    const char *lib = library_path();

    snprintf(script, sizeof(script), "%s/bench/python_path.py", KVPB_SOURCE_DIR);
    snprintf(env_path, sizeof(env_path), "PYTHONPATH=%s/python", KVPB_SOURCE_DIR);
    snprintf(env_lib, sizeof(env_lib), "KVPOOL_LIB=%s", lib ? lib : "");
    snprintf(foot, sizeof(foot), "%" PRIu64, footprint);
    snprintf(run, sizeof(run), "%u", run_id);
    snprintf(log, sizeof(log), "%s/python_path.log", dir);
    if (access(script, R_OK) != 0) {
        printf("python section skipped: %s not found\n", script);
        return -ENOENT;
    }
    char *const argv[] = {PYTHON,        script, "--serve",  "--socket", (char *)socket,
                          "--footprint", foot,   "--run-id", run,        NULL};
    char *const env[] = {env_path, lib ? env_lib : NULL, NULL};
    int rc = kvpb_script_start(p, "python_path.py", argv, env, log);
    if (rc < 0)
        printf("python section skipped: cannot start %s: %s\n", script, strerror(-rc));
    return rc;
}

/* One cell: per-repetition GB/s and ops/s, every latency sample. */
/* The Python side of a repetition: "store CHUNK NOPS SEQ VERIFY". */
static void py_run(struct kvpb_script *p, const char *op, uint64_t chunk, uint32_t nops,
                   uint64_t seq, bool verify, struct kvpb_cell *c, double *lat)
{
    char cmd[160];
    double ns;
    snprintf(cmd, sizeof(cmd), "%s %" PRIu64 " %u %" PRIu64 " %d\n", op, chunk, nops, seq, verify);
    kvpb_script_timed(p, cmd, nops, (uint64_t)nops * chunk, &ns, lat);
    if (c)
        kvpb_cell_add(c, ns, (uint64_t)nops * chunk, nops, lat);
}

/* The C side: worker 0, kvp_store()/kvp_retrieve() on shm. */
static void c_run(struct kvpb_pool *pool, int op, uint64_t chunk, uint32_t nops, uint64_t seq,
                  uint32_t run_id, bool verify, struct kvpb_cell *c)
{
    struct kvpb_wres res[KVPB_MAX_WORKERS];
    const double *samples[KVPB_MAX_WORKERS];
    struct kvpb_cmd cmd = {.transport = KVPB_T_SHM,
                           .op = op,
                           .chunk_bytes = chunk,
                           .nops = nops,
                           .seq_base = seq,
                           .verify = verify,
                           .nworkers = 1,
                           .run_id = run_id,
                           .batch = 1,
                           .plain = 1};
    if (kvpb_pool_run(pool, &cmd, res, samples) < 0)
        exit(1);
    if (c)
        kvpb_cell_add(c, (double)(res[0].t_end_ns - res[0].t_start_ns), res[0].bytes, res[0].nops,
                      samples[0]);
}

static void push(struct kvpb_rows *rows, int transport, int op, const char *detail, uint64_t chunk,
                 struct kvpb_cell *c, const struct kvpb_cell *vs)
{
    struct kvpb_row r = kvpb_row_blank(transport, op, detail);

    r.chunk_bytes = chunk;
    if (vs && vs->gbps.n == c->gbps.n)
        r.ratio_to_c = kvpb_paired_ratio(c->gbps.v, vs->gbps.v, c->gbps.n);
    kvpb_cell_push(rows, &r, c);
    kvpb_cell_free(c);
}

void kvpb_python_phase(const struct kvpb_config *cfg, struct kvpb_pool *pool, const char *socket,
                       const char *dir, uint64_t pool_size, uint32_t run_id, uint64_t *next_seq,
                       struct kvpb_rows *rows)
{
    static const uint64_t sizes[] = {4 * KVPB_MiB, 16 * KVPB_MiB};
    static const uint64_t quick[] = {256 * KVPB_KiB};
    const uint64_t *s = cfg->quick ? quick : sizes;
    size_t nsizes = cfg->quick ? 1 : 2;
    struct kvpb_script p;
    const char *why = numpy_missing();
    char sz[32], cmd[64];

    if (why) {
        printf("%s\n", why);
        return;
    }
    uint64_t t0 = kvpb_now_ns();
    if (py_start(&p, socket, dir, cfg->footprint, run_id) < 0)
        return;
    if (kvpb_script_read(&p) < 0 || strncmp(p.line, "ready ", 6) != 0) {
        printf("python section skipped: python_path.py did not start: %s\n", p.line);
        kvpb_child_print_log(&p.ch, 20);
        kvpb_script_stop(&p);
        return;
    }
    char pyv[32] = "?", npv[32] = "?", lib[512] = "?";
    sscanf(p.line, "ready %31s %31s %511s", pyv, npv, lib);
    printf("python: Python %s, numpy %s, %s; %u+1 repetitions per size, interleaved with the C "
           "path\n",
           pyv, npv, lib, cfg->reps);
    fflush(stdout);
    double *lat = malloc(sizeof(double) * KVPB_MAX_SAMPLES);
    if (!lat)
        exit(1);
    for (size_t i = 0; i < nsizes; i++) {
        uint64_t c = s[i];
        uint64_t bytes = cfg->rep_bytes < pool_size / 2 ? cfg->rep_bytes : pool_size / 2;
        uint32_t nops = (uint32_t)(bytes / c ? bytes / c : 1);
        struct kvpb_cell cs = {0}, cr = {0}, ps = {0}, pr = {0};
        struct kvpb_cmd setup = {.transport = KVPB_T_SHM,
                                 .op = KVPB_OP_SETUP,
                                 .chunk_bytes = c,
                                 .nworkers = 1,
                                 .run_id = run_id};
        struct kvpb_wres res[KVPB_MAX_WORKERS];

        if (nops > KVPB_MAX_SAMPLES)
            nops = KVPB_MAX_SAMPLES;
        if (c > cfg->footprint || kvpb_pool_run(pool, &setup, res, NULL) < 0 || !res[0].shm) {
            printf("python: %s skipped: no shm instance for the C path (footprint or shared "
                   "memory)\n",
                   kvpb_fmt_size(c, sz, sizeof(sz)));
            continue;
        }
        snprintf(cmd, sizeof(cmd), "setup %" PRIu64 "\n", c);
        char *t = kvpb_script_cmd(&p, cmd);
        if (strcmp(t, " shm") != 0) {
            printf("python: %s skipped: the Python instance is on%s, not shm\n",
                   kvpb_fmt_size(c, sz, sizeof(sz)), t);
            continue;
        }
        printf("python %s: %u operations per side and repetition ...",
               kvpb_fmt_size(c, sz, sizeof(sz)), nops);
        fflush(stdout);
        uint64_t ts = kvpb_now_ns();
        for (uint32_t rep = 0; rep <= cfg->reps; rep++) {
            bool m = rep > 0;
            uint64_t cseq = *next_seq, pseq = *next_seq + nops;
            *next_seq += 2ull * nops;
            /* Whichever side goes first after a pause, each goes first as often. */
            for (int k = 0; k < 2; k++) {
                if ((k + (int)rep) % 2 == 0) {
                    c_run(pool, KVPB_OP_STORE, c, nops, cseq, run_id, !m, m ? &cs : NULL);
                    c_run(pool, KVPB_OP_RETRIEVE, c, nops, cseq, run_id, !m, m ? &cr : NULL);
                } else {
                    py_run(&p, "store", c, nops, pseq, !m, m ? &ps : NULL, lat);
                    py_run(&p, "retrieve", c, nops, pseq, !m, m ? &pr : NULL, lat);
                }
            }
        }
        printf(" %.1f s\n", (double)(kvpb_now_ns() - ts) / 1e9);
        fflush(stdout);
        push(rows, KVPB_T_PYSHM, KVPB_OP_STORE, KVPB_D_NUMPY, c, &ps, &cs);
        push(rows, KVPB_T_PYSHM, KVPB_OP_RETRIEVE, KVPB_D_NUMPY, c, &pr, &cr);
        push(rows, KVPB_T_SHM, KVPB_OP_STORE, KVPB_D_CPATH, c, &cs, NULL);
        push(rows, KVPB_T_SHM, KVPB_OP_RETRIEVE, KVPB_D_CPATH, c, &cr, NULL);
    }
    free(lat);
    kvpb_script_stop(&p);
    printf("python: %.1f s\n", (double)(kvpb_now_ns() - t0) / 1e9);
}
