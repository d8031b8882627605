/*
 * listener.c - the LMCache front end's ZeroMQ ROUTER and its one thread (see listener.h).
 *
 * Framing (LMCache's transport/zmq_impl/mq.py): a request arrives as [identity][uid][op]
 * [payload...], DEALER to ROUTER without a delimiter frame; the reply is [identity][uid][op]
 * [value], uid and op echoed byte for byte, or the three frames alone for a None reply. Every
 * request of three frames or more is answered exactly once (handlers.c decides what); a message
 * of fewer than three frames cannot be answered and is dropped (counted, logged at a limited
 * rate).
 *
 * Streams. LMCache 0.5.7's subscribe_kv_events opens a stream: the reply is its first value, and
 * the worker answers each value with a control message, [identity][uid][""]["ack"] (send the
 * next) or ["cancel"] (stop); [identity][uid][op] without a value ends the stream from the
 * server's side. kvpoold's only stream answers one value (kvpoold records no KV events), so the
 * listener keeps the frames of each open stream (struct open_stream) and sends that end when
 * the worker's ack or cancel arrives, and never before: a worker whose stream ends before it
 * has acknowledged the value drops the value and subscribes again a second later, forever. The
 * table is bounded (MAX_STREAMS, STREAMS_PER_PEER per identity): a stream pushed out of it is
 * ended at once. The cancel of a stream that is over needs nothing; any other control message
 * of no open stream is dropped (counted).
 *
 * Thread: one thread owns the socket (ZeroMQ sockets are not thread-safe) and serves every
 * request itself, in arrival order, so requests of one peer are handled first in, first out,
 * as LMCache's affinity pool does for a worker's prepare/commit pairs, and a commit is always
 * applied before the same worker's next prepare. Nothing in a request blocks: the operations
 * take the core's leaf locks around metadata only, the workers copy the bytes themselves. The
 * thread waits in zmq_poll() on the socket and on an eventfd that lmc_listener_close() writes.
 *
 * Sending never blocks either (ZMQ_DONTWAIT). ZMQ_ROUTER_MANDATORY makes a reply to a peer that
 * has gone fail with EHOSTUNREACH instead of vanishing; such a reply, and one refused because
 * the peer stopped reading (its queue is full), is counted and logged, never retried.
 *
 * What one peer can make the daemon hold (docs/SECURITY.md):
 *   - Replies it does not read. Every value frame of SMALL_VALUE bytes or more is a message of
 *     ours (reply_alloc()) counted, until libzmq frees it (sent or dropped with its peer), in
 *     the total and in the peer's slot of PEER_SLOTS (by lmc_front.peer: peers that share a
 *     slot share its budget). While the peer has a quarter of --lmcache-reply-memory unread,
 *     or all peers together the whole of it, its prepares (the operations whose replies can be
 *     large) are answered negatively before they reserve or pin anything: counted
 *     (lmcache_replies_refused), logged at a limited rate. Smaller replies are at most SND_HWM
 *     per peer (ZMQ_SNDHWM; beyond, a reply is lost and counted). So replies hold at most
 *     --lmcache-reply-memory plus one reply, plus SND_HWM small ones per connection.
 *   - Connections. libzmq has no limit of its own, so every connection's handshake asks this
 *     thread (ZAP, RFC 27, with the NULL mechanism: no credentials, only the question), which
 *     counts the connections open from the socket's monitor events (accepted, disconnected, by
 *     descriptor) and refuses one beyond --lmcache-max-connections: libzmq closes it at once,
 *     counted (lmcache_connections_refused) and logged at a limited rate. Those descriptors
 *     are in the limit start-up raises (server.c), with LMC_FD_SLACK for connections being
 *     closed, so LMCache peers never take the descriptors of the other front ends, and the
 *     accept loop of libzmq never meets EMFILE (on which it would spin). A peer that never
 *     completes the handshake is closed after HANDSHAKE_MS.
 *   - Requests it sends. A frame larger than --lmcache-max-message (by default the largest
 *     legal frame: a commit's pickle of a pool's worth of chunks, lmc_max_value_frame(), or a
 *     key of KVP_MAX_TOKENS token ids, whichever is larger) makes libzmq drop the connection
 *     as soon as the frame's header says so (ZMQ_MAXMSGSIZE); at most RCV_HWM whole messages
 *     per connection wait to be served (ZMQ_RCVHWM: beyond, libzmq stops reading from it). So
 *     incoming messages hold at most --lmcache-max-connections x (RCV_HWM + 1) x that size.
 *
 * Who connects: on ipc:// the socket file has kvpool's socket mode, and the credentials of every
 * connection are checked as on kvpool's own socket (set_peer_filters()); on tcp:// anyone who
 * reaches the address (docs/SECURITY.md).
 *
 * A pickle retrieve's reply value is written by the encoder into a ZeroMQ message of its exact
 * size (lmc_front.value_alloc): the chunks are copied once, from the pool into the message,
 * which ZeroMQ then sends without another copy.
 *
 * Those messages come from malloc(), and a commit's or a retrieve's is as large as its chunks.
 * glibc serves a request above its mmap threshold (32 MiB at most) with a fresh mapping and
 * unmaps it on free(), so every 32 MiB chunk cost 8192 page faults and an munmap (a profile of
 * the daemon during 32 MiB pickle commits: a third of its time in the fault path of ZeroMQ's
 * I/O thread). keep_freed_memory() makes the process reuse such buffers instead: no malloc() is
 * served by a mapping of its own, and the heap's free top is returned to the kernel only past
 * TRIM_BYTES. Memory then stays at the high-water mark of messages in flight.
 */
