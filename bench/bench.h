/*
 * bench.h - kvpool-bench: shared definitions of the benchmark's modules.
 *
 * Modules:
 *   main.c       the order of the measurements, aggregation into rows, start and clean-up
 *   cli.c        command line and defaults
 *   worker.c     worker processes: start, command/done pipes, per-worker state and setup
 *   ops.c        the measured loops (kvpool, memcpy, raw Unix socket, Redis, paged, pressure)
 *   daemon.c     starting and stopping kvpoold and redis-server as child processes; free memory
 *   redis_cmp.c  the Redis comparator over hiredis (stubs when built without hiredis)
 *   l2.c         the L2 tier's rows: write-behind and loads through Redis, L1 hits with L2
 *   startup.c    daemons of 1-12 GiB: time to first answer, registration, reservation speed
 *   many.c       16 workers at once against two-process memcpy, a ping's p99 under that load
 *   frag.c       chunks of 4 KiB-32 MiB sharing 1-12 GiB pools: large stores, the store lock,
 *                a probe's lookups; the hit ratio against a byte-LRU model
 *   restart.c    warm restart: a full 1-12 GiB pool adopted after SIGKILL, time to the first
 *                hit, verification on first read, against a cold start storing it all again
 *   memory.c     the daemon's RSS beyond the pool with 64 connected clients
 *   python.c     the Python binding (bench/python_path.py) against the C path, same bytes
 *   lmcache.c    the real LMCache worker (bench/lmcache_worker.py) against `lmcache server`
 *                and kvpoold's LMCache front end, SHM and pickle transports; the same for
 *                LMCache 0.5.7 (bench/lmcache_worker057.py), SHM and the tensor envelope
 *   vllm.c       vLLM itself (bench/vllm_worker.py): time to first token of a prompt whose
 *                prefix `lmcache server` or kvpoold holds, against recomputing it
 *   script.c     a helper script as a child process, one answer line per command
 *   stats.c      medians, percentiles, growable sample arrays
 *   report.c     the table on stdout with the target check; the rows' shared helpers
 *   report_files.c the same rows as CSV, JSON and a gnuplot chart
 *
 * The benchmark uses only the public client API (kvpool.h, kvpool_paged.h): it measures what a
 * worker linking libkvpool.so gets.
 */
#ifndef KVPB_BENCH_H
#define KVPB_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvpool.h"

#define KVPB_MAX_WORKERS 16
#define KVPB_MAX_SAMPLES (1u << 16) /* latency samples per worker and command */
#define KVPB_MAX_SIZES 16
#define KVPB_MAX_BATCH 64 /* chunks per operation (--batch) */
#define KVPB_KiB ((uint64_t)1 << 10)
#define KVPB_MiB ((uint64_t)1 << 20)
#define KVPB_GiB ((uint64_t)1 << 30)

/* Transports as they appear in the output ("transport" column). */
enum kvpb_transport {
    KVPB_T_SHM,         /* kvpool, shared-memory transport */
    KVPB_T_INLINE,      /* kvpool, bytes over the Unix socket */
    KVPB_T_KVPOOL,      /* kvpool control requests (ping, lookup): transport-independent */
    KVPB_T_REDIS,       /* redis-server over a private Unix socket, hiredis client */
    KVPB_T_MEMCPY,      /* the physical limit: one memcpy of the same bytes */
    KVPB_T_UDS,         /* a raw Unix stream socket with a minimal 32-byte framing */
    KVPB_T_PAGED,       /* kvp_paged_gather / kvp_paged_scatter */
    KVPB_T_MEMSET,      /* first touch of fresh anonymous memory: the limit of reserving a pool */
    KVPB_T_PYSHM,       /* the Python binding on numpy arrays, shm transport (python_path.py) */
    KVPB_T_LMC_SERVER,  /* lmcache: `lmcache server`, LMCache's own multiprocess server */
    KVPB_T_LMC_KVPOOL,  /* lmcache: kvpoold's LMCache front end (--lmcache) */
    KVPB_T_LMC_WORKER,  /* lmcache: the worker's own copies of the same bytes, no server */
    KVPB_T_HASH,        /* a chunk's key hash alone, in the bench's process (keyhash.c) */
    KVPB_T_VLLM,        /* vllm: vLLM without a KV connector: the prompt computed in full */
    KVPB_T_VLLM_LMC,    /* vllm: LMCache's connector against `lmcache server` */
    KVPB_T_VLLM_KVPOOL, /* vllm: LMCache's connector against kvpoold --lmcache */
    KVPB_T_COUNT_
};

