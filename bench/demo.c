/*
 * demo.c - kvpool-demo: a newcomer's first look at kvpool (`make demo`).
 *
 * It starts a private kvpoold, then runs two simulated inference workers one after the other,
 * each a separate process with its own client, as engine ranks are:
 *
 *   worker A  transport "auto": maps the daemon's shared-memory pool (zero copy);
 *   worker B  transport forced to inline: the bytes travel over the Unix socket.
 *
 * Each worker registers a KV layout, makes up a 4096-token prompt (16 chunks of 256 tokens),
 * looks it up, stores its KV chunks, looks it up again, retrieves them into fresh buffers and
 * checks every byte, printing its transport and throughput. Worker B also finds worker A's
 * prompt, which shows that the cache is shared between workers and transports. Finally the
 * demo prints the daemon's own log lines for the two registrations (the transport each worker
 * really got) and stops the daemon.
 *
 * Everything goes through the public API (kvpool.h); the calls are the ones a worker makes.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#ifndef KVPB_KVPOOLD
#define KVPB_KVPOOLD "kvpoold"
#endif

#define DEMO_CHUNKS 16u
#define DEMO_ROUNDS 3

struct demo {
    const char *socket;
    uint32_t layers;
    uint32_t chunk_tokens;
};

/* Deterministic token ids of prompt p (a real worker has them from its tokenizer). */
static void make_prompt(uint32_t *ids, uint32_t n, uint32_t p)
{
    for (uint32_t i = 0; i < n; i++)
        ids[i] = (p * 7919u + i * 31u) % 128256u;
}

/* Fake KV bytes of chunk i of prompt p. */
static void fill_kv(uint8_t *buf, uint64_t len, uint32_t p, uint32_t i)
{
    uint64_t x = 0x9e3779b97f4a7c15ull * (p * 1000u + i + 1);
    for (uint64_t o = 0; o + 8 <= len; o += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(buf + o, &x, 8);
    }
}

static int fail(const char *who, const char *what, int rc, kvp_client *c)
{
    fprintf(stderr, "%s: %s: %s%s%s\n", who, what, kvp_strerror(rc), c ? " - " : "",
            c ? kvp_last_error(c) : "");
    return 1;
}

