/*
 * sessions.c - the set of client connections: accepting one into the server's list, its thread,
 * the request loop that reads a frame and dispatches it (handlers.c), and its end, which
 * releases its owner (owner.c): the holds and the instances it owns.
 *
 * Threading model: one thread per connection (bounded by --max-clients). A thread blocks only
 * on its own socket, so a worker streaming a 32 MiB inline chunk, or one that stops reading, never
 * delays another worker. Shared state is reached only through the store and the registry, each
 * behind its own leaf lock taken for metadata work only; the connection's own fields (buffers,
 * holds) are touched by this thread alone. Lock order: none is ever nested.
 *
 * Dropping a client releases its holds at once: reservations are aborted (never published) and
 * pins are released, then the instances it registered are unregistered. Framing errors (bad
 * header, undecodable body) are answered with an error reply and the connection is closed,
 * because the byte stream can no longer be trusted.
 *
 * The server's list of connections (s->conns, under s->conns_lock) is kept here: a connection
 * joins it before its thread starts (the --max-clients check and the insertion are one step
 * under the lock) and leaves it as the last thing its thread does, so kvp_sessions_close_all()
 * can wait for an empty list knowing that nothing of any connection is still running.
 */
#include "kvp/listener.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "common/errors.h"
#include "common/msg.h"
#include "core/daemon.h"
#include "core/stats.h"
#include "kvp/handlers.h"
#include "kvp/placement.h"
#include "kvp/refusals.h"
#include "kvp/session.h"

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
    c->cpu = -1;
    kvp_wbuf_init(&c->out);
    /* The owner (its id, peer and start time) before joining the list. */
    struct ucred peer;
    socklen_t len = sizeof(peer);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0)
        peer = (struct ucred){.pid = -1};
    kvp_owner_init(&c->owner, s, "kvpool", (int32_t)peer.pid, (uint32_t)peer.uid);

    pthread_mutex_lock(&s->conns_lock);
    if (s->nconns >= s->cfg.max_clients) {
        pthread_mutex_unlock(&s->conns_lock);
        kvp_owner_destroy(&c->owner);
        free(c);
        *err = -EUSERS;
        return NULL;
    }
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

/*
 * Injected failures, for the tests of what a connection that cannot be served is answered:
 * KVPOOL_FAULT_CONN=thread makes every connection's thread creation fail (EAGAIN), =memory
 * every connection's buffers (ENOMEM). Only in builds with KVP_FAULT_INJECTION (CMake option,
 * on by default; off for a release build that wants no such switch).
 */
static bool fault(const char *what)
{
#ifdef KVP_FAULT_INJECTION
    const char *v = getenv("KVPOOL_FAULT_CONN");
    return v && strcmp(v, what) == 0;
#else
    (void)what;
    return false;
#endif
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
    int rc = fault("thread") ? EAGAIN : kvp_thread_create(&tid, &attr, kvp_session_main, c);
    pthread_attr_destroy(&attr);
    if (rc) {
        conn_leave(c);
        c->fd = -1; /* the caller closes it */
        kvp_wbuf_free(&c->out);
        kvp_owner_destroy(&c->owner);
        free(c);
        return -rc;
    }
    return 0;
}