/* Operations ("op" column). */
enum kvpb_op {
    KVPB_OP_STORE,     /* worker buffer -> server (SET for Redis) */
    KVPB_OP_RETRIEVE,  /* server -> worker buffer (GET for Redis) */
    KVPB_OP_COPY,      /* memcpy */
    KVPB_OP_PING,      /* smallest request and reply, back to back */
    KVPB_OP_PING_IDLE, /* the same after 500 us of work, long enough for the peer's CPU to idle */
    KVPB_OP_LOOKUP,    /* kvp_lookup of a one-chunk sequence that is cached */
    KVPB_OP_GATHER,    /* paged KV cache -> chunk */
    KVPB_OP_SCATTER,   /* chunk -> paged KV cache */
    KVPB_OP_PRESSURE,  /* retrieve, store on a miss; working set several times the pool */
    KVPB_OP_COLD,      /* first store pass over the pool after this process mapped it */
    KVPB_OP_REGISTER,  /* a client's first shm registration: maps the pool */
    KVPB_OP_SETUP,     /* not measured: register instances / build buffers for a size */
    KVPB_OP_TEARDOWN,  /* not measured: drop them */
    KVPB_OP_READY,     /* startup: fork/exec of kvpoold until its first answered ping */
    KVPB_OP_RESERVE,   /* startup: fork/exec until the daemon reports the whole pool reserved */
    KVPB_OP_TOUCH,     /* startup baseline: mmap + memset of fresh anonymous memory */
    KVPB_OP_LOOKUP128, /* kvp_lookup of a cached 128-chunk (32k-token) prefix */
    KVPB_OP_PING_LOAD, /* many: a ping from another client while 16 workers transfer */
    KVPB_OP_PING_IDLE_P99, /* many: the same pings just before, without the load */
    KVPB_OP_RSS_BASE,      /* memory: the daemon's RSS with only the bench's client connected */
    KVPB_OP_RSS64,         /* memory: the same with 64 more clients, one instance each */
    KVPB_OP_FRAG_FILL,     /* fragmentation: stores of 4 KiB-32 MiB chunks until the pool is full */
    KVPB_OP_FRAG_LARGE,    /* fragmentation: 8 and 32 MiB stores over that pool */
    KVPB_OP_FRAG_IDLE,     /* fragmentation: a probe's one-chunk lookups before them */
    KVPB_OP_FRAG_PROBE,    /* fragmentation: the same lookups during them */
    KVPB_OP_FRAG_CONTROL,  /* fragmentation: the same lookups during the small stores alone */
    KVPB_OP_HIT_RATIO,     /* fragmentation: lookups and stores of a mixed-size trace */
    KVPB_OP_CHUNK_SIZE,    /* lmcache: get_chunk_size, the worker's first request */
    KVPB_OP_TORCH_COPY,    /* lmcache: torch copy_ between contiguous chunk tensors */
    KVPB_OP_HASH_BLAKE2B,  /* rtt: one link of the daemon's key chain (kvp_key_chain) */
    KVPB_OP_HASH_SIPHASH,  /* rtt: the same link by SipHash-2-4-128 (libsodium) */
    KVPB_OP_HASH_XXH3,     /* rtt: the same link by XXH3-128 with a secret (libxxhash) */
    KVPB_OP_TTFT,          /* vllm: time to first token (with a connector: of a prompt whose
                            * prefix the server holds) */
    KVPB_OP_TTFT_COLD,     /* vllm: the same prompt's first run, which stores its chunks */
    KVPB_OP_WARM_HIT,      /* restart: exec of the new kvpoold until a lookup finds a chunk */
    KVPB_OP_ADOPT,         /* restart: the adoption itself, as the new kvpoold's log says */
    KVPB_OP_FIRST_READ,    /* restart: retrieving every adopted chunk the first time (verified) */
    KVPB_OP_REREAD,        /* restart: the same again (no verification) */
    KVPB_OP_CHECKSUM,      /* restart: XXH3-64 of the same bytes in the bench's process */
    KVPB_OP_COLD_READY,    /* restart: a cold kvpoold's exec until its first answered ping */
    KVPB_OP_COLD_RESERVE,  /* restart: the same until its pool is wholly reserved */
    KVPB_OP_STORE_AGAIN,   /* restart: a worker storing the same chunks into the cold pool */
    KVPB_OP_STORE_NOWARM,  /* restart: the same into a kvpoold with --warm-restart off */
    KVPB_OP_COUNT_
};

