/*
 * l2_redis.c - the Redis backend of the L2 tier (interface in l2_backend.h), through hiredis:
 * one node over TCP or a Unix socket, or a Redis Cluster (routing in l2_cluster.c); values are
 * read by l2_redis_read.c.
 *
 * Design. A kvp_l2_conn is one logical client with one hiredis context per node (l2_node.c). A
 * single server must answer PING (a cluster CLUSTER SLOTS) before a connection counts as open: a
 * server that accepts connections but does not answer (stopped, overloaded) is not up.
 *
 * Writes. Values are written without an intermediate copy: the SET command's framing is built
 * here and sent with the header and the chunk (straight from the pool) in one sendmsg chain, so
 * a 32 MiB chunk is not copied into hiredis' output buffer twice, as redisCommandArgv would.
 *
 * Batches. A batch of one command per key (EXISTS) is pipelined per node: every node gets its
 * commands before any reply is read, so a batch costs one round trip per node, not per key.
 * Redirected keys are then asked again, one at a time, through run_key().
 *
 * Credentials: AUTH [user] password on every new node connection; the password is wiped when
 * the connection closes and never appears in a message (hiredis' error strings do not hold it,
 * Redis' error replies do not echo it).
 *
 * Threads: a connection is used by one thread at a time; nothing here is shared between
 * connections.
 */
#include "l2/l2_redis.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/iov.h"
#include "core/stats.h"
#include "l2/l2_backend.h"
#include "l2/l2_cluster.h"
#include "l2/l2_node.h"

/* ---- commands ---- */

/* Sends ASKING on ctx and checks its answer (before a command redirected by -ASK). */
static int asking(struct kvp_l2_conn *c, uint32_t node, char *why, size_t why_size)
{
    const char *argv[1] = {"ASKING"};
    size_t lens[1] = {6};
    redisReply *r = NULL;
    int rc = kvp_l2r_node_cmd(c, node, 1, argv, lens, &r, why, why_size);
    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_ERROR)
        return kvp_l2r_reply_error(r, "ASKING", why, why_size);
    freeReplyObject(r);
    return 0;
}

/*
 * Runs a command about key on the node that serves it, following redirections. *out is the
 * final reply (possibly an error reply other than a redirection); the caller frees it.
 */
static int run_key(struct kvp_l2_conn *c, const char *key, int argc, const char **argv,
                   const size_t *lens, redisReply **out, char *why, size_t why_size)
{
    uint32_t node;
    bool ask = false;
    int rc = kvp_l2r_route(c, key, &node, why, why_size);
    for (int hop = 0; rc == 0; hop++) {
        redisContext *ctx;
        redisReply *r = NULL;
        rc = kvp_l2r_node_ctx(c, node, &ctx, why, why_size);
        if (rc == 0 && ask)
            rc = asking(c, node, why, why_size);
        if (rc == 0)
            rc = kvp_l2r_node_cmd(c, node, argc, argv, lens, &r, why, why_size);
        if (rc)
            return rc;
        /* After KVP_REDIRECTS hops the redirection itself is the answer: a cluster that keeps
         * sending us around is reported, not followed forever. */
        uint32_t from = node;
        int kind = hop < KVP_REDIRECTS ? kvp_l2r_redirect(c, r, from, &node) : 0;
        if (!kind) {
            *out = r;
            return 0;
        }
        freeReplyObject(r);
        ask = kind == 2;
    }
    return rc;
}

static int ping_node(struct kvp_l2_conn *c, char *why, size_t why_size);

/* The seeds (or the single server) go into the node table first; a cluster adds the rest from
 * its slot map. The connection is returned only once the target has answered. */
static int redis_open(const struct kvp_l2_target *target, uint32_t timeout_ms,
                      struct kvp_l2_conn **out, char *why, size_t why_size)
{
    struct kvp_l2_conn *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(why, why_size, "out of memory");
        return -ENOMEM;
    }
    c->t = *target;
    c->timeout_ms = timeout_ms;
    /* One operation: connecting, AUTH, SELECT and the first answer share the deadline. */
    kvp_l2r_op_begin(c);
    c->cluster = target->scheme == KVP_L2_REDIS_CLUSTER;
    for (uint32_t i = 0; i < target->nnodes; i++)
        kvp_l2r_node_find_add(c, target->nodes[i].host, strlen(target->nodes[i].host),
                              target->nodes[i].port);
    if (target->scheme == KVP_L2_REDIS_UNIX)
        c->nnodes = 1;
    /* A server that accepts connections but does not answer (stopped, overloaded) is not up:
     * a cluster answers CLUSTER SLOTS, a single node PING. */
    int rc = c->cluster ? kvp_l2r_cluster_refresh(c, why, why_size) : ping_node(c, why, why_size);
    if (rc) {
        kvp_l2_redis_backend.close(c);
        return rc;
    }
    *out = c;
    return 0;
}

/* The target's copy held the password: it is wiped before the memory goes back. */
static void redis_close(struct kvp_l2_conn *c)
{
    if (!c)
        return;
    for (uint32_t i = 0; i < c->nnodes; i++)
        kvp_l2r_node_drop(&c->nodes[i]);
    explicit_bzero(c->t.password, sizeof(c->t.password));
    free(c);
}