#include "lmc/listener.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include "base/listen_addr.h"
#include "base/log.h"
#include "common/errors.h"
#include "common/socket_path.h"
#include "core/daemon.h"
#include "core/stats.h"
#include "lmc/front.h"
#include "lmc/latency.h"

/* Frames kept of one message: identity, uid, op and LMC_MAX_PAYLOADS payloads. */
#define MAX_FRAMES (3 + LMC_MAX_PAYLOADS)
/* Requests served before the thread looks at the wake-up descriptor and the timers again. */
#define BATCH 64
/* Free memory at the top of a heap kept for reuse before the rest goes back to the kernel. */
#define TRIM_BYTES (256 << 20)
/* Reply budgets by peer: slots of lmc_front.peer. */
#define PEER_SLOTS 4096u
/* Value frames from this size on are counted against --lmcache-reply-memory. */
#define SMALL_VALUE 1024u
/* Messages queued per connection: replies not sent, requests not served. */
#define SND_HWM 256
#define RCV_HWM 8
/* Open streams kept (see the top), in all and per routing identity. */
#define MAX_STREAMS 256u
#define STREAMS_PER_PEER 4u
/* A connection that has not finished its handshake by then is closed. */
#define HANDSHAKE_MS 3000
/* Where libzmq asks whether to accept a connection (RFC 27), and where the socket's monitor
 * reports connections. */
#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_DOMAIN "kvpool-lmcache"
#define MONITOR_ENDPOINT "inproc://kvpool-lmcache-monitor"

/* The frames that end an open stream: [identity][uid][op], as its request had them. */
struct open_stream {
    uint64_t seq; /* order of opening; 0: a free entry */
    uint8_t id_len, uid_len, op_len;
    uint8_t id[255]; /* a ZeroMQ routing identity is 1 to 255 bytes */
    uint8_t uid[16]; /* a msgpack int: 9 bytes at most */
    uint8_t op[64];  /* "subscribe_kv_events" as a msgpack str: 20 bytes */
};

struct lmc_listener {
    struct kvp_server *srv;
    struct kvp_lmc_addr addr;
    char url[300];
    void *zctx, *router;
    int wake_fd;
    pthread_t thread;
    bool started;
    atomic_bool stop;
    bool ipc_bound; /* the ipc socket file is ours ... */
    dev_t ipc_dev;  /* ... as long as it is this inode */
    ino_t ipc_ino;
    struct lmc_front front;
    bool front_ready;
    zmq_msg_t value; /* the reply's value when the front end asked for it (value_alloc) */

    /* Connections (the listener thread's): ZAP handler, monitor, open descriptors, and the
     * monitor's event counts that tell the handshaking connections from the established
     * ones (established_conns()). */
    void *zap, *monitor;
    uint8_t *fd_open; /* bitmap by descriptor: open connections */
    uint32_t fd_bits;
    uint64_t open, accepted, settled, succeeded, approved;

    /* Open streams (the listener thread's). */
    struct open_stream streams[MAX_STREAMS];
    uint64_t stream_seq;

    /* Replies not sent yet (reply_alloc()), in bytes: decremented by libzmq's I/O thread. */
    uint64_t reply_limit, peer_limit;
    _Atomic uint64_t queued;
    _Atomic uint64_t peer_queued[PEER_SLOTS];
};

/* A reply value of ours: counted until libzmq frees it. */
struct reply_buf {
    struct lmc_listener *l;
    uint64_t size;
    uint32_t slot;
    uint8_t data[];
};

/* libzmq's free function of a reply_buf message (its I/O thread, or ours). */
static void reply_free(void *data, void *hint)
{
    struct reply_buf *b = hint;
    (void)data;
    atomic_fetch_sub_explicit(&b->l->queued, b->size, memory_order_relaxed);
    atomic_fetch_sub_explicit(&b->l->peer_queued[b->slot], b->size, memory_order_relaxed);
    free(b);
}

/* l->value becomes a counted message of size bytes for the request's peer; its data, or NULL. */
static uint8_t *reply_alloc(struct lmc_listener *l, size_t size)
{
    zmq_msg_close(&l->value);
    zmq_msg_init(&l->value);
    struct reply_buf *b = malloc(sizeof(*b) + size);
    if (!b)
        return NULL;
    *b = (struct reply_buf){.l = l, .size = size, .slot = (uint32_t)(l->front.peer % PEER_SLOTS)};
    if (zmq_msg_init_data(&l->value, b->data, size, reply_free, b)) {
        free(b);
        zmq_msg_init(&l->value);
        return NULL;
    }
    atomic_fetch_add_explicit(&l->queued, size, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->peer_queued[b->slot], size, memory_order_relaxed);
    return b->data;
}

