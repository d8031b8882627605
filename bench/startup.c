/*
 * startup.c - the "startup" section: how soon kvpoold serves its first request, how long a
 * worker's first registration takes, and how fast the daemon reserves its pool, for pools of
 * 1, 4 and 12 GiB.
 *
 * For each size the bench starts a daemon of its own (--shm-backend memfd for every size: a
 * 12 GiB pool does not fit a 12 GiB /dev/shm, and the three sizes must be comparable) and
 * measures, on CLOCK_MONOTONIC from just before the fork:
 *
 *   daemon-ready  until a kvp_client_open + kvp_ping first succeeds. The bench polls by
 *                 connecting every millisecond: the socket may exist before the daemon serves
 *                 it, and a connection accepted early simply waits for its HELLO answer.
 *   register      right after that, a new client's first kvp_register on the shm transport
 *                 (it maps the pool), timed around that one call, while the daemon may still
 *                 be reserving the rest of the pool in the background.
 *   reserve       until the daemon's statistic of reserved pool bytes (pool_reserved, added
 *                 with the background reservation; n/a without it) reaches the pool size,
 *                 polled every 5 ms. GB/s = pool bytes / that time.
 *   first-touch   the baseline, once the daemon has exited: mmap + memset of as many bytes of
 *                 fresh anonymous memory, the cost of touching that much memory for the first
 *                 time on this machine, measured in the same section.
 *
 * A size is skipped, with a note, when MemAvailable is below the pool plus 2 GiB. A daemon
 * that does not answer, a registration that fails and a reservation that never completes make
 * their rows invalid (printed as such, no number), never a figure.
 *
 * Single-threaded; the daemons are children of the bench (PR_SET_PDEATHSIG, daemon.c) and are
 * stopped before the next size starts.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench.h"

#define READY_TIMEOUT_MS 180000   /* a daemon that reserves everything first takes ~2 s/GiB */
#define RESERVE_TIMEOUT_MS 300000 /* the whole pool reserved, counted from the fork */
#define STARTUP_CHUNK (4 * KVPB_MiB)

/* Stops the compiler from treating the baseline's memset as dead. */
#define KVPB_CLOBBER() __asm__ volatile("" ::: "memory")

/*
 * Reads the daemon's reserved pool bytes and pool size. The name of the first is matched
 * loosely ("pool_" and "reserved" in it): other statistics say "reserved" too
 * (store_chunks_reserved, objects_reserved), none of them starts with "pool_". Returns 1 when
 * both exist, 0 when the daemon has no such statistic, or a negative error.
 */
static int reserved_stat(kvp_client *c, uint64_t *reserved, uint64_t *pool)
{
    kvp_stat st[256];
    bool have_res = false, have_pool = false;
    int n = kvp_stats(c, st, 256);

    if (n < 0)
        return n;
    for (int i = 0; i < n && i < 256; i++) {
        if (strncmp(st[i].name, "pool_", 5) == 0 && strstr(st[i].name, "reserved") && !have_res) {
            *reserved = st[i].value;
            have_res = true;
        }
        if (strcmp(st[i].name, "pool_size") == 0 || strcmp(st[i].name, "pool_bytes") == 0) {
            *pool = st[i].value;
            have_pool = true;
        }
    }
    return have_res && have_pool;
}

int kvpb_wait_pool_reserved(kvp_client *c, int timeout_ms, double *ms)
{
    uint64_t reserved = 0, pool = 0, t0 = kvpb_now_ns();

    for (;;) {
        int rc = reserved_stat(c, &reserved, &pool);
        *ms = (double)(kvpb_now_ns() - t0) / 1e6;
        if (rc <= 0)
            return rc;
        if (reserved >= pool)
            return 1;
        if (*ms > timeout_ms) {
            fprintf(stderr,
                    "kvpool-bench: the daemon has reserved %" PRIu64 " of %" PRIu64
                    " pool bytes after %d s\n",
                    reserved, pool, timeout_ms / 1000);
            return -ETIMEDOUT;
        }
        kvpb_sleep_ms(5);
    }
}

/* Connects and pings every millisecond until it works; *ret keeps that client open. */
static int wait_ready(const char *socket, struct kvpb_child *ch, uint64_t t0, double *ms,
                      kvp_client **ret)
{
    for (;;) {
        kvp_client *c = NULL;
        kvp_opts o = {.socket_path = socket, .timeout_ms = 120000};
        int rc = kvp_client_open(&o, &c);
        if (rc == 0 && (rc = kvp_ping(c)) == 0) {
            *ms = (double)(kvpb_now_ns() - t0) / 1e6;
            *ret = c;
            return 0;
        }
        kvp_client_close(c);
        if (!kvpb_child_alive(ch)) {
            printf("  kvpoold exited during start-up (log below): daemon-ready invalid\n");
            kvpb_child_print_log(ch, 20);
            return -ECHILD;
        }
        if (kvpb_now_ns() - t0 > (uint64_t)READY_TIMEOUT_MS * 1000000) {
            printf("  kvpoold did not answer within %d s (%s): daemon-ready invalid\n",
                   READY_TIMEOUT_MS / 1000, kvp_strerror(rc));
            return -ETIMEDOUT;
        }
        kvpb_sleep_ms(1);
    }
}

