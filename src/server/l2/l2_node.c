/*
 * l2_node.c - the Redis backend's nodes (l2_node.h): connecting one on first use, AUTH and
 * SELECT on every new context, commands and replies under the operation's deadline, dropping a
 * context on any I/O error, so that the error is returned and the next call opens it again.
 *
 * I/O. hiredis 0.14 would block in read() and write() with a timeout per call (SO_RCVTIMEO), so
 * a server that sends one byte a little faster than the timeout could hold a call for minutes.
 * Here every context is non-blocking (hiredis is told so: REDIS_BLOCK is cleared) and driven by
 * poll() until the operation's deadline (kvp_l2r_op_begin()): redisBufferWrite() and
 * redisBufferRead() never wait, kvp_l2r_wait() does, and never past the deadline. hiredis'
 * blocking calls (redisCommand, redisGetReply) are never used.
 *
 * Bounds. hiredis 0.14's reader has no limit on a bulk's length or an array's element count
 * (newer versions have maxbulklen and maxelements): a hostile server could announce a 2 GiB
 * bulk and make it buffer every byte. So each reply is bounded twice: the bytes buffered for
 * it (checked before each read) and the memory of the objects built from it (the reader's
 * object functions are wrapped to charge every object to the node's budget, refused when it is
 * spent; an array is charged for its announced element count before any element arrives). Both
 * are KVP_L2_REPLY_MAX; a reply over them drops the node with -EMSGSIZE.
 *
 * Credentials: the password is sent by AUTH and never appears in a message (hiredis' error
 * strings do not hold it, Redis' error replies do not echo it). A refused AUTH, and a NOAUTH
 * or WRONGPASS reply to any command, are -EACCES: the tier reports them as such.
 *
 * Threads: a connection is used by one thread at a time; nothing here is shared between
 * connections.
 */
#include "l2/l2_node.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "base/clock.h"

void kvp_l2r_op_begin(struct kvp_l2_conn *c)
{
    c->deadline_ms = kvp_mono_ms() + c->timeout_ms;
}

int kvp_l2r_wait(struct kvp_l2_conn *c, int fd, short events, const char *what, char *why,
                 size_t why_size)
{
    for (;;) {
        uint64_t now = kvp_mono_ms();
        if (now >= c->deadline_ms) {
            snprintf(why, why_size, "%s: timed out (--l2-timeout %u ms)", what,
                     (unsigned)c->timeout_ms);
            return -ETIMEDOUT;
        }
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, (int)(c->deadline_ms - now));
        /* Ready, or an error or hang-up that the next read or write reports. */
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR) {
            int rc = -errno;
            snprintf(why, why_size, "%s: poll: %s", what, strerror(-rc));
            return rc;
        }
    }
}

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

/* ---- the reply budget: hiredis' object functions, charged to the node ---- */

static bool charge(const redisReadTask *t, size_t bytes)
{
    struct reply_budget *b = t->privdata;
    if (bytes > b->left) {
        b->over = true;
        return false;
    }
    b->left -= bytes;
    return true;
}

static void *budget_string(const redisReadTask *t, char *s, size_t len)
{
    const struct reply_budget *b = t->privdata;
    return charge(t, sizeof(redisReply) + len + 1) ? b->orig->createString(t, s, len) : NULL;
}

static void *budget_array(const redisReadTask *t, int elements)
{
    const struct reply_budget *b = t->privdata;
    size_t n = elements > 0 ? (size_t)elements : 0;
    return charge(t, sizeof(redisReply) + n * sizeof(redisReply *))
               ? b->orig->createArray(t, elements)
               : NULL;
}

static void *budget_integer(const redisReadTask *t, long long v)
{
    const struct reply_budget *b = t->privdata;
    return charge(t, sizeof(redisReply)) ? b->orig->createInteger(t, v) : NULL;
}

static void *budget_nil(const redisReadTask *t)
{
    const struct reply_budget *b = t->privdata;
    return charge(t, sizeof(redisReply)) ? b->orig->createNil(t) : NULL;
}

/* The objects are hiredis' own: freeReplyObject() frees them. */
static redisReplyObjectFunctions budget_fns = {
    .createString = budget_string,
    .createArray = budget_array,
    .createInteger = budget_integer,
    .createNil = budget_nil,
    .freeObject = freeReplyObject,
};

/* ---- commands and replies ---- */

int kvp_l2r_node_flush(struct kvp_l2_conn *c, uint32_t i, const char *what, char *why,
                       size_t why_size)
{
    struct node *n = &c->nodes[i];
    int done = 0, rc = 0;
    while (rc == 0) {
        if (redisBufferWrite(n->ctx, &done) != REDIS_OK)
            rc = kvp_l2r_ctx_error(n->ctx, what, why, why_size);
        else if (done)
            return 0;
        else
            rc = kvp_l2r_wait(c, n->ctx->fd, POLLOUT, what, why, why_size);
    }
    kvp_l2r_node_drop(n);
    return rc;
}

