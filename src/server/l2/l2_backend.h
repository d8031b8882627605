/*
 * l2_backend.h - the narrow interface between the L2 tier (l2_tier.c) and the store behind it.
 *
 * A backend stores opaque values under short string keys: put, batches of read and exists,
 * delete and ping, over a connection that one thread uses at a time. That is all the tier needs, so
 * another backend (a local directory, Valkey, S3) fits behind the same table. The Redis backend
 * (l2_redis.c) serves redis://, unix:// and redis-cluster:// targets.
 *
 * Errors. Every call returns 0 or a negative errno:
 *   -EREMOTEIO  the server answered with an error (out of memory, a refused command): the
 *               connection is still usable;
 *   -EACCES     the server refused the credentials (a wrong password, or one it requires):
 *               the connection is unusable, and trying again at once will not help;
 *   anything else (-ETIMEDOUT, -ECONNREFUSED, -ECONNRESET, -EIO, -EPROTO, -EMSGSIZE for a reply
 *               over the backend's bound, -ENOMEM): the connection is unusable; the caller
 *               closes it and opens another one later.
 * why (why_size bytes) then says what happened, without credentials. Every call, as a whole
 * (every connect, write and read it makes), ends within the timeout given at open: a server
 * that answers slowly fails it with -ETIMEDOUT.
 */
#ifndef KVP_L2_BACKEND_H
#define KVP_L2_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "base/l2_url.h"

struct kvp_l2_conn;

struct kvp_l2_backend {
    const char *name;

    /* Connects to target; the open (connect, AUTH, the first answer) and every later
     * operation of the connection each end within timeout_ms. The target is copied (the
     * password is wiped at close). */
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

    /*
     * Reads the values of keys[0..n) straight into the caller's buffers, in as few round trips
     * as the backend can (Redis: one pipelined round per node): value i goes to hdr[i] (its
     * first hdr_len bytes), then to data[i] (the next data_len bytes); len[i] is its whole
     * length, 0 when there is none. At most hdr_len + data_len + 1 bytes of a value are read,
     * so a foreign value costs no memory and a longer one is seen as such. Returns 0,
     * -EREMOTEIO when the server refused some (the others are read), or an error.
     */
    int (*read)(struct kvp_l2_conn *c, const char *const *keys, uint32_t n, uint8_t *const *hdr,
                size_t hdr_len, uint8_t *const *data, size_t data_len, uint64_t *len, char *why,
                size_t why_size);

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
