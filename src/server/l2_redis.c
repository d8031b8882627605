/*
 * l2_redis.c - the Redis backend of the L2 tier (interface in l2_backend.h), through hiredis:
 * one node over TCP or a Unix socket, or a Redis Cluster.
 *
 * Design. A kvp_l2_conn is one logical client. It owns one blocking hiredis context per node it
 * talks to, each with the tier's timeout on connect and on every read and write
 * (SO_RCVTIMEO/SO_SNDTIMEO), so no call can hang. A node's context is opened on first use and
 * dropped on any I/O error; the error is returned, and the next call opens it again.
 *
 * Cluster. hiredis 0.14 knows nothing of Redis Cluster, so the routing is done here: a key's
 * slot is CRC16(key) mod 16384 (kvp_l2_key_slot); the slot map comes from CLUSTER SLOTS of any
 * reachable node (the known nodes first, then the seeds). A -MOVED reply updates the slot at
 * once and marks the map stale, so the next call fetches it again; -ASK sends ASKING and the
 * command to the named node, once, without touching the map. At most KVP_REDIRECTS redirections
 * per command. A batch of EXISTS is pipelined per node: every node gets its commands before any
 * reply is read, so a batch costs one round trip per node, not per key.
 *
 * Values are written without an intermediate copy: the SET command's framing is built here and
 * sent with the header and the chunk (straight from the pool) in one sendmsg chain, so a 32 MiB
 * chunk is not copied into hiredis' output buffer twice as redisCommandArgv would. Replies are
 * read by hiredis. Reads use GETRANGE so that a foreign value never costs more memory than the
 * caller's limit.
 *
 * Credentials: AUTH [user] password on every new node connection; the password is wiped when
 * the connection closes and never appears in a message (hiredis' error strings do not hold it,
 * Redis' error replies do not echo it).
 *
 * Threads: a connection is used by one thread at a time (the tier hands them out); nothing here
 * is shared between connections.
 */
#include "l2_redis.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <hiredis/hiredis.h>

#include "common/iov.h"
#include "l2_backend.h"
#include "stats.h"

#define KVP_MAX_NODES 64 /* nodes of one cluster a connection keeps; slot_node is uint8_t */
#define KVP_REDIRECTS 5  /* MOVED/ASK hops per command */

struct node {
    char host[KVP_L2_MAX_HOST + 1];
    uint16_t port;
    redisContext *ctx; /* NULL until used, and after an I/O error */
};

struct kvp_l2_conn {
    struct kvp_l2_target t;
    struct timeval tv;
    bool cluster;
    struct node nodes[KVP_MAX_NODES]; /* single node: nodes[0] */
    uint32_t nnodes;
    uint8_t slot_node[KVP_L2_CLUSTER_SLOTS]; /* node index + 1; 0: unknown */
    bool stale;                              /* fetch the slot map before routing */
};

/* ---- CRC16 and key slots ---- */

uint16_t kvp_l2_crc16(const void *data, size_t len)
{
    const uint8_t *p = data;
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)(p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = crc & 0x8000 ? (uint16_t)(crc << 1 ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

uint32_t kvp_l2_key_slot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open) {
        size_t rest = len - (size_t)(open + 1 - key);
        const char *close = memchr(open + 1, '}', rest);
        if (close && close > open + 1)
            return kvp_l2_crc16(open + 1, (size_t)(close - open - 1)) % KVP_L2_CLUSTER_SLOTS;
    }
    return kvp_l2_crc16(key, len) % KVP_L2_CLUSTER_SLOTS;
}

/* ---- nodes ---- */

/* A context's error as a negative errno, with hiredis' text in why. */
static int ctx_error(const redisContext *ctx, const char *what, char *why, size_t why_size)
{
    snprintf(why, why_size, "%s: %s", what, ctx->errstr[0] ? ctx->errstr : "connection lost");
    if (ctx->err == REDIS_ERR_IO) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINPROGRESS ||
            strstr(ctx->errstr, "temporarily unavailable") || strstr(ctx->errstr, "timed out"))
            return -ETIMEDOUT;
        return errno ? -errno : -EIO;
    }
    if (ctx->err == REDIS_ERR_EOF)
        return -ECONNRESET;
    if (ctx->err == REDIS_ERR_OOM)
        return -ENOMEM;
    if (ctx->err == REDIS_ERR_PROTOCOL)
        return -EPROTO;
    return -EIO;
}

