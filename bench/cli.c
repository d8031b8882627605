/*
 * cli.c - kvpool-bench's command line: defaults, options, usage.
 *
 * Defaults are the published configuration (docs/PERFORMANCE.md): the five chunk sizes of the
 * issue's sweep, 11 measured repetitions, 256 MiB rotating buffers (several times the CPU's
 * last-level cache, so no transport is measured from cache), a 1 GiB pool. --quick shrinks
 * everything for the smoke test; options given with it still apply on top.
 *
 * Sizes accept binary suffixes: 4096, 256K, 256KiB, 4M, 4MiB, 1G, 1GiB.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#ifndef KVPB_KVPOOLD
#define KVPB_KVPOOLD "kvpoold"
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

static int parse_sizes(const char *list, struct kvpb_config *cfg)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", list);
    cfg->nsizes = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (cfg->nsizes == KVPB_MAX_SIZES || parse_size(t, &cfg->sizes[cfg->nsizes]) < 0)
            return -EINVAL;
        cfg->nsizes++;
    }
    return cfg->nsizes ? 0 : -EINVAL;
}

static int parse_only(const char *list, struct kvpb_config *cfg)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", list);
    cfg->do_sweep = cfg->do_rtt = cfg->do_paged = cfg->do_pressure = false;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (strcmp(t, "sweep") == 0)
            cfg->do_sweep = true;
        else if (strcmp(t, "rtt") == 0)
            cfg->do_rtt = true;
        else if (strcmp(t, "paged") == 0)
            cfg->do_paged = true;
        else if (strcmp(t, "pressure") == 0)
            cfg->do_pressure = true;
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

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: kvpool-bench [options]\n"
        "\n"
        "Measures kvpool store and retrieve on both transports against single-thread memcpy of "
        "the\n"
        "same bytes (the physical limit), a raw Unix socket, and Redis, all in the same run.\n"
        "\n"
        "  --socket PATH          use a running kvpoold instead of starting one\n"
        "  --kvpoold PATH         daemon binary to start (default: the one built with the bench)\n"
        "  --l1-size SIZE         pool of the started daemon (default 1GiB)\n"
        "  --chunk-tokens N       --chunk-size of the started daemon (default 256)\n"
        "  --workers N            worker processes, each with its own client (default 1, max %d)\n"
        "  --batch N              chunks per store/retrieve call in the sweep, as a worker storing "
        "a\n"
        "                         whole prompt does (default 1; Redis then uses MSET/MGET)\n"
        "  --sizes LIST           chunk sizes (default 256KiB,1MiB,4MiB,16MiB,32MiB)\n"
        "  --reps N               measured repetitions per cell, after one warm-up (default 11)\n"
        "  --footprint SIZE       size of each worker buffer that chunks rotate through; larger\n"
        "                         than the CPU caches so copies are not cache-hot (default "
        "256MiB)\n"
        "  --rep-bytes SIZE       bytes per worker and repetition of a cell (default 256MiB)\n"
        "  --rtt-count N          round trips per repetition (default 5000)\n"
        "  --pressure-factor N    pressure working set in pools (default 4)\n"
        "  --pressure-size SIZE   pressure chunk size, also the first pass's (default 4MiB)\n"
        "  --only LIST            sections to run: sweep,rtt,paged,pressure (default all)\n"
        "  --transports LIST      sweep transports: shm,inline,uds,redis (default all; memcpy, "
        "the\n"
        "                         baseline, always runs)\n"
        "  --no-redis             skip the Redis comparator\n"
        "  --redis-server PATH    redis-server binary (default: from PATH)\n"
        "  --csv FILE             write the rows as CSV\n"
        "  --json FILE            write the rows as a JSON list\n"
        "  --png FILE             draw GB/s against chunk size with gnuplot (FILE.gp, FILE.dat "
        "too)\n"
        "  --quick                tiny sizes and few repetitions: a smoke test in seconds\n"
        "  --help                 this text\n",
        KVPB_MAX_WORKERS);
}

void kvpb_parse_args(int argc, char **argv, struct kvpb_config *cfg)
{
    enum {
        O_SOCKET = 256,
        O_KVPOOLD,
        O_L1,
        O_TOKENS,
        O_WORKERS,
        O_SIZES,
        O_REPS,
        O_FOOT,
        O_REPBYTES,
        O_BATCH,
        O_RTT,
        O_PFACTOR,
        O_PSIZE,
        O_ONLY,
        O_TRANSPORTS,
        O_NOREDIS,
        O_REDIS,
        O_CSV,
        O_JSON,
        O_PNG,
        O_QUICK,
        O_HELP
    };
    static const struct option opts[] = {
        {"socket", required_argument, 0, O_SOCKET},
        {"kvpoold", required_argument, 0, O_KVPOOLD},
        {"l1-size", required_argument, 0, O_L1},
        {"chunk-tokens", required_argument, 0, O_TOKENS},
        {"workers", required_argument, 0, O_WORKERS},
        {"sizes", required_argument, 0, O_SIZES},
        {"reps", required_argument, 0, O_REPS},
        {"footprint", required_argument, 0, O_FOOT},
        {"rep-bytes", required_argument, 0, O_REPBYTES},
        {"batch", required_argument, 0, O_BATCH},
        {"rtt-count", required_argument, 0, O_RTT},
        {"pressure-factor", required_argument, 0, O_PFACTOR},
        {"pressure-size", required_argument, 0, O_PSIZE},
        {"only", required_argument, 0, O_ONLY},
        {"transports", required_argument, 0, O_TRANSPORTS},
        {"no-redis", no_argument, 0, O_NOREDIS},
        {"redis-server", required_argument, 0, O_REDIS},
        {"csv", required_argument, 0, O_CSV},
        {"json", required_argument, 0, O_JSON},
        {"png", required_argument, 0, O_PNG},
        {"quick", no_argument, 0, O_QUICK},
        {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0},
    };
    const char *sizes = NULL, *only = NULL, *transports = NULL;
    bool bad = false;
    long v;
    int o;

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
    }
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case O_SOCKET:
            cfg->socket = optarg;
            break;
        case O_KVPOOLD:
            cfg->kvpoold = optarg;
            break;
        case O_L1:
            bad |= parse_size(optarg, &cfg->l1_size) < 0;
            break;
        case O_TOKENS:
            v = strtol(optarg, NULL, 10);
            bad |= v < 1 || v > 65536;
            cfg->chunk_tokens = (uint32_t)v;
            break;
        case O_WORKERS:
            v = strtol(optarg, NULL, 10);
            bad |= v < 1 || v > KVPB_MAX_WORKERS;
            cfg->workers = (uint32_t)v;
            break;
        case O_SIZES:
            sizes = optarg;
            break;
        case O_REPS:
            v = strtol(optarg, NULL, 10);
            bad |= v < 1 || v > 1000;
            cfg->reps = (uint32_t)v;
            cfg->pressure_reps = cfg->reps < 5 ? cfg->reps : 5;
            break;
        case O_FOOT:
            bad |= parse_size(optarg, &cfg->footprint) < 0;
            break;
        case O_REPBYTES:
            bad |= parse_size(optarg, &cfg->rep_bytes) < 0;
            break;
        case O_BATCH:
            v = strtol(optarg, NULL, 10);
            bad |= v < 1 || v > KVPB_MAX_BATCH;
            cfg->batch = (uint32_t)v;
            break;
        case O_RTT:
            v = strtol(optarg, NULL, 10);
            bad |= v < 1 || v > (long)KVPB_MAX_SAMPLES;
            cfg->rtt_count = (uint32_t)v;
            break;
        case O_PFACTOR:
            v = strtol(optarg, NULL, 10);
            bad |= v < 1 || v > 64;
            cfg->pressure_factor = (uint32_t)v;
            break;
        case O_PSIZE:
            bad |= parse_size(optarg, &cfg->pressure_chunk) < 0;
            break;
        case O_ONLY:
            only = optarg;
            break;
        case O_TRANSPORTS:
            transports = optarg;
            break;
        case O_NOREDIS:
            cfg->do_redis = false;
            break;
        case O_REDIS:
            cfg->redis_server = optarg;
            break;
        case O_CSV:
            cfg->csv = optarg;
            break;
        case O_JSON:
            cfg->json = optarg;
            break;
        case O_PNG:
            cfg->png = optarg;
            break;
        case O_QUICK:
            break;
        case O_HELP:
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            exit(2);
        }
    }
    if (sizes && parse_sizes(sizes, cfg) < 0) {
        fprintf(stderr, "kvpool-bench: bad --sizes '%s'\n", sizes);
        exit(2);
    }
    if (only && parse_only(only, cfg) < 0) {
        fprintf(stderr, "kvpool-bench: bad --only '%s' (sweep,rtt,paged,pressure)\n", only);
        exit(2);
    }
    if (transports && parse_transports(transports, cfg) < 0) {
        fprintf(stderr, "kvpool-bench: bad --transports '%s' (shm,inline,uds,redis)\n", transports);
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