/* Whether the request's peer, or all peers, have their part of --lmcache-reply-memory unread:
 * then its prepares are refused. */
static bool replies_full(struct lmc_listener *l, uint64_t *mine, uint64_t *all)
{
    *mine = atomic_load_explicit(&l->peer_queued[l->front.peer % PEER_SLOTS], memory_order_relaxed);
    *all = atomic_load_explicit(&l->queued, memory_order_relaxed);
    return *mine >= l->peer_limit || *all >= l->reply_limit;
}

/* lmc_front.value_alloc: the value frame as a ZeroMQ message of size bytes. */
static uint8_t *value_alloc(struct lmc_front *f, size_t size)
{
    return reply_alloc(f->value_ctx, size);
}

/* Large messages reuse freed heap memory instead of fresh mappings (see the top). */
static void keep_freed_memory(void)
{
    if (!mallopt(M_MMAP_MAX, 0) || !mallopt(M_TRIM_THRESHOLD, TRIM_BYTES))
        log_warn("The LMCache front end cannot tune malloc: large messages will be slower");
}

/* The rules of kvpool's own socket for an ipc:// path: a private directory, no live socket
 * and nothing else at the path (libzmq would unlink whatever is there). */
static int check_ipc_path(const char *path)
{
    char dir[sizeof(((struct kvp_lmc_addr *)0)->path)], why[512];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        slash[1] = '\0';
    else
        *slash = '\0';
    int rc = kvp_socket_dir_check(dir, geteuid(), why, sizeof(why));
    if (rc) {
        log_error("%s: the LMCache socket %s: %s",
                  rc == -EPERM ? "Refusing to start" : "Cannot start", path, why);
        return rc;
    }
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            log_error("Refusing to start: %s exists and is not a socket (--lmcache)", path);
            return -EEXIST;
        }
        if (kvp_socket_answers(path)) {
            log_error("Refusing to start: something is listening on %s (--lmcache)", path);
            return -EADDRINUSE;
        }
        unlink(path);
    }
    return 0;
}

/*
 * The peer-credential policy of kvpool's own socket on an ipc:// socket, through libzmq's IPC
 * filters (SO_PEERCRED at accept): the daemon's user, --allow-uid, and --allow-gid (the peer's
 * primary group, or a group that lists the peer's user name in the group database). libzmq
 * closes any other connection at once, unanswered. Set before bind; a reload does not change
 * them. Returns 0 or a negative errno.
 */
static int set_peer_filters(void *router, const struct kvp_config *cfg)
{
    uid_t uid = geteuid();
    if (zmq_setsockopt(router, ZMQ_IPC_FILTER_UID, &uid, sizeof(uid)))
        return -errno;
    for (uint32_t i = 0; i < cfg->n_allow_uids; i++) {
        uid = (uid_t)cfg->allow_uids[i];
        if (zmq_setsockopt(router, ZMQ_IPC_FILTER_UID, &uid, sizeof(uid)))
            return -errno;
    }
    for (uint32_t i = 0; i < cfg->n_allow_gids; i++) {
        gid_t gid = (gid_t)cfg->allow_gids[i];
        if (zmq_setsockopt(router, ZMQ_IPC_FILTER_GID, &gid, sizeof(gid)))
            return -errno;
    }
    return 0;
}

/* The largest message accepted: --lmcache-max-message, and never more than the largest legal
 * one (a commit may carry a pool's worth of pickled chunks; a key at most KVP_MAX_TOKENS token
 * ids of 5 bytes each, plus its other fields). */
static uint64_t lmc_max_message(const struct kvp_config *cfg)
{
    uint64_t value = lmc_max_value_frame(cfg->l1_size);
    uint64_t key = (uint64_t)KVP_MAX_TOKENS * 5 + (1 << 20);
    uint64_t most = value > key ? value : key;
    return cfg->lmcache_max_msg && cfg->lmcache_max_msg < most ? cfg->lmcache_max_msg : most;
}

/* The ZAP handler and the monitor of the router's connections (see the top), made before the
 * router binds, so that no connection is ever accepted without them. */
static int open_gatekeeping(struct lmc_listener *l)
{
    struct rlimit rl;
    l->fd_bits = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
                         rl.rlim_cur < (1u << 24)
                     ? (uint32_t)rl.rlim_cur
                     : 1u << 24;
    l->fd_open = calloc(l->fd_bits / 8 + 1, 1);
    if (!l->fd_open)
        return -ENOMEM;
    l->zap = zmq_socket(l->zctx, ZMQ_REP);
    if (!l->zap || zmq_bind(l->zap, ZAP_ENDPOINT))
        return -errno;
    if (zmq_socket_monitor(l->router, MONITOR_ENDPOINT,
                           ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED |
                               ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH))
        return -errno;
    l->monitor = zmq_socket(l->zctx, ZMQ_PAIR);
    if (!l->monitor || zmq_connect(l->monitor, MONITOR_ENDPOINT))
        return -errno;
    return 0;
}