/* Names as printed and written (report.c); "?" for an unknown value. */
const char *kvpb_transport_name(int t);
const char *kvpb_op_name(int op);

/* One command for the workers, written by the parent into shared memory. */
struct kvpb_cmd {
    int transport;
    int op;
    uint32_t layout; /* paged: a kvp_paged_layout */
    uint32_t nops;   /* operations to run, per worker */
    uint64_t chunk_bytes;
    uint64_t seq_base;  /* first key number; keys are seq_base .. seq_base + nops - 1 */
    uint64_t ws_chunks; /* pressure: distinct keys per worker */
    uint64_t rng_seed;  /* pressure: key choice */
    uint32_t verify;    /* non-zero: check every byte that comes back */
    uint32_t nworkers;  /* workers taking part (the first nworkers) */
    uint32_t run_id;    /* part of every key: runs never see each other's chunks */
    uint32_t batch;     /* chunks per store/retrieve call (1 unless --batch) */
    uint32_t plain;     /* shm store/retrieve through kvp_store()/kvp_retrieve(), untimed copy */
};

/* Chunks of the long lookup (KVPB_OP_LOOKUP128): a 32k-token prefix of 256-token chunks. */
#define KVPB_LOOKUP_CHUNKS 128u

/* One worker's answer to a command. */
struct kvpb_wres {
    int rc; /* 0, or a negative error (err says what failed) */
    char err[256];
    uint64_t t_start_ns; /* CLOCK_MONOTONIC, comparable across processes */
    uint64_t t_end_ns;
    uint64_t bytes;   /* payload bytes moved */
    uint32_t nops;    /* operations done (= samples written) */
    uint32_t hits;    /* pressure: retrieves that found the chunk */
    uint32_t shm;     /* set-up: 1 when this worker has a shm instance */
    uint64_t minflt;  /* minor page faults of the worker process during the command */
    uint64_t nivcsw;  /* times the worker was preempted during the command */
    uint64_t copy_ns; /* shm store/retrieve: time spent in the copy itself */
};

/* Benchmark configuration (command line). */
struct kvpb_config {
    const char *socket;       /* existing daemon, or NULL to start one */
    const char *kvpoold;      /* daemon binary */
    const char *redis_server; /* redis-server binary, or NULL to search PATH */
    uint64_t l1_size;
    uint32_t chunk_tokens; /* --chunk-size of a started daemon */
    uint32_t workers;
    uint32_t batch; /* chunks per store/retrieve call */
    uint64_t sizes[KVPB_MAX_SIZES];
    uint32_t nsizes;
    uint32_t reps;            /* measured repetitions per cell (one warm-up rep before) */
    uint64_t footprint;       /* bytes of each rotating worker buffer */
    uint64_t rep_bytes;       /* target bytes per worker and repetition */
    uint32_t rtt_count;       /* round trips per repetition */
    uint32_t pressure_factor; /* working set / pool */
    uint64_t pressure_chunk;
    uint32_t pressure_reps;
    bool do_sweep, do_rtt, do_paged, do_pressure, do_redis;
    bool do_l2; /* the L2 tier's rows (l2.c); they need the Redis comparator */
    bool do_startup, do_many, do_memory, do_python; /* the scale sections (their own files) */
    bool do_frag;                                   /* the fragmentation section (frag.c) */
    bool do_restart;                                /* the warm-restart section (restart.c) */
    uint64_t restart_pools[KVPB_MAX_SIZES];         /* its pool sizes (--restart-pools) */
    uint32_t nrestart_pools;
    bool do_lmcache;             /* the LMCache section (lmcache.c) */
    const char *lmcache_venv;    /* its virtual environment (scripts/lmcache-env.sh) */
    const char *lmcache057_venv; /* the same for the LMCache 0.5.7 worker and server */
    bool do_vllm;                /* the vLLM section (vllm.c) */
    const char *vllm_venv;       /* its virtual environment (scripts/vllm-env.sh) */
    bool lean; /* workers without a raw socket peer (the many section's 16 workers) */
    bool do_shm, do_inline, do_uds; /* sweep transports (memcpy always runs) */
    bool quick;
    const char *csv, *json, *png;
};

/* ------------------------------------------------------------------------------------------ */
/* cli.c                                                                                      */

