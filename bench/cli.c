/*
 * cli.c - kvpool-bench's command line: defaults, options, usage.
 *
 * Defaults are the published configuration (docs/PERFORMANCE.md): the five chunk sizes of the
 * published sweep, 11 measured repetitions, 256 MiB rotating buffers (several times the CPU's
 * last-level cache, so no transport is measured from cache), a 1 GiB pool. --quick shrinks
 * everything for the smoke test; options given with it still apply on top.
 *
 * Sizes accept binary suffixes: 4096, 256K, 256KiB, 4M, 4MiB, 1G, 1GiB.
 *
 * The option table is the single source for getopt and --help: each option has its name, its
 * argument, its help text and the setter that applies it. The lists (--sizes, --only,
 * --transports) are parsed after every other option, so their errors come first and --only or
 * --transports win over --no-redis wherever they stand.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#ifndef KVPB_KVPOOLD
#define KVPB_KVPOOLD "kvpoold"
#endif
#ifndef KVPB_LMCACHE_VENV
#define KVPB_LMCACHE_VENV "build/venv-lmcache-0.5.6"
#endif
#ifndef KVPB_LMCACHE057_VENV
#define KVPB_LMCACHE057_VENV "build/venv-lmcache-0.5.7rc2"
#endif
#ifndef KVPB_VLLM_VENV
#define KVPB_VLLM_VENV "build/venv-vllm"
#endif

static void set_defaults(struct kvpb_config *cfg)
{
    static const uint64_t sizes[] = {256 * KVPB_KiB, KVPB_MiB, 4 * KVPB_MiB, 16 * KVPB_MiB,
                                     32 * KVPB_MiB};
    *cfg = (struct kvpb_config){
        .kvpoold = KVPB_KVPOOLD,
        .l1_size = KVPB_GiB,
        .chunk_tokens = 256,
        .workers = 1,
        .batch = 1,
        .reps = 11,
        .footprint = 256 * KVPB_MiB,
        .rep_bytes = 256 * KVPB_MiB,
        .rtt_count = 5000,
        .pressure_factor = 4,
        .pressure_chunk = 4 * KVPB_MiB,
        .pressure_reps = 5,
        .do_sweep = true,
        .do_rtt = true,
        .do_paged = true,
        .do_pressure = true,
        .do_l2 = true,
        .do_startup = true,
        .do_many = true,
        .do_frag = true,
        .do_restart = true,
        .restart_pools = {KVPB_GiB, 4 * KVPB_GiB, 12 * KVPB_GiB},
        .nrestart_pools = 3,
        .do_memory = true,
        .do_python = true,
        .do_lmcache = true,
        .lmcache_venv = KVPB_LMCACHE_VENV,
        .lmcache057_venv = KVPB_LMCACHE057_VENV,
        .do_vllm = true,
        .vllm_venv = KVPB_VLLM_VENV,
        .do_redis = true,
        .do_shm = true,
        .do_inline = true,
        .do_uds = true,
    };
    memcpy(cfg->sizes, sizes, sizeof(sizes));
    cfg->nsizes = sizeof(sizes) / sizeof(sizes[0]);
}

static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v <= 0)
        return -EINVAL;
    uint64_t mult = 1;
    if (*end == 'k' || *end == 'K')
        mult = KVPB_KiB;
    else if (*end == 'm' || *end == 'M')
        mult = KVPB_MiB;
    else if (*end == 'g' || *end == 'G')
        mult = KVPB_GiB;
    else if (*end != '\0')
        return -EINVAL;
    if (*end)
        end++;
    if (*end && strcmp(end, "iB") != 0 && strcmp(end, "B") != 0 && strcmp(end, "ib") != 0)
        return -EINVAL;
    *out = (uint64_t)(v * (double)mult);
    return *out ? 0 : -EINVAL;
}

/* A comma-separated list of sizes into v (at most KVPB_MAX_SIZES), *n of them. */
static int parse_size_list(const char *list, uint64_t *v, uint32_t *n)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", list);
    *n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n == KVPB_MAX_SIZES || parse_size(t, &v[*n]) < 0)
            return -EINVAL;
        (*n)++;
    }
    return *n ? 0 : -EINVAL;
}

static int parse_sizes(const char *list, struct kvpb_config *cfg)
{
    return parse_size_list(list, cfg->sizes, &cfg->nsizes);
}