static void node_drop(struct node *n)
{
    if (n->ctx)
        redisFree(n->ctx);
    n->ctx = NULL;
}

/* One command on a context; a NULL reply (I/O error) drops the node. */
static int node_cmd(struct node *n, int argc, const char **argv, const size_t *lens,
                    redisReply **out, char *why, size_t why_size)
{
    redisReply *r = redisCommandArgv(n->ctx, argc, argv, lens);
    if (!r) {
        int rc = ctx_error(n->ctx, argv[0], why, why_size);
        node_drop(n);
        return rc;
    }
    *out = r;
    return 0;
}

/* An error reply as -EREMOTEIO with its text; frees r. */
static int reply_error(redisReply *r, const char *what, char *why, size_t why_size)
{
    snprintf(why, why_size, "%s: %.*s", what, (int)(r->len < 200 ? r->len : 200), r->str);
    freeReplyObject(r);
    return -EREMOTEIO;
}

/* AUTH and SELECT on a fresh context. */
static int node_handshake(struct kvp_l2_conn *c, struct node *n, char *why, size_t why_size)
{
    redisReply *r = NULL;
    int rc;
    if (c->t.password[0]) {
        const char *argv[3] = {"AUTH"};
        size_t lens[3] = {4};
        int argc = 1;
        if (c->t.user[0]) {
            argv[argc] = c->t.user;
            lens[argc++] = strlen(c->t.user);
        }
        argv[argc] = c->t.password;
        lens[argc++] = strlen(c->t.password);
        rc = node_cmd(n, argc, argv, lens, &r, why, why_size);
        if (rc)
            return rc;
        if (r->type == REDIS_REPLY_ERROR) {
            reply_error(r, "AUTH", why, why_size);
            return -EACCES;
        }
        freeReplyObject(r);
    }
    if (!c->cluster && c->t.db) {
        char db[16];
        snprintf(db, sizeof(db), "%u", (unsigned)c->t.db);
        const char *argv[2] = {"SELECT", db};
        size_t lens[2] = {6, strlen(db)};
        rc = node_cmd(n, 2, argv, lens, &r, why, why_size);
        if (rc)
            return rc;
        if (r->type == REDIS_REPLY_ERROR)
            return reply_error(r, "SELECT", why, why_size);
        freeReplyObject(r);
    }
    return 0;
}

/* The context of node i, connected now if it is not. */
static int node_ctx(struct kvp_l2_conn *c, uint32_t i, redisContext **out, char *why,
                    size_t why_size)
{
    struct node *n = &c->nodes[i];
    if (n->ctx) {
        *out = n->ctx;
        return 0;
    }
    if (c->t.scheme == KVP_L2_REDIS_UNIX)
        n->ctx = redisConnectUnixWithTimeout(c->t.path, c->tv);
    else
        n->ctx = redisConnectWithTimeout(n->host, n->port, c->tv);
    if (!n->ctx) {
        snprintf(why, why_size, "cannot connect: out of memory");
        return -ENOMEM;
    }
    if (n->ctx->err) {
        int rc = ctx_error(n->ctx, "connect", why, why_size);
        if (rc == -EIO || rc == -EPROTO)
            rc = -ECONNREFUSED;
        node_drop(n);
        return rc;
    }
    /* hiredis opens its socket without O_CLOEXEC. */
    fcntl(n->ctx->fd, F_SETFD, FD_CLOEXEC);
    int rc = redisSetTimeout(n->ctx, c->tv) == REDIS_OK ? 0 : -EIO;
    if (rc)
        snprintf(why, why_size, "cannot set the socket timeouts");
    if (!rc)
        rc = node_handshake(c, n, why, why_size);
    if (rc) {
        node_drop(n);
        return rc;
    }
    *out = n->ctx;
    return 0;
}

