/*
 * l2_node.h - the Redis backend's connection object (one logical client of the L2 tier) and its
 * nodes: one hiredis context per server it talks to (l2_node.c). Shared by the backend's
 * modules: l2_redis.c, l2_cluster.c, l2_redis_read.c.
 *
 * Deadlines. Every operation of the backend (l2_backend.h: open, ping, put, read, exists, del)
 * starts with kvp_l2r_op_begin(), which sets the connection's deadline: --l2-timeout from now.
 * Every wait of the operation (connect, each write, each read, on every node it touches) ends
 * at that deadline, so a server that answers one byte at a time cannot stretch an operation
 * beyond it. The sockets are non-blocking; the waits are poll()s.
 *
 * Threads: a kvp_l2_conn is used by one thread at a time (the tier hands them out); nothing is
 * shared between connections.
 */
#ifndef KVP_L2_NODE_H
#define KVP_L2_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "base/l2_url.h"

#define KVP_L2_CLUSTER_SLOTS 16384 /* key slots of a Redis Cluster */
#define KVP_MAX_NODES 64 /* nodes of one cluster a connection keeps; slot_node is uint8_t */
#define KVP_REDIRECTS 5  /* MOVED/ASK hops per command */

/*
 * The most a reply read through hiredis may make the daemon hold: bytes buffered for it, and
 * bytes of the reply objects built from it. Those replies are short (+OK, :1, an error) except
 * CLUSTER SLOTS, whose worst case (16384 one-slot ranges) stays under this. Values are not read
 * through hiredis (l2_redis_read.c bounds them by the caller's buffers).
 */
#define KVP_L2_REPLY_MAX (8u << 20)

/* What one reply being read may still allocate (the reader's object functions count it). */
struct reply_budget {
    const redisReplyObjectFunctions *orig; /* hiredis' own functions */
    size_t left;
    bool over; /* a reply went over: the node is dropped */
};

/* One server: a cluster node, or the single server of redis:// and unix:// targets. */
struct node {
    char host[KVP_L2_MAX_HOST + 1];
    uint16_t port;
    redisContext *ctx; /* NULL until used, and after an I/O error */
    struct reply_budget budget;
};

/* One logical client of the backend. */
struct kvp_l2_conn {
    struct kvp_l2_target t; /* with the password: wiped at close */
    uint32_t timeout_ms;    /* of every operation, from its start */
    uint64_t deadline_ms;   /* the current operation's end, on kvp_mono_ms()'s clock */
    bool cluster;
    struct node nodes[KVP_MAX_NODES]; /* single node: nodes[0] */
    uint32_t nnodes;
    uint8_t slot_node[KVP_L2_CLUSTER_SLOTS]; /* node index + 1; 0: unknown */
    bool stale;                              /* fetch the slot map before routing */
};

/* Starts an operation: its deadline is the connection's timeout from now. */
void kvp_l2r_op_begin(struct kvp_l2_conn *c);

/* Waits until fd is ready for events (POLLIN, POLLOUT) or the operation's deadline passes.
 * Returns 0, -ETIMEDOUT (with what in why), or another negative errno. */
int kvp_l2r_wait(struct kvp_l2_conn *c, int fd, short events, const char *what, char *why,
                 size_t why_size);

/* A context's error as a negative errno (-ETIMEDOUT, -ECONNRESET, ...), hiredis' text in why. */
int kvp_l2r_ctx_error(const redisContext *ctx, const char *what, char *why, size_t why_size);

/* Closes a node's context (after an I/O error: the next use opens a new one). */
void kvp_l2r_node_drop(struct node *n);

/* Sends everything hiredis holds for node i (appended commands), by the deadline. An error
 * drops the node. */
int kvp_l2r_node_flush(struct kvp_l2_conn *c, uint32_t i, const char *what, char *why,
                       size_t why_size);

/* The next reply of node i, by the deadline and within KVP_L2_REPLY_MAX. An error drops the
 * node. *out: the caller frees it. */
int kvp_l2r_node_reply(struct kvp_l2_conn *c, uint32_t i, const char *what, redisReply **out,
                       char *why, size_t why_size);

/* One command on node i, connected: sent, then its reply read (the two above). */
int kvp_l2r_node_cmd(struct kvp_l2_conn *c, uint32_t i, int argc, const char **argv,
                     const size_t *lens, redisReply **out, char *why, size_t why_size);

/*
 * An error reply as a negative errno with its text in why; frees r. -EACCES when it says that
 * the credentials are wrong or missing (WRONGPASS, NOAUTH, an AUTH refused), else -EREMOTEIO.
 */
int kvp_l2r_reply_error(redisReply *r, const char *what, char *why, size_t why_size);

/* The context of node i, connected (AUTH, SELECT) now if it is not. */
int kvp_l2r_node_ctx(struct kvp_l2_conn *c, uint32_t i, redisContext **out, char *why,
                     size_t why_size);

/* The index of node host:port (hlen bytes of host), added if new; -1 when the table is full. */
int kvp_l2r_node_find_add(struct kvp_l2_conn *c, const char *host, size_t hlen, uint16_t port);

#endif /* KVP_L2_NODE_H */