int kvp_l2r_node_reply(struct kvp_l2_conn *c, uint32_t i, const char *what, redisReply **out,
                       char *why, size_t why_size)
{
    struct node *n = &c->nodes[i];
    redisContext *ctx = n->ctx;
    int rc = 0;

    n->budget.left = KVP_L2_REPLY_MAX;
    n->budget.over = false;
    while (rc == 0) {
        void *r = NULL;
        if (redisGetReplyFromReader(ctx, &r) != REDIS_OK) {
            rc = n->budget.over ? -EMSGSIZE : kvp_l2r_ctx_error(ctx, what, why, why_size);
            break;
        }
        if (r) {
            *out = r;
            return 0;
        }
        if (ctx->reader->len - ctx->reader->pos > KVP_L2_REPLY_MAX) {
            rc = -EMSGSIZE;
            break;
        }
        rc = kvp_l2r_wait(c, ctx->fd, POLLIN, what, why, why_size);
        if (rc == 0 && redisBufferRead(ctx) != REDIS_OK)
            rc = kvp_l2r_ctx_error(ctx, what, why, why_size);
    }
    if (rc == -EMSGSIZE)
        snprintf(why, why_size, "%s: a reply larger than %u bytes", what,
                 (unsigned)KVP_L2_REPLY_MAX);
    kvp_l2r_node_drop(n);
    return rc;
}

int kvp_l2r_node_cmd(struct kvp_l2_conn *c, uint32_t i, int argc, const char **argv,
                     const size_t *lens, redisReply **out, char *why, size_t why_size)
{
    if (redisAppendCommandArgv(c->nodes[i].ctx, argc, argv, lens) != REDIS_OK) {
        kvp_l2r_node_drop(&c->nodes[i]);
        snprintf(why, why_size, "%s: out of memory", argv[0]);
        return -ENOMEM;
    }
    int rc = kvp_l2r_node_flush(c, i, argv[0], why, why_size);
    return rc ? rc : kvp_l2r_node_reply(c, i, argv[0], out, why, why_size);
}

int kvp_l2r_reply_error(redisReply *r, const char *what, char *why, size_t why_size)
{
    bool denied = strcmp(what, "AUTH") == 0 || strncmp(r->str, "WRONGPASS", 9) == 0 ||
                  strncmp(r->str, "NOAUTH", 6) == 0;
    snprintf(why, why_size, "%s: %.*s", what, (int)(r->len < 200 ? r->len : 200), r->str);
    freeReplyObject(r);
    return denied ? -EACCES : -EREMOTEIO;
}

/* AUTH and SELECT on a fresh context. */
static int node_handshake(struct kvp_l2_conn *c, uint32_t i, char *why, size_t why_size)
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
        rc = kvp_l2r_node_cmd(c, i, argc, argv, lens, &r, why, why_size);
        if (rc)
            return rc;
        if (r->type == REDIS_REPLY_ERROR)
            return kvp_l2r_reply_error(r, "AUTH", why, why_size);
        freeReplyObject(r);
    }
    if (!c->cluster && c->t.db) {
        char db[16];
        snprintf(db, sizeof(db), "%u", (unsigned)c->t.db);
        const char *argv[2] = {"SELECT", db};
        size_t lens[2] = {6, strlen(db)};
        rc = kvp_l2r_node_cmd(c, i, 2, argv, lens, &r, why, why_size);
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
    uint64_t now = kvp_mono_ms();
    if (now >= c->deadline_ms) {
        snprintf(why, why_size, "connect: timed out (--l2-timeout %u ms)", (unsigned)c->timeout_ms);
        return -ETIMEDOUT;
    }
    /* The connect waits until the operation's deadline at most. */
    uint64_t left = c->deadline_ms - now;
    struct timeval tv = {.tv_sec = (time_t)(left / 1000), .tv_usec = (long)(left % 1000) * 1000};
    if (c->t.scheme == KVP_L2_REDIS_UNIX)
        n->ctx = redisConnectUnixWithTimeout(c->t.path, tv);
    else
        n->ctx = redisConnectWithTimeout(n->host, n->port, tv);
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
    /* hiredis opens its socket without O_CLOEXEC, and blocking: from here on, poll() waits. */
    int fl = fcntl(n->ctx->fd, F_GETFL);
    if (fcntl(n->ctx->fd, F_SETFD, FD_CLOEXEC) != 0 || fl < 0 ||
        fcntl(n->ctx->fd, F_SETFL, fl | O_NONBLOCK) != 0) {
        int rc = -errno;
        snprintf(why, why_size, "connect: fcntl: %s", strerror(-rc));
        kvp_l2r_node_drop(n);
        return rc;
    }
    n->ctx->flags &= ~REDIS_BLOCK;
    n->budget.orig = n->ctx->reader->fn;
    n->ctx->reader->fn = &budget_fns;
    n->ctx->reader->privdata = &n->budget;
    int rc = node_handshake(c, i, why, why_size);
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
