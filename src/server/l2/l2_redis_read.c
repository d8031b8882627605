/*
 * l2_redis_read.c - the Redis backend's reads (kvp_l2_backend.read): values go from the socket
 * straight into the caller's buffers, so a chunk read from Redis lands in its reserved pool slot
 * without an intermediate copy (hiredis would copy it twice: into its reader's buffer, then
 * into a reply object).
 *
 * Design. Commands are written through hiredis (GETRANGE key 0 N, N = what the caller can take
 * plus one byte, so a longer value is seen as such and a foreign one never costs memory), all of
 * one node's at once. The replies are then parsed here, off the socket, by a small reader: reply
 * lines and short values through its 16 KiB buffer, the bulk of a value by recv() into the
 * destination. This is safe because hiredis' own reader holds nothing at that point (checked):
 * every earlier reply on the context was consumed, and Redis sends nothing unasked. A reply that
 * does not parse, or bytes after the last one, mean the stream is out of step: the node is
 * dropped. Redirected values are read again, one at a time, from the node named.
 *
 * Deadline: a read is one operation of the backend (kvp_l2r_op_begin()): every wait for bytes,
 * on every node it reads from, ends at the same deadline (l2_node.h).
 *
 * Threads: the connection's thread only.
 */
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "l2/l2_cluster.h"
#include "l2/l2_redis.h"

/*
 * A reader of one node's reply stream that bypasses hiredis' reader: a small buffer for reply
 * lines and short values, and recv() straight into the destination for the bulk of a value, so
 * a chunk read from Redis lands in its pool slot without an intermediate copy. It is used only
 * right after the commands were written and while hiredis' own reader holds nothing, so the two
 * never see the same bytes.
 */
struct rd {
    struct kvp_l2_conn *c; /* its deadline bounds every wait */
    int fd;
    size_t pos, len;
    char buf[16384];
};

/* recv() on the non-blocking socket, waiting for bytes until the operation's deadline. */
static ssize_t rd_recv(struct rd *r, void *dst, size_t n)
{
    char why[128];
    for (;;) {
        ssize_t got = recv(r->fd, dst, n, 0);
        if (got > 0)
            return got;
        if (got == 0)
            return -ECONNRESET;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = kvp_l2r_wait(r->c, r->fd, POLLIN, "GETRANGE", why, sizeof(why));
            if (rc)
                return rc;
        } else if (errno != EINTR) {
            return -errno;
        }
    }
}

static int rd_fill(struct rd *r)
{
    if (r->pos == r->len)
        r->pos = r->len = 0;
    if (r->len == sizeof(r->buf)) {
        memmove(r->buf, r->buf + r->pos, r->len - r->pos);
        r->len -= r->pos;
        r->pos = 0;
    }
    ssize_t n = rd_recv(r, r->buf + r->len, sizeof(r->buf) - r->len);
    if (n < 0)
        return (int)n;
    r->len += (size_t)n;
    return 0;
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
        ssize_t got = rd_recv(r, d, n);
        if (got < 0)
            return (int)got;
        d += got;
        n -= (size_t)got;
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
        int kind = kvp_l2r_redirect_msg(c, line + 1, node, to);
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
    int rc = kvp_l2r_node_ctx(c, node, &ctx, why, why_size);
    if (rc)
        return rc;
    for (uint32_t j = 0; j < k; j++) {
        const char *argv[4] = {"GETRANGE", q->keys[idx[j]], "0", q->end};
        size_t lens[4] = {8, strlen(q->keys[idx[j]]), 1, strlen(q->end)};
        if ((ask && redisAppendCommand(ctx, "ASKING") != REDIS_OK) ||
            redisAppendCommandArgv(ctx, 4, argv, lens) != REDIS_OK) {
            kvp_l2r_node_drop(&c->nodes[node]);
            snprintf(why, why_size, "out of memory");
            return -ENOMEM;
        }
    }
    if ((rc = kvp_l2r_node_flush(c, node, "GETRANGE", why, why_size)) != 0)
        return rc;
    /* hiredis has read nothing it did not hand out: every earlier reply was consumed. */
    if (ctx->reader->pos != ctx->reader->len) {
        kvp_l2r_node_drop(&c->nodes[node]);
        snprintf(why, why_size, "unexpected bytes from the server");
        return -EPROTO;
    }
    struct rd *r = malloc(sizeof(*r));
    if (!r) {
        kvp_l2r_node_drop(&c->nodes[node]);
        snprintf(why, why_size, "out of memory");
        return -ENOMEM;
    }
    r->c = c;
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
        else if (rc == -ETIMEDOUT)
            snprintf(why, why_size, "GETRANGE: timed out (--l2-timeout %u ms)",
                     (unsigned)c->timeout_ms);
        else if (rc == -ECONNRESET)
            snprintf(why, why_size, "GETRANGE: connection lost");
        else
            snprintf(why, why_size, "GETRANGE: %s", strerror(-rc));
        kvp_l2r_node_drop(&c->nodes[node]);
        return rc;
    }
    return status;
}

int kvp_l2r_read(struct kvp_l2_conn *c, const char *const *keys, uint32_t n, uint8_t *const *hdr,
                 size_t hdr_len, uint8_t *const *data, size_t data_len, uint64_t *len, char *why,
                 size_t why_size)
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
    kvp_l2r_op_begin(c);
    snprintf(q.end, sizeof(q.end), "%zu", hdr_len + data_len);
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        len[i] = 0;
        rc = kvp_l2r_route(c, keys[i], &where[i], why, why_size);
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