static int bind_router(struct lmc_listener *l)
{
    const struct kvp_config *cfg = &l->srv->cfg;
    int one = 1, zero = 0, sndhwm = SND_HWM, rcvhwm = RCV_HWM, handshake = HANDSHAKE_MS;
    int64_t maxmsg = (int64_t)lmc_max_message(cfg);

    if (zmq_setsockopt(l->router, ZMQ_ROUTER_MANDATORY, &one, sizeof(one)) ||
        zmq_setsockopt(l->router, ZMQ_LINGER, &zero, sizeof(zero)) ||
        zmq_setsockopt(l->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg)) ||
        zmq_setsockopt(l->router, ZMQ_SNDHWM, &sndhwm, sizeof(sndhwm)) ||
        zmq_setsockopt(l->router, ZMQ_RCVHWM, &rcvhwm, sizeof(rcvhwm)) ||
        zmq_setsockopt(l->router, ZMQ_HANDSHAKE_IVL, &handshake, sizeof(handshake)) ||
        zmq_setsockopt(l->router, ZMQ_ZAP_DOMAIN, ZAP_DOMAIN, strlen(ZAP_DOMAIN)))
        return -errno;
    if (!l->addr.ipc && l->addr.host[0] == '[' &&
        zmq_setsockopt(l->router, ZMQ_IPV6, &one, sizeof(one)))
        return -errno;
    if (l->addr.ipc) {
        int rc = check_ipc_path(l->addr.path);
        if (rc)
            return rc;
        rc = set_peer_filters(l->router, cfg);
        if (rc)
            return rc;
        mode_t old = umask(0777 & ~cfg->socket_mode);
        rc = zmq_bind(l->router, l->url);
        int err = errno;
        umask(old);
        if (rc) {
            log_error("Cannot start: cannot bind the LMCache socket %s: %s", l->url,
                      zmq_strerror(err));
            return -err;
        }
        struct stat st;
        if (stat(l->addr.path, &st) == 0) {
            l->ipc_bound = true;
            l->ipc_dev = st.st_dev;
            l->ipc_ino = st.st_ino;
        }
        if (chmod(l->addr.path, cfg->socket_mode) != 0)
            log_warn("Cannot set mode %o on %s: %s", cfg->socket_mode, l->addr.path,
                     kvp_strerror(-errno));
        return 0;
    }
    if (zmq_bind(l->router, l->url)) {
        int err = errno;
        log_error("Cannot start: cannot bind the LMCache front end to %s: %s", l->url,
                  zmq_strerror(err));
        return -err;
    }
    return 0;
}

/* Closes every socket of l and the context (NULL ones skipped). */
static void close_sockets(struct lmc_listener *l)
{
    if (l->router && l->monitor)
        zmq_socket_monitor(l->router, NULL, 0);
    if (l->monitor)
        zmq_close(l->monitor);
    if (l->zap)
        zmq_close(l->zap);
    if (l->router)
        zmq_close(l->router);
    if (l->zctx)
        zmq_ctx_term(l->zctx);
    free(l->fd_open);
}

int lmc_listener_open(struct kvp_server *s, struct lmc_listener **out)
{
    struct lmc_listener *l = calloc(1, sizeof(*l));
    sigset_t old;
    int rc;

    *out = NULL;
    if (!l)
        return -ENOMEM;
    l->srv = s;
    l->wake_fd = -1;
    zmq_msg_init(&l->value);
    if (kvp_lmc_addr_parse(s->cfg.lmcache, &l->addr)) {
        log_error("Cannot start: invalid --lmcache address %s", s->cfg.lmcache);
        free(l);
        return -EINVAL;
    }
    /* localhost as 127.0.0.1: ZeroMQ takes a name for an interface's. */
    snprintf(l->url, sizeof(l->url), "%s", l->addr.url);
    l->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (l->wake_fd < 0) {
        rc = -errno;
        log_error("Cannot start: eventfd: %s", kvp_strerror(rc));
        goto out_free;
    }
    keep_freed_memory();
    /* libzmq starts its I/O thread here: it must not take the stop signals. */
    kvp_stop_signals_block(&old);
    l->zctx = zmq_ctx_new();
    l->router = l->zctx ? zmq_socket(l->zctx, ZMQ_ROUTER) : NULL;
    kvp_stop_signals_restore(&old);
    if (!l->router) {
        rc = -errno;
        log_error("Cannot start: cannot create the LMCache front end's socket: %s",
                  zmq_strerror(-rc));
        goto out_close;
    }
    rc = open_gatekeeping(l);
    if (rc) {
        log_error("Cannot start: cannot set up the LMCache front end's connection checks: %s",
                  rc == -ENOMEM ? "out of memory" : zmq_strerror(-rc));
        goto out_close;
    }
    rc = bind_router(l);
    if (rc)
        goto out_close;
    /* Default: a quarter of the pool, at least 64 MiB (--help). */
    l->reply_limit = s->cfg.lmcache_reply_mem ? s->cfg.lmcache_reply_mem : s->cfg.l1_size / 4;
    if (!s->cfg.lmcache_reply_mem && l->reply_limit < (64ull << 20))
        l->reply_limit = 64ull << 20;
    l->peer_limit = l->reply_limit / 4;
    if (!l->addr.ipc && !l->addr.loopback)
        log_warn("The LMCache front end listens on %s, which is not a loopback address: "
                 "LMCache's protocol has no authentication, so whoever reaches that port can "
                 "read and write every chunk (docs/SECURITY.md; ipc:// is safer)",
                 l->url);
    *out = l;
    return 0;

out_close:
    close_sockets(l);
    close(l->wake_fd);
out_free:
    free(l);
    return rc;
}

