/*
 * l2.h - the L2 tier: a second, shared tier behind the L1 pool, on a distributed store (Redis or
 * Redis Cluster through l2_backend.h), so that a prefix computed by one daemon is found by
 * another, and survives a restart.
 *
 * What the daemon sees (the operations, core/ops.c; server.c starts and stops it):
 *   - after a commit, kvp_l2_stored() queues the new chunks for a copy to L2 (write-behind, by
 *     background threads, never on a worker's request path);
 *   - a lookup that ends before the end of the sequence asks kvp_l2_lookup() how many of the
 *     next chunks L2 has (one pipelined round of EXISTS), and those start loading into L1;
 *   - a retrieve whose leading run in L1 ends early calls kvp_l2_fetch(), which waits (bounded)
 *     for those loads or loads the chunks itself, through the store's reserve -> write -> commit
 *     path; the handler then pins them as if they had always been in L1.
 * A tier that is off (no --l2) is a NULL pointer: every call accepts it and does nothing.
 *
 * Faults: L2 being unreachable (at start-up or later), slow (every operation ends within
 * --l2-timeout, or L2 counts as down) or refusing the password never fails a request; the
 * daemon serves from L1, logs the change of state once, and the background threads reconnect
 * with backoff.
 */
#ifndef KVP_L2_H
#define KVP_L2_H

#include <stdbool.h>
#include <stdint.h>

#include "base/config.h"
#include "core/registry.h"
#include "core/store.h"
#include "l2/l2_value.h"

struct kvp_l2;

/* The tier's state: unknown until the first operation, then up or down; auth_failed when the
 * server refused the credentials (down, told apart: retrying at once will not help). */
enum kvp_l2_state {
    KVP_L2_STATE_UNKNOWN,
    KVP_L2_STATE_UP,
    KVP_L2_STATE_DOWN,
    KVP_L2_STATE_AUTH_FAILED,
};

#define KVP_L2_REASON_MAX 256

/* What the reports show of the tier. */
struct kvp_l2_gauges {
    bool up; /* the last operation reached L2 */
    enum kvp_l2_state state;
    char reason[KVP_L2_REASON_MAX]; /* why it is not up, in words; "" when it is */
    uint64_t backlog_chunks, backlog_bytes;
};

/* The state as the reports name it: "up", "down" (unknown too), "auth_failed". */
const char *kvp_l2_state_name(enum kvp_l2_state st);

/*
 * Starts the tier described by cfg (l2_url, l2_password_file, ...) over store, whose offsets
 * are relative to base: reads the password file, allocates every queue at its bound and starts
 * the background threads, which connect by themselves. With no --l2, *out is NULL and 0 is
 * returned. Returns 0 or a negative errno after logging exactly one ERROR line.
 */
int kvp_l2_start(const struct kvp_config *cfg, struct kvp_store *store, uint8_t *base,
                 struct kvp_l2 **out);

/* Stops the threads (a copy in flight finishes or times out) and frees everything. Callers
 * of the other functions must be gone. NULL is fine. */
void kvp_l2_stop(struct kvp_l2 *l2);

/* The layout of an instance's chunks, as L2 values record it. */
void kvp_l2_layout_of(const struct kvp_registration *inst, struct kvp_l2_layout *lay);

/* Queues copies of n chunks just committed (keys: n x KVP_KEY_SIZE bytes). Never blocks: when
 * the backlog would exceed --l2-queue, the oldest pending copies are dropped (counted). */
void kvp_l2_stored(struct kvp_l2 *l2, const uint8_t *keys, uint32_t n,
                   const struct kvp_l2_layout *lay);

/*
 * How many of keys[0..n) (the chunks after the run found in L1), from the first, exist in L2.
 * They are queued for loading into L1. 0 when the tier is off or unreachable.
 */
uint32_t kvp_l2_lookup(struct kvp_l2 *l2, const uint8_t *keys, uint32_t n,
                       const struct kvp_l2_layout *lay);

/*
 * Makes keys[0..n) (chunks missing from L1) present in L1 as far as L2 has them, from the
 * first: waits (bounded by --l2-timeout) for a load in progress, or loads a chunk itself.
 * Returns how many leading chunks were brought into L1 (or found there); they may be evicted
 * again before the caller pins them, so the caller pins and uses what it gets.
 */
uint32_t kvp_l2_fetch(struct kvp_l2 *l2, const uint8_t *keys, uint32_t n,
                      const struct kvp_l2_layout *lay);

/* Sets --l2-ttl and --l2-timeout (SIGHUP): copies queued and connections opened, operations
 * and waits begun after the call use them; a connection already open keeps its socket
 * timeouts. NULL is fine. Any thread. */
void kvp_l2_set_limits(struct kvp_l2 *l2, uint32_t ttl_s, uint32_t timeout_ms);

/* The --l2 URL with its password masked: what logs and reports show. "" for NULL. */
const char *kvp_l2_name(const struct kvp_l2 *l2);

/* The tier's gauges; all zero for NULL. */
void kvp_l2_get_gauges(struct kvp_l2 *l2, struct kvp_l2_gauges *g);

#endif /* KVP_L2_H */
