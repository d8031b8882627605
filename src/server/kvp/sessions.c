/*
 * sessions.c - the set of kvpool connections: joining it, a thread for each connection, the
 * request loop that reads a frame and dispatches it (handlers.c), and the end of a connection,
 * which releases its owner (owner.c): the holds and the instances it owns.
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
 * The set's list (under set->lock, a leaf lock) is kept here: a connection joins it before its
 * thread starts (the --max-clients check and the insertion are one step under the lock) and
 * leaves it as the last thing its thread does, so kvp_sessions_wait() can wait for an empty
 * list knowing that nothing of any connection is still running.
 *
 * The core reaches a connection only through its owner's callbacks (owner.h): "shared memory
 * lost" and "drop" both shut its socket down, from whichever thread found the event, under the
 * owners' lock; the connection's thread then sees EOF and ends it as usual, and the library
 * reconnects (registering again, inline, after a lost segment). So the socket must stay open
 * while the owner is listed: a connection's thread destroys (unlists) its owner before it
 * closes the socket, and clears the callbacks before it hands the socket to anyone else.
 */
#include "kvp/sessions.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
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
#include "kvp/latency.h"
#include "kvp/placement.h"
#include "kvp/refusals.h"
#include "kvp/session.h"

struct kvp_sessions {
    struct kvp_server *srv;
    struct kvp_refusals *refusals; /* takes connections that get no buffers, or NULL */
    uint32_t max;                  /* --max-clients */
    /* The options SIGHUP changes: stored by the main thread (kvp_sessions_configure), loaded
     * relaxed where they are used (each value is used on its own). */
    _Atomic uint32_t io_timeout_ms;
    atomic_bool follow_cpu;

    pthread_mutex_t lock; /* guards head and n (a leaf lock) */
    pthread_cond_t cv;    /* signalled when a connection leaves */
    struct kvp_session *head;
    uint32_t n;
};

int kvp_sessions_new(struct kvp_server *s, struct kvp_refusals *refusals, struct kvp_sessions **out)
{
    struct kvp_sessions *set = calloc(1, sizeof(*set));
    *out = NULL;
    if (!set)
        return -ENOMEM;
    set->srv = s;
    set->refusals = refusals;
    set->max = s->cfg.max_clients;
    atomic_init(&set->io_timeout_ms, s->cfg.io_timeout_ms);
    atomic_init(&set->follow_cpu, s->cfg.follow_cpu);
    pthread_mutex_init(&set->lock, NULL);
    pthread_cond_init(&set->cv, NULL);
    *out = set;
    return 0;
}

void kvp_sessions_free(struct kvp_sessions *set)
{
    if (!set)
        return;
    pthread_mutex_destroy(&set->lock);
    pthread_cond_destroy(&set->cv);
    free(set);
}

void kvp_sessions_configure(struct kvp_sessions *set, uint32_t io_timeout_ms, bool follow_cpu)
{
    atomic_store_explicit(&set->io_timeout_ms, io_timeout_ms, memory_order_relaxed);
    atomic_store_explicit(&set->follow_cpu, follow_cpu, memory_order_relaxed);
}

uint32_t kvp_sessions_count(struct kvp_sessions *set)
{
    pthread_mutex_lock(&set->lock);
    uint32_t n = set->n;
    pthread_mutex_unlock(&set->lock);
    return n;
}

/*
 * Both events end the connection: its socket is shut down, and its thread, seeing EOF, releases
 * the owner and leaves. Called under the owners' lock (owner.h), which keeps c and its socket
 * alive: the thread unlists the owner before it closes the socket or frees c.
 */
static void session_shut(struct kvp_owner *o)
{
    struct kvp_session *c = (struct kvp_session *)((char *)o - offsetof(struct kvp_session, owner));
    if (c->fd >= 0)
        shutdown(c->fd, SHUT_RDWR);
}

static const struct kvp_owner_ops session_ops = {
    /* The library reconnects and registers again, and is then given the inline transport. */
    .shm_lost = session_shut,
    .drop = session_shut,
};