/* Receives one whole message (nonblocking). Returns the number of frames received (frames
 * beyond MAX_FRAMES are counted, not kept), 0 when none is waiting, or -1 on error. */
static int recv_message(struct lmc_listener *l, zmq_msg_t *m, uint32_t *nkept)
{
    int total = 0;
    *nkept = 0;
    for (;;) {
        zmq_msg_t tmp;
        zmq_msg_t *dst = *nkept < MAX_FRAMES ? &m[*nkept] : &tmp;
        zmq_msg_init(dst);
        if (zmq_msg_recv(dst, l->router, total == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            int err = errno;
            zmq_msg_close(dst);
            if (total == 0 && err == EAGAIN)
                return 0;
            if (err != ETERM)
                log_warn_rl("LMCache front end: receiving a message failed: %s", zmq_strerror(err));
            return -1;
        }
        total++;
        bool more = zmq_msg_more(dst);
        if (dst == &tmp)
            zmq_msg_close(&tmp);
        else
            (*nkept)++;
        if (!more)
            return total;
    }
}

static int send_frame(struct lmc_listener *l, const void *p, size_t n, bool more)
{
    return zmq_send(l->router, p, n, ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0)) < 0 ? -errno : 0;
}

/* Sends [identity][uid][op] and, when has_value, the value in l->front.out. */
static void send_reply(struct lmc_listener *l, zmq_msg_t *m, const struct lmc_req *r,
                       bool has_value)
{
    struct lmc_mp_writer *w = &l->front.out;
    int rc = send_frame(l, zmq_msg_data(&m[0]), zmq_msg_size(&m[0]), true);
    if (rc == 0) {
        /* Once the first frame is queued, ZeroMQ takes the rest of the message. */
        send_frame(l, zmq_msg_data(&m[1]), zmq_msg_size(&m[1]), true);
        send_frame(l, r->op_frame, r->op_len, has_value);
        if (has_value && !l->front.value_external && w->len >= SMALL_VALUE) {
            /* Counted against --lmcache-reply-memory like the large values. */
            uint8_t *v = reply_alloc(l, w->len);
            if (v) {
                memcpy(v, w->buf, w->len);
                l->front.value_external = true;
            }
        }
        if (has_value && l->front.value_external) {
            if (zmq_msg_send(&l->value, l->router, ZMQ_DONTWAIT) < 0)
                log_warn_rl("LMCache front end: sending a reply of %zu bytes failed: %s",
                            zmq_msg_size(&l->value), zmq_strerror(errno));
        } else if (has_value) {
            send_frame(l, w->buf, w->len, false);
        }
        return;
    }
    KVP_COUNT(lmcache_replies_lost, 1);
    log_warn_rl("LMCache front end: the reply to %s was lost: %s", lmc_op_name(r->op),
                rc == -EHOSTUNREACH ? "its client has gone"
                : rc == -EAGAIN     ? "its client does not read its replies"
                                    : zmq_strerror(-rc));
}

/* The entry of the stream whose request came from identity id with uid frame uid, or NULL. */
static struct open_stream *stream_find(struct lmc_listener *l, zmq_msg_t *id, zmq_msg_t *uid)
{
    for (uint32_t i = 0; i < MAX_STREAMS; i++) {
        struct open_stream *o = &l->streams[i];
        if (o->seq && o->id_len == zmq_msg_size(id) && o->uid_len == zmq_msg_size(uid) &&
            memcmp(o->id, zmq_msg_data(id), o->id_len) == 0 &&
            memcmp(o->uid, zmq_msg_data(uid), o->uid_len) == 0)
            return o;
    }
    return NULL;
}

/* Ends stream o from the server's side ([identity][uid][op], no value) and forgets it. */
static void stream_end(struct lmc_listener *l, struct open_stream *o)
{
    if (send_frame(l, o->id, o->id_len, true) == 0) {
        send_frame(l, o->uid, o->uid_len, true);
        send_frame(l, o->op, o->op_len, false);
    } else {
        log_debug("LMCache front end: the end of a stream was not delivered (its client has "
                  "gone)");
    }
    o->seq = 0;
}

/* Keeps the frames of the stream request r opened, ending the oldest stream of the same
 * identity, or of all, to make room. */