/* One simulated worker; returns its exit code. */
static int worker(const struct demo *d, const char *name, uint32_t transport, uint32_t prompt,
                  int other_prompt)
{
    kvp_client *c = NULL;
    kvp_instance *inst = NULL;
    kvp_opts o = {.socket_path = d->socket};
    int rc;

    rc = kvp_client_open(&o, &c);
    if (rc < 0)
        return fail(name, "connect", rc, NULL);
    kvp_register_opts ro = {
        .instance_id = name,
        .model_name = "llama-3-8b-demo",
        .world_size = 1,
        .worker_rank = 0,
        .block_size = 16,
        .num_layers = d->layers,
        .hidden_dim = 1024,
        .dtype = "bfloat16",
        .transport = transport,
    };
    uint64_t t0 = kvpb_now_ns();
    rc = kvp_register(c, &ro, &inst);
    double reg_ms = (double)(kvpb_now_ns() - t0) / 1e6;
    if (rc < 0)
        return fail(name, "register", rc, c);
    const kvp_instance_info *info = kvp_instance_get_info(inst);
    uint64_t cb = info->chunk_bytes;
    uint32_t ntok = DEMO_CHUNKS * info->chunk_tokens;
    char sz[32];

    printf("\n%s (pid %d) asked for transport %s\n", name, (int)getpid(),
           transport == KVP_TRANSPORT_INLINE ? "inline" : "auto");
    if (info->transport == KVP_TRANSPORT_SHM)
        printf("  got: shm (segment %s mapped in %.0f ms: zero-copy, two-phase "
               "prepare/commit)\n",
               info->shm_name, reg_ms);
    else
        printf("  got: inline (%s): bytes go over the Unix socket\n", info->reason);
    printf("  layout: [2, %u layers, %u tokens, 1024] bfloat16 = %s per chunk\n", info->shape[1],
           info->chunk_tokens, kvpb_fmt_size(cb, sz, sizeof(sz)));

    /* The worker's KV buffers, touched once (fresh memory is slow to touch the first time). */
    int anon = MAP_PRIVATE | MAP_ANONYMOUS;
    /* cppcheck-suppress invalidFunctionArg ; an anonymous mapping takes fd -1 */
    uint8_t *kv = mmap(NULL, cb * DEMO_CHUNKS, PROT_READ | PROT_WRITE, anon, -1, 0);
    /* cppcheck-suppress invalidFunctionArg ; an anonymous mapping takes fd -1 */
    uint8_t *out = mmap(NULL, cb * DEMO_CHUNKS, PROT_READ | PROT_WRITE, anon, -1, 0);
    uint32_t *ids = calloc(ntok, sizeof(*ids));
    if (kv == MAP_FAILED || out == MAP_FAILED || !ids)
        return fail(name, "allocate buffers", -ENOMEM, NULL);
    memset(out, 0, cb * DEMO_CHUNKS);
    const void *chunks[DEMO_CHUNKS];
    void *outs[DEMO_CHUNKS];
    for (uint32_t i = 0; i < DEMO_CHUNKS; i++) {
        chunks[i] = kv + i * cb;
        outs[i] = out + i * cb;
    }

    if (other_prompt >= 0) {
        /* Another worker stored this prompt: its KV is found, whatever the transport. */
        make_prompt(ids, ntok, (uint32_t)other_prompt);
        kvp_tokens s = {.ids = ids, .count = ntok};
        int hit = kvp_lookup(inst, &s);
        int got = hit > 0 ? kvp_retrieve(inst, &s, 0, ntok, outs) : hit;
        bool same = got == DEMO_CHUNKS;
        for (uint32_t i = 0; same && i < DEMO_CHUNKS; i++) {
            fill_kv(kv, cb, (uint32_t)other_prompt, i);
            same = memcmp(kv, out + i * cb, cb) == 0;
        }
        printf("  the other worker's prompt: %d of %u chunks cached, retrieved %s\n", hit,
               DEMO_CHUNKS, same ? "and identical" : "WITH DIFFERENT BYTES");
        if (!same)
            return 1;
    }

    double st[DEMO_ROUNDS], rt[DEMO_ROUNDS];
    for (uint32_t r = 0; r < DEMO_ROUNDS; r++) {
        uint32_t p = prompt + r;
        make_prompt(ids, ntok, p);
        for (uint32_t i = 0; i < DEMO_CHUNKS; i++)
            fill_kv(kv + i * cb, cb, p, i);
        kvp_tokens s = {.ids = ids, .count = ntok};
        int before = kvp_lookup(inst, &s);
        kvp_store_result res;
        t0 = kvpb_now_ns();
        rc = kvp_store(inst, &s, 0, ntok, chunks, &res);
        st[r] = (double)(kvpb_now_ns() - t0) / 1e9;
        if (rc < 0)
            return fail(name, "store", rc, c);
        int after = kvp_lookup(inst, &s);
        memset(out, 0, cb * DEMO_CHUNKS);
        t0 = kvpb_now_ns();
        int got = kvp_retrieve(inst, &s, 0, ntok, outs);
        rt[r] = (double)(kvpb_now_ns() - t0) / 1e9;
        if (got < 0)
            return fail(name, "retrieve", got, c);
        if (got != DEMO_CHUNKS || memcmp(kv, out, cb * DEMO_CHUNKS) != 0) {
            fprintf(stderr, "%s: retrieved %d chunks, or different bytes\n", name, got);
            return 1;
        }
        if (r == 0)
            printf("  prompt of %u tokens: lookup before store %d/%u cached, stored %u, lookup "
                   "after %d/%u, retrieved %d, every byte checked\n",
                   ntok, before, DEMO_CHUNKS, res.stored, after, DEMO_CHUNKS, got);
    }
    double st_med = kvpb_percentile(st, DEMO_ROUNDS, 50.0);
    double rt_med = kvpb_percentile(rt, DEMO_ROUNDS, 50.0);
    double bytes = (double)cb * DEMO_CHUNKS;
    printf("  store    %u x %s in one call: %6.1f ms = %5.2f GB/s (median of %d prompts)\n",
           DEMO_CHUNKS, sz, st_med * 1e3, bytes / st_med / 1e9, DEMO_ROUNDS);
    printf("  retrieve %u x %s in one call: %6.1f ms = %5.2f GB/s\n", DEMO_CHUNKS, sz, rt_med * 1e3,
           bytes / rt_med / 1e9);
    fflush(stdout);
    kvp_client_close(c); /* unregisters the instance */
    return 0;
}