/* Fills cfg with the defaults and the command line; exits with usage on a bad option. */
void kvpb_parse_args(int argc, char **argv, struct kvpb_config *cfg);

/* ------------------------------------------------------------------------------------------ */
/* stats.c                                                                                    */

/* A growable array of doubles (latency samples in microseconds, per-rep rates). */
struct kvpb_samples {
    double *v;
    size_t n, cap;
};

int kvpb_samples_push(struct kvpb_samples *s, double x);
int kvpb_samples_append(struct kvpb_samples *s, const double *x, size_t n);
void kvpb_samples_free(struct kvpb_samples *s);

/* Percentile p in [0, 100] with linear interpolation between closest ranks. Sorts v in place.
 * Returns NAN for an empty array. */
double kvpb_percentile(double *v, size_t n, double p);

/* Median, minimum and maximum of v[0..n) (v is sorted in place). NAN for n == 0. */
void kvpb_summary(double *v, size_t n, double *median, double *min, double *max);

/* Median over i of a[i] / b[i] (pairs of the same repetition); NAN when n == 0. */
double kvpb_paired_ratio(const double *a, const double *b, size_t n);

/* Monotonic clock in nanoseconds. */
uint64_t kvpb_now_ns(void);

/* Formats a byte count as "256 KiB", "4 MiB" (exact binary units, else bytes). */
const char *kvpb_fmt_size(uint64_t bytes, char *buf, size_t size);

/* ------------------------------------------------------------------------------------------ */
/* Rows: one line of the results, filled by main.c, printed by report.c.                      */

struct kvpb_row {
    int transport;        /* enum kvpb_transport */
    int op;               /* enum kvpb_op */
    const char *detail;   /* "" or a qualifier (paged layout, "cold pool") */
    uint64_t chunk_bytes; /* 0 for round-trip rows */
    uint32_t batch;       /* chunks per operation */
    uint32_t workers;
    uint32_t reps;
    uint64_t samples;        /* latency samples behind p50/p99 */
    double gb_per_s;         /* median over repetitions (1e9 bytes per second) */
    double gb_min, gb_max;   /* spread over repetitions */
    double ops_per_s;        /* operations (calls) per second, median over repetitions */
    double p50_us, p99_us;   /* per operation, over every sample */
    double ratio_to_memcpy;  /* gb_per_s / memcpy's for the same chunk size; NAN if n/a */
    double ratio_to_uds;     /* round trips: p50 / raw socket ping-pong p50; NAN if n/a */
    double vs_redis;         /* shm rows: gb_per_s / Redis's same op and size; NAN if n/a */
    double hit_rate;         /* pressure rows; NAN otherwise */
    double evictions_per_op; /* pressure rows; NAN otherwise */
    double load1;            /* 1-minute load average when the row's cell finished */
    double faults_per_op;    /* the workers' minor page faults per operation */
    double preempt_per_op;   /* involuntary context switches of the workers per operation */
    double copy_share;       /* shm store/retrieve: copy time / operation time; NAN otherwise */
    /* Added for the start-up, many-worker, memory and Python sections; NAN (0) elsewhere. */
    uint64_t pool_bytes;  /* startup rows: the pool size of the daemon measured */
    double ms;            /* startup rows: the time measured, milliseconds */
    double us_per_chunk;  /* lookup-128: p50 / chunks looked up */
    double ratio_to_idle; /* ping-under-load: p99 / p99 of the same pings without the load */
    double ratio_to_c;    /* python rows: GB/s / the C path's, paired by repetition */
    double rss_mib;       /* memory rows: RssAnon + RssFile (the daemon beyond its pool), MiB */
    double vm_rss_mib, rss_anon_mib, rss_file_mib, rss_shmem_mib; /* /proc/PID/status, MiB */
    /* Added for the fragmentation section; NAN elsewhere. */
    double max_us;         /* the largest latency sample */
    double lock_max_ms;    /* the daemon's longest hold of its store lock, since it started */
    double lock_over_1ms;  /* holds of the store lock over 1 ms during the large stores */
    double steal_pct;      /* probe rows: CPU time the hypervisor took from this VM during the
                            * row's window (steal, /proc/stat), % of all CPU time */
    double model_hit_rate; /* hit-ratio: a byte-LRU model's hit ratio on the same trace */
    double ratio_to_model; /* hit-ratio: hit_rate / model_hit_rate */
    /* Added for the LMCache section; NAN elsewhere. */
    double ratio_to_limit;  /* GB/s / the worker's own copy of the same bytes, paired */
    double vs_lmcache;      /* kvpoold's front end against `lmcache server`, paired: GB/s ratio,
                             * or lmcache server's p50 / this p50 for round trips (> 1: better) */
    double server_us;       /* kvpoold's transfer rows: its LMCache thread's run time per
                             * operation, microseconds (/proc/PID/task/TID/schedstat) */
    double vs_lmcache_free; /* the same rows: lmcache server's p50 / (this p50 - server_us), the
                             * ratio a server whose own thread took no time would reach */
    /* Added for the vLLM section (the rows above serve it too: p50_us, vs_lmcache, server_us,
     * vm_rss_mib and rss_anon_mib of the server); NAN elsewhere. */
    double speedup; /* the time to first token without a connector / this one, paired */
    bool invalid;   /* the measurement did not complete: printed as such, values NAN */
};

