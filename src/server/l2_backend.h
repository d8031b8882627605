/*
 * l2_backend.h - the narrow interface between the L2 tier (l2_tier.c) and the store behind it.
 *
 * A backend stores opaque values under short string keys: put, get, a batch of exists, delete
 * and ping, over a connection that one thread uses at a time. That is all the tier needs, so
 * another backend (a local directory, Valkey, S3) fits behind the same table. The Redis backend
 * (l2_redis.c) serves redis://, unix:// and redis-cluster:// targets.
 *
 * Errors. Every call returns 0 or a negative errno:
 *   -ENOENT     get: no such key (not an error of the backend);
 *   -EREMOTEIO  the server answered with an error (out of memory, a refused command): the
 *               connection is still usable;
 *   anything else (-ETIMEDOUT, -ECONNREFUSED, -ECONNRESET, -EIO, -EPROTO, -ENOMEM): the
 *               connection is unusable; the caller closes it and opens another one later.
 * why (why_size bytes) then says what happened, without credentials. Every call is bounded by
 * the timeout given at open, per network operation.
 */
#ifndef KVP_L2_BACKEND_H
#define KVP_L2_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "l2_url.h"

struct kvp_l2_conn;

/* A value read by get: len bytes at data, owned by the backend until value_free(). */
struct kvp_l2_value {
    const uint8_t *data;
    size_t len;
    void *priv;
};

struct kvp_l2_backend {
    const char *name;

    /* Connects to target; every later operation of the connection, and the connect itself, is
     * bounded by timeout_ms. The target is copied (the password is wiped at close). */
    int (*open)(const struct kvp_l2_target *target, uint32_t timeout_ms, struct kvp_l2_conn **out,
                char *why, size_t why_size);
    /* Closes a connection; NULL is fine. */
    void (*close)(struct kvp_l2_conn *c);

    /* Checks that the store answers. */
    int (*ping)(struct kvp_l2_conn *c, char *why, size_t why_size);

    /* Stores the concatenation of parts[0..nparts) under key, replacing any value; with
     * ttl_s > 0 the value expires after that many seconds. The parts are sent as they are,
     * without an intermediate copy where the backend can. */
    int (*put)(struct kvp_l2_conn *c, const char *key, const struct iovec *parts, int nparts,
               uint32_t ttl_s, char *why, size_t why_size);

    /* Reads the value of key, at most max_len bytes of it (a longer value comes back cut at
     * max_len, so that a foreign value never costs more memory than the caller allows).
     * -ENOENT when there is none. Free *v with value_free(). */
    int (*get)(struct kvp_l2_conn *c, const char *key, size_t max_len, struct kvp_l2_value *v,
               char *why, size_t why_size);
    void (*value_free)(struct kvp_l2_value *v);

    /* found[i] = 1 if keys[i] exists, else 0, for i < n, in as few round trips as the backend
     * can (Redis: one pipelined round per node). */
    int (*exists)(struct kvp_l2_conn *c, const char *const *keys, uint32_t n, uint8_t *found,
                  char *why, size_t why_size);

    /* Deletes key (a value that failed its checks, so a good copy can replace it). */
    int (*del)(struct kvp_l2_conn *c, const char *key, char *why, size_t why_size);
};

/* The Redis backend: single node (TCP or Unix socket) and Redis Cluster (l2_redis.c). */
extern const struct kvp_l2_backend kvp_l2_redis_backend;

#endif /* KVP_L2_BACKEND_H */