static int run_worker(const struct demo *d, const char *name, uint32_t transport, uint32_t prompt,
                      int other_prompt)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0)
        _exit(worker(d, name, transport, prompt, other_prompt));
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
        return 1;
    return WEXITSTATUS(st);
}

/* Prints the daemon's log lines that name an instance's transport. */
static void print_transport_lines(const char *log)
{
    char line[1024];
    FILE *f = fopen(log, "r");
    printf("\nkvpoold's log, one line per registration:\n");
    while (f && fgets(line, sizeof(line), f))
        if (strstr(line, "Instance ") && strstr(line, "transport"))
            printf("  %s", line);
    if (f)
        fclose(f);
}

int main(int argc, char **argv)
{
    struct kvpb_child daemon = {0};
    struct demo d = {.layers = 4};
    char dir[] = "/tmp/kvpool-demo.XXXXXX", socket[256], exe[512], line[1024];
    const char *kvpoold = KVPB_KVPOOLD;
    int o, rc = 0;

    static const struct option opts[] = {
        {"kvpoold", required_argument, 0, 'k'},
        {"layers", required_argument, 0, 'l'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (o == 'k') {
            kvpoold = optarg;
        } else if (o == 'l') {
            d.layers = (uint32_t)strtoul(optarg, NULL, 10);
            if (d.layers < 1 || d.layers > 32) {
                fprintf(stderr, "kvpool-demo: --layers must be 1..32\n");
                return 2;
            }
        } else {
            printf("usage: kvpool-demo [--kvpoold PATH] [--layers N]\n\n"
                   "Starts a private kvpoold, runs a worker on shared memory and one forced to\n"
                   "the inline transport, prints what each got, stops the daemon.\n"
                   "--layers sets the chunk size: N x 1 MiB (default 4).\n");
            return o == 'h' ? 0 : 2;
        }
    }
    if (!kvpb_find_exe(kvpoold, exe, sizeof(exe))) {
        fprintf(stderr, "kvpool-demo: cannot find kvpoold (%s); use --kvpoold PATH\n", kvpoold);
        return 1;
    }
    if (!mkdtemp(dir)) {
        perror("kvpool-demo: mkdtemp");
        return 1;
    }
    /* Room for both workers' 3 prompts of 16 chunks, and the first one's again. */
    uint64_t pool = (uint64_t)d.layers * KVPB_MiB * DEMO_CHUNKS * (2 * DEMO_ROUNDS + 1);
    char psz[32];
    printf("kvpool demo: starting %s with a %s pool on %s/kvpoold.sock\n", exe,
           kvpb_fmt_size(pool, psz, sizeof(psz)), dir);
    char log[300];
    snprintf(log, sizeof(log), "%s/kvpoold.log", dir);
    /* The demo shows the daemon's info lines, so it cannot use kvpb_kvpoold_start (warn). */
    char l1[32], shm[64];
    snprintf(socket, sizeof(socket), "%s/kvpoold.sock", dir);
    snprintf(l1, sizeof(l1), "%" PRIu64, pool);
    snprintf(shm, sizeof(shm), "demo_%d", (int)getpid());
    char *const args[] = {exe, "--socket",    socket, "--l1-size", l1,    "--shm-name",
                          shm, "--log-level", "info", "--http",    "off", NULL};
    if (kvpb_child_spawn(&daemon, "kvpoold", args, log) < 0 ||
        kvpb_wait_kvpoold(socket, &daemon, 120000) < 0) {
        kvpb_child_stop(&daemon, 5000);
        return 1;
    }
    FILE *f = fopen(log, "r");
    while (f && fgets(line, sizeof(line), f))
        if (strstr(line, "ready"))
            printf("  %s", line);
    if (f)
        fclose(f);

    d.socket = socket;
    rc = run_worker(&d, "demo-worker-A", KVP_TRANSPORT_AUTO, 100, -1);
    if (rc == 0)
        rc = run_worker(&d, "demo-worker-B", KVP_TRANSPORT_INLINE, 200, 100);
    print_transport_lines(log);

    int st = kvpb_child_stop(&daemon, 20000);
    printf("\nstopped kvpoold (exit status %d)%s\n", st,
           st == 0 ? ": segment and socket removed" : "");
    if (st != 0) {
        kvpb_child_print_log(&daemon, 20);
        rc = 1;
    }
    remove(log);
    rmdir(dir);
    if (rc)
        fprintf(stderr, "kvpool-demo: FAILED\n");
    return rc;
}
