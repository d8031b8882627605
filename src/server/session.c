/*
 * session.c - the daemon side of one client connection (a session), its whole life: allocation
 * and the server's list, its thread, framing, timed I/O, and the end that releases the holds
 * (holds.c) and the instances it owns.
 *
 * Threading model: one thread per connection (bounded by --max-clients). A thread blocks only
 * on its own socket, so a worker streaming a 32 MiB inline chunk, or one that stops reading, never
 * delays another worker. Shared state is reached only through the store and the registry, each
 * behind its own leaf lock taken for metadata work only; the connection's own fields (buffers,
 * holds) are touched by this thread alone. Lock order: none is ever nested.
 *
 * Timeouts: SO_RCVTIMEO/SO_SNDTIMEO are set to --io-timeout. Waiting for the first byte of a
 * request may last forever (an idle worker is normal); once a frame has started, a stall longer
 * than the timeout drops the client, and so does a reader that stops draining a reply. Dropping
 * a client releases its holds at once: reservations are aborted (never published) and pins are
 * released, then the instances it registered are unregistered.
 *
 * Framing errors (bad header, undecodable body) are answered with an error reply and the
 * connection is closed, because the byte stream can no longer be trusted.
 *
 * The server's list of connections (s->conns, under s->conns_lock) is kept here: a connection
 * joins it before its thread starts (the --max-clients check and the insertion are one step
 * under the lock) and leaves it as the last thing its thread does, so kvp_sessions_close_all() can
 * wait for an empty list knowing that nothing of any connection is still running.
 */
#include "session.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/iov.h"
#include "common/msg.h"
#include "handlers.h"
#include "log.h"
#include "server.h"
#include "stats.h"

/* Used inside a frame, where SO_RCVTIMEO expiring means the peer stalled: -ETIMEDOUT. */
int kvp_session_recv(struct kvp_session *c, void *buf, size_t len)
{
    uint8_t *p = buf;
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
            return -errno;
        }
    }
    return 0;
}

/* Waits for and reads a request header. Idle time is unlimited; a started header is not. */
static int recv_header(struct kvp_session *c, uint8_t *hdr)
{
    for (;;) {
        ssize_t n = recv(c->fd, hdr, KVP_HEADER_SIZE, 0);
        if (n > 0)
            return n == KVP_HEADER_SIZE ? 0
                                        : kvp_session_recv(c, hdr + n, KVP_HEADER_SIZE - (size_t)n);
        if (n == 0)
            return -ECONNRESET;
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            if (atomic_load(&c->srv->stopping))
                return -ESHUTDOWN;
            continue;
        }
        return -errno;
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
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
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
    if ((size_t)n < sizeof(hdr)) {
        struct iovec rest = {hdr + n, sizeof(hdr) - (size_t)n};
        return send_all(c, &rest, 1);
    }
    return 0;
}

/* Scratch sized for the largest request, allocated once per connection, not per request. */
static int conn_alloc_buffers(struct kvp_session *c)
{
    c->keys = malloc((size_t)KVP_MAX_CHUNKS * KVP_KEY_SIZE);
    c->objs = malloc(sizeof(*c->objs) * KVP_MAX_CHUNKS);
    c->idx = malloc(sizeof(*c->idx) * KVP_MAX_CHUNKS);
    c->slots = malloc(sizeof(*c->slots) * KVP_MAX_CHUNKS);
    if (!c->keys || !c->objs || !c->idx || !c->slots)
        return -ENOMEM;
    return kvp_holds_init(&c->holds, &c->srv->store);
}

/* Joins the server's list, unless --max-clients connections are there already. */
static struct kvp_session *conn_new(struct kvp_server *s, int fd, int *err)
{
    struct kvp_session *c = calloc(1, sizeof(*c));
    if (!c) {
        *err = -ENOMEM;
        return NULL;
    }
    c->srv = s;
    c->fd = fd;
    kvp_wbuf_init(&c->out);
    /* Before joining the list: the status report reads both under conns_lock. */
    socklen_t len = sizeof(c->peer);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c->peer, &len) != 0)
        c->peer = (struct ucred){.pid = -1};
    c->connected_since_ms = kvp_wall_ms();

    pthread_mutex_lock(&s->conns_lock);
    if (s->nconns >= s->cfg.max_clients) {
        pthread_mutex_unlock(&s->conns_lock);
        free(c);
        *err = -EUSERS;
        return NULL;
    }
    c->id = ++s->next_conn_id;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    pthread_mutex_unlock(&s->conns_lock);
    return c;
}

/* Last step of a connection thread: leave the list and wake a shutdown waiting for it. */
static void conn_leave(struct kvp_session *c)
{
    struct kvp_server *s = c->srv;

    pthread_mutex_lock(&s->conns_lock);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->nconns--;
    pthread_cond_broadcast(&s->conns_cv);
    pthread_mutex_unlock(&s->conns_lock);
}

struct kvp_session *kvp_session_new(struct kvp_server *s, int fd)
{
    int err;
    return conn_new(s, fd, &err);
}

