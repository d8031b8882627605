/*
 * session.c - the daemon side of one client connection (a session): its state, its buffers and
 * its framed, timed I/O. The handlers (handlers.c) answer through these calls; the set of
 * sessions, their threads and the request loop are in sessions.c.
 *
 * Timeouts: SO_RCVTIMEO/SO_SNDTIMEO are set to --io-timeout. Waiting for the first byte of a
 * request may last forever (an idle worker is normal); once a frame has started, a stall longer
 * than the timeout drops the client, and so does a reader that stops draining a reply. Replies
 * leave in one gathered send: payload bytes go straight from the pool, never through a buffer.
 *
 * Threads: a session is used by its own thread only (its fields, buffers and holds).
 */
#include "kvp/session.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "common/errors.h"
#include "common/iov.h"
#include "common/msg.h"
#include "core/daemon.h"
#include "core/seg_guard.h"
#include "core/stats.h"

/* Takes up to len bytes read ahead (c->in); returns how many. */
static size_t take_ahead(struct kvp_session *c, uint8_t *p, size_t len)
{
    size_t n = c->in_len - c->in_pos;
    if (n > len)
        n = len;
    memcpy(p, c->in + c->in_pos, n);
    c->in_pos += (uint32_t)n;
    if (c->in_pos == c->in_len)
        c->in_pos = c->in_len = 0;
    return n;
}

/*
 * Used inside a frame, where SO_RCVTIMEO expiring means the peer stalled: -ETIMEDOUT. Bytes
 * read ahead come first; the rest goes straight from the socket into buf (a payload into the
 * pool's slots), never through the read-ahead buffer.
 */
int kvp_session_recv(struct kvp_session *c, void *buf, size_t len)
{
    if (len == 0) /* buf may be NULL: an empty body */
        return 0;
    uint8_t *p = buf;
    size_t got = take_ahead(c, p, len);
    p += got;
    len -= got;
    while (len) {
        ssize_t n = recv(c->fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n == 0) {
            return -ECONNRESET;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return -ETIMEDOUT;
        } else if (errno != EINTR) {
            int err = -errno;
            if (err == -EFAULT)
                kvp_seg_guard_check(); /* into the pool: was it truncated under us? */
            return err;
        }
    }
    return 0;
}

/*
 * Waits for and reads a request header. Idle time is unlimited; a started header is not. The
 * wait reads whatever has arrived, up to the read-ahead buffer: the header and, for most
 * requests, the whole body in one call (one recv() fewer per request). Only the waiting read
 * does so: one frame's bytes are never spread over the buffer and the socket twice.
 */
int kvp_session_recv_header(struct kvp_session *c, uint8_t *hdr)
{
    if (c->in_len - c->in_pos >= KVP_HEADER_SIZE) {
        take_ahead(c, hdr, KVP_HEADER_SIZE);
        return 0;
    }
    if (c->in_pos) { /* a partial header left by the last read moves to the front */
        memmove(c->in, c->in + c->in_pos, c->in_len - c->in_pos);
        c->in_len -= c->in_pos;
        c->in_pos = 0;
    }
    for (;;) {
        ssize_t n = recv(c->fd, c->in + c->in_len, sizeof(c->in) - c->in_len, 0);
        if (n > 0) {
            c->in_len += (uint32_t)n;
            size_t first = take_ahead(c, hdr, KVP_HEADER_SIZE);
            return first == KVP_HEADER_SIZE
                       ? 0
                       : kvp_session_recv(c, hdr + first, KVP_HEADER_SIZE - first);
        }
        if (n == 0)
            return c->in_len ? -ECONNRESET : -ENOTCONN;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return -errno;
        if (c->in_len) /* a header started in the last read, and stalled */
            return -ETIMEDOUT;
        if (atomic_load(&c->srv->stopping))
            return -ESHUTDOWN;
    }
}

/*
 * Gathered send of a whole reply, resuming after partial writes. MSG_NOSIGNAL: a worker that
 * vanished is an EPIPE on its own connection, never a signal to the daemon. Consumes iov.
 */