static void stream_open(struct lmc_listener *l, zmq_msg_t *m, const struct lmc_req *r)
{
    size_t id_len = zmq_msg_size(&m[0]), uid_len = zmq_msg_size(&m[1]);
    struct open_stream *o = stream_find(l, &m[0], &m[1]);
    if (!o && (id_len > sizeof(o->id) || uid_len > sizeof(o->uid) || r->op_len > sizeof(o->op))) {
        /* No real client sends such frames; LMCache's worker cancels the stream itself. */
        log_debug("LMCache front end: a stream with frames too long to keep is not ended");
        return;
    }
    if (!o) {
        struct open_stream *free_slot = NULL, *oldest = NULL, *mine = NULL;
        uint32_t nmine = 0;
        for (uint32_t i = 0; i < MAX_STREAMS; i++) {
            struct open_stream *e = &l->streams[i];
            if (!e->seq) {
                if (!free_slot)
                    free_slot = e;
                continue;
            }
            if (!oldest || e->seq < oldest->seq)
                oldest = e;
            if (e->id_len == id_len && memcmp(e->id, zmq_msg_data(&m[0]), id_len) == 0) {
                nmine++;
                if (!mine || e->seq < mine->seq)
                    mine = e;
            }
        }
        if (nmine >= STREAMS_PER_PEER) {
            stream_end(l, mine);
            o = mine;
        } else if (free_slot) {
            o = free_slot;
        } else {
            log_warn_rl("LMCache front end: %u event streams are open; ending the oldest",
                        MAX_STREAMS);
            stream_end(l, oldest);
            o = oldest;
        }
    }
    o->seq = ++l->stream_seq;
    o->id_len = (uint8_t)id_len;
    o->uid_len = (uint8_t)uid_len;
    o->op_len = (uint8_t)r->op_len;
    memcpy(o->id, zmq_msg_data(&m[0]), id_len);
    memcpy(o->uid, zmq_msg_data(&m[1]), uid_len);
    memcpy(o->op, r->op_frame, r->op_len);
}

/* A stream control message ([identity][uid][""][action]): the worker's ack or cancel of an open
 * stream ends it (see the top). A cancel of a stream that is over needs nothing (LMCache's worker
 * cancels the stream it has read to the end); anything else is dropped. */
static void serve_control(struct lmc_listener *l, zmq_msg_t *m, uint32_t nkept, int total)
{
    struct open_stream *o = stream_find(l, &m[0], &m[1]);
    bool ack = total == 4 && nkept == 4 && zmq_msg_size(&m[3]) == 3 &&
               memcmp(zmq_msg_data(&m[3]), "ack", 3) == 0;
    bool cancel = total == 4 && nkept == 4 && zmq_msg_size(&m[3]) == 6 &&
                  memcmp(zmq_msg_data(&m[3]), "cancel", 6) == 0;
    if (o && (ack || cancel)) {
        log_debug("LMCache front end: a stream's %s: ended", ack ? "ack" : "cancel");
        stream_end(l, o);
        return;
    }
    if (cancel) {
        log_debug("LMCache front end: the cancel of a stream that is over");
        return;
    }
    KVP_COUNT(lmcache_dropped, 1);
    log_debug("LMCache front end: ignored a stream control message (%s)",
              o ? "neither ack nor cancel" : "no such stream open");
}

static void serve_message(struct lmc_listener *l, zmq_msg_t *m, uint32_t nkept, int total)
{
    uint64_t t0 = kvp_mono_ns();
    struct lmc_req r;
    memset(&r, 0, sizeof(r));
    if (total < 3) {
        KVP_COUNT(lmcache_dropped, 1);
        log_warn_rl("LMCache front end: dropped a message of %d frame%s (a request has at least "
                    "3: identity, uid, operation)",
                    total, total == 1 ? "" : "s");
        return;
    }
    r.op_frame = zmq_msg_data(&m[2]);
    r.op_len = zmq_msg_size(&m[2]);
    if (r.op_len == 0) {
        /* LMCache's stream control (ack, cancel) of an event stream. */
        serve_control(l, m, nkept, total);
        return;
    }
    r.op = lmc_op_decode(r.op_frame, r.op_len, r.name, sizeof(r.name));
    r.npayloads = (uint32_t)total - 3;
    for (uint32_t i = 0; i + 3 < nkept; i++) {
        r.p[i] = zmq_msg_data(&m[3 + i]);
        r.n[i] = zmq_msg_size(&m[3 + i]);
    }
    l->front.now_ms = kvp_mono_ms();
    l->front.peer = lmc_peer_of(&l->front, zmq_msg_data(&m[0]), zmq_msg_size(&m[0]));
    lmc_mp_writer_reset(&l->front.out);
    l->front.value_external = false;
    l->front.stream_opened = false;
    l->front.outcome[0] = '\0';
    bool has_value;
    uint64_t mine, all;
    if ((r.op == LMC_OP_PREPARE_STORE || r.op == LMC_OP_PREPARE_RETRIEVE) &&
        replies_full(l, &mine, &all)) {
        /* Refused before it reserves or pins anything (see the top). */
        KVP_COUNT(lmcache_requests, 1);
        KVP_COUNT(lmcache_replies_refused, 1);
        log_warn_rl("LMCache front end: a %s answered negatively: %s has %" PRIu64 " bytes of "
                    "replies unread (at most %" PRIu64 " for one client, %" PRIu64
                    " for all: --lmcache-reply-memory)",
                    lmc_op_name(r.op), mine >= l->peer_limit ? "its client" : "every client",
                    mine >= l->peer_limit ? mine : all, l->peer_limit, l->reply_limit);
        has_value = lmc_encode_negative(&l->front.out, r.op);
    } else {
        has_value = lmc_dispatch(&l->front, &r);
    }
    if (has_value && l->front.out.failed) {
        /* Out of memory for the reply: the negative one is a few bytes. */
        lmc_mp_writer_reset(&l->front.out);
        l->front.value_external = false;
        has_value = lmc_encode_negative(&l->front.out, r.op) && !l->front.out.failed;
    }
    log_debug("LMCache %s (%u payload%s): %s", r.op != LMC_OP_UNKNOWN ? lmc_op_name(r.op) : r.name,
              r.npayloads, r.npayloads == 1 ? "" : "s",
              l->front.outcome[0] ? l->front.outcome : "answered");
    send_reply(l, m, &r, has_value);
    if (has_value && l->front.stream_opened)
        stream_open(l, m, &r);
    /* Sent (emptied by ZeroMQ) or not: the value message is done with. */
    zmq_msg_close(&l->value);
    zmq_msg_init(&l->value);
    if (r.op != LMC_OP_UNKNOWN)
        kvp_lmc_latency_record((unsigned)r.op, lmc_op_name(r.op), kvp_mono_ns() - t0);
}