void kvp_sessions_drop(struct kvp_server *s, const uint64_t *ids, uint32_t n)
{
    pthread_mutex_lock(&s->conns_lock);
    for (struct kvp_session *c = s->conns; c; c = c->next)
        for (uint32_t i = 0; i < n; i++)
            if (c->owner.id == ids[i] && c->fd >= 0) {
                shutdown(c->fd, SHUT_RDWR);
                break;
            }
    pthread_mutex_unlock(&s->conns_lock);
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

/* Answers a frame that cannot be trusted; the caller closes the connection. */
static void reply_protocol_error(struct kvp_session *c, const struct kvp_header *h, int status,
                                 const char *what)
{
    snprintf(c->errmsg, sizeof(c->errmsg), "%s", what);
    kvp_session_reply(c, h, status, NULL, 0, 0);
    KVP_COUNT(protocol_errors, 1);
    log_warn_rl("Connection %llu (pid %d): %s; closing", (unsigned long long)c->owner.id,
                (int)c->owner.pid, what);
}

/*
 * Answers a request, without performing it, with the failure of an earlier commit that was sent
 * with KVP_REQ_NOREPLY (docs/PROTOCOL.md, "Pipelined commits").
 */
static int answer_deferred(struct kvp_session *c, const struct kvp_header *h)
{
    char more[48] = "";
    if (c->deferred_more)
        snprintf(more, sizeof(more), " (and %u later one(s))", c->deferred_more);
    snprintf(c->errmsg, sizeof(c->errmsg),
             "%s #%llu, sent without waiting for its reply, failed%s with %s: %.150s; this %s was "
             "not performed",
             kvp_opcode_name(c->deferred_opcode), (unsigned long long)c->deferred_id, more,
             kvp_err_name(c->deferred_status), c->deferred_msg, kvp_opcode_name(h->opcode));
    c->deferred_status = 0;
    c->deferred_more = 0;
    return kvp_session_reply(c, h, KVP_EPIPELINED, NULL, 0, 0);
}

/* Serves requests until the connection ends. Returns why it ended. */
static int conn_serve(struct kvp_session *c)
{
    uint8_t raw[KVP_HEADER_SIZE];
    struct kvp_header h;

    for (;;) {
        int rc = kvp_session_recv_header(c, raw);
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
        /* No reply is expected to a NOREPLY frame, so a wrong one cannot be answered in step:
         * close, as for any frame that cannot be trusted. */
        bool noreply = h.flags & KVP_REQ_NOREPLY;
        if ((h.flags & 0xffffu & ~KVP_REQ_KNOWN) ||
            (noreply && h.opcode != KVP_OP_COMMIT_STORE && h.opcode != KVP_OP_COMMIT_RETRIEVE)) {
            reply_protocol_error(c, &h, -EPROTO,
                                 "unknown request flags, or NOREPLY on a request "
                                 "that is not a commit");
            return -EPROTO;
        }
        kvp_placement_follow(c, h.flags >> KVP_REQ_CPU_SHIFT);
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
        c->noreply = noreply;
        if (c->deferred_status && !noreply && h.payload_len == 0)
            rc = answer_deferred(c, &h);
        else
            rc = kvp_handle_request(c, &h);
        c->noreply = false;
        kvp_latency_record(h.opcode, kvp_mono_ns() - t0);
        if (rc)
            return rc;
    }
}

void *kvp_session_main(void *arg)
{
    struct kvp_session *c = arg;
    kvp_thread_name("kvp-session");
    struct kvp_server *s = c->srv;

    /* Changed by SIGHUP for connections opened after it. */
    uint32_t io_timeout_ms = atomic_load_explicit(&s->io_timeout_ms, memory_order_relaxed);
    struct timeval tv = {.tv_sec = io_timeout_ms / 1000, .tv_usec = (io_timeout_ms % 1000) * 1000};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));

    log_debug("Connection %llu opened (pid %d, uid %d)", (unsigned long long)c->owner.id,
              (int)c->owner.pid, (int)c->owner.uid);
    int rc = fault("memory") ? -ENOMEM : kvp_session_alloc_buffers(c);
    if (rc == 0) {
        rc = conn_serve(c);
    } else {
        log_error_rl("Connection %llu: out of memory for connection buffers",
                     (unsigned long long)c->owner.id);
        /* Answered like any connection that is not served; the socket changes hands under
         * the lock that kvp_sessions_close_all() reads it with. */
        pthread_mutex_lock(&s->conns_lock);
        int fd = c->fd;
        c->fd = -1;
        pthread_mutex_unlock(&s->conns_lock);
        kvp_refusals_add(s->refusals, fd, -ENOMEM,
                         "kvpoold has no memory for this connection's buffers now");
    }

    if (rc == -ETIMEDOUT)
        log_warn_rl("Connection %llu (pid %d) stalled mid-frame for more than %u ms; dropped",
                    (unsigned long long)c->owner.id, (int)c->owner.pid, io_timeout_ms);
    else if (rc == -ENOTCONN)
        log_debug("Connection %llu closed by its client", (unsigned long long)c->owner.id);
    else
        log_debug("Connection %llu closed (%s)", (unsigned long long)c->owner.id, kvp_strerror(rc));

    /* Everything the client held is released now, not at a timeout, and before the connection
     * leaves the list: shutdown waits for that, then tears down what the owner uses. */
    kvp_owner_destroy(&c->owner);
    conn_leave(c);
    kvp_session_free(c);
    return NULL;
}