static int send_all(struct kvp_session *c, struct iovec *iov, int iovcnt)
{
    size_t n = (size_t)iovcnt, i = kvp_iov_advance(iov, n, 0, 0);
    while (i < n) {
        struct msghdr mh = {.msg_iov = iov + i, .msg_iovlen = n - i < IOV_MAX ? n - i : IOV_MAX};
        ssize_t r = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
        if (r < 0) {
            int err = errno;
            if (err == EINTR)
                continue;
            if (err == EFAULT)
                kvp_seg_guard_check(); /* from the pool: was it truncated under us? */
            return err == EAGAIN || err == EWOULDBLOCK ? -ETIMEDOUT : -err;
        }
        i = kvp_iov_advance(iov, n, i, (size_t)r);
    }
    return 0;
}

/* Header, body and payload leave in one sendmsg chain: payload bytes are sent straight from
 * the pool, never copied into a reply buffer. */
int kvp_session_reply(struct kvp_session *c, const struct kvp_header *req, int status,
                      const struct iovec *payload, int npayload, uint64_t payload_len)
{
    struct kvp_wbuf err;
    const struct kvp_wbuf *body = &c->out;
    uint8_t hdr[KVP_HEADER_SIZE];
    struct iovec stackv[2 + 64], *iov = stackv;
    int rc;

    /* A commit sent without waiting: no reply; a failure answers the next request instead. */
    if (c->noreply) {
        KVP_COUNT(requests, 1);
        if (status >= 0)
            return 0;
        KVP_COUNT(request_errors, 1);
        if (c->deferred_status) {
            c->deferred_more++;
            return 0;
        }
        c->deferred_status = status;
        c->deferred_opcode = req->opcode;
        c->deferred_id = req->request_id;
        snprintf(c->deferred_msg, sizeof(c->deferred_msg), "%s", c->errmsg);
        return 0;
    }

    kvp_wbuf_init(&err);
    if (status < 0) {
        kvp_encode_error(&err, c->errmsg);
        body = &err;
        npayload = 0;
        payload_len = 0;
        KVP_COUNT(request_errors, 1);
    }
    if (body->err) {
        kvp_wbuf_free(&err);
        return -ENOMEM;
    }

    kvp_reply_header_encode(req, status, (uint32_t)body->len, payload_len, hdr);

    if (npayload > 64) {
        iov = malloc(sizeof(*iov) * (size_t)(2 + npayload));
        if (!iov) {
            kvp_wbuf_free(&err);
            return -ENOMEM;
        }
    }
    iov[0] = (struct iovec){hdr, sizeof(hdr)};
    iov[1] = (struct iovec){body->data, body->len};
    for (int i = 0; i < npayload; i++)
        iov[2 + i] = payload[i];
    rc = send_all(c, iov, 2 + npayload);
    if (iov != stackv)
        free(iov);
    kvp_wbuf_free(&err);
    KVP_COUNT(requests, 1);
    return rc;
}

int kvp_session_reply_fd(struct kvp_session *c, const struct kvp_header *req, int fd)
{
    uint8_t hdr[KVP_HEADER_SIZE];
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = {hdr, sizeof(hdr)};
    struct msghdr mh = {.msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = ctl.buf,
                        .msg_controllen = sizeof(ctl.buf)};

    kvp_reply_header_encode(req, 0, 0, 0, hdr);
    memset(ctl.buf, 0, sizeof(ctl.buf));
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));

    /* The descriptor rides on the first byte; the rest of the header may follow separately. */
    ssize_t n;
    do {
        n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
    KVP_COUNT(requests, 1);
    c->sent_segment_fd = true; /* sent with the first byte: the peer has it now */
    if ((size_t)n < sizeof(hdr)) {
        struct iovec rest = {hdr + n, sizeof(hdr) - (size_t)n};
        return send_all(c, &rest, 1);
    }
    return 0;
}

/* Scratch sized for the largest request, allocated once per connection, not per request. */
int kvp_session_alloc_buffers(struct kvp_session *c)
{
    c->slots = malloc(sizeof(*c->slots) * KVP_MAX_CHUNKS);
    if (!c->slots)
        return -ENOMEM;
    return kvp_owner_alloc(&c->owner);
}

/* Frees a connection (and its owner, releasing whatever it still holds); closes its socket. */
void kvp_session_free(struct kvp_session *c)
{
    free(c->slots);
    kvp_owner_destroy(&c->owner);
    free(c->body);
    kvp_wbuf_free(&c->out);
    if (c->fd >= 0)
        close(c->fd);
    free(c);
}