/* Marks descriptor fd open or closed; returns whether it was open. */
static bool fd_mark(struct lmc_listener *l, int64_t fd, bool open)
{
    if (fd < 0 || (uint64_t)fd >= l->fd_bits)
        return false;
    uint8_t bit = (uint8_t)(1u << (fd % 8));
    bool was = l->fd_open[fd / 8] & bit;
    if (open)
        l->fd_open[fd / 8] |= bit;
    else
        l->fd_open[fd / 8] &= (uint8_t)~bit;
    return was;
}

/* Reads every event the monitor has queued: the count of open connections. */
static void drain_monitor(struct lmc_listener *l)
{
    for (;;) {
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, l->monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        uint16_t id = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&ev) >= 6) {
            memcpy(&id, zmq_msg_data(&ev), sizeof(id));
            memcpy(&value, (uint8_t *)zmq_msg_data(&ev) + 2, sizeof(value));
        }
        bool more = zmq_msg_more(&ev);
        zmq_msg_close(&ev);
        if (more) {
            /* The endpoint's address: not needed. */
            zmq_msg_init(&addr);
            zmq_msg_recv(&addr, l->monitor, 0);
            zmq_msg_close(&addr);
        }
        if (id == ZMQ_EVENT_ACCEPTED) {
            l->accepted++;
            l->open += !fd_mark(l, (int32_t)value, true);
        } else if (id == ZMQ_EVENT_DISCONNECTED || id == ZMQ_EVENT_CLOSED) {
            l->open -= fd_mark(l, (int32_t)value, false);
        } else if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            l->settled++;
            l->succeeded++;
        } else if (id & (ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                         ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)) {
            l->settled++;
        }
    }
}

/*
 * Connections established, or accepted by this handler and about to be: libzmq's monitor says
 * when a descriptor opens and closes, and when a handshake ends (succeeded or failed), but not
 * whose; every connection ends its handshake with exactly one such event. So the open ones
 * minus those still in their handshake are established, and the approvals whose success has
 * not been reported yet are about to be.
 */
static uint64_t established_conns(const struct lmc_listener *l)
{
    uint64_t shaking = l->accepted > l->settled ? l->accepted - l->settled : 0;
    if (shaking > l->open)
        shaking = l->open;
    uint64_t coming = l->approved > l->succeeded ? l->approved - l->succeeded : 0;
    if (coming > shaking)
        coming = shaking;
    return l->open - shaking + coming;
}

/* Answers one ZAP request (RFC 27): accepted while --lmcache-max-connections are not exceeded
 * (the connection asking is one of those counted). */