/* The detail of the rows of the scale sections, which the report groups by. */
#define KVPB_D_STARTUP "memfd pool"   /* startup.c */
#define KVPB_D_MANY "many"            /* many.c: the store/retrieve/memcpy cells of 16 workers */
#define KVPB_D_CPATH "C path"         /* python.c: kvp_store()/kvp_retrieve() from C */
#define KVPB_D_NUMPY "numpy"          /* python.c: ctx.store()/ctx.retrieve() on numpy arrays */
#define KVPB_D_FRAG "fragmentation"   /* frag.c */
#define KVPB_D_RESTART "warm restart" /* restart.c */
#define KVPB_D_LMC_SHM "lmcache shm"  /* lmcache.c: LMCache's SHM transport */
#define KVPB_D_LMC_PICKLE "lmcache pickle"         /* lmcache.c: LMCache's pickle transport */
#define KVPB_D_LMC057_SHM "lmcache 0.5.7 shm"      /* lmcache.c: LMCache 0.5.7's SHM transport */
#define KVPB_D_LMC057_ENV "lmcache 0.5.7 envelope" /* lmcache.c: 0.5.7's TensorEnvelope */

/* A growable list of rows, for the sections that build their rows themselves. */
struct kvpb_rows {
    struct kvpb_row *v;
    size_t n, cap;
};

/* A row with every optional value NAN (report.c). detail must outlive the row. */
struct kvpb_row kvpb_row_blank(int transport, int op, const char *detail);

/* Appends a copy of r; exits the program when out of memory. */
void kvpb_rows_push(struct kvpb_rows *rows, const struct kvpb_row *r);

/*
 * Fills r's throughput and latency summaries: gb_per_s median [min-max] and ops_per_s over the
 * per-repetition values, p50/p99 over every latency sample (each array is sorted in place).
 */
void kvpb_row_summarise(struct kvpb_row *r, double *rep_gbps, double *rep_ops, size_t nreps,
                        double *lat_us, size_t nlat);

/* One measured cell of a section: a GB/s and an ops/s figure per repetition, every latency. */
struct kvpb_cell {
    struct kvpb_samples gbps, ops, lat;
};

/* Adds a repetition that moved bytes in nops operations in ns nanoseconds, with their nops
 * latencies (microseconds; lat may be NULL when the caller appends them itself). Exits when out
 * of memory. */
void kvpb_cell_add(struct kvpb_cell *c, double ns, uint64_t bytes, uint64_t nops,
                   const double *lat);

/* Summarises c into r (kvpb_row_summarise, which sorts c's arrays, and the load average) and
 * appends r to rows. */
void kvpb_cell_push(struct kvpb_rows *rows, struct kvpb_row *r, struct kvpb_cell *c);

void kvpb_cell_free(struct kvpb_cell *c);

/* Run description printed above the table and in the chart title. */
struct kvpb_run_info {
    char cpu[128];
    int ncpu;
    char kernel[128];
    double load_start, load_end;
    char redis[256];  /* "redis-server 7.0.15" or why it was skipped */
    char daemon[512]; /* how the daemon was started / found */
    uint64_t pool_size;
    uint32_t chunk_tokens;
    double seconds;
};

/* ------------------------------------------------------------------------------------------ */
/* report.c                                                                                   */

/* Sorts rows into the order of the table: groups, chunk size, transport. */
void kvpb_rows_sort(struct kvpb_row *rows, size_t n);

void kvpb_report_table(const struct kvpb_config *cfg, const struct kvpb_run_info *info,
                       const struct kvpb_row *rows, size_t n);
