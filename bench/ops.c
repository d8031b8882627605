/*
 * ops.c - the measured loops of one worker process.
 *
 * Every command runs cmd->nops operations of one kind and times each one with CLOCK_MONOTONIC
 * (samples in microseconds); the worker's wall time for the command is [t_start, t_end], so
 * the parent can add several workers up. Nothing is allocated inside a timed loop.
 *
 * Fairness rules, the same for every transport:
 *   - Chunk j of operation i (an operation carries cmd->batch chunks) reads from / writes to
 *     slot (i * batch + j) % nrot of the worker's rotating buffers (src for stores, dst for
 *     retrieves), nrot = footprint / chunk. With the default 256 MiB footprint every chunk
 *     comes from and goes to memory that is not in the CPU caches, as a real KV cache's does.
 *     The memcpy baseline copies src slot -> scratch slot the same way (see run_memcpy for
 *     why it runs twice).
 *   - Every buffer is pre-faulted (worker.c) and the pool is pre-faulted by the daemon and the
 *     library. The first pass before the sweep (main.c, reported as its own rows) writes the
 *     whole pool once per transport, as a long-running worker would have.
 *   - Each kvpool store uses a fresh key (nothing is skipped as "cached") and must store every
 *     chunk of its call; each retrieve must return every chunk. Anything else fails the run: a
 *     benchmark that silently measures a no-op is worse than none.
 *   - With cmd->verify (the warm-up repetition), every retrieved byte is compared with what was
 *     stored, on every transport that returns data.
 *
 * Keys: the token ids of a chunk are (seq low, seq high, worker, run id, 4, 5, ...): unique per
 * key number, worker and run, so repeated runs against a long-lived daemon never hit old data.
 *
 * The raw socket peer (kvpb_uds_peer_main) speaks the smallest framing that does the same job
 * as kvpool's: a 32-byte header, the payload, a 32-byte reply. It receives into and sends from
 * its own rotating buffer, like the daemon's pool. For round trips (ping) both ends run on the
 * worker's CPU (the header carries it): the fastest a request and its reply can go on this
 * machine, whatever the scheduler would have done with the pair.
 */
#include "worker.h"

#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* Stops the compiler from treating a copy whose destination is not read again as dead. */
#define KVPB_CLOBBER() __asm__ volatile("" ::: "memory")

int kvpb_fail(struct kvpb_wres *res, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res->err, sizeof(res->err), fmt, ap);
    va_end(ap);
    res->rc = rc < 0 ? rc : -EIO;
    return res->rc;
}

/* Offset of operation i's chunk in a rotating buffer. */
static uint64_t slot_off(const struct kvpb_worker *w, uint64_t i, uint64_t chunk)
{
    uint64_t nrot = w->footprint / chunk;
    return (i % (nrot ? nrot : 1)) * chunk;
}

/*
 * Work before each "ping-idle": long enough that the peer's CPU goes idle, as the daemon's does
 * while a worker copies a multi-megabyte chunk, so the round trip pays the wake-up.
 */
#define KVPB_IDLE_US 500

static void busy_wait_us(uint64_t us)
{
    uint64_t end = kvpb_now_ns() + us * 1000;
    while (kvpb_now_ns() < end)
        ;
}

static void set_key(struct kvpb_worker *w, const struct kvpb_cmd *cmd, uint64_t seq)
{
    w->tokens[0] = (uint32_t)seq;
    w->tokens[1] = (uint32_t)(seq >> 32);
    w->tokens[2] = w->index;
    w->tokens[3] = cmd->run_id;
}

/* ------------------------------------------------------------------------------------------ */
/* Instances                                                                                  */

/* Prefers Llama-3-8B-like 32 layers (bench.h). */
int kvpb_pick_layout(uint64_t bytes, uint32_t tokens, uint32_t *layers, uint32_t *hidden,
                     const char **dtype)
{
    static const struct {
        const char *name;
        uint32_t size;
    } dt[] = {{"bfloat16", 2}, {"uint8", 1}};

    for (size_t d = 0; d < sizeof(dt) / sizeof(dt[0]); d++)
        for (uint32_t l = 32; l >= 1; l /= 2) {
            uint64_t unit = 2ull * l * tokens * dt[d].size;
            if (bytes % unit == 0 && bytes / unit >= 1 && bytes / unit <= UINT32_MAX) {
                *layers = l;
                *hidden = (uint32_t)(bytes / unit);
                *dtype = dt[d].name;
                return 0;
            }
        }
    return -EINVAL;
}

int kvpb_register_opts(const char *id, uint64_t bytes, uint32_t tokens, uint32_t transport,
                       kvp_register_opts *o)
{
    uint32_t layers, hidden;
    const char *dtype;

    if (kvpb_pick_layout(bytes, tokens, &layers, &hidden, &dtype) < 0)
        return -EINVAL;
    *o = (kvp_register_opts){
        .instance_id = id,
        .model_name = "kvpool-bench",
        .world_size = 1,
        .worker_rank = 0,
        .block_size = 16,
        .num_layers = layers,
        .hidden_dim = hidden,
        .dtype = dtype,
        .transport = transport,
    };
    return 0;
}