/* A new client's first shm registration, timed around kvp_register() alone. NAN on failure
 * (said on stdout). */
static double time_register(const char *socket, uint32_t chunk_tokens)
{
    kvp_client *c = NULL;
    kvp_instance *inst = NULL;
    double ms = NAN;
    kvp_opts o = {.socket_path = socket, .timeout_ms = 60000};
    int rc = kvp_client_open(&o, &c);

    if (rc < 0) {
        printf("  register: cannot connect: %s\n", kvp_strerror(rc));
        return NAN;
    }
    kvp_register_opts ro;
    if (kvpb_register_opts("bench-startup", STARTUP_CHUNK, chunk_tokens, KVP_TRANSPORT_SHM, &ro) <
        0) {
        printf("  register: no layout has %" PRIu64 "-byte chunks\n", STARTUP_CHUNK);
        goto out_close;
    }
    uint64_t t0 = kvpb_now_ns();
    rc = kvp_register(c, &ro, &inst);
    uint64_t t1 = kvpb_now_ns();
    if (rc < 0) {
        printf("  register (shm): %s (%s): register invalid\n", kvp_strerror(rc),
               kvp_last_error(c));
        goto out_close;
    }
    ms = (double)(t1 - t0) / 1e6;
    kvp_unregister(inst);
out_close:
    /* Closing unmaps the pool and stops the library's pre-fault thread before the next poll. */
    kvp_client_close(c);
    return ms;
}

/* Polls until the reserved bytes reach the pool. Returns the ms since t0, NAN on a timeout or
 * an error (said), or -1.0 when the daemon has no such statistic. */
static double wait_reserved(kvp_client *c, struct kvpb_child *ch, uint64_t t0, uint64_t *pool)
{
    uint64_t reserved = 0;

    for (;;) {
        int rc = reserved_stat(c, &reserved, pool);
        uint64_t now = kvpb_now_ns();
        if (rc == 0)
            return -1.0;
        if (rc < 0) {
            printf("  stats: %s: reserve invalid\n", kvp_strerror(rc));
            return NAN;
        }
        if (reserved >= *pool)
            return (double)(now - t0) / 1e6;
        if (!kvpb_child_alive(ch)) {
            printf("  kvpoold exited while reserving its pool: reserve invalid\n");
            kvpb_child_print_log(ch, 20);
            return NAN;
        }
        if (now - t0 > (uint64_t)RESERVE_TIMEOUT_MS * 1000000) {
            printf("  %" PRIu64 " of %" PRIu64 " bytes reserved after %d s: reserve invalid\n",
                   reserved, *pool, RESERVE_TIMEOUT_MS / 1000);
            return NAN;
        }
        kvpb_sleep_ms(5);
    }
}

/* mmap + memset of bytes of fresh anonymous memory, first touch. GB/s, NAN if no memory. */
static double memset_gbps(uint64_t bytes, double *ms)
{
    uint64_t t0 = kvpb_now_ns();
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    /* cppcheck-suppress invalidFunctionArg ; an anonymous mapping takes fd -1 */
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED)
        return NAN;
    memset(p, 0x5a, bytes);
    KVPB_CLOBBER();
    uint64_t t1 = kvpb_now_ns();
    munmap(p, bytes);
    *ms = (double)(t1 - t0) / 1e6;
    return (double)bytes / ((double)(t1 - t0));
}

/* "12.3", or "-" for NAN (a value not measured: its row says why). */
static const char *fmt(char buf[32], double v, int prec)
{
    if (isnan(v))
        return "-";
    snprintf(buf, 32, "%.*f", prec, v);
    return buf;
}