/* The index of node host:port, added to the table if it is new; -1 when the table is full. */
static int node_find_add(struct kvp_l2_conn *c, const char *host, size_t hlen, uint16_t port)
{
    if (hlen > KVP_L2_MAX_HOST)
        return -1;
    for (uint32_t i = 0; i < c->nnodes; i++)
        if (c->nodes[i].port == port && strlen(c->nodes[i].host) == hlen &&
            memcmp(c->nodes[i].host, host, hlen) == 0)
            return (int)i;
    if (c->nnodes == KVP_MAX_NODES)
        return -1;
    struct node *n = &c->nodes[c->nnodes];
    *n = (struct node){.port = port};
    memcpy(n->host, host, hlen);
    n->host[hlen] = '\0';
    return (int)c->nnodes++;
}

/* ---- cluster slot map ---- */

/* Applies a CLUSTER SLOTS reply from node `from`. Returns the number of slots mapped. */
static uint32_t apply_slots(struct kvp_l2_conn *c, const redisReply *r, uint32_t from)
{
    uint32_t mapped = 0;
    memset(c->slot_node, 0, sizeof(c->slot_node));
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER ||
            e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2 ||
            e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
            e->element[2]->element[1]->type != REDIS_REPLY_INTEGER)
            continue;
        long long lo = e->element[0]->integer, hi = e->element[1]->integer;
        long long port = e->element[2]->element[1]->integer;
        const redisReply *h = e->element[2]->element[0];
        if (lo < 0 || hi >= KVP_L2_CLUSTER_SLOTS || lo > hi || port < 1 || port > 65535)
            continue;
        /* An empty host means "the node you asked" (cluster-announce-hostname unset). */
        const char *host = h->len ? h->str : c->nodes[from].host;
        size_t hlen = h->len ? h->len : strlen(c->nodes[from].host);
        int idx = node_find_add(c, host, hlen, (uint16_t)port);
        if (idx < 0)
            continue;
        for (long long s = lo; s <= hi; s++)
            c->slot_node[s] = (uint8_t)(idx + 1);
        mapped += (uint32_t)(hi - lo + 1);
    }
    return mapped;
}

/* Fetches the slot map from the first node that answers: connected nodes first. */
static int cluster_refresh(struct kvp_l2_conn *c, char *why, size_t why_size)
{
    int rc = -ECONNREFUSED;
    snprintf(why, why_size, "no cluster node reachable");
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < c->nnodes; i++) {
            if ((pass == 0) != (c->nodes[i].ctx != NULL))
                continue;
            redisContext *ctx;
            redisReply *r = NULL;
            const char *argv[2] = {"CLUSTER", "SLOTS"};
            size_t lens[2] = {7, 5};
            rc = node_ctx(c, i, &ctx, why, why_size);
            if (rc == 0)
                rc = node_cmd(&c->nodes[i], 2, argv, lens, &r, why, why_size);
            if (rc)
                continue;
            if (r->type != REDIS_REPLY_ARRAY) {
                rc = r->type == REDIS_REPLY_ERROR ? reply_error(r, "CLUSTER SLOTS", why, why_size)
                                                  : -EPROTO;
                if (rc == -EPROTO)
                    freeReplyObject(r);
                continue;
            }
            uint32_t mapped = apply_slots(c, r, i);
            freeReplyObject(r);
            if (mapped == 0) {
                snprintf(why, why_size, "CLUSTER SLOTS of %s:%u maps no slot", c->nodes[i].host,
                         (unsigned)c->nodes[i].port);
                rc = -EREMOTEIO;
                continue;
            }
            c->stale = false;
            return 0;
        }
    }
    return rc;
}

