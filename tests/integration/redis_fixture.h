/*
 * redis_fixture.h - real redis-server processes for the L2 tests: one server on a Unix socket
 * or a loopback port, or a three-master Redis Cluster, each in a temporary directory, without
 * persistence. Servers die with the test process (PR_SET_PDEATHSIG), so a test killed by its
 * timeout leaves none behind. A machine without redis-server makes the test exit 77.
 */
#ifndef KVPT_REDIS_FIXTURE_H
#define KVPT_REDIS_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <hiredis/hiredis.h>

struct kvpt_redis {
    pid_t pid;
    char dir[64];
    char sock[128];       /* the Unix socket (always there) */
    uint16_t port;        /* the loopback port, 0 for none */
    char url[256];        /* what --l2 takes: unix:///... or redis://127.0.0.1:PORT */
    const char *extra[8]; /* extra redis-server arguments, NULL-terminated */
};

/* Exits 77 (skipped) with the reason when redis-server or redis-cli is not installed. */
void kvpt_redis_require(void);

/* Starts a server in a fresh directory: on a loopback port too when tcp. Waits until it
 * answers PING; fails the test otherwise. */
void kvpt_redis_start(struct kvpt_redis *r, bool tcp);

/* Starts the server of r again (after kvpt_redis_kill()), on the same socket and port. */
void kvpt_redis_restart(struct kvpt_redis *r);

/* SIGKILLs the server and waits for it; the directory stays. */
void kvpt_redis_kill(struct kvpt_redis *r);

/* Stops the server (if running) and removes its directory. */
void kvpt_redis_stop(struct kvpt_redis *r);

/* A hiredis connection to r (Unix socket); fails the test if it cannot connect. */
redisContext *kvpt_redis_connect(const struct kvpt_redis *r);

/* Runs a command (hiredis format) and returns its reply; fails the test on an I/O error.
 * The caller frees the reply. */
redisReply *kvpt_redis_cmd(redisContext *c, const char *fmt, ...);

/* The keys matching pattern, through KEYS (small test databases only). Returns their count;
 * names (may be NULL) gets up to max of them, each malloc'd (the caller frees). */
size_t kvpt_redis_keys(redisContext *c, const char *pattern, char **names, size_t max);

/* A three-master Redis Cluster on loopback ports, made with redis-cli --cluster create. */
struct kvpt_cluster {
    struct kvpt_redis node[3];
    char url[256]; /* redis-cluster://127.0.0.1:P1 (one seed: the rest is discovered) */
};

/* Starts three masters and creates the cluster; waits for cluster_state:ok everywhere. */
void kvpt_cluster_start(struct kvpt_cluster *cl);
void kvpt_cluster_stop(struct kvpt_cluster *cl);

/* The node id (CLUSTER MYID) of node i, into id (41 bytes). */
void kvpt_cluster_id(const struct kvpt_cluster *cl, int i, char *id);

/* Moves nslots slots from node `from` to node `to` with redis-cli --cluster reshard (their
 * keys migrate with them), then waits until every node agrees. */
void kvpt_cluster_reshard(struct kvpt_cluster *cl, int from, int to, int nslots);

#endif /* KVPT_REDIS_FIXTURE_H */
