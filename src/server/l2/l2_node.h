/*
 * l2_node.h - the Redis backend's connection object (one logical client of the L2 tier) and its
 * nodes: one blocking hiredis context per server it talks to (l2_node.c). Shared by the
 * backend's modules: l2_redis.c, l2_cluster.c, l2_redis_read.c.
 *
 * Threads: a kvp_l2_conn is used by one thread at a time (the tier hands them out); nothing is
 * shared between connections.
 */
#ifndef KVP_L2_NODE_H
#define KVP_L2_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>

#include "base/l2_url.h"

#define KVP_L2_CLUSTER_SLOTS 16384 /* key slots of a Redis Cluster */
#define KVP_MAX_NODES 64 /* nodes of one cluster a connection keeps; slot_node is uint8_t */
#define KVP_REDIRECTS 5  /* MOVED/ASK hops per command */

/* One server: a cluster node, or the single server of redis:// and unix:// targets. */
struct node {
    char host[KVP_L2_MAX_HOST + 1];
    uint16_t port;
    redisContext *ctx; /* NULL until used, and after an I/O error */
};

/* One logical client of the backend. */
struct kvp_l2_conn {
    struct kvp_l2_target t; /* with the password: wiped at close */
    struct timeval tv;      /* connect, read and write timeout */
    bool cluster;
    struct node nodes[KVP_MAX_NODES]; /* single node: nodes[0] */
    uint32_t nnodes;
    uint8_t slot_node[KVP_L2_CLUSTER_SLOTS]; /* node index + 1; 0: unknown */
    bool stale;                              /* fetch the slot map before routing */
};

/* A context's error as a negative errno (-ETIMEDOUT, -ECONNRESET, ...), hiredis' text in why. */
int kvp_l2r_ctx_error(const redisContext *ctx, const char *what, char *why, size_t why_size);

/* Closes a node's context (after an I/O error: the next use opens a new one). */
void kvp_l2r_node_drop(struct node *n);

/* One command on a connected node; an I/O error drops the node. *out: the caller frees it. */
int kvp_l2r_node_cmd(struct node *n, int argc, const char **argv, const size_t *lens,
                     redisReply **out, char *why, size_t why_size);

/* An error reply as -EREMOTEIO with its text in why; frees r. */
int kvp_l2r_reply_error(redisReply *r, const char *what, char *why, size_t why_size);

/* The context of node i, connected (timeouts, AUTH, SELECT) now if it is not. */
int kvp_l2r_node_ctx(struct kvp_l2_conn *c, uint32_t i, redisContext **out, char *why,
                     size_t why_size);

/* The index of node host:port (hlen bytes of host), added if new; -1 when the table is full. */
int kvp_l2r_node_find_add(struct kvp_l2_conn *c, const char *host, size_t hlen, uint16_t port);

#endif /* KVP_L2_NODE_H */