static int register_one(struct kvpb_worker *w, uint32_t transport, const char *tag, uint64_t bytes,
                        kvp_instance **ret, struct kvpb_wres *res)
{
    kvp_register_opts o;
    char id[96];

    snprintf(id, sizeof(id), "bench-w%u-%s-%" PRIu64, w->index, tag, bytes);
    if (kvpb_register_opts(id, bytes, w->chunk_tokens, transport, &o) < 0)
        return kvpb_fail(res, -EINVAL, "no KV layout has %" PRIu64 "-byte chunks of %u tokens",
                         bytes, w->chunk_tokens);
    int rc = kvp_register(w->client, &o, ret);
    if (rc == KVP_ENOSHM && transport == KVP_TRANSPORT_SHM) {
        *ret = NULL; /* no shared memory here: the shm cells are skipped, not failed */
        return 0;
    }
    if (rc < 0)
        return kvpb_fail(res, rc, "register %s: %s (%s)", id, kvp_strerror(rc),
                         kvp_last_error(w->client));
    if (kvp_instance_get_info(*ret)->chunk_bytes != bytes)
        return kvpb_fail(res, -EPROTO, "instance %s has %" PRIu64 "-byte chunks, not %" PRIu64, id,
                         kvp_instance_get_info(*ret)->chunk_bytes, bytes);
    return 0;
}

static void paged_free(struct kvpb_worker *w)
{
    if (w->paged_mem)
        munmap(w->paged_mem, w->paged_mem_bytes);
    free(w->paged_layers);
    free(w->block_tables);
    w->paged_mem = NULL;
    w->paged_layers = NULL;
    w->block_tables = NULL;
    w->paged = (kvp_paged_cache){0};
}

void kvpb_ops_teardown(struct kvpb_worker *w)
{
    kvp_unregister(w->shm);
    kvp_unregister(w->inl);
    w->shm = w->inl = NULL;
    w->inst_chunk = 0;
    paged_free(w);
}

/*
 * Builds a paged KV cache whose chunks are `bytes` long: 8 KV heads of 128 bfloat16 elements
 * (Llama-3-8B), blocks of 16 tokens, as many layers as the size needs at 256 tokens per chunk
 * (fewer tokens for small chunks). The cache is about one footprint large and every sequence's
 * block table is a random set of blocks, as an engine's allocator leaves them.
 */
static int paged_setup(struct kvpb_worker *w, const struct kvpb_cmd *cmd, struct kvpb_wres *res)
{
    static const uint32_t hiddens[][2] = {{8, 128}, {1, 128}, {1, 16}};
    static const uint32_t token_opts[] = {256, 128, 64, 32, 16};
    const uint32_t block = 16, elem = 2;
    uint32_t heads = 0, head_dim = 0, layers = 0, tokens = 0;
    uint64_t bytes = cmd->chunk_bytes;

    paged_free(w);
    for (size_t h = 0; h < 3 && !layers; h++)
        for (size_t t = 0; t < sizeof(token_opts) / sizeof(token_opts[0]) && !layers; t++) {
            uint64_t per_layer = 2ull * token_opts[t] * hiddens[h][0] * hiddens[h][1] * elem;
            if (bytes % per_layer == 0 && bytes / per_layer >= 1 && bytes / per_layer <= 64) {
                heads = hiddens[h][0];
                head_dim = hiddens[h][1];
                tokens = token_opts[t];
                layers = (uint32_t)(bytes / per_layer);
            }
        }
    if (!layers)
        return kvpb_fail(res, -EINVAL, "no paged layout has %" PRIu64 "-byte chunks", bytes);

    uint64_t block_bytes = 2ull * block * heads * head_dim * elem;
    uint32_t table_len = tokens / block;
    uint64_t nblocks = w->footprint / layers / block_bytes;
    if (nblocks < 2ull * table_len)
        nblocks = 2ull * table_len;
    if (nblocks > INT32_MAX)
        nblocks = INT32_MAX;
    uint64_t layer_bytes = nblocks * block_bytes;
    w->paged_mem_bytes = layer_bytes * layers;
    w->paged_mem = kvpb_map_prefaulted(w->paged_mem_bytes, 0x5a);
    if (!w->paged_mem)
        return kvpb_fail(res, -ENOMEM, "cannot map a %" PRIu64 "-byte paged cache",
                         w->paged_mem_bytes);

    w->ntables = (uint32_t)(nblocks / table_len);
    w->table_len = table_len;
    w->paged_layers = calloc(layers, sizeof(*w->paged_layers));
    w->block_tables = malloc(sizeof(*w->block_tables) * (size_t)nblocks);
    if (!w->paged_layers || !w->block_tables)
        return kvpb_fail(res, -ENOMEM, "out of memory for block tables");
    for (uint32_t l = 0; l < layers; l++)
        w->paged_layers[l] = w->paged_mem + (uint64_t)l * layer_bytes;
    /* A random permutation of the blocks (Fisher-Yates, fixed seed: runs are comparable). */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (uint64_t i = 0; i < nblocks; i++)
        w->block_tables[i] = (int32_t)i;
    for (uint64_t i = nblocks - 1; i > 0; i--) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint64_t j = x % (i + 1);
        int32_t t = w->block_tables[i];
        w->block_tables[i] = w->block_tables[j];
        w->block_tables[j] = t;
    }
    w->paged = (kvp_paged_cache){
        .layout = cmd->layout,
        .flags = 0,
        .num_layers = layers,
        .num_blocks = (uint32_t)nblocks,
        .block_size = block,
        .heads = heads,
        .head_dim = head_dim,
        .elem_size = elem,
        .layer_bytes = layer_bytes,
        .layers = w->paged_layers,
    };
    w->paged_tokens = tokens;
    uint64_t check = 0;
    int rc = kvp_paged_chunk_bytes(&w->paged, tokens, &check);
    if (rc < 0 || check != bytes)
        return kvpb_fail(res, rc < 0 ? rc : -EINVAL,
                         "paged cache chunk is %" PRIu64 " bytes, not %" PRIu64, check, bytes);
    return 0;
}