static int parse_only(const char *list, struct kvpb_config *cfg)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", list);
    cfg->do_sweep = cfg->do_rtt = cfg->do_paged = cfg->do_pressure = cfg->do_l2 = false;
    cfg->do_startup = cfg->do_many = cfg->do_memory = cfg->do_python = cfg->do_frag = false;
    cfg->do_restart = false;
    cfg->do_lmcache = cfg->do_vllm = false;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (strcmp(t, "sweep") == 0)
            cfg->do_sweep = true;
        else if (strcmp(t, "rtt") == 0)
            cfg->do_rtt = true;
        else if (strcmp(t, "paged") == 0)
            cfg->do_paged = true;
        else if (strcmp(t, "pressure") == 0)
            cfg->do_pressure = true;
        else if (strcmp(t, "l2") == 0)
            cfg->do_l2 = true;
        else if (strcmp(t, "startup") == 0)
            cfg->do_startup = true;
        else if (strcmp(t, "many") == 0)
            cfg->do_many = true;
        else if (strcmp(t, "fragmentation") == 0)
            cfg->do_frag = true;
        else if (strcmp(t, "restart") == 0)
            cfg->do_restart = true;
        else if (strcmp(t, "memory") == 0)
            cfg->do_memory = true;
        else if (strcmp(t, "python") == 0)
            cfg->do_python = true;
        else if (strcmp(t, "lmcache") == 0)
            cfg->do_lmcache = true;
        else if (strcmp(t, "vllm") == 0)
            cfg->do_vllm = true;
        else
            return -EINVAL;
    }
    return 0;
}

static int parse_transports(const char *list, struct kvpb_config *cfg)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", list);
    cfg->do_shm = cfg->do_inline = cfg->do_uds = cfg->do_redis = false;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (strcmp(t, "shm") == 0)
            cfg->do_shm = true;
        else if (strcmp(t, "inline") == 0)
            cfg->do_inline = true;
        else if (strcmp(t, "uds") == 0)
            cfg->do_uds = true;
        else if (strcmp(t, "redis") == 0)
            cfg->do_redis = true;
        else
            return -EINVAL;
    }
    return 0;
}

/* What the setters write: the configuration, and the lists kept for after the loop. */
struct cli {
    struct kvpb_config *cfg;
    const char *sizes, *only, *transports, *restart_pools;
};

struct cli_opt {
    const char *name;
    const char *arg;  /* NULL: the option takes no argument */
    const char *help; /* lines after the first are printed under it */
    /* Applies the option: 0, or -EINVAL for a bad value. NULL for --help. */
    int (*set)(struct cli *cli, const struct cli_opt *o, const char *arg);
    size_t field; /* what a shared setter writes: offsetof() in struct kvpb_config (in struct
                   * cli for set_later) */
    long max;     /* set_count: the largest value allowed; the smallest is 1 */
};

#define FIELD(type, o) ((type *)(void *)((char *)cli->cfg + (o)->field))

static int set_string(struct cli *cli, const struct cli_opt *o, const char *arg)
{
    *FIELD(const char *, o) = arg;
    return 0;
}

static int set_size(struct cli *cli, const struct cli_opt *o, const char *arg)
{
    return parse_size(arg, FIELD(uint64_t, o));
}

static int set_count(struct cli *cli, const struct cli_opt *o, const char *arg)
{
    long v = strtol(arg, NULL, 10);
    if (v < 1 || v > o->max)
        return -EINVAL;
    *FIELD(uint32_t, o) = (uint32_t)v;
    return 0;
}

/* --reps also caps the pressure section's repetitions at 5. */
static int set_reps(struct cli *cli, const struct cli_opt *o, const char *arg)
{
    if (set_count(cli, o, arg) < 0)
        return -EINVAL;
    cli->cfg->pressure_reps = cli->cfg->reps < 5 ? cli->cfg->reps : 5;
    return 0;
}

/* A list: parsed once every option is known (see the top of the file). */
static int set_later(struct cli *cli, const struct cli_opt *o, const char *arg)
{
    *(const char **)(void *)((char *)cli + o->field) = arg;
    return 0;
}

static int set_no_redis(struct cli *cli, const struct cli_opt *o, const char *arg)
{
    (void)o;
    (void)arg;
    cli->cfg->do_redis = false;
    return 0;
}

/* --quick is applied before every other option (see kvpb_parse_args), so that they win. */
static int set_quick(struct cli *cli, const struct cli_opt *o, const char *arg)
{
    (void)o;
    (void)arg;
    cli->cfg->quick = true;
    return 0;
}