int kvpb_report_csv(const char *path, const struct kvpb_row *rows, size_t n);
int kvpb_report_json(const char *path, const struct kvpb_row *rows, size_t n);
/* Writes PATH.gp and PATH.dat next to the PNG and runs gnuplot. Returns 0, 1 when gnuplot is
 * not installed (said on stdout), or a negative error. */
int kvpb_report_chart(const char *png, const struct kvpb_config *cfg,
                      const struct kvpb_run_info *info, const struct kvpb_row *rows, size_t n);

/* ------------------------------------------------------------------------------------------ */
/* keyhash.c                                                                                  */

/*
 * Times n samples of one key-chain link over chunk_tokens token ids, by the hash of op
 * (KVPB_OP_HASH_*), in the calling process; each sample (microseconds per link) is the mean of a
 * small batch. Returns 0, or -EINVAL for a chunk beyond 4096 tokens, -ENOMEM if libsodium
 * cannot start.
 */
int kvpb_time_key_hash(int op, uint32_t chunk_tokens, uint32_t n, double *samples);

/* ------------------------------------------------------------------------------------------ */
/* daemon.c                                                                                   */

/* A server started as a child process, its output in a log file. */
struct kvpb_child {
    pid_t pid; /* 0 when not running */
    char name[32];
    char log[256];
};

/*
 * Starts argv[0] with stdout and stderr appended to log; the child gets SIGTERM if the bench
 * dies. Returns 0 or a negative errno.
 */
int kvpb_child_spawn(struct kvpb_child *ch, const char *name, char *const argv[], const char *log);

/* True while the child runs (reaps it when it has exited). */
bool kvpb_child_alive(struct kvpb_child *ch);

/* SIGTERM, then SIGKILL after timeout_ms. Returns the exit status, or -1 if killed. */
int kvpb_child_stop(struct kvpb_child *ch, int timeout_ms);

/* Prints the last lines of the child's log to stderr. */
void kvpb_child_print_log(const struct kvpb_child *ch, int lines);

/*
 * Starts kvpoold on dir/kvpoold.sock with the given pool and chunk size and waits (up to
 * 120 s) until it answers a ping. socket receives the socket path.
 */
int kvpb_kvpoold_start(struct kvpb_child *ch, const char *binary, const char *dir, uint64_t l1_size,
                       uint32_t chunk_tokens, char *socket, size_t size);

/* Finds an executable in PATH (or checks an explicit path). Returns true and fills out. */
bool kvpb_find_exe(const char *name, char *out, size_t size);

/* Polls kvp_client_open + kvp_ping on socket until it answers or timeout_ms passes. */
int kvpb_wait_kvpoold(const char *socket, struct kvpb_child *ch, int timeout_ms);

/* Sleeps for ms milliseconds. */
void kvpb_sleep_ms(int ms);

/* The host's room for a daemon of a given size: MemAvailable from /proc/meminfo and the space
 * free in /dev/shm, in bytes; 0 when unknown. */
uint64_t kvpb_mem_available(void);
uint64_t kvpb_free_devshm(void);

/* ------------------------------------------------------------------------------------------ */
/* redis_cmp.c                                                                                */

typedef struct kvpb_redis kvpb_redis;

/* True when the comparator was compiled in (hiredis found by pkg-config). */
bool kvpb_redis_compiled(void);

/* Starts redis-server (binary) on a private Unix socket in dir: no persistence, no TCP port.
 * Waits until it answers PING. version receives "redis-server X.Y.Z". */
int kvpb_redis_start(struct kvpb_child *ch, const char *binary, const char *dir, char *socket,
                     size_t socket_size, char *version, size_t version_size);

/* Connects; returns NULL with a message in err. */
kvpb_redis *kvpb_redis_connect(const char *socket, char *err, size_t err_size);
void kvpb_redis_close(kvpb_redis *r);

/* l2.c: starts daemons with and without --l2 on redis_socket (kvpoold is their binary, dir
 * holds their sockets and logs), measures the L2 rows and prints their table. Exits the
 * program on a failed operation. */
void kvpb_l2_phase(const struct kvpb_config *cfg, const char *kvpoold, const char *dir,
                   const char *redis_socket);

/* SET keys[0] (n == 1) or MSET keys[0..n) to values of len bytes. Returns 0 or a negative
 * error (message in err). */
