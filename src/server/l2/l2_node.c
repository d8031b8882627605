/*
 * l2_node.c - the Redis backend's nodes (l2_node.h): connecting one on first use with the tier's
 * timeout on connect and on every read and write (SO_RCVTIMEO/SO_SNDTIMEO), so no call can hang;
 * AUTH and SELECT on every new context; one command at a time; dropping a context on any I/O
 * error, so that the error is returned and the next call opens it again.
 *
 * Credentials: the password is sent by AUTH and never appears in a message (hiredis' error
 * strings do not hold it, Redis' error replies do not echo it).
 *
 * Threads: a connection is used by one thread at a time; nothing here is shared between
 * connections.
 */
#include "l2/l2_node.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A context's error as a negative errno, with hiredis' text in why. */
int kvp_l2r_ctx_error(const redisContext *ctx, const char *what, char *why, size_t why_size)
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

void kvp_l2r_node_drop(struct node *n)
{
    if (n->ctx)
        redisFree(n->ctx);
    n->ctx = NULL;
}

/* One command on a context; a NULL reply (I/O error) drops the node. */
int kvp_l2r_node_cmd(struct node *n, int argc, const char **argv, const size_t *lens,
                     redisReply **out, char *why, size_t why_size)
{
    redisReply *r = redisCommandArgv(n->ctx, argc, argv, lens);
    if (!r) {
        int rc = kvp_l2r_ctx_error(n->ctx, argv[0], why, why_size);
        kvp_l2r_node_drop(n);
        return rc;
    }
    *out = r;
    return 0;
}

/* An error reply as -EREMOTEIO with its text; frees r. */
int kvp_l2r_reply_error(redisReply *r, const char *what, char *why, size_t why_size)
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
        rc = kvp_l2r_node_cmd(n, argc, argv, lens, &r, why, why_size);
        if (rc)
            return rc;
        if (r->type == REDIS_REPLY_ERROR) {
            kvp_l2r_reply_error(r, "AUTH", why, why_size);
            return -EACCES;
        }
        freeReplyObject(r);
    }
    if (!c->cluster && c->t.db) {
        char db[16];
        snprintf(db, sizeof(db), "%u", (unsigned)c->t.db);
        const char *argv[2] = {"SELECT", db};
        size_t lens[2] = {6, strlen(db)};
        rc = kvp_l2r_node_cmd(n, 2, argv, lens, &r, why, why_size);
        if (rc)
            return rc;
        if (r->type == REDIS_REPLY_ERROR)
            return kvp_l2r_reply_error(r, "SELECT", why, why_size);
        freeReplyObject(r);
    }
    return 0;
}

/* The context of node i, connected now if it is not. */
int kvp_l2r_node_ctx(struct kvp_l2_conn *c, uint32_t i, redisContext **out, char *why,
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
        int rc = kvp_l2r_ctx_error(n->ctx, "connect", why, why_size);
        if (rc == -EIO || rc == -EPROTO)
            rc = -ECONNREFUSED;
        kvp_l2r_node_drop(n);
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
        kvp_l2r_node_drop(n);
        return rc;
    }
    *out = n->ctx;
    return 0;
}

/* The index of node host:port, added to the table if it is new; -1 when the table is full. */
int kvp_l2r_node_find_add(struct kvp_l2_conn *c, const char *host, size_t hlen, uint16_t port)
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