/* The node that serves key. */
static int route(struct kvp_l2_conn *c, const char *key, uint32_t *node, char *why, size_t why_size)
{
    if (!c->cluster) {
        *node = 0;
        return 0;
    }
    uint32_t slot = kvp_l2_key_slot(key, strlen(key));
    if (c->stale || c->slot_node[slot] == 0) {
        int rc = cluster_refresh(c, why, why_size);
        if (rc)
            return rc;
    }
    if (c->slot_node[slot] == 0) {
        snprintf(why, why_size, "no cluster node serves slot %u", (unsigned)slot);
        return -EREMOTEIO;
    }
    *node = c->slot_node[slot] - 1u;
    return 0;
}

/*
 * A -MOVED or -ASK error (its text, without '-'): the node it names (added to the table) in *node;
 * for MOVED the slot map is updated and marked stale. Returns 1 for MOVED, 2 for ASK, 0 for another
 * reply.
 */
static int redirect_msg(struct kvp_l2_conn *c, const char *msg, uint32_t from, uint32_t *node)
{
    if (!c->cluster)
        return 0;
    int kind = strncmp(msg, "MOVED ", 6) == 0 ? 1 : strncmp(msg, "ASK ", 4) == 0 ? 2 : 0;
    if (!kind)
        return 0;
    /* "MOVED <slot> <host>:<port>"; the host may be empty (":7001"): the node asked. */
    char *end;
    const char *p = msg + (kind == 1 ? 6 : 4);
    unsigned long slot = strtoul(p, &end, 10);
    if (end == p || *end != ' ' || slot >= KVP_L2_CLUSTER_SLOTS)
        return 0;
    const char *hp = end + 1, *colon = strrchr(hp, ':');
    if (!colon)
        return 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (port < 1 || port > 65535 || *end)
        return 0;
    const char *host = colon > hp ? hp : c->nodes[from].host;
    size_t hlen = colon > hp ? (size_t)(colon - hp) : strlen(c->nodes[from].host);
    int idx = node_find_add(c, host, hlen, (uint16_t)port);
    if (idx < 0)
        return 0;
    *node = (uint32_t)idx;
    KVP_COUNT(l2_redirects, 1);
    if (kind == 1) {
        c->slot_node[slot] = (uint8_t)(idx + 1);
        c->stale = true;
    }
    return kind;
}

static int redirect(struct kvp_l2_conn *c, const redisReply *r, uint32_t from, uint32_t *node)
{
    return r->type == REDIS_REPLY_ERROR ? redirect_msg(c, r->str, from, node) : 0;
}

/* ---- commands ---- */

/* Sends ASKING on ctx and checks its answer (before a command redirected by -ASK). */
static int asking(struct node *n, char *why, size_t why_size)
{
    const char *argv[1] = {"ASKING"};
    size_t lens[1] = {6};
    redisReply *r = NULL;
    int rc = node_cmd(n, 1, argv, lens, &r, why, why_size);
    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_ERROR)
        return reply_error(r, "ASKING", why, why_size);
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
    int rc = route(c, key, &node, why, why_size);
    for (int hop = 0; rc == 0; hop++) {
        redisContext *ctx;
        redisReply *r = NULL;
        rc = node_ctx(c, node, &ctx, why, why_size);
        if (rc == 0 && ask)
            rc = asking(&c->nodes[node], why, why_size);
        if (rc == 0)
            rc = node_cmd(&c->nodes[node], argc, argv, lens, &r, why, why_size);
        if (rc)
            return rc;
        uint32_t from = node;
        int kind = hop < KVP_REDIRECTS ? redirect(c, r, from, &node) : 0;
        if (!kind) {
            *out = r;
            return 0;
        }
        freeReplyObject(r);
        ask = kind == 2;
    }
    return rc;
}

static int redis_ping(struct kvp_l2_conn *c, char *why, size_t why_size);