static void serve_zap(struct lmc_listener *l)
{
    zmq_msg_t m[8];
    uint32_t nkept = 0;
    bool more = true;
    while (more) {
        zmq_msg_t *dst = &m[nkept < 8 ? nkept : 7];
        if (nkept >= 8)
            zmq_msg_close(dst);
        zmq_msg_init(dst);
        if (zmq_msg_recv(dst, l->zap, nkept == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(dst);
            break;
        }
        more = zmq_msg_more(dst);
        if (nkept < 8)
            nkept++;
    }
    if (nkept >= 2) {
        drain_monitor(l);
        uint32_t cap = l->srv->cfg.lmcache_max_conns;
        uint64_t have = established_conns(l);
        uint64_t shaking = l->open > have ? l->open - have : 0;
        bool ok = have < cap;
        l->approved += ok;
        /* 300, a temporary refusal, makes the peer's libzmq retry (LMCache's client backs off to
         * a second) but keeps the connection until HANDSHAKE_MS; 400 closes it at once, and the
         * peer never retries. So: 300 while few such connections wait, 400 to a crowd. */
        const char *code = ok ? "200" : shaking <= LMC_FD_SLACK / 2 ? "300" : "400";
        const char *text = ok ? "OK" : "too many connections (--lmcache-max-connections)";
        zmq_send(l->zap, "1.0", 3, ZMQ_SNDMORE);
        zmq_send(l->zap, zmq_msg_data(&m[1]), zmq_msg_size(&m[1]), ZMQ_SNDMORE);
        zmq_send(l->zap, code, 3, ZMQ_SNDMORE);
        zmq_send(l->zap, text, strlen(text), ZMQ_SNDMORE);
        zmq_send(l->zap, "", 0, ZMQ_SNDMORE);
        zmq_send(l->zap, "", 0, 0);
        if (!ok) {
            char addr[64] = "?";
            if (nkept >= 4)
                snprintf(addr, sizeof(addr), "%.*s", (int)zmq_msg_size(&m[3]),
                         (const char *)zmq_msg_data(&m[3]));
            KVP_COUNT(lmcache_connections_refused, 1);
            log_warn_rl("LMCache front end: refused a connection from %s: %" PRIu64
                        " connections are open (--lmcache-max-connections %u)",
                        addr[0] ? addr : "a local peer", have, cap);
        }
    }
    for (uint32_t i = 0; i < nkept; i++)
        zmq_msg_close(&m[i]);
}

static void *listener_main(void *arg)
{
    struct lmc_listener *l = arg;
    kvp_thread_name("kvp-lmcache");
    zmq_pollitem_t items[4] = {
        {.socket = l->router, .events = ZMQ_POLLIN},
        {.fd = l->wake_fd, .events = ZMQ_POLLIN},
        {.socket = l->zap, .events = ZMQ_POLLIN},
        {.socket = l->monitor, .events = ZMQ_POLLIN},
    };
    zmq_msg_t m[MAX_FRAMES];

    while (!atomic_load_explicit(&l->stop, memory_order_acquire)) {
        l->front.now_ms = kvp_mono_ms();
        uint64_t wait = lmc_tick(&l->front);
        if (wait > 1000)
            wait = 1000;
        if (zmq_poll(items, 4, (long)wait) < 0) {
            if (errno == EINTR)
                continue;
            log_error("LMCache front end: zmq_poll: %s; stopping", zmq_strerror(errno));
            break;
        }
        if (items[1].revents & ZMQ_POLLIN) {
            uint64_t v;
            if (read(l->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                log_debug("LMCache front end: reading the wake-up descriptor: %s",
                          kvp_strerror(-errno));
        }
        if (items[3].revents & ZMQ_POLLIN)
            drain_monitor(l);
        if (items[2].revents & ZMQ_POLLIN)
            for (int i = 0; i < BATCH; i++) {
                int ev = 0;
                size_t len = sizeof(ev);
                serve_zap(l);
                if (zmq_getsockopt(l->zap, ZMQ_EVENTS, &ev, &len) || !(ev & ZMQ_POLLIN))
                    break;
            }
        for (int i = 0; i < BATCH && !atomic_load_explicit(&l->stop, memory_order_acquire); i++) {
            uint32_t nkept;
            int total = recv_message(l, m, &nkept);
            if (total <= 0)
                break;
            serve_message(l, m, nkept, total);
            for (uint32_t k = 0; k < nkept; k++)
                zmq_msg_close(&m[k]);
        }
    }
    return NULL;
}

int lmc_listener_start(struct lmc_listener *l)
{
    int rc = lmc_front_init(&l->front, l->srv);
    if (rc) {
        log_error("Cannot start the LMCache front end: %s", kvp_strerror(rc));
        return rc;
    }
    l->front_ready = true;
    l->front.value_alloc = value_alloc;
    l->front.value_ctx = l;
    rc = kvp_thread_create(&l->thread, NULL, listener_main, l);
    if (rc) {
        log_error("Cannot start the LMCache front end's thread: %s", kvp_strerror(-rc));
        return -rc;
    }
    l->started = true;
    const struct kvp_server *s = l->srv;
    bool shm = s->seg.shared && !s->seg.memfd;
    log_info("LMCache front end listening on %s (chunk size %u tokens; %s%s)", l->url,
             s->cfg.chunk_tokens, shm ? "shared memory " : "no named shared memory: ",
             shm ? s->seg.name : "workers use their pickle or envelope transport");
    return 0;
}

void lmc_listener_close(struct lmc_listener *l)
{
    if (!l)
        return;
    if (l->started) {
        uint64_t one = 1;
        atomic_store_explicit(&l->stop, true, memory_order_release);
        if (write(l->wake_fd, &one, sizeof(one)) < 0)
            log_debug("LMCache front end: waking its thread: %s", kvp_strerror(-errno));
        pthread_join(l->thread, NULL);
    }
    if (l->front_ready)
        lmc_front_destroy(&l->front);
    zmq_msg_close(&l->value);
    close_sockets(l);
    if (l->ipc_bound) {
        struct stat st;
        if (lstat(l->addr.path, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == l->ipc_dev &&
            st.st_ino == l->ipc_ino)
            unlink(l->addr.path);
    }
    close(l->wake_fd);
    free(l);
}
