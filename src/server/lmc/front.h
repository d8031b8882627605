/*
 * front.h - inside the LMCache front end: one decoded request, the front end's state, and the
 * calls between the listener (listener.c: the socket and its thread), the request handlers
 * (handlers.c) and the LMCache semantics kvpool's own protocol does not have (their state in
 * state.h: instances and their liveness in instances.h, pending prepare/commit pairs in
 * pending.h, stores and retrieves in transfers.h and inband.h, prefetch jobs and lookup read
 * locks in jobs.h).
 *
 * Threads: everything here belongs to the listener's one thread, which owns the ZeroMQ socket,
 * calls lmc_dispatch() for every request and lmc_tick() between them: no lock. The core (the
 * operations, the store, the registry) takes its own locks. Only the events of the instances
 * are written by other threads (their owners' callbacks: atomics, instances.c); the reports
 * read the daemon's counters (core/stats.h), never this state.
 */
#ifndef KVP_LMC_FRONT_H
#define KVP_LMC_FRONT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lmc/codec.h"
#include "lmc/messages.h"

struct kvp_server;
struct lmc_state;

/* One request as the listener received it, after the identity frame. */
struct lmc_req {
    enum lmc_op op;
    char name[64]; /* the name an op frame carried as a str ("" for an int) */
    const uint8_t *op_frame;
    size_t op_len;
    uint32_t npayloads; /* payload frames received (counted beyond LMC_MAX_PAYLOADS too) */
    const uint8_t *p[LMC_MAX_PAYLOADS];
    size_t n[LMC_MAX_PAYLOADS];
};

struct lmc_front {
    struct kvp_server *srv;
    struct lmc_mp_writer out; /* the reply's value */
    /* A large value (a pickle retrieve's chunks) goes straight into a buffer of the transport's
     * (a ZeroMQ message) so that the chunks are copied once: value_alloc(f, size) gives size
     * bytes for the value frame, or NULL. The listener sets it; when it is NULL the value is
     * written into out. A handler that used it sets value_external. */
    uint8_t *(*value_alloc)(struct lmc_front *f, size_t size);
    void *value_ctx;
    bool value_external;
    uint8_t *tokens; /* KVP_MAX_TOKENS * 4 bytes: a key's token ids */
    /* Monotonic time of the request being served, or of the tick: the listener sets it, and
     * every time rule of the semantics (reaping, the read TTL) reads it, never a clock. */
    uint64_t now_ms;
    /* What the request came to, in words, for the DEBUG line of each request ("3 of 5 chunks
     * hit"); "" when nothing was said. Written only while DEBUG is logged (lmc_outcome()). */
    char outcome[160];
    /* Who sent it: SipHash of its ZeroMQ routing identity (one per connection) under a key
     * drawn at start-up, so that no peer can choose an identity that collides with another's.
     * lmc_peer_of() computes it. */
    uint64_t peer;
    uint8_t peer_key[16]; /* crypto_shorthash_KEYBYTES */
    struct lmc_state *st; /* state.h */
    uint64_t warned_ops;  /* bit per unsupported operation id already logged at WARN */
    bool warned_unknown;
    /* Set by a handler whose reply opens a stream (subscribe_kv_events): the listener then
     * keeps the request's identity, uid and operation frames to end the stream with later. */
    bool stream_opened;
    /* This run of the front end, for LMCache's KV event stream: the wall clock at start-up in
     * nanoseconds, as `lmcache server` gives its own incarnation. */
    uint64_t incarnation;
};

/*
 * The largest value frame a request may carry with this pool of l1_size bytes: a commit_store
 * whose pickle holds a pool's worth of chunks in at most KVP_MAX_CHUNKS tensors
 * (kvp_tpickle_max_payload() of any registration, plus the bin header). ZMQ_MAXMSGSIZE.
 */
uint64_t lmc_max_value_frame(uint64_t l1_size);

/* The peer value of a request whose identity frame is id[0..len). */
uint64_t lmc_peer_of(const struct lmc_front *f, const void *id, size_t len);

/* Sets up the front end's state for server s. Returns 0 or -ENOMEM. */
int lmc_front_init(struct lmc_front *f, struct kvp_server *s);

/* Releases every instance (reservations aborted, pins dropped), then frees the state. */
void lmc_front_destroy(struct lmc_front *f);

/*
 * Serves one request: writes the reply's value into f->out and returns true, or returns false
 * when the reply is None (the three frames alone). Never fails: a request it cannot serve gets
 * the negative reply of its operation's type.
 */
bool lmc_dispatch(struct lmc_front *f, const struct lmc_req *r);

/* Periodic work between requests (reaping silent instances, expiring lookup locks). Returns
 * the milliseconds until it wants to run again. */
uint64_t lmc_tick(struct lmc_front *f);

#endif /* KVP_LMC_FRONT_H */