static int redis_open(const struct kvp_l2_target *target, uint32_t timeout_ms,
                      struct kvp_l2_conn **out, char *why, size_t why_size)
{
    struct kvp_l2_conn *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(why, why_size, "out of memory");
        return -ENOMEM;
    }
    c->t = *target;
    c->tv = (struct timeval){.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    c->cluster = target->scheme == KVP_L2_REDIS_CLUSTER;
    for (uint32_t i = 0; i < target->nnodes; i++)
        node_find_add(c, target->nodes[i].host, strlen(target->nodes[i].host),
                      target->nodes[i].port);
    if (target->scheme == KVP_L2_REDIS_UNIX)
        c->nnodes = 1;
    /* A server that accepts connections but does not answer (stopped, overloaded) is not up:
     * a cluster answers CLUSTER SLOTS, a single node PING. */
    int rc = c->cluster ? cluster_refresh(c, why, why_size) : redis_ping(c, why, why_size);
    if (rc) {
        kvp_l2_redis_backend.close(c);
        return rc;
    }
    *out = c;
    return 0;
}

static void redis_close(struct kvp_l2_conn *c)
{
    if (!c)
        return;
    for (uint32_t i = 0; i < c->nnodes; i++)
        node_drop(&c->nodes[i]);
    explicit_bzero(c->t.password, sizeof(c->t.password));
    free(c);
}

static int redis_ping(struct kvp_l2_conn *c, char *why, size_t why_size)
{
    const char *argv[1] = {"PING"};
    size_t lens[1] = {4};
    redisContext *ctx;
    redisReply *r = NULL;
    uint32_t node = 0;
    int rc = 0;
    /* A cluster answers when the node of some slot does: the map is fetched again if needed. */
    if (c->cluster)
        rc = route(c, "", &node, why, why_size);
    if (rc == 0)
        rc = node_ctx(c, node, &ctx, why, why_size);
    if (rc == 0)
        rc = node_cmd(&c->nodes[node], 1, argv, lens, &r, why, why_size);
    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_ERROR)
        return reply_error(r, "PING", why, why_size);
    freeReplyObject(r);
    return 0;
}