#define STR_(x) #x
#define STR(x) STR_(x)
#define CFG(f) offsetof(struct kvpb_config, f)

static const struct cli_opt opts[] = {
    {"socket", "PATH", "use a running kvpoold instead of starting one", set_string, CFG(socket), 0},
    {"kvpoold", "PATH", "daemon binary to start (default: the one built with the bench)",
     set_string, CFG(kvpoold), 0},
    {"l1-size", "SIZE", "pool of the started daemon (default 1GiB)", set_size, CFG(l1_size), 0},
    {"chunk-tokens", "N", "--chunk-size of the started daemon (default 256)", set_count,
     CFG(chunk_tokens), 65536},
    {"workers", "N",
     "worker processes, each with its own client (default 1, max " STR(KVPB_MAX_WORKERS) ")",
     set_count, CFG(workers), KVPB_MAX_WORKERS},
    {"batch", "N",
     "chunks per store/retrieve call in the sweep, as a worker storing a\n"
     "whole prompt does (default 1; Redis then uses MSET/MGET)",
     set_count, CFG(batch), KVPB_MAX_BATCH},
    {"sizes", "LIST", "chunk sizes (default 256KiB,1MiB,4MiB,16MiB,32MiB)", set_later,
     offsetof(struct cli, sizes), 0},
    {"reps", "N", "measured repetitions per cell, after one warm-up (default 11)", set_reps,
     CFG(reps), 1000},
    {"footprint", "SIZE",
     "size of each worker buffer that chunks rotate through; larger\n"
     "than the CPU caches so copies are not cache-hot (default 256MiB)",
     set_size, CFG(footprint), 0},
    {"rep-bytes", "SIZE", "bytes per worker and repetition of a cell (default 256MiB)", set_size,
     CFG(rep_bytes), 0},
    {"rtt-count", "N", "round trips per repetition (default 5000)", set_count, CFG(rtt_count),
     (long)KVPB_MAX_SAMPLES},
    {"pressure-factor", "N", "pressure working set in pools (default 4)", set_count,
     CFG(pressure_factor), 64},
    {"pressure-size", "SIZE", "pressure chunk size, also the first pass's (default 4MiB)", set_size,
     CFG(pressure_chunk), 0},
    {"only", "LIST",
     "sections to run: sweep,rtt,paged,pressure,l2,startup,many,memory,\n"
     "python,fragmentation,restart,lmcache,vllm (default all)",
     set_later, offsetof(struct cli, only), 0},
    {"restart-pools", "LIST",
     "pool sizes of the restart section (default 1GiB,4GiB,12GiB;\n"
     "--quick: 64MiB)",
     set_later, offsetof(struct cli, restart_pools), 0},
    {"transports", "LIST",
     "sweep transports: shm,inline,uds,redis (default all; memcpy, the\n"
     "baseline, always runs)",
     set_later, offsetof(struct cli, transports), 0},
    {"lmcache-venv", "DIR",
     "LMCache virtual environment of the lmcache section (default: the\n"
     "build tree's venv-lmcache-0.5.6, made by scripts/lmcache-env.sh)",
     set_string, CFG(lmcache_venv), 0},
    {"lmcache057-venv", "DIR",
     "LMCache 0.5.7 virtual environment of the lmcache section (default:\n"
     "the build tree's venv-lmcache-0.5.7rc2, made by scripts/lmcache-env.sh)",
     set_string, CFG(lmcache057_venv), 0},
    {"vllm-venv", "DIR",
     "vLLM virtual environment of the vllm section (default: the build\n"
     "tree's venv-vllm, made by scripts/vllm-env.sh)",
     set_string, CFG(vllm_venv), 0},
    {"no-redis", NULL, "skip the Redis comparator", set_no_redis, 0, 0},
    {"redis-server", "PATH", "redis-server binary (default: from PATH)", set_string,
     CFG(redis_server), 0},
    {"csv", "FILE", "write the rows as CSV", set_string, CFG(csv), 0},
    {"json", "FILE", "write the rows as a JSON list", set_string, CFG(json), 0},
    {"png", "FILE", "draw GB/s against chunk size with gnuplot (FILE.gp, FILE.dat too)", set_string,
     CFG(png), 0},
    {"quick", NULL,
     "tiny sizes and few repetitions: a smoke test in seconds (without\n"
     "the vllm section unless --only names it: minutes of engine start-up)",
     set_quick, 0, 0},
    {"help", NULL, "this text", NULL, 0, 0},
};