int kvpb_ops_setup(struct kvpb_worker *w, const struct kvpb_cmd *cmd, struct kvpb_wres *res)
{
    if (cmd->transport == KVPB_T_PAGED)
        return paged_setup(w, cmd, res);
    if (w->inst_chunk == cmd->chunk_bytes)
        goto out;
    kvpb_ops_teardown(w);
    /* Timed: the first shm registration of a client maps (and pre-faults) the pool. */
    res->t_start_ns = kvpb_now_ns();
    int rc = register_one(w, KVP_TRANSPORT_SHM, "shm", cmd->chunk_bytes, &w->shm, res);
    res->t_end_ns = kvpb_now_ns();
    if (rc < 0 ||
        register_one(w, KVP_TRANSPORT_INLINE, "inline", cmd->chunk_bytes, &w->inl, res) < 0) {
        kvpb_ops_teardown(w);
        return res->rc;
    }
    w->inst_chunk = cmd->chunk_bytes;
out:
    res->shm = w->shm != NULL;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Measured loops                                                                             */

/* Chunk j of operation i: its slot in a rotating buffer (operations carry cmd->batch chunks). */
static uint64_t chunk_off(const struct kvpb_worker *w, const struct kvpb_cmd *cmd, uint32_t i,
                          uint32_t j)
{
    return slot_off(w, (uint64_t)i * cmd->batch + j, cmd->chunk_bytes);
}

/*
 * The physical limit. The same copies run twice and only the second pass is timed: on the
 * development VM, memory nobody touched for a second or more is several times slower to access
 * the next time (a cost of the hypervisor, see docs/PERFORMANCE.md), and the limit is meant to
 * be the machine's copy bandwidth, not that penalty. The footprint is still far larger than the
 * CPU caches, so the timed pass copies cache-cold data. kvpool's cells get no such help, which
 * keeps their ratios conservative.
 */
static int run_memcpy(struct kvpb_worker *w, const struct kvpb_cmd *cmd, struct kvpb_wres *res,
                      double *samples)
{
    uint64_t c = cmd->chunk_bytes;
    for (uint32_t i = 0; i < cmd->nops; i++)
        for (uint32_t j = 0; j < cmd->batch; j++) {
            uint64_t off = chunk_off(w, cmd, i, j);
            memcpy(w->scratch + off, w->src + off, c);
            KVPB_CLOBBER();
        }
    res->t_start_ns = kvpb_now_ns(); /* the wall time starts with the timed pass */
    for (uint32_t i = 0; i < cmd->nops; i++) {
        uint64_t t0 = kvpb_now_ns();
        for (uint32_t j = 0; j < cmd->batch; j++) {
            uint64_t off = chunk_off(w, cmd, i, j);
            memcpy(w->scratch + off, w->src + off, c);
            KVPB_CLOBBER();
        }
        samples[i] = (double)(kvpb_now_ns() - t0) / 1e3;
    }
    res->bytes = (uint64_t)cmd->nops * cmd->batch * c;
    return 0;
}

static kvp_instance *instance_for(struct kvpb_worker *w, int transport)
{
    return transport == KVPB_T_SHM ? w->shm : w->inl;
}

/* kvp_store() of the n chunks of key `seq` (a sequence of n * chunk_tokens tokens). */
static int store_n(struct kvpb_worker *w, kvp_instance *inst, const struct kvpb_cmd *cmd,
                   uint64_t seq, const void *const *chunks, uint32_t n, struct kvpb_wres *res)
{
    kvp_tokens s = {.ids = w->tokens, .count = n * w->chunk_tokens};
    kvp_store_result r;

    set_key(w, cmd, seq);
    int rc = kvp_store(inst, &s, 0, s.count, chunks, &r);
    if (rc < 0)
        return kvpb_fail(res, rc, "store of key %" PRIu64 ": %s (%s)", seq, kvp_strerror(rc),
                         kvp_last_error(w->client));
    return rc;
}

static int retrieve_n(struct kvpb_worker *w, kvp_instance *inst, const struct kvpb_cmd *cmd,
                      uint64_t seq, void *const *outs, uint32_t n, struct kvpb_wres *res)
{
    kvp_tokens s = {.ids = w->tokens, .count = n * w->chunk_tokens};

    set_key(w, cmd, seq);
    int rc = kvp_retrieve(inst, &s, 0, s.count, outs);
    if (rc < 0)
        return kvpb_fail(res, rc, "retrieve of key %" PRIu64 ": %s (%s)", seq, kvp_strerror(rc),
                         kvp_last_error(w->client));
    return rc;
}

/*
 * The shm transport through the two-phase calls, which is what kvp_store() and kvp_retrieve()
 * do on shm (prepare, copy, commit), with the copy timed on its own: the copy is the part of
 * the operation that moves bytes, the rest is the round trip to the daemon (the prepare's; the
 * commit is pipelined, src/client/transfer.c). Measured in
 * the same operation on the same memory, the copy share is immune to how warm or cold any
 * other buffer is. Returns the chunks stored / retrieved, or a negative error.
 */
static int shm_store_timed(struct kvpb_worker *w, const struct kvpb_cmd *cmd, uint64_t seq,
                           const void *const *chunks, uint32_t n, struct kvpb_wres *res)
{
    kvp_tokens s = {.ids = w->tokens, .count = n * w->chunk_tokens};
    kvp_store_plan plan;

    set_key(w, cmd, seq);
    int rc = kvp_prepare_store(w->shm, &s, 0, s.count, &plan);
    if (rc < 0)
        return kvpb_fail(res, rc, "prepare-store of key %" PRIu64 ": %s (%s)", seq,
                         kvp_strerror(rc), kvp_last_error(w->client));
    uint64_t t0 = kvpb_now_ns();
    for (uint32_t i = 0; i < plan.nslots; i++)
        memcpy(plan.slots[i].data, chunks[plan.slots[i].chunk_index], (size_t)plan.slots[i].length);
    res->copy_ns += kvpb_now_ns() - t0;
    rc = kvp_commit_store(w->shm, &plan);
    if (rc < 0)
        return kvpb_fail(res, rc, "commit-store of key %" PRIu64 ": %s (%s)", seq, kvp_strerror(rc),
                         kvp_last_error(w->client));
    return rc;
}

static int shm_retrieve_timed(struct kvpb_worker *w, const struct kvpb_cmd *cmd, uint64_t seq,
                              void *const *outs, uint32_t n, struct kvpb_wres *res)
{
    kvp_tokens s = {.ids = w->tokens, .count = n * w->chunk_tokens};
    kvp_retrieve_plan plan;

    set_key(w, cmd, seq);
    int rc = kvp_prepare_retrieve(w->shm, &s, 0, s.count, &plan);
    if (rc < 0)
        return kvpb_fail(res, rc, "prepare-retrieve of key %" PRIu64 ": %s (%s)", seq,
                         kvp_strerror(rc), kvp_last_error(w->client));
    uint64_t t0 = kvpb_now_ns();
    for (uint32_t i = 0; i < plan.nslots; i++)
        memcpy(outs[i], plan.slots[i].data, (size_t)plan.slots[i].length);
    res->copy_ns += kvpb_now_ns() - t0;
    int got = (int)plan.nslots;
    rc = kvp_commit_retrieve(w->shm, &plan);
    if (rc < 0)
        return kvpb_fail(res, rc, "commit-retrieve of key %" PRIu64 ": %s (%s)", seq,
                         kvp_strerror(rc), kvp_last_error(w->client));
    return got;
}

static int store_one(struct kvpb_worker *w, kvp_instance *inst, const struct kvpb_cmd *cmd,
                     uint64_t seq, const void *chunk, struct kvpb_wres *res)
{
    return store_n(w, inst, cmd, seq, &chunk, 1, res);
}

static int retrieve_one(struct kvpb_worker *w, kvp_instance *inst, const struct kvpb_cmd *cmd,
                        uint64_t seq, void *out, struct kvpb_wres *res)
{
    return retrieve_n(w, inst, cmd, seq, &out, 1, res);
}

static int run_kv_store(struct kvpb_worker *w, const struct kvpb_cmd *cmd, struct kvpb_wres *res,
                        double *samples)
{
    kvp_instance *inst = instance_for(w, cmd->transport);
    const void *chunks[KVPB_MAX_BATCH];

    for (uint32_t i = 0; i < cmd->nops; i++) {
        for (uint32_t j = 0; j < cmd->batch; j++)
            chunks[j] = w->src + chunk_off(w, cmd, i, j);
        uint64_t t0 = kvpb_now_ns();
        int rc = inst == w->shm && !cmd->plain
                     ? shm_store_timed(w, cmd, cmd->seq_base + i, chunks, cmd->batch, res)
                     : store_n(w, inst, cmd, cmd->seq_base + i, chunks, cmd->batch, res);
        samples[i] = (double)(kvpb_now_ns() - t0) / 1e3;
        if (rc < 0)
            return rc;
        if (rc != (int)cmd->batch)
            return kvpb_fail(res, -EIO,
                             "store of key %" PRIu64 " stored %d chunks, not %u "
                             "(the pool is too small for the working set?)",
                             cmd->seq_base + i, rc, cmd->batch);
    }
    res->bytes = (uint64_t)cmd->nops * cmd->batch * cmd->chunk_bytes;
    return 0;
}

static int run_kv_retrieve(struct kvpb_worker *w, const struct kvpb_cmd *cmd, struct kvpb_wres *res,
                           double *samples)
{
    kvp_instance *inst = instance_for(w, cmd->transport);
    uint64_t c = cmd->chunk_bytes;
    void *outs[KVPB_MAX_BATCH];

    for (uint32_t i = 0; i < cmd->nops; i++) {
        for (uint32_t j = 0; j < cmd->batch; j++)
            outs[j] = w->dst + chunk_off(w, cmd, i, j);
        uint64_t t0 = kvpb_now_ns();
        int rc = inst == w->shm && !cmd->plain
                     ? shm_retrieve_timed(w, cmd, cmd->seq_base + i, outs, cmd->batch, res)
                     : retrieve_n(w, inst, cmd, cmd->seq_base + i, outs, cmd->batch, res);
        samples[i] = (double)(kvpb_now_ns() - t0) / 1e3;
        if (rc < 0)
            return rc;
        if (rc != (int)cmd->batch)
            return kvpb_fail(res, -EIO,
                             "key %" PRIu64 " stored in this repetition: %d of %u "
                             "chunks found (evicted: pool too small for the working set?)",
                             cmd->seq_base + i, rc, cmd->batch);
        for (uint32_t j = 0; cmd->verify && j < cmd->batch; j++) {
            uint64_t off = chunk_off(w, cmd, i, j);
            if (memcmp(w->dst + off, w->src + off, c) != 0)
                return kvpb_fail(res, -EIO,
                                 "key %" PRIu64 ", chunk %u: retrieved bytes differ "
                                 "from the stored ones",
                                 cmd->seq_base + i, j);
        }
    }
    res->bytes = (uint64_t)cmd->nops * cmd->batch * c;
    return 0;
}

/* Pressure: get-or-put of uniformly random keys out of ws_chunks, as a serving loop does. */
static int run_pressure(struct kvpb_worker *w, const struct kvpb_cmd *cmd, struct kvpb_wres *res,
                        double *samples)
{
    kvp_instance *inst = instance_for(w, cmd->transport);
    uint64_t c = cmd->chunk_bytes;
    uint64_t x = cmd->rng_seed * 2654435761u + w->index + 1;

    for (uint32_t i = 0; i < cmd->nops; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint64_t k = x % cmd->ws_chunks;
        uint64_t off = slot_off(w, i, c), src_off = slot_off(w, k, c);
        uint64_t t0 = kvpb_now_ns();
        int rc = retrieve_one(w, inst, cmd, cmd->seq_base + k, w->dst + off, res);
        bool hit = rc == 1;
        if (rc == 0)
            rc = store_one(w, inst, cmd, cmd->seq_base + k, w->src + src_off, res);
        samples[i] = (double)(kvpb_now_ns() - t0) / 1e3;
        if (rc < 0)
            return rc;
        res->hits += hit;
        if (hit && cmd->verify && memcmp(w->dst + off, w->src + src_off, c) != 0)
            return kvpb_fail(res, -EIO, "pressure key %" PRIu64 ": wrong bytes", k);
    }
    res->bytes = (uint64_t)cmd->nops * c;
    return 0;
}

/*
 * Stores the KVPB_LOOKUP_CHUNKS chunks of key `seq` as one 32k-token sequence (w->long_tokens),
 * from consecutive slots of src, in one call. Every chunk must be stored.
 */
static int store_long(struct kvpb_worker *w, kvp_instance *inst, const struct kvpb_cmd *cmd,
                      uint64_t seq, struct kvpb_wres *res)
{
    const void *chunks[KVPB_LOOKUP_CHUNKS];
    kvp_tokens s = {.ids = w->long_tokens, .count = KVPB_LOOKUP_CHUNKS * w->chunk_tokens};

    w->long_tokens[0] = (uint32_t)seq;
    w->long_tokens[1] = (uint32_t)(seq >> 32);
    w->long_tokens[2] = w->index;
    w->long_tokens[3] = cmd->run_id;
    for (uint32_t k = 0; k < KVPB_LOOKUP_CHUNKS; k++)
        chunks[k] = w->src + slot_off(w, k, w->inst_chunk);
    int rc = kvp_store(inst, &s, 0, s.count, chunks, NULL);
    if (rc < 0)
        return kvpb_fail(res, rc, "store of the %u-chunk prefix: %s (%s)", KVPB_LOOKUP_CHUNKS,
                         kvp_strerror(rc), kvp_last_error(w->client));
    if (rc != (int)KVPB_LOOKUP_CHUNKS)
        return kvpb_fail(res, -EIO, "store of the %u-chunk prefix stored %d chunks",
                         KVPB_LOOKUP_CHUNKS, rc);
    return 0;
}

static int run_kv_small(struct kvpb_worker *w, const struct kvpb_cmd *cmd, struct kvpb_wres *res,
                        double *samples)
{
    kvp_instance *inst = w->shm ? w->shm : w->inl;
    kvp_tokens s = {.ids = w->tokens, .count = w->chunk_tokens};
    int rc, want = 1;

    if (cmd->op == KVPB_OP_LOOKUP) {
        /* One cached chunk to find, stored before the clock starts. */
        rc = store_one(w, inst, cmd, cmd->seq_base, w->src, res);
        if (rc < 0)
            return rc;
    } else if (cmd->op == KVPB_OP_LOOKUP128) {
        /* A cached 32k-token prefix, stored before the clock starts. */
        if ((rc = store_long(w, inst, cmd, cmd->seq_base, res)) < 0)
            return rc;
        s = (kvp_tokens){.ids = w->long_tokens, .count = KVPB_LOOKUP_CHUNKS * w->chunk_tokens};
        want = (int)KVPB_LOOKUP_CHUNKS;
    }
    /* requests/s counts the requests, not the store before them. */
    res->t_start_ns = kvpb_now_ns();
    bool lookup = cmd->op == KVPB_OP_LOOKUP || cmd->op == KVPB_OP_LOOKUP128;
    for (uint32_t i = 0; i < cmd->nops; i++) {
        if (cmd->op == KVPB_OP_PING_IDLE)
            busy_wait_us(KVPB_IDLE_US);
        uint64_t t0 = kvpb_now_ns();
        rc = lookup ? kvp_lookup(inst, &s) : kvp_ping(w->client);
        samples[i] = (double)(kvpb_now_ns() - t0) / 1e3;
        if (rc < 0)
            return kvpb_fail(res, rc, "%s: %s", kvpb_op_name(cmd->op), kvp_strerror(rc));
        if (lookup && rc != want)
            return kvpb_fail(res, -EIO, "%s found %d chunks, not %d", kvpb_op_name(cmd->op), rc,
                             want);
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Raw Unix socket                                                                            */

/* Moves past the first done bytes of the n-entry vector *iov (a partial send or receive). */
static void iov_advance(struct iovec **iov, int *n, size_t done)
{
    while (*n > 0 && done >= (*iov)->iov_len) {
        done -= (*iov)->iov_len;
        (*iov)++;
        (*n)--;
    }
    if (*n > 0) {
        (*iov)->iov_base = (uint8_t *)(*iov)->iov_base + done;
        (*iov)->iov_len -= done;
    }
}

static int send_iov(int fd, struct iovec *iov, int n)
{
    while (n > 0) {
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t r = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        iov_advance(&iov, &n, (size_t)r);
    }
    return 0;
}

static int recv_full(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t r = recv(fd, p, len, MSG_WAITALL);
        if (r == 0)
            return -ECONNRESET;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

static int recv_iov_full(int fd, struct iovec *iov, int n)
{
    while (n > 0) {
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t r = recvmsg(fd, &mh, MSG_WAITALL);
        if (r == 0)
            return -ECONNRESET;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        iov_advance(&iov, &n, (size_t)r);
    }
    return 0;
}

static int run_uds(struct kvpb_worker *w, const struct kvpb_cmd *cmd, struct kvpb_wres *res,
                   double *samples)
{
    bool bulk = cmd->op == KVPB_OP_STORE || cmd->op == KVPB_OP_RETRIEVE;
    uint32_t nchunks = bulk ? cmd->batch : 0;
    uint64_t c = cmd->chunk_bytes;
    struct iovec iov[1 + KVPB_MAX_BATCH];

    if (w->uds_fd < 0)
        return kvpb_fail(res, -ENOTCONN, "no raw socket peer");
    /*
     * Round trips: both ends on one CPU, the fastest a request and its reply can go here (a
     * switch between two threads of one CPU). Left to the scheduler, the pair sometimes lands
     * on two CPUs and then pays two wake-ups of an idle CPU per round trip (65-80 us on the
     * development VM), which would make a poor limit. Bulk cells leave both ends free.
     */
    cpu_set_t saved;
    int cpu = -1;
    if (!bulk && sched_getaffinity(0, sizeof(saved), &saved) == 0 && (cpu = sched_getcpu()) >= 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        if (sched_setaffinity(0, sizeof(one), &one) != 0)
            cpu = -1;
    }
    int rc = 0;
    for (uint32_t i = 0; i < cmd->nops && rc == 0; i++) {
        /* One frame per operation, as kvpool sends one request per call. */
        struct kvpb_uds_hdr h = {.op = (uint64_t)cmd->op,
                                 .len = nchunks * c,
                                 .cpu = cpu >= 0 ? (uint64_t)cpu + 1 : 0},
                            reply;
        uint8_t *buf = cmd->op == KVPB_OP_STORE ? w->src : w->dst;
        iov[0] = (struct iovec){&h, sizeof(h)};
        for (uint32_t j = 0; j < nchunks; j++)
            iov[1 + j] = (struct iovec){buf + chunk_off(w, cmd, i, j), c};
        if (cmd->op == KVPB_OP_PING_IDLE)
            busy_wait_us(KVPB_IDLE_US);
        uint64_t t0 = kvpb_now_ns();
        rc = send_iov(w->uds_fd, iov, cmd->op == KVPB_OP_STORE ? 1 + (int)nchunks : 1);
        if (rc == 0)
            rc = recv_full(w->uds_fd, &reply, sizeof(reply));
        if (rc == 0 && cmd->op == KVPB_OP_RETRIEVE) {
            for (uint32_t j = 0; j < nchunks; j++)
                iov[1 + j] = (struct iovec){buf + chunk_off(w, cmd, i, j), c};
            rc = recv_iov_full(w->uds_fd, iov + 1, (int)nchunks);
        }
        samples[i] = (double)(kvpb_now_ns() - t0) / 1e3;
    }
    if (cpu >= 0)
        sched_setaffinity(0, sizeof(saved), &saved);
    if (rc < 0)
        return kvpb_fail(res, rc, "raw socket %s: %s", kvpb_op_name(cmd->op), strerror(-rc));
    res->bytes = (uint64_t)cmd->nops * nchunks * c;
    return 0;
}

void kvpb_uds_peer_main(int fd, uint64_t footprint)
{
    uint8_t *area = kvpb_map_prefaulted(footprint, 0xa5);
    struct kvpb_uds_hdr h;
    uint64_t n = 0, on = 0; /* on: the CPU + 1 this process is bound to, 0: none */
    cpu_set_t all;

    if (!area || sched_getaffinity(0, sizeof(all), &all) != 0)
        return;
    while (recv_full(fd, &h, sizeof(h)) == 0) {
        uint64_t off = 0;
        /* Run where the sender asks (its own CPU, for round trips), or anywhere again. */
        if (h.cpu != on && h.cpu <= CPU_SETSIZE) {
            cpu_set_t one;
            CPU_ZERO(&one);
            if (h.cpu)
                CPU_SET((int)h.cpu - 1, &one);
            if (sched_setaffinity(0, sizeof(one), h.cpu ? &one : &all) == 0)
                on = h.cpu;
        }
        if (h.len > footprint)
            return;
        if (h.len)
            off = (n++ % (footprint / h.len)) * h.len;
        if (h.op == KVPB_OP_STORE && recv_full(fd, area + off, h.len) < 0)
            return;
        struct iovec iov[2] = {{&h, sizeof(h)}, {area + off, h.len}};
        if (send_iov(fd, iov, h.op == KVPB_OP_RETRIEVE ? 2 : 1) < 0)
            return;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Redis                                                                                      */

static int run_redis(struct kvpb_worker *w, const struct kvpb_cmd *cmd, struct kvpb_wres *res,
                     double *samples)
{
    uint32_t n = cmd->op == KVPB_OP_PING ? 0 : cmd->batch;
    uint64_t c = cmd->chunk_bytes;
    char names[KVPB_MAX_BATCH][48];
    const char *keys[KVPB_MAX_BATCH];
    const void *vals[KVPB_MAX_BATCH];
    void *dsts[KVPB_MAX_BATCH];

    if (!w->redis)
        return kvpb_fail(res, -ENOTCONN, "no Redis connection");
    for (uint32_t i = 0; i < cmd->nops; i++) {
        /* Keys of one repetition overwrite the previous one's: Redis holds one working set. */
        for (uint32_t j = 0; j < n; j++) {
            uint64_t off = chunk_off(w, cmd, i, j);
            snprintf(names[j], sizeof(names[j]), "kvpb:%u:%u:%u", w->index, i, j);
            keys[j] = names[j];
            vals[j] = w->src + off;
            dsts[j] = w->dst + off;
        }
        int rc;
        uint64_t t0 = kvpb_now_ns();
        if (cmd->op == KVPB_OP_STORE)
            rc = kvpb_redis_set(w->redis, keys, vals, n, c, res->err, sizeof(res->err));
        else if (cmd->op == KVPB_OP_RETRIEVE)
            rc = kvpb_redis_get(w->redis, keys, dsts, n, c, res->err, sizeof(res->err));
        else
            rc = kvpb_redis_ping(w->redis, res->err, sizeof(res->err));
        samples[i] = (double)(kvpb_now_ns() - t0) / 1e3;
        if (rc < 0)
            return res->rc = rc;
        for (uint32_t j = 0; cmd->op == KVPB_OP_RETRIEVE && cmd->verify && j < n; j++)
            if (memcmp(dsts[j], vals[j], c) != 0)
                return kvpb_fail(res, -EIO, "Redis GET %s returned other bytes than SET", keys[j]);
    }
    res->bytes = (uint64_t)cmd->nops * n * c;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Paged gather / scatter                                                                     */

static int run_paged(struct kvpb_worker *w, const struct kvpb_cmd *cmd, struct kvpb_wres *res,
                     double *samples)
{
    uint64_t c = cmd->chunk_bytes;
    uint32_t T = w->paged_tokens;

    if (!w->paged_mem || w->paged.layout != cmd->layout)
        return kvpb_fail(res, -EINVAL, "paged cache not set up for this command");
    for (uint32_t i = 0; i < cmd->nops; i++) {
        const int32_t *table = w->block_tables + (size_t)(i % w->ntables) * w->table_len;
        uint64_t off = slot_off(w, i, c);
        int rc;
        uint64_t t0 = kvpb_now_ns();
        if (cmd->op == KVPB_OP_GATHER)
            rc = kvp_paged_gather(&w->paged, table, w->table_len, 0, T, w->dst + off, c, T);
        else
            rc = kvp_paged_scatter(&w->paged, table, w->table_len, 0, T, 0, w->src + off, c, T);
        KVPB_CLOBBER();
        samples[i] = (double)(kvpb_now_ns() - t0) / 1e3;
        if (rc < 0)
            return kvpb_fail(res, rc, "paged %s: %s", kvpb_op_name(cmd->op), kvp_strerror(rc));
        /* Scatter then gather must give the chunk back. */
        if (cmd->verify && cmd->op == KVPB_OP_SCATTER) {
            rc = kvp_paged_gather(&w->paged, table, w->table_len, 0, T, w->dst + off, c, T);
            if (rc < 0 || memcmp(w->dst + off, w->src + off, c) != 0)
                return kvpb_fail(res, -EIO, "gather after scatter did not return the chunk");
        }
    }
    res->bytes = (uint64_t)cmd->nops * c;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */

int kvpb_ops_run(struct kvpb_worker *w, const struct kvpb_cmd *cmd, struct kvpb_wres *res,
                 double *samples)
{
    int rc;

    if (cmd->nops > KVPB_MAX_SAMPLES)
        return kvpb_fail(res, -E2BIG, "%u operations exceed the %u-sample buffer", cmd->nops,
                         KVPB_MAX_SAMPLES);
    if (cmd->batch < 1 || cmd->batch > KVPB_MAX_BATCH ||
        (uint64_t)cmd->batch * cmd->chunk_bytes > w->footprint)
        return kvpb_fail(res, -E2BIG,
                         "%u chunks of %" PRIu64 " bytes exceed the %" PRIu64 "-byte footprint",
                         cmd->batch, cmd->chunk_bytes, w->footprint);
    if ((cmd->transport == KVPB_T_SHM && !w->shm) || (cmd->transport == KVPB_T_INLINE && !w->inl) ||
        (cmd->transport == KVPB_T_KVPOOL &&
         (cmd->op == KVPB_OP_LOOKUP || cmd->op == KVPB_OP_LOOKUP128) && !w->shm && !w->inl))
        return kvpb_fail(res, -ENOENT, "no %s instance registered for %" PRIu64 "-byte chunks",
                         kvpb_transport_name(cmd->transport), cmd->chunk_bytes);

    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    res->t_start_ns = kvpb_now_ns();
    switch (cmd->transport) {
    case KVPB_T_MEMCPY:
        rc = run_memcpy(w, cmd, res, samples);
        break;
    case KVPB_T_SHM:
    case KVPB_T_INLINE:
        if (cmd->op == KVPB_OP_STORE || cmd->op == KVPB_OP_COLD)
            rc = run_kv_store(w, cmd, res, samples);
        else if (cmd->op == KVPB_OP_RETRIEVE)
            rc = run_kv_retrieve(w, cmd, res, samples);
        else
            rc = run_pressure(w, cmd, res, samples);
        break;
    case KVPB_T_KVPOOL:
        rc = run_kv_small(w, cmd, res, samples);
        break;
    case KVPB_T_UDS:
        rc = run_uds(w, cmd, res, samples);
        break;
    case KVPB_T_REDIS:
        rc = run_redis(w, cmd, res, samples);
        break;
    case KVPB_T_PAGED:
        rc = run_paged(w, cmd, res, samples);
        break;
    default:
        rc = kvpb_fail(res, -EINVAL, "unknown transport %d", cmd->transport);
    }
    res->t_end_ns = kvpb_now_ns();
    getrusage(RUSAGE_SELF, &ru1);
    res->minflt = (uint64_t)(ru1.ru_minflt - ru0.ru_minflt);
    res->nivcsw = (uint64_t)(ru1.ru_nivcsw - ru0.ru_nivcsw);
    if (rc == 0)
        res->nops = cmd->nops;
    return rc;
}