/* Sends every byte of iov on fd, resuming after partial writes. */
static int send_all(int fd, struct iovec *iov, size_t n, char *why, size_t why_size)
{
    for (size_t i = kvp_iov_advance(iov, n, 0, 0); i < n;) {
        struct msghdr mh = {.msg_iov = iov + i, .msg_iovlen = n - i};
        ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            int rc = errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
            snprintf(why, why_size, "SET: %s", rc == -ETIMEDOUT ? "timed out" : strerror(-rc));
            return rc;
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
    int rc = node_ctx(c, node, &ctx, why, why_size);
    if (rc == 0 && ask)
        rc = asking(&c->nodes[node], why, why_size);
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
    rc = send_all(ctx->fd, iov, (size_t)nparts + 2, why, why_size);
    if (rc) {
        node_drop(&c->nodes[node]);
        return rc;
    }
    redisReply *r = NULL;
    if (redisGetReply(ctx, (void **)&r) != REDIS_OK || !r) {
        rc = ctx_error(ctx, "SET", why, why_size);
        node_drop(&c->nodes[node]);
        return rc;
    }
    *out = r;
    return 0;
}

static int redis_put(struct kvp_l2_conn *c, const char *key, const struct iovec *parts, int nparts,
                     uint32_t ttl_s, char *why, size_t why_size)
{
    uint32_t node;
    bool ask = false;
    int rc = route(c, key, &node, why, why_size);
    for (int hop = 0; rc == 0; hop++) {
        redisReply *r = NULL;
        rc = set_direct(c, node, ask, key, parts, nparts, ttl_s, &r, why, why_size);
        if (rc)
            return rc;
        int kind = hop < KVP_REDIRECTS ? redirect(c, r, node, &node) : 0;
        if (!kind) {
            if (r->type == REDIS_REPLY_ERROR)
                return reply_error(r, "SET", why, why_size);
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
                            redisReply **out, char *why, size_t why_size)
{
    for (uint32_t i = 0; i < n; i++) {
        if (where[i] != node)
            continue;
        redisReply *r = NULL;
        if (redisGetReply(c->nodes[node].ctx, (void **)&r) != REDIS_OK || !r) {
            int rc = ctx_error(c->nodes[node].ctx, "reply", why, why_size);
            node_drop(&c->nodes[node]);
            return rc;
        }
        uint32_t to;
        if (redirect(c, r, node, &to))
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
        rc = route(c, keys[i], &node, why, why_size);
        where[i] = (uint8_t)node;
    }
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        redisContext *ctx;
        rc = node_ctx(c, where[i], &ctx, why, why_size);
        argv[1] = keys[i];
        lens[1] = strlen(keys[i]);
        if (rc == 0 && redisAppendCommandArgv(ctx, argc, argv, lens) != REDIS_OK)
            rc = -ENOMEM;
        used[where[i]] = true;
    }
    for (uint32_t node = 0; node < c->nnodes && rc == 0; node++)
        if (used[node])
            rc = pipeline_collect(c, node, where, n, out, why, why_size);
    if (rc) {
        /* Replies may be left unread in some pipelines: those contexts are out of step. */
        for (uint32_t node = 0; node < c->nnodes; node++)
            if (used[node])
                node_drop(&c->nodes[node]);
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

/* ---- values read straight into the caller's buffers ---- */

/*
 * A reader of one node's reply stream that bypasses hiredis' reader: a small buffer for reply
 * lines and short values, and recv() straight into the destination for the bulk of a value, so
 * a chunk read from Redis lands in its pool slot without an intermediate copy. It is used only
 * right after the commands were written and while hiredis' own reader holds nothing, so the two
 * never see the same bytes.
 */
struct rd {
    int fd;
    size_t pos, len;
    char buf[16384];
};

static int rd_fill(struct rd *r)
{
    if (r->pos == r->len)
        r->pos = r->len = 0;
    if (r->len == sizeof(r->buf)) {
        memmove(r->buf, r->buf + r->pos, r->len - r->pos);
        r->len -= r->pos;
        r->pos = 0;
    }
    for (;;) {
        ssize_t n = recv(r->fd, r->buf + r->len, sizeof(r->buf) - r->len, 0);
        if (n > 0) {
            r->len += (size_t)n;
            return 0;
        }
        if (n == 0)
            return -ECONNRESET;
        if (errno != EINTR)
            return errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
    }
}

/* One reply line without its CRLF, at most size - 1 bytes. */
static int rd_line(struct rd *r, char *line, size_t size)
{
    for (;;) {
        char *lf = memchr(r->buf + r->pos, '\n', r->len - r->pos);
        if (lf) {
            size_t n = (size_t)(lf - (r->buf + r->pos));
            if (n == 0 || r->buf[r->pos + n - 1] != '\r' || n > size)
                return -EPROTO;
            memcpy(line, r->buf + r->pos, n - 1);
            line[n - 1] = '\0';
            r->pos += n + 1;
            return 0;
        }
        if (r->len - r->pos >= size)
            return -EPROTO;
        int rc = rd_fill(r);
        if (rc)
            return rc;
    }
}

/* Exactly n bytes into dst (NULL: discarded): what the buffer holds, then straight from the
 * socket. */
static int rd_exact(struct rd *r, void *dst, size_t n)
{
    uint8_t *d = dst;
    size_t have = r->len - r->pos < n ? r->len - r->pos : n;
    if (d)
        memcpy(d, r->buf + r->pos, have);
    r->pos += have;
    n -= have;
    if (d)
        d += have;
    while (n) {
        if (!d || n < 4096) {
            int rc = rd_fill(r);
            if (rc)
                return rc;
            have = r->len - r->pos < n ? r->len - r->pos : n;
            if (d) {
                memcpy(d, r->buf + r->pos, have);
                d += have;
            }
            r->pos += have;
            n -= have;
            continue;
        }
        ssize_t got = recv(r->fd, d, n, 0);
        if (got > 0) {
            d += got;
            n -= (size_t)got;
        } else if (got == 0) {
            return -ECONNRESET;
        } else if (errno != EINTR) {
            return errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
        }
    }
    return 0;
}

/* Where the values of a read go (see kvp_l2_backend.read). */
struct read_req {
    const char *const *keys;
    uint8_t *const *hdr;
    size_t hdr_len;
    uint8_t *const *data;
    size_t data_len;
    uint64_t *len;
    char end[24]; /* GETRANGE's last offset */
};

/*
 * Reads one GETRANGE reply for value i. Returns 0 (len[i] set), 1 when the reply redirects
 * (*to, *ask), -EREMOTEIO for another error reply (the stream stays in step), or a stream error.
 */
static int read_value(struct kvp_l2_conn *c, struct rd *r, uint32_t node, const struct read_req *q,
                      uint32_t i, uint32_t *to, bool *ask, char *why, size_t why_size)
{
    char line[512];
    int rc = rd_line(r, line, sizeof(line));
    if (rc)
        return rc;
    if (line[0] == '-') {
        int kind = redirect_msg(c, line + 1, node, to);
        if (kind) {
            *ask = kind == 2;
            return 1;
        }
        snprintf(why, why_size, "GETRANGE: %.200s", line + 1);
        return -EREMOTEIO;
    }
    char *end;
    long long n = strtoll(line + 1, &end, 10);
    if (line[0] != '$' || *end || n < -1 || (uint64_t)n > q->hdr_len + q->data_len + 1)
        return -EPROTO;
    q->len[i] = n < 0 ? 0 : (uint64_t)n;
    if (n <= 0)
        return n == 0 ? rd_exact(r, NULL, 2) : 0;
    size_t h = (size_t)n < q->hdr_len ? (size_t)n : q->hdr_len;
    size_t d = (size_t)n - h < q->data_len ? (size_t)n - h : q->data_len;
    char crlf[2];
    if ((rc = rd_exact(r, q->hdr[i], h)) || (rc = rd_exact(r, q->data[i], d)) ||
        (rc = rd_exact(r, NULL, (size_t)n - h - d)) || (rc = rd_exact(r, crlf, 2)))
        return rc;
    return crlf[0] == '\r' && crlf[1] == '\n' ? 0 : -EPROTO;
}

/*
 * One round on one node: GETRANGE of the values idx[0..k) (each preceded by ASKING with ask),
 * written at once, then their replies read in order. Redirected values are put in redo[] (their
 * number in *nredo) with where they go. Returns 0, -EREMOTEIO (after reading every reply), or a
 * stream error (the node is dropped).
 */
static int read_round(struct kvp_l2_conn *c, uint32_t node, bool ask, const uint32_t *idx,
                      uint32_t k, const struct read_req *q, uint32_t *redo, uint32_t *redo_node,
                      bool *redo_ask, uint32_t *nredo, char *why, size_t why_size)
{
    redisContext *ctx;
    int rc = node_ctx(c, node, &ctx, why, why_size), done = 0;
    if (rc)
        return rc;
    for (uint32_t j = 0; j < k; j++) {
        const char *argv[4] = {"GETRANGE", q->keys[idx[j]], "0", q->end};
        size_t lens[4] = {8, strlen(q->keys[idx[j]]), 1, strlen(q->end)};
        if ((ask && redisAppendCommand(ctx, "ASKING") != REDIS_OK) ||
            redisAppendCommandArgv(ctx, 4, argv, lens) != REDIS_OK) {
            node_drop(&c->nodes[node]);
            snprintf(why, why_size, "out of memory");
            return -ENOMEM;
        }
    }
    while (!done)
        if (redisBufferWrite(ctx, &done) != REDIS_OK) {
            rc = ctx_error(ctx, "GETRANGE", why, why_size);
            node_drop(&c->nodes[node]);
            return rc;
        }
    /* hiredis has read nothing it did not hand out: every earlier reply was consumed. */
    if (ctx->reader->pos != ctx->reader->len) {
        node_drop(&c->nodes[node]);
        snprintf(why, why_size, "unexpected bytes from the server");
        return -EPROTO;
    }
    struct rd *r = malloc(sizeof(*r));
    if (!r) {
        node_drop(&c->nodes[node]);
        snprintf(why, why_size, "out of memory");
        return -ENOMEM;
    }
    r->fd = ctx->fd;
    r->pos = r->len = 0;
    int status = 0;
    for (uint32_t j = 0; j < k && rc >= 0; j++) {
        char line[512];
        if (ask && (rc = rd_line(r, line, sizeof(line))) == 0 && line[0] != '+')
            rc = -EPROTO; /* ASKING answers +OK */
        if (rc)
            break;
        uint32_t to = node;
        bool to_ask = false;
        rc = read_value(c, r, node, q, idx[j], &to, &to_ask, why, why_size);
        if (rc == 1) {
            redo[*nredo] = idx[j];
            redo_node[*nredo] = to;
            redo_ask[(*nredo)++] = to_ask;
            rc = 0;
        } else if (rc == -EREMOTEIO) {
            status = rc;
            rc = 0;
        }
    }
    /* A reply we did not expect, or bytes after the last one: the stream is out of step. */
    if (rc == 0 && r->pos != r->len)
        rc = -EPROTO;
    free(r);
    if (rc < 0) {
        if (rc == -EPROTO)
            snprintf(why, why_size, "malformed reply to GETRANGE");
        else if (rc == -ETIMEDOUT || rc == -ECONNRESET)
            snprintf(why, why_size, "GETRANGE: %s",
                     rc == -ETIMEDOUT ? "timed out" : "connection lost");
        else
            snprintf(why, why_size, "GETRANGE: %s", strerror(-rc));
        node_drop(&c->nodes[node]);
        return rc;
    }
    return status;
}

static int redis_read(struct kvp_l2_conn *c, const char *const *keys, uint32_t n,
                      uint8_t *const *hdr, size_t hdr_len, uint8_t *const *data, size_t data_len,
                      uint64_t *len, char *why, size_t why_size)
{
    struct read_req q = {.keys = keys,
                         .hdr = hdr,
                         .hdr_len = hdr_len,
                         .data = data,
                         .data_len = data_len,
                         .len = len};
    /* Four arrays of n: the values of one node's round, the redirected ones, where those go,
     * and where every value goes first. */
    uint32_t *idx = malloc(sizeof(*idx) * 4 * (n ? n : 1));
    bool *rask = malloc(n ? n : 1);
    int rc = 0, status = 0;

    if (!idx || !rask) {
        free(idx);
        free(rask);
        snprintf(why, why_size, "out of memory");
        return -ENOMEM;
    }
    uint32_t *redo = idx + n, *rnode = redo + n, *where = rnode + n, nredo = 0;
    snprintf(q.end, sizeof(q.end), "%zu", hdr_len + data_len);
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        len[i] = 0;
        rc = route(c, keys[i], &where[i], why, why_size);
    }
    /* One round per node, in node order; then the redirected values, one at a time. */
    for (uint32_t node = 0; node < c->nnodes && rc >= 0; node++) {
        uint32_t k = 0;
        for (uint32_t i = 0; i < n; i++)
            if (where[i] == node)
                idx[k++] = i;
        if (k)
            rc = read_round(c, node, false, idx, k, &q, redo, rnode, rask, &nredo, why, why_size);
        if (rc == -EREMOTEIO) {
            status = rc;
            rc = 0;
        }
    }
    for (uint32_t j = 0; j < nredo && rc >= 0; j++) {
        for (int hop = 0; hop < KVP_REDIRECTS && rc >= 0; hop++) {
            uint32_t more = 0, i = redo[j];
            uint32_t mnode;
            bool mask;
            rc = read_round(c, rnode[j], rask[j], &i, 1, &q, &i, &mnode, &mask, &more, why,
                            why_size);
            if (rc == -EREMOTEIO) {
                status = rc;
                rc = 0;
            }
            if (!more)
                break;
            rnode[j] = mnode;
            rask[j] = mask;
        }
    }
    free(idx);
    free(rask);
    return rc ? rc : status;
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
    int rc = run_key(c, key, 2, argv, lens, &r, why, why_size);
    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_ERROR)
        return reply_error(r, "DEL", why, why_size);
    freeReplyObject(r);
    return 0;
}

const struct kvp_l2_backend kvp_l2_redis_backend = {
    .name = "redis",
    .open = redis_open,
    .close = redis_close,
    .ping = redis_ping,
    .put = redis_put,
    .read = redis_read,
    .exists = redis_exists,
    .del = redis_del,
};