int kvpb_redis_set(kvpb_redis *r, const char *const *keys, const void *const *values, size_t n,
                   size_t len, char *err, size_t err_size);

/* GET (n == 1) or MGET keys[0..n) into dsts[i], each of which must receive exactly len bytes
 * (copied out of the reply, as a user has to). */
int kvpb_redis_get(kvpb_redis *r, const char *const *keys, void *const *dsts, size_t n, size_t len,
                   char *err, size_t err_size);

/* PING. */
int kvpb_redis_ping(kvpb_redis *r, char *err, size_t err_size);

/* ------------------------------------------------------------------------------------------ */
/* worker.c and ops.c                                                                         */

/* The worker processes and the memory they share with the parent. */
struct kvpb_pool;

/*
 * Forks cfg->workers worker processes. Each opens its own client on socket, connects to Redis
 * when redis_socket is not NULL, allocates and pre-faults its buffers and starts a raw socket
 * peer process. Returns the pool, or NULL with a message on stderr.
 */
struct kvpb_pool *kvpb_pool_start(const struct kvpb_config *cfg, const char *socket,
                                  const char *redis_socket, uint32_t chunk_tokens);

/* Runs one command on the first cmd->nworkers workers and waits for them. res receives each
 * worker's answer; samples[i] points at worker i's latency samples (res[i].nops of them).
 * Returns 0, or the first worker error (printed on stderr). */
int kvpb_pool_run(struct kvpb_pool *p, const struct kvpb_cmd *cmd, struct kvpb_wres *res,
                  const double **samples);

/* Stops the workers (closing their command pipes) and waits for them. NULL is ok. */
void kvpb_pool_stop(struct kvpb_pool *p);

/* Finds a layout [2, layers, tokens, hidden] of bfloat16 (else uint8) whose chunk is exactly
 * `bytes` (ops.c). Returns 0 or -EINVAL. */
int kvpb_pick_layout(uint64_t bytes, uint32_t tokens, uint32_t *layers, uint32_t *hidden,
                     const char **dtype);

/* Registration options for the instance id with the layout kvpb_pick_layout() picks for chunks
 * of bytes at tokens per chunk, world size 1, rank 0. Returns 0 or -EINVAL (no such layout). */
int kvpb_register_opts(const char *id, uint64_t bytes, uint32_t tokens, uint32_t transport,
                       kvp_register_opts *o);

/* ------------------------------------------------------------------------------------------ */
/* The scale sections. Each prints what it does, appends its rows and says on stdout why it  */
/* skips anything. A failed operation either exits the program (after the atexit clean-up)    */
/* or marks its row invalid: no number from a run that did not do what it claims is printed. */

/* startup.c: daemons with 1, 4 and 12 GiB pools (memfd), started and stopped one by one. */
void kvpb_startup_phase(const struct kvpb_config *cfg, const char *kvpoold, const char *dir,
                        struct kvpb_rows *rows);

/* startup.c: polls the daemon's statistics every 5 ms until its pool is wholly reserved (the
 * daemon reserves it in the background after it starts serving). Returns 1 when it is, 0 when
 * the daemon has no such statistic (it reserves everything before serving), or a negative
 * error (-ETIMEDOUT, said on stderr). *ms receives the time waited. */
int kvpb_wait_pool_reserved(kvp_client *c, int timeout_ms, double *ms);

/* many.c: 16 worker processes of its own on socket, store and retrieve at once, pings from the
 * bench's own thread meanwhile. *next_seq is the run's next unused key number. */
void kvpb_many_phase(const struct kvpb_config *cfg, const char *socket, uint32_t chunk_tokens,
                     uint64_t pool_size, uint32_t run_id, uint64_t *next_seq,
                     struct kvpb_rows *rows);

/* frag.c: daemons with 1, 4 and 12 GiB pools (memfd) shared by chunk sizes of 4 KiB-32 MiB,
 * one after the other, and the hit ratio of a mixed-size trace against a byte-LRU model. */
void kvpb_frag_phase(const struct kvpb_config *cfg, const char *kvpoold, const char *dir,
                     struct kvpb_rows *rows);

/* restart.c: for each pool of cfg->restart_pools, a kvpoold (posix segment) filled with 4 MiB
 * chunks, then with 256 KiB ones, SIGKILLed and started again: the time to its first hit, the
 * adoption, first reads against later reads, against a cold start whose worker stores the same
 * chunks again. kvpoold is its binary, dir holds its socket and logs. */