int kvp_session_spawn(struct kvp_server *s, int fd)
{
    int err = 0;
    struct kvp_session *c = conn_new(s, fd, &err);
    if (!c)
        return err;

    pthread_attr_t attr;
    pthread_t tid;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = kvp_thread_create(&tid, &attr, kvp_session_main, c);
    pthread_attr_destroy(&attr);
    if (rc) {
        conn_leave(c);
        c->fd = -1; /* the caller closes it */
        kvp_wbuf_free(&c->out);
        free(c);
        return -rc;
    }
    return 0;
}

void kvp_sessions_close_all(struct kvp_server *s)
{
    pthread_mutex_lock(&s->conns_lock);
    for (struct kvp_session *c = s->conns; c; c = c->next)
        shutdown(c->fd, SHUT_RDWR);
    while (s->nconns)
        pthread_cond_wait(&s->conns_cv, &s->conns_lock);
    pthread_mutex_unlock(&s->conns_lock);
}

/* Frees a connection whose holds are already released; closes its socket. */
static void conn_free(struct kvp_session *c)
{
    free(c->keys);
    free(c->objs);
    free(c->idx);
    free(c->slots);
    kvp_holds_destroy(&c->holds);
    free(c->body);
    kvp_wbuf_free(&c->out);
    if (c->fd >= 0)
        close(c->fd);
    free(c);
}

/* Answers a frame that cannot be trusted; the caller closes the connection. */
static void reply_protocol_error(struct kvp_session *c, const struct kvp_header *h, int status,
                                 const char *what)
{
    snprintf(c->errmsg, sizeof(c->errmsg), "%s", what);
    kvp_session_reply(c, h, status, NULL, 0, 0);
    KVP_COUNT(protocol_errors, 1);
    log_warn_rl("Connection %llu (pid %d): %s; closing", (unsigned long long)c->id,
                (int)c->peer.pid, what);
}

/* Serves requests until the connection ends. Returns why it ended. */
static int conn_serve(struct kvp_session *c)
{
    uint8_t raw[KVP_HEADER_SIZE];
    struct kvp_header h;

    for (;;) {
        int rc = recv_header(c, raw);
        if (rc)
            return rc;
        rc = kvp_header_decode(raw, &h);
        if (rc == 0 && (h.opcode & KVP_REPLY_FLAG))
            rc = -EPROTO;
        if (rc) {
            reply_protocol_error(c, &h, rc,
                                 rc == -EPROTONOSUPPORT ? "unsupported protocol version"
                                                        : "malformed frame header");
            return rc;
        }
        /* From the end of the header: the body, the payload and the reply, not the idle wait. */
        uint64_t t0 = kvp_mono_ns();
        if (h.body_len > c->body_cap) {
            uint8_t *b = realloc(c->body, h.body_len);
            if (!b) {
                snprintf(c->errmsg, sizeof(c->errmsg), "out of memory for a %u-byte body",
                         h.body_len);
                kvp_session_reply(c, &h, -ENOMEM, NULL, 0, 0);
                return -ENOMEM;
            }
            c->body = b;
            c->body_cap = h.body_len;
        }
        rc = kvp_session_recv(c, c->body, h.body_len);
        if (rc)
            return rc;
        if (h.payload_len && h.opcode != KVP_OP_STORE_INLINE) {
            reply_protocol_error(c, &h, -EPROTO, "payload on a request that takes none");
            return -EPROTO;
        }
        kvp_wbuf_reset(&c->out);
        c->errmsg[0] = '\0';
        rc = kvp_handle_request(c, &h);
        kvp_latency_record(h.opcode, kvp_mono_ns() - t0);
        if (rc)
            return rc;
    }
}

void *kvp_session_main(void *arg)
{
    struct kvp_session *c = arg;
    struct kvp_server *s = c->srv;

    struct timeval tv = {.tv_sec = s->cfg.io_timeout_ms / 1000,
                         .tv_usec = (s->cfg.io_timeout_ms % 1000) * 1000};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));

    log_debug("Connection %llu opened (pid %d, uid %d)", (unsigned long long)c->id,
              (int)c->peer.pid, (int)c->peer.uid);
    int rc = conn_alloc_buffers(c);
    if (rc == 0)
        rc = conn_serve(c);
    else
        log_error_rl("Connection %llu: out of memory for connection buffers",
                     (unsigned long long)c->id);

    if (rc == -ETIMEDOUT)
        log_warn_rl("Connection %llu (pid %d) stalled mid-frame for more than %u ms; dropped",
                    (unsigned long long)c->id, (int)c->peer.pid, s->cfg.io_timeout_ms);
    else
        log_debug("Connection %llu closed (%s)", (unsigned long long)c->id, kvp_strerror(rc));

    /* Everything the client held is released now, not at a timeout. */
    kvp_holds_release_all(&c->holds, 0, true, KVP_DROP_DISCONNECT);
    kvp_registry_remove_owner(&s->registry, c->id);
    conn_leave(c);
    conn_free(c);
    return NULL;
}