/* Joins the set's list, unless --max-clients connections are there already. */
static struct kvp_session *conn_new(struct kvp_sessions *set, int fd, int *err)
{
    struct kvp_server *s = set->srv;
    struct kvp_session *c = calloc(1, sizeof(*c));
    if (!c) {
        *err = -ENOMEM;
        return NULL;
    }
    c->srv = s;
    c->set = set;
    c->fd = fd;
    c->cpu = -1;
    kvp_wbuf_init(&c->out);
    /* The owner (its id, peer and start time) before joining the list. */
    struct ucred peer;
    socklen_t len = sizeof(peer);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0)
        peer = (struct ucred){.pid = -1};
    kvp_owner_init(&c->owner, s, "kvpool", (int32_t)peer.pid, (uint32_t)peer.uid);
    kvp_owner_set_ops(&c->owner, &session_ops);

    pthread_mutex_lock(&set->lock);
    if (set->n >= set->max) {
        pthread_mutex_unlock(&set->lock);
        kvp_owner_destroy(&c->owner);
        free(c);
        *err = -EUSERS;
        return NULL;
    }
    c->next = set->head;
    if (set->head)
        set->head->prev = c;
    set->head = c;
    set->n++;
    pthread_mutex_unlock(&set->lock);
    return c;
}

/* Last step of a connection thread: leave the list and wake kvp_sessions_wait(). */
static void conn_leave(struct kvp_session *c)
{
    struct kvp_sessions *set = c->set;

    pthread_mutex_lock(&set->lock);
    if (c->prev)
        c->prev->next = c->next;
    else
        set->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    set->n--;
    pthread_cond_broadcast(&set->cv);
    pthread_mutex_unlock(&set->lock);
}

struct kvp_session *kvp_session_new(struct kvp_sessions *set, int fd)
{
    int err;
    return conn_new(set, fd, &err);
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

int kvp_session_spawn(struct kvp_sessions *set, int fd)
{
    int err = 0;
    struct kvp_session *c = conn_new(set, fd, &err);
    if (!c)
        return err;

    pthread_attr_t attr;
    pthread_t tid;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = fault("thread") ? EAGAIN : kvp_thread_create(&tid, &attr, kvp_session_main, c);
    pthread_attr_destroy(&attr);
    if (rc) {
        /* Unlisted first: from then on no callback reaches the socket, which the caller keeps. */
        kvp_owner_destroy(&c->owner);
        conn_leave(c);
        c->fd = -1;
        kvp_wbuf_free(&c->out);
        free(c);
        return -rc;
    }
    return 0;
}

void kvp_sessions_wait(struct kvp_sessions *set)
{
    if (!set)
        return;
    pthread_mutex_lock(&set->lock);
    while (set->n)
        pthread_cond_wait(&set->cv, &set->lock);
    pthread_mutex_unlock(&set->lock);
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
        kvp_placement_follow(c, h.flags >> KVP_REQ_CPU_SHIFT,
                             atomic_load_explicit(&c->set->follow_cpu, memory_order_relaxed));
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
    struct kvp_sessions *set = c->set;

    /* Changed by SIGHUP for connections opened after it. */
    uint32_t io_timeout_ms = atomic_load_explicit(&set->io_timeout_ms, memory_order_relaxed);
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
        /* Answered like any connection that is not served. The socket changes hands: no
         * callback may reach it once it is the refusals thread's. */
        kvp_owner_set_ops(&c->owner, NULL);
        int fd = c->fd;
        c->fd = -1;
        kvp_refusals_add(set->refusals, fd, -ENOMEM,
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
     * leaves the list: shutdown waits for that, then tears down what the owner uses. The owner
     * is unlisted before the socket closes (kvp_session_free), so no callback finds it closed. */
    kvp_owner_destroy(&c->owner);
    conn_leave(c);
    kvp_session_free(c);
    return NULL;
}
