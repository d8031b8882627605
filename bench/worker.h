/*
 * worker.h - the state of one worker process, shared by worker.c (set-up, command loop) and
 * ops.c (the measured loops). Internal to kvpool-bench.
 */
#ifndef KVPB_WORKER_H
#define KVPB_WORKER_H

#include "bench.h"
#include "kvpool_paged.h"

/* Header of the raw socket comparator's frames: as small as kvpool's, same size. */
struct kvpb_uds_hdr {
    uint64_t op;  /* KVPB_OP_PING, KVPB_OP_STORE (payload follows), KVPB_OP_RETRIEVE */
    uint64_t len; /* payload bytes */
    uint64_t cpu; /* pings: the sender's CPU + 1, where the peer runs too; else 0 (anywhere) */
    uint64_t pad;
};
_Static_assert(sizeof(struct kvpb_uds_hdr) == 32, "raw socket frame header is 32 bytes");

struct kvpb_worker {
    uint32_t index;
    const struct kvpb_config *cfg;
    uint32_t chunk_tokens; /* the daemon's tokens per chunk */

    /* Rotating buffers, pre-faulted: chunk k of a command uses offset (k % nrot) * chunk. */
    uint8_t *src;     /* what stores read */
    uint8_t *dst;     /* where retrieves write */
    uint8_t *scratch; /* memcpy baseline destination */
    uint64_t footprint;

    kvp_client *client;
    kvp_instance *shm;      /* NULL when the daemon offers no shared memory */
    kvp_instance *inl;      /* forced inline */
    uint64_t inst_chunk;    /* chunk bytes the instances were registered for */
    uint32_t *tokens;       /* chunk_tokens token ids, rewritten per key */
    uint32_t *long_tokens;  /* KVPB_LOOKUP_CHUNKS * chunk_tokens ids: the lookup-128 prefix */
    uint32_t pressure_seed; /* distinct namespace for the pressure keys */

    int uds_fd; /* raw socket to the peer process, -1 if none */
    pid_t uds_peer;

    kvpb_redis *redis; /* NULL when the comparator is off */

    /* Paged KV cache for gather/scatter, built by the paged set-up for one chunk size. */
    kvp_paged_cache paged;
    void **paged_layers;
    uint8_t *paged_mem;
    uint64_t paged_mem_bytes;
    int32_t *block_tables; /* ntables tables of tokens/block_size entries */
    uint32_t ntables;
    uint32_t table_len;
    uint32_t paged_tokens; /* tokens per gathered chunk */
};

/* Runs one measured command (ops.c). Fills res and samples. Returns 0 or a negative error
 * with res->err set. */
int kvpb_ops_run(struct kvpb_worker *w, const struct kvpb_cmd *cmd, struct kvpb_wres *res,
                 double *samples);

/* Registers the shm and inline instances for cmd->chunk_bytes (ops.c). */
int kvpb_ops_setup(struct kvpb_worker *w, const struct kvpb_cmd *cmd, struct kvpb_wres *res);

/* Unregisters them and frees the paged cache (ops.c). */
void kvpb_ops_teardown(struct kvpb_worker *w);

/* The raw socket peer's main loop (ops.c): answers frames on fd until EOF. */
void kvpb_uds_peer_main(int fd, uint64_t footprint);

/* Private anonymous memory of bytes, every page touched (memset to fill) so that no page fault
 * is measured later, or NULL (worker.c). */
void *kvpb_map_prefaulted(uint64_t bytes, int fill);

/* Records an error in res and returns rc. */
int kvpb_fail(struct kvpb_wres *res, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* KVPB_WORKER_H */