#define NOPTS (sizeof(opts) / sizeof(opts[0]))
#define OPT_VAL 256 /* getopt_long's value of opts[i] is OPT_VAL + i */

static void usage(FILE *f)
{
    fputs("usage: kvpool-bench [options]\n"
          "\n"
          "Measures kvpool store and retrieve on both transports against single-thread memcpy "
          "of the\n"
          "same bytes (the physical limit), a raw Unix socket, and Redis, all in the same run.\n"
          "\n",
          f);
    for (size_t i = 0; i < NOPTS; i++) {
        char left[32];
        snprintf(left, sizeof(left), "--%s%s%s", opts[i].name, opts[i].arg ? " " : "",
                 opts[i].arg ? opts[i].arg : "");
        /* The first line of the help text goes next to the option, the others under it. */
        const char *line = opts[i].help;
        for (bool first = true; *line; first = false) {
            const char *nl = strchr(line, '\n');
            int len = nl ? (int)(nl - line) : (int)strlen(line);
            fprintf(f, "  %-23s%.*s\n", first ? left : "", len, line);
            line += len + (nl ? 1 : 0);
        }
    }
}

void kvpb_parse_args(int argc, char **argv, struct kvpb_config *cfg)
{
    struct option lopts[NOPTS + 1];
    struct cli cli = {.cfg = cfg};
    bool bad = false;
    int c;

    for (size_t i = 0; i < NOPTS; i++)
        lopts[i] = (struct option){opts[i].name, opts[i].arg ? required_argument : no_argument,
                                   NULL, OPT_VAL + (int)i};
    lopts[NOPTS] = (struct option){0};

    set_defaults(cfg);
    /* --quick first: explicit options given with it still win. */
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--quick") == 0)
            cfg->quick = true;
    if (cfg->quick) {
        parse_sizes("64KiB,256KiB", cfg);
        cfg->reps = 2;
        cfg->footprint = 8 * KVPB_MiB;
        cfg->rep_bytes = 4 * KVPB_MiB;
        cfg->l1_size = 32 * KVPB_MiB; /* fits a default 64 MiB container /dev/shm */
        cfg->rtt_count = 200;
        cfg->pressure_chunk = 256 * KVPB_KiB;
        cfg->pressure_reps = 2;
        cfg->restart_pools[0] = 64 * KVPB_MiB;
        cfg->nrestart_pools = 1;
    }
    while ((c = getopt_long(argc, argv, "", lopts, NULL)) != -1) {
        if (c < OPT_VAL || c >= OPT_VAL + (int)NOPTS) {
            usage(stderr);
            exit(2);
        }
        const struct cli_opt *o = &opts[c - OPT_VAL];
        if (!o->set) {
            usage(stdout);
            exit(0);
        }
        bad |= o->set(&cli, o, optarg) < 0;
    }
    if (cli.sizes && parse_sizes(cli.sizes, cfg) < 0) {
        fprintf(stderr, "kvpool-bench: bad --sizes '%s'\n", cli.sizes);
        exit(2);
    }
    if (cli.restart_pools &&
        parse_size_list(cli.restart_pools, cfg->restart_pools, &cfg->nrestart_pools) < 0) {
        fprintf(stderr, "kvpool-bench: bad --restart-pools '%s'\n", cli.restart_pools);
        exit(2);
    }
    if (cfg->quick && !cli.only)
        cfg->do_vllm = false;
    if (cli.only && parse_only(cli.only, cfg) < 0) {
        fprintf(stderr,
                "kvpool-bench: bad --only '%s' "
                "(sweep,rtt,paged,pressure,l2,startup,many,memory,python,fragmentation,restart,"
                "lmcache,vllm)\n",
                cli.only);
        exit(2);
    }
    if (cli.transports && parse_transports(cli.transports, cfg) < 0) {
        fprintf(stderr, "kvpool-bench: bad --transports '%s' (shm,inline,uds,redis)\n",
                cli.transports);
        exit(2);
    }
    if (bad || optind != argc) {
        usage(stderr);
        exit(2);
    }
    for (uint32_t i = 0; i < cfg->nsizes; i++)
        if (cfg->sizes[i] * cfg->batch > cfg->footprint) {
            fprintf(stderr, "kvpool-bench: %u chunk(s) of %" PRIu64 " bytes exceed --footprint\n",
                    cfg->batch, cfg->sizes[i]);
            exit(2);
        }
}
