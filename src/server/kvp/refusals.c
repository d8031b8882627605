/*
 * refusals.c - answering the connections the daemon will not or cannot serve, off the accept
 * loop.
 *
 * Design. A refused connection is owed one error reply (docs/PROTOCOL.md: every request is
 * answered), and a reply answers a request: its opcode and request id. The client library sends
 * HELLO as soon as it has connected, so the request is usually there by the time the
 * connection is accepted, and is answered at once, without blocking (MSG_DONTWAIT on both
 * sides). When it is not there yet, the connection is handed to this module's thread, which
 * waits for up to KVP_REFUSAL_WAIT_MS for it, for up to KVP_REFUSALS_MAX connections at once,
 * all in one poll(). Beyond that many the connection is closed unanswered: a peer that opens
 * connections and sends nothing only ever delays its own refusals, never the accept loop, so it
 * cannot lock allowed workers out.
 *
 * Threads: kvp_refusals_add() runs on the accept thread or a connection thread (a connection
 * that cannot get its buffers); the refusals thread owns the waiting connections. lock guards
 * the table of waiting connections: adders fill free entries, only the thread empties them, so
 * a descriptor the thread polls is never closed under it. A byte on the wake-up pipe tells it
 * that the table or the stop flag changed.
 */
#include "kvp/refusals.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "common/msg.h"
#include "common/wire.h"
#include "core/daemon.h"

struct refusal {
    int fd; /* -1: free entry */
    int status;
    uint64_t deadline_ms;
    char msg[160];
};

struct kvp_refusals {
    pthread_mutex_t lock;
    struct refusal waiting[KVP_REFUSALS_MAX];
    int wake[2];
    atomic_bool stop;
    pthread_t thread;
};

/*
 * Answers fd's first request with status and msg if its header has arrived. Returns 1 when
 * answered (or when the peer is gone or sent something that is not a request: nothing more to
 * wait for), 0 when the header is not complete yet. Never blocks.
 */
static int try_answer(int fd, int status, const char *msg)
{
    uint8_t raw[KVP_HEADER_SIZE], out[KVP_HEADER_SIZE];
    struct kvp_header h;

    ssize_t n = recv(fd, raw, sizeof(raw), MSG_PEEK | MSG_DONTWAIT);
    if (n < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : 1;
    if (n == 0)
        return 1; /* the peer is gone */
    if (n < (ssize_t)sizeof(raw))
        return 0; /* part of a header: the rest is on its way */
    if (kvp_header_decode(raw, &h) != 0)
        return 1;
    struct kvp_wbuf w;
    kvp_wbuf_init(&w);
    kvp_encode_error(&w, msg);
    kvp_reply_header_encode(&h, status, (uint32_t)w.len, 0, out);
    /* The socket's send buffer is empty: a reply this small fits it whole. */
    struct iovec iov[2] = {{out, sizeof(out)}, {w.data, w.len}};
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
    if (!w.err && sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
        log_debug("Cannot answer a refused connection: %s", strerror(errno));
    kvp_wbuf_free(&w);
    return 1;
}

/* Copies the descriptors to poll into p (wake-up pipe first) with the entries they belong to;
 * returns how many, and the time to the nearest deadline in *timeout_ms. Takes the lock. */
static nfds_t collect(struct kvp_refusals *r, struct pollfd *p, int *idx, int *timeout_ms)
{
    uint64_t now = kvp_mono_ms(), nearest = UINT64_MAX;
    nfds_t n = 1;

    p[0] = (struct pollfd){.fd = r->wake[0], .events = POLLIN};
    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < KVP_REFUSALS_MAX; i++) {
        if (r->waiting[i].fd < 0)
            continue;
        p[n] = (struct pollfd){.fd = r->waiting[i].fd, .events = POLLIN};
        idx[n++] = i;
        if (r->waiting[i].deadline_ms < nearest)
            nearest = r->waiting[i].deadline_ms;
    }
    pthread_mutex_unlock(&r->lock);
    *timeout_ms = nearest == UINT64_MAX ? -1 : nearest <= now ? 0 : (int)(nearest - now);
    return n;
}

static void *refusals_main(void *arg)
{
    struct kvp_refusals *r = arg;
    kvp_thread_name("kvp-refusals");
    struct pollfd p[KVP_REFUSALS_MAX + 1];
    int idx[KVP_REFUSALS_MAX + 1], timeout;
    char drain[64];

    while (!atomic_load(&r->stop)) {
        nfds_t n = collect(r, p, idx, &timeout);
        if (poll(p, n, timeout) < 0 && errno != EINTR)
            break;
        if (p[0].revents)
            while (read(r->wake[0], drain, sizeof(drain)) > 0)
                ;
        uint64_t now = kvp_mono_ms();
        for (nfds_t k = 1; k < n; k++) {
            /* Only this thread frees entries: the copy taken under the lock is still true. */
            struct refusal *e = &r->waiting[idx[k]];
            bool done = p[k].revents && try_answer(e->fd, e->status, e->msg);
            if (!done && now < e->deadline_ms)
                continue;
            close(e->fd);
            pthread_mutex_lock(&r->lock);
            e->fd = -1;
            pthread_mutex_unlock(&r->lock);
        }
    }
    return NULL;
}

int kvp_refusals_start(struct kvp_refusals **out)
{
    *out = NULL;
    struct kvp_refusals *r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    for (int i = 0; i < KVP_REFUSALS_MAX; i++)
        r->waiting[i].fd = -1;
    atomic_init(&r->stop, false);
    pthread_mutex_init(&r->lock, NULL);
    if (pipe2(r->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        int err = -errno;
        pthread_mutex_destroy(&r->lock);
        free(r);
        return err;
    }
    int rc = kvp_thread_create(&r->thread, NULL, refusals_main, r);
    if (rc) {
        close(r->wake[0]);
        close(r->wake[1]);
        pthread_mutex_destroy(&r->lock);
        free(r);
        return -rc;
    }
    *out = r;
    return 0;
}

void kvp_refusals_add(struct kvp_refusals *r, int fd, int status, const char *msg)
{
    if (try_answer(fd, status, msg) || !r) {
        close(fd);
        return;
    }
    int i = 0;
    pthread_mutex_lock(&r->lock);
    while (i < KVP_REFUSALS_MAX && r->waiting[i].fd >= 0)
        i++;
    if (i < KVP_REFUSALS_MAX) {
        struct refusal *e = &r->waiting[i];
        e->fd = fd;
        e->status = status;
        e->deadline_ms = kvp_mono_ms() + KVP_REFUSAL_WAIT_MS;
        snprintf(e->msg, sizeof(e->msg), "%s", msg);
    }
    pthread_mutex_unlock(&r->lock);
    if (i == KVP_REFUSALS_MAX) {
        log_warn_rl("%d refused connections are waiting for their first request already; "
                    "closing another one without an answer",
                    KVP_REFUSALS_MAX);
        close(fd);
        return;
    }
    ssize_t w = write(r->wake[1], "x", 1);
    (void)w; /* a full pipe has woken the thread already */
}

void kvp_refusals_stop(struct kvp_refusals *r)
{
    if (!r)
        return;
    atomic_store(&r->stop, true);
    ssize_t w = write(r->wake[1], "x", 1);
    (void)w;
    pthread_join(r->thread, NULL);
    for (int i = 0; i < KVP_REFUSALS_MAX; i++)
        if (r->waiting[i].fd >= 0)
            close(r->waiting[i].fd);
    close(r->wake[0]);
    close(r->wake[1]);
    pthread_mutex_destroy(&r->lock);
    free(r);
}