void kvpb_restart_phase(const struct kvpb_config *cfg, const char *kvpoold, const char *dir,
                        struct kvpb_rows *rows);

/* memory.c: the RSS of the daemon with pid daemon_pid before and after 64 clients connect. */
void kvpb_memory_phase(const struct kvpb_config *cfg, const char *socket, pid_t daemon_pid,
                       uint32_t chunk_tokens, struct kvpb_rows *rows);

/* python.c: bench/python_path.py under /usr/bin/python3 against worker 0 of pool (C path). */
void kvpb_python_phase(const struct kvpb_config *cfg, struct kvpb_pool *pool, const char *socket,
                       const char *dir, uint64_t pool_size, uint32_t run_id, uint64_t *next_seq,
                       struct kvpb_rows *rows);

/* lmcache.c: `lmcache server` from cfg->lmcache_venv and kvpoold --lmcache (kvpoold is its
 * binary), one after the other with shared memory and without, driven by LMCache's own worker
 * classes (bench/lmcache_worker.py); then the same with cfg->lmcache057_venv's server and
 * worker (bench/lmcache_worker057.py). Each version is skipped with a note when its venv is
 * absent, the kvpoold rows when the binary has no --lmcache. Exits the program on a failed
 * operation. */
void kvpb_lmcache_phase(const struct kvpb_config *cfg, const char *kvpoold, const char *dir,
                        uint32_t run_id, struct kvpb_rows *rows);

/* vllm.c: vLLM's CPU engine (cfg->vllm_venv, bench/vllm_worker.py) on two small models, with
 * no connector, with LMCache's connector against `lmcache server` (from the same environment)
 * and against kvpoold --lmcache (kvpoold is its binary), over shared memory and over the pickle
 * transport. Skipped with a note when the venv or the daemon's --lmcache is absent. Exits the
 * program on a failed request. */
void kvpb_vllm_phase(const struct kvpb_config *cfg, const char *kvpoold, const char *dir,
                     uint32_t run_id, struct kvpb_rows *rows);

/* Helpers of the LMCache sections (lmcache.c): a loopback TCP port nobody listens on now; the run
 * time so far of kvpoold's LMCache thread, nanoseconds (0 when it cannot be read); whether
 * `kvpoold --help` mentions --lmcache. */
int kvpb_free_port(void);
uint64_t kvpb_lmc_thread_ns(pid_t pid);
bool kvpb_kvpoold_has_lmcache(const char *kvpoold);

/* ------------------------------------------------------------------------------------------ */
/* script.c                                                                                   */

#define KVPB_SCRIPT_TIMEOUT_MS 300000 /* per answer: a command moves at most a few hundred MiB */

/* A helper script as a child process: its stdin, its stdout, and the child record for its log. */
struct kvpb_script {
    struct kvpb_child ch;
    int in, out;
    char *line;  /* the last answer, NUL-terminated, without its newline */
    size_t have; /* bytes buffered in line (the answer and what followed it) */
    size_t next; /* where what followed the answer starts */
};

/* Starts argv[0] with argv, the "NAME=VALUE" strings of env (NULL-terminated, may be NULL) added
 * to the environment, stdin and stdout piped to the bench, stderr appended to log. Returns 0 or
 * a negative errno. */
int kvpb_script_start(struct kvpb_script *s, const char *name, char *const argv[],
                      char *const env[], const char *log);

/* Reads the next line of the script's output into s->line. Returns 0 or a negative error
 * (-ETIMEDOUT after KVPB_SCRIPT_TIMEOUT_MS, -EPIPE when the script has exited). */
int kvpb_script_read(struct kvpb_script *s);

/* Sends cmd (one line, with its newline) and reads the answer; returns what follows its "ok".
 * An answer that is not "ok ..." ends the run with the script's log. */
char *kvpb_script_cmd(struct kvpb_script *s, const char *cmd);

/* kvpb_script_cmd() for a timed command answered "ok NS BYTES LAT_US...": *ns receives NS,
 * lat[0..nops) the latencies. An answer with another byte count or fewer latencies ends the
 * run. */
void kvpb_script_timed(struct kvpb_script *s, const char *cmd, uint32_t nops, uint64_t want_bytes,
                       double *ns, double *lat);

/* Closes its stdin, waits up to 5 s for it to exit, then stops it; says so if it failed. */
void kvpb_script_stop(struct kvpb_script *s);

#endif /* KVPB_BENCH_H */