static int ping_node(struct kvp_l2_conn *c, char *why, size_t why_size)
{
    const char *argv[1] = {"PING"};
    size_t lens[1] = {4};
    redisContext *ctx;
    redisReply *r = NULL;
    uint32_t node = 0;
    int rc = 0;
    /* A cluster answers when the node of some slot does: the map is fetched again if needed. */
    if (c->cluster)
        rc = kvp_l2r_route(c, "", &node, why, why_size);
    if (rc == 0)
        rc = kvp_l2r_node_ctx(c, node, &ctx, why, why_size);
    if (rc == 0)
        rc = kvp_l2r_node_cmd(c, node, 1, argv, lens, &r, why, why_size);
    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_ERROR)
        return kvp_l2r_reply_error(r, "PING", why, why_size);
    freeReplyObject(r);
    return 0;
}

static int redis_ping(struct kvp_l2_conn *c, char *why, size_t why_size)
{
    kvp_l2r_op_begin(c);
    return ping_node(c, why, why_size);
}

/* Sends every byte of iov on fd (non-blocking), resuming after partial writes, by the
 * operation's deadline. */
static int send_all(struct kvp_l2_conn *c, int fd, struct iovec *iov, size_t n, char *why,
                    size_t why_size)
{
    for (size_t i = kvp_iov_advance(iov, n, 0, 0); i < n;) {
        struct msghdr mh = {.msg_iov = iov + i, .msg_iovlen = n - i};
        ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (w < 0) {
            int rc = 0;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                rc = kvp_l2r_wait(c, fd, POLLOUT, "SET", why, why_size);
            else if (errno != EINTR)
                snprintf(why, why_size, "SET: %s", strerror(-(rc = -errno)));
            if (rc)
                return rc;
            continue;
        }
        i = kvp_iov_advance(iov, n, i, (size_t)w);
    }
    return 0;
}

/* SET key <parts...> [EX ttl] framed here and sent as one gathered write, then its reply. */
static int set_direct(struct kvp_l2_conn *c, uint32_t node, bool ask, const char *key,
                      const struct iovec *parts, int nparts, uint32_t ttl_s, redisReply **out,
                      char *why, size_t why_size)
{
    struct iovec iov[2 + 8];
    char head[160], tail[64];
    size_t vlen = 0, klen = strlen(key);
    redisContext *ctx;

    if (nparts > 8)
        return -EINVAL;
    int rc = kvp_l2r_node_ctx(c, node, &ctx, why, why_size);
    if (rc == 0 && ask)
        rc = asking(c, node, why, why_size);
    if (rc)
        return rc;
    for (int i = 0; i < nparts; i++)
        vlen += parts[i].iov_len;
    char ttl[16];
    int tlen = snprintf(ttl, sizeof(ttl), "%u", (unsigned)ttl_s);
    int hlen = snprintf(head, sizeof(head), "*%d\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%zu\r\n",
                        ttl_s ? 5 : 3, klen, key, vlen);
    int tl = ttl_s ? snprintf(tail, sizeof(tail), "\r\n$2\r\nEX\r\n$%d\r\n%s\r\n", tlen, ttl)
                   : snprintf(tail, sizeof(tail), "\r\n");
    if (hlen < 0 || (size_t)hlen >= sizeof(head) || tl < 0)
        return -EINVAL;
    iov[0] = (struct iovec){head, (size_t)hlen};
    for (int i = 0; i < nparts; i++)
        iov[1 + i] = parts[i];
    iov[1 + nparts] = (struct iovec){tail, (size_t)tl};
    /* Nothing of hiredis may be pending in its output buffer: every call here is synchronous. */
    rc = send_all(c, ctx->fd, iov, (size_t)nparts + 2, why, why_size);
    if (rc) {
        kvp_l2r_node_drop(&c->nodes[node]);
        return rc;
    }
    return kvp_l2r_node_reply(c, node, "SET", out, why, why_size);
}

static int redis_put(struct kvp_l2_conn *c, const char *key, const struct iovec *parts, int nparts,
                     uint32_t ttl_s, char *why, size_t why_size)
{
    uint32_t node;
    bool ask = false;
    kvp_l2r_op_begin(c);
    int rc = kvp_l2r_route(c, key, &node, why, why_size);
    for (int hop = 0; rc == 0; hop++) {
        redisReply *r = NULL;
        rc = set_direct(c, node, ask, key, parts, nparts, ttl_s, &r, why, why_size);
        if (rc)
            return rc;
        int kind = hop < KVP_REDIRECTS ? kvp_l2r_redirect(c, r, node, &node) : 0;
        if (!kind) {
            if (r->type == REDIS_REPLY_ERROR)
                return kvp_l2r_reply_error(r, "SET", why, why_size);
            freeReplyObject(r);
            return 0;
        }
        freeReplyObject(r);
        ask = kind == 2;
    }
    return rc;
}