static void one_size(const struct kvpb_config *cfg, const char *kvpoold, const char *dir,
                     uint64_t size, struct kvpb_rows *rows)
{
    char l1[32], tokens[16], socket[256], log[256], sz[32], a[32], b[32], c[32], d[32], e[32];
    struct kvpb_child ch = {0};
    double load;
    struct kvpb_row ready = kvpb_row_blank(KVPB_T_KVPOOL, KVPB_OP_READY, KVPB_D_STARTUP);
    struct kvpb_row reg = kvpb_row_blank(KVPB_T_SHM, KVPB_OP_REGISTER, KVPB_D_STARTUP);
    struct kvpb_row res = kvpb_row_blank(KVPB_T_KVPOOL, KVPB_OP_RESERVE, KVPB_D_STARTUP);
    struct kvpb_row touch = kvpb_row_blank(KVPB_T_MEMSET, KVPB_OP_TOUCH, KVPB_D_STARTUP);
    kvp_client *cl = NULL;
    uint64_t pool = size;

    ready.pool_bytes = reg.pool_bytes = res.pool_bytes = touch.pool_bytes = size;
    reg.chunk_bytes = STARTUP_CHUNK;
    ready.samples = reg.samples = res.samples = touch.samples = 1;
    kvpb_fmt_size(size, sz, sizeof(sz));
    printf("startup: %s pool ...", sz);
    fflush(stdout);

    snprintf(socket, sizeof(socket), "%s/startup.sock", dir);
    snprintf(log, sizeof(log), "%s/kvpoold-startup-%" PRIu64 ".log", dir, size);
    snprintf(l1, sizeof(l1), "%" PRIu64, size);
    snprintf(tokens, sizeof(tokens), "%u", cfg->chunk_tokens);
    unlink(socket);
    char *const argv[] = {
        (char *)kvpoold, "--socket", socket,        "--l1-size", l1,       "--chunk-size", tokens,
        "--shm-backend", "memfd",    "--log-level", "warn",      "--http", "off",          NULL,
    };
    uint64_t t0 = kvpb_now_ns();
    int rc = kvpb_child_spawn(&ch, "kvpoold", argv, log);
    if (rc < 0) {
        printf(" cannot start kvpoold: %s\n", strerror(-rc));
        ready.invalid = reg.invalid = res.invalid = touch.invalid = true;
        goto out_rows;
    }
    printf("\n");
    if (wait_ready(socket, &ch, t0, &ready.ms, &cl) < 0) {
        ready.invalid = reg.invalid = res.invalid = true;
        goto out_stop;
    }
    reg.ms = time_register(socket, cfg->chunk_tokens);
    reg.invalid = isnan(reg.ms);
    res.ms = wait_reserved(cl, &ch, t0, &pool);
    if (res.ms < 0) {
        printf("  the daemon reports no pool_reserved statistic: reservation speed n/a\n");
        res.ms = NAN;
    } else if (isnan(res.ms)) {
        res.invalid = true;
    } else {
        res.gb_per_s = (double)pool / (res.ms * 1e6);
    }
out_stop:
    kvp_client_close(cl);
    rc = kvpb_child_stop(&ch, 60000);
    if (rc != 0) {
        printf("  note: kvpoold (%s pool) exited with status %d (log below)\n", sz, rc);
        kvpb_child_print_log(&ch, 20);
    }
    /* The baseline once the pool is gone: both must not need the memory at once. */
    touch.gb_per_s = memset_gbps(size, &touch.ms);
    touch.invalid = isnan(touch.gb_per_s);
    if (!res.invalid && !touch.invalid)
        res.ratio_to_memcpy = res.gb_per_s / touch.gb_per_s;
    printf("  ready %s ms, register %s ms, reserved after %s ms (%s GB/s), memset %s GB/s\n",
           fmt(a, ready.ms, 1), fmt(b, reg.ms, 1), fmt(c, res.ms, 0), fmt(d, res.gb_per_s, 2),
           fmt(e, touch.gb_per_s, 2));
out_rows:
    if (getloadavg(&load, 1) == 1)
        ready.load1 = reg.load1 = res.load1 = touch.load1 = load;
    kvpb_rows_push(rows, &ready);
    kvpb_rows_push(rows, &reg);
    kvpb_rows_push(rows, &res);
    kvpb_rows_push(rows, &touch);
    fflush(stdout);
}

void kvpb_startup_phase(const struct kvpb_config *cfg, const char *kvpoold, const char *dir,
                        struct kvpb_rows *rows)
{
    static const uint64_t sizes[] = {KVPB_GiB, 4 * KVPB_GiB, 12 * KVPB_GiB};
    static const uint64_t quick[] = {64 * KVPB_MiB};
    const uint64_t *s = cfg->quick ? quick : sizes;
    size_t n = cfg->quick ? 1 : sizeof(sizes) / sizeof(sizes[0]);
    char sz[32];

    printf("startup: daemons with %s, --shm-backend memfd, one after the other\n",
           cfg->quick ? "a 64 MiB pool (--quick)" : "1, 4 and 12 GiB pools");
    for (size_t i = 0; i < n; i++) {
        uint64_t avail = kvpb_mem_available();
        if (avail < s[i] + 2 * KVPB_GiB) {
            printf("startup: %s pool skipped: MemAvailable is %.1f GiB, it needs the pool + "
                   "2 GiB\n",
                   kvpb_fmt_size(s[i], sz, sizeof(sz)), (double)avail / (double)KVPB_GiB);
            continue;
        }
        one_size(cfg, kvpoold, dir, s[i], rows);
    }
}
