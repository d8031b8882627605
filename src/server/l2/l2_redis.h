/*
 * l2_redis.h - inside the Redis backend of the L2 tier (whose interface is l2_backend.h): what
 * the backend's table (l2_redis.c) takes from its other modules.
 *
 *   l2_node.c        the connection object and its nodes (timeouts, AUTH, SELECT), commands
 *   l2_cluster.c     Redis Cluster: key slots, the slot map, MOVED and ASK
 *   l2_redis.c       zero-copy writes, pipelines, the backend's table
 *   l2_redis_read.c  values read off the socket straight into the caller's buffers
 *
 * Threads: a kvp_l2_conn is used by one thread at a time (the tier hands them out); nothing is
 * shared between connections. Errors follow l2_backend.h: a negative errno and a message in
 * why, -EREMOTEIO when a server refused a command and the connection is still usable.
 */
#ifndef KVP_L2_REDIS_H
#define KVP_L2_REDIS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>

#include "l2/l2_node.h"

/* The backend's read (l2_backend.h), in l2_redis_read.c. */
int kvp_l2r_read(struct kvp_l2_conn *c, const char *const *keys, uint32_t n, uint8_t *const *hdr,
                 size_t hdr_len, uint8_t *const *data, size_t data_len, uint64_t *len, char *why,
                 size_t why_size);

#endif /* KVP_L2_REDIS_H */