/*
 * Reads the replies of node's pipelined commands (keys with where[i] == node, in order) into
 * out[]. A redirected key gets no reply here (out[i] stays NULL): it is asked again, alone.
 */
static int pipeline_collect(struct kvp_l2_conn *c, uint32_t node, const uint8_t *where, uint32_t n,
                            const char *what, redisReply **out, char *why, size_t why_size)
{
    for (uint32_t i = 0; i < n; i++) {
        if (where[i] != node)
            continue;
        redisReply *r = NULL;
        int rc = kvp_l2r_node_reply(c, node, what, &r, why, why_size);
        if (rc)
            return rc;
        uint32_t to;
        if (kvp_l2r_redirect(c, r, node, &to))
            freeReplyObject(r);
        else
            out[i] = r;
    }
    return 0;
}

/*
 * One command per key, argv[1] being the key (argv[0] and argv[2..argc) the same for all):
 * every node gets all its commands before any reply is read, so the batch costs one round trip
 * per node, not per key, and the server works while earlier replies are being read. out[i] is
 * the final reply for keys[i] (redirections followed, one key at a time); on an error nothing
 * is left in out[].
 */
static int pipeline(struct kvp_l2_conn *c, const char *const *keys, uint32_t n, int argc,
                    const char **argv, size_t *lens, redisReply **out, char *why, size_t why_size)
{
    uint8_t *where = malloc(n ? n : 1);
    bool used[KVP_MAX_NODES] = {false};
    int rc = 0;

    if (!where) {
        snprintf(why, why_size, "out of memory");
        return -ENOMEM;
    }
    memset(out, 0, sizeof(*out) * n);
    /* Route every key first: a stale map is fetched once, not per key. */
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        uint32_t node;
        rc = kvp_l2r_route(c, keys[i], &node, why, why_size);
        where[i] = (uint8_t)node;
    }
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        redisContext *ctx;
        rc = kvp_l2r_node_ctx(c, where[i], &ctx, why, why_size);
        argv[1] = keys[i];
        lens[1] = strlen(keys[i]);
        if (rc == 0 && redisAppendCommandArgv(ctx, argc, argv, lens) != REDIS_OK)
            rc = -ENOMEM;
        used[where[i]] = true;
    }
    /* Every node gets its commands before any reply is read. */
    for (uint32_t node = 0; node < c->nnodes && rc == 0; node++)
        if (used[node])
            rc = kvp_l2r_node_flush(c, node, argv[0], why, why_size);
    for (uint32_t node = 0; node < c->nnodes && rc == 0; node++)
        if (used[node])
            rc = pipeline_collect(c, node, where, n, argv[0], out, why, why_size);
    if (rc) {
        /* Replies may be left unread in some pipelines: those contexts are out of step. */
        for (uint32_t node = 0; node < c->nnodes; node++)
            if (used[node])
                kvp_l2r_node_drop(&c->nodes[node]);
    }
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        if (out[i])
            continue;
        argv[1] = keys[i];
        lens[1] = strlen(keys[i]);
        rc = run_key(c, keys[i], argc, argv, lens, &out[i], why, why_size);
    }
    if (rc) {
        for (uint32_t i = 0; i < n; i++)
            if (out[i])
                freeReplyObject(out[i]);
        memset(out, 0, sizeof(*out) * n);
    }
    free(where);
    return rc;
}

static int redis_exists(struct kvp_l2_conn *c, const char *const *keys, uint32_t n, uint8_t *found,
                        char *why, size_t why_size)
{
    const char *argv[2] = {"EXISTS", NULL};
    size_t lens[2] = {6, 0};
    redisReply **r = malloc(sizeof(*r) * (n ? n : 1));
    if (!r) {
        snprintf(why, why_size, "out of memory");
        return -ENOMEM;
    }
    kvp_l2r_op_begin(c);
    int rc = pipeline(c, keys, n, 2, argv, lens, r, why, why_size);
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        if (r[i]->type != REDIS_REPLY_INTEGER) {
            snprintf(why, why_size, "EXISTS: unexpected reply of type %d", r[i]->type);
            rc = -EREMOTEIO;
        }
        found[i] = rc == 0 && r[i]->integer > 0;
    }
    for (uint32_t i = 0; i < n; i++)
        if (r[i])
            freeReplyObject(r[i]);
    free(r);
    return rc;
}

static int redis_del(struct kvp_l2_conn *c, const char *key, char *why, size_t why_size)
{
    const char *argv[2] = {"DEL", key};
    size_t lens[2] = {3, strlen(key)};
    redisReply *r = NULL;
    kvp_l2r_op_begin(c);
    int rc = run_key(c, key, 2, argv, lens, &r, why, why_size);
    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_ERROR)
        return kvp_l2r_reply_error(r, "DEL", why, why_size);
    freeReplyObject(r);
    return 0;
}

const struct kvp_l2_backend kvp_l2_redis_backend = {
    .name = "redis",
    .open = redis_open,
    .close = redis_close,
    .ping = redis_ping,
    .put = redis_put,
    .read = kvp_l2r_read,
    .exists = redis_exists,
    .del = redis_del,
};
