/*
 * conn.c - the client's Unix-socket connection to kvpoold.
 *
 * Design. The protocol is strictly request/reply in order (docs/PROTOCOL.md), so a connection is
 * a blocking socket plus a little state: the next request id, a reusable request-body buffer and
 * a reusable reply-body buffer. kvp_conn_call() writes header, body and an optional bulk payload
 * with one sendmsg() loop whose iovecs point at the caller's chunk buffers, and reads the reply
 * header and body. A bulk reply payload is left in the socket so that the caller can receive it
 * straight into its own buffers with kvp_conn_read_payload(): no intermediate copy either way.
 *
 * Waiting for a reply: the daemon runs the thread serving this connection on the CPU the request
 * came from (the CPU hint in every request header, src/server/kvp/placement.c), so that a request
 * and its reply are a switch between two threads of one CPU instead of two wake-ups of idle
 * CPUs, which cost tens of microseconds each on virtual machines. But a thread that sleeps in
 * recv() is woken on whichever CPU looks idlest, and once the daemon's thread has worked a
 * microsecond or two that is another CPU: measured on the development VM, a 3 us request took
 * 26 us in p50 that way, with a migration on nearly every request. So after sending, the caller
 * does not sleep at once: it yields its CPU (sched_yield) and then checks for the reply without
 * blocking, which lets the daemon's thread run right there and answer; the same request then
 * takes 8 us, with no migration. At most KVP_POLL_YIELDS times and KVPOOL_POLL_US microseconds
 * (default 50, 0: never); a longer request ends it and the caller sleeps as before. A yield that
 * took long (KVP_POLL_SLOW_YIELD_US) means the CPU had other work to run: there a yield costs
 * the caller its turn behind that work, while a sleeper is woken with priority (measured with
 * 16 busy workers on 2 CPUs: a ping's p50 went from 12 us to 1 ms when everyone yielded), and
 * a busy CPU has no idle neighbour to be woken on anyway. So after such a yield the connection
 * sleeps for its replies for KVP_POLL_BACKOFF_US, then tries again. But a yield is also long when
 * the thread that ran meanwhile was the daemon's, serving this very request (a lookup of a long
 * prefix, a thread that had just followed the caller to its CPU): backing off then turns every
 * later request into two wake-ups of the idle CPU (measured on the development VM: a one-chunk
 * lookup went from 16 us to 73 us in p50, the back-off renewed every few hundred requests). So
 * a long yield backs off only when the machine has more runnable threads than CPUs at that
 * moment (/proc/loadavg's running count; unknown counts as busy).
 *
 * Timeouts are SO_RCVTIMEO/SO_SNDTIMEO (they also bound a blocking connect() on a Unix socket);
 * the resulting EAGAIN is reported as -ETIMEDOUT. MSG_NOSIGNAL on every send: a daemon that goes
 * away yields -EPIPE, never SIGPIPE.
 *
 * Invariant: once a read or write fails halfway, or a reply cannot be trusted (wrong magic,
 * opcode or request id, malformed body), the byte stream position is unknown. The connection is
 * then marked broken (c->broken holds the error) and never used again: kvp_conn_begin() fails
 * at once with -ENOTCONN. Whether the client replaces it with a new connection is decided by
 * kvp_conn_reconnectable() (a lost connection: yes; a confused peer: no) and done by
 * src/client/reconnect.c; the daemon sees the close and releases everything the client held.
 *
 * Threads: none of this locks; the owning kvp_client's mutex serialises all use.
 */
#include "conn.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/sysinfo.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/iov.h"
#include "common/msg.h"
#include "common/socket_path.h"
#include "kvpool.h"

/* Request and reply buffers above this size are freed before the next call, not kept. */
#define KVP_KEEP_BUFFER (256u << 10)

/* Small payload iovec arrays live on the stack; bigger ones are allocated. */
#define KVP_STACK_IOV 8

static int set_msg(char *dst, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

static int set_msg(char *dst, const char *fmt, va_list ap)
{
    vsnprintf(dst, KVP_ERRMSG_SIZE, fmt, ap);
    return 0;
}

int kvp_conn_error(struct kvp_conn *c, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_msg(c->errmsg, fmt, ap);
    va_end(ap);
    return err;
}

int kvp_conn_break(struct kvp_conn *c, int err)
{
    if (!c->broken) {
        c->broken = err;
        memcpy(c->broken_msg, c->errmsg, sizeof(c->broken_msg));
    }
    return err;
}

int kvp_conn_fail(struct kvp_conn *c, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_msg(c->errmsg, fmt, ap);
    va_end(ap);
    return kvp_conn_break(c, err);
}

/* Maps the errno of a failed send/recv to the library's return code: with SO_RCVTIMEO or
 * SO_SNDTIMEO set, a blocking call that runs out of time fails with EAGAIN, which callers should
 * see as the timeout it is. */
static int io_errno(int e)
{
    return (e == EAGAIN || e == EWOULDBLOCK) ? -ETIMEDOUT : -e;
}

/* The daemon uses the same rule (src/common/socket_path.c): both sides find each other by it. */
KVP_EXPORT int kvp_default_socket_path(char *buf, size_t size)
{
    return kvp_socket_path_default(buf, size);
}

/*
 * Whether uid may be the daemon's: ours and root always, then kvp_opts.trust_uid, then the
 * comma-separated $KVPOOL_TRUST_UID. Returns 1 (trusted), 0 (not), or -EINVAL for a malformed
 * variable, which is refused rather than ignored: a typo must not silently trust nobody, nor
 * anybody.
 */
static int uid_trusted(const struct kvp_conn *c, uid_t uid)
{
    const char *env = getenv("KVPOOL_TRUST_UID");

    if (uid == geteuid() || uid == 0 || (c->trust_uid >= 0 && (int64_t)uid == c->trust_uid))
        return 1;
    if (!env || !env[0])
        return 0;
    for (const char *p = env;;) {
        char *end;
        if (*p < '0' || *p > '9')
            return -EINVAL;
        errno = 0;
        unsigned long long v = strtoull(p, &end, 10);
        if (errno || v > UINT32_MAX || (*end && *end != ','))
            return -EINVAL;
        if (v == uid)
            return 1;
        if (!*end)
            return 0;
        p = end + 1;
    }
}

/* SO_PEERCRED gives the credentials of whoever called listen(): the daemon, not a relay. */
static int check_peer(struct kvp_conn *c, int fd, const char *path)
{
    struct ucred cr;
    socklen_t len = sizeof(cr);

    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0)
        return kvp_conn_error(c, -errno, "cannot read the credentials of %s: %s", path,
                              kvp_strerror(-errno));
    int ok = uid_trusted(c, cr.uid);
    if (ok < 0)
        return kvp_conn_error(c, ok, "KVPOOL_TRUST_UID is not a comma-separated list of uids");
    if (!ok)
        return kvp_conn_error(c, KVP_EPEER,
                              "refusing %s: the process listening there (pid %ld) runs as uid "
                              "%lu; this process trusts only uid %lu and root (set "
                              "KVPOOL_TRUST_UID=%lu to trust it)",
                              path, (long)cr.pid, (unsigned long)cr.uid, (unsigned long)geteuid(),
                              (unsigned long)cr.uid);
    return 0;
}

/* The default socket's directory must be private: see socket_path.c for the attack. An
 * explicit path is the caller's choice and is not judged here. */
static int check_default_dir(struct kvp_conn *c, const char *path)
{
    char def[sizeof(((struct sockaddr_un *)0)->sun_path)], why[KVP_ERRMSG_SIZE - 64];

    if (kvp_socket_path_default(def, sizeof(def)) <= 0 || strcmp(def, path) != 0)
        return 0;
    if (kvp_socket_dir_default(def, sizeof(def)) <= 0)
        return 0;
    int rc = kvp_socket_dir_check(def, geteuid(), why, sizeof(why));
    if (rc == -ENOENT)
        return kvp_conn_error(c, rc, "cannot connect to %s: no kvpoold has created %s", path, def);
    if (rc < 0)
        return kvp_conn_error(c, rc, "refusing %s: %s", path, why);
    return 0;
}

/* Timeouts are set before connect() so that a daemon whose backlog is full cannot block the
 * caller for longer than timeout_ms either. */
int kvp_conn_connect(struct kvp_conn *c, const char *path, uint32_t timeout_ms)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    size_t len = strlen(path);
    int fd, rc;

    c->timeout_ms = timeout_ms ? timeout_ms : KVP_DEFAULT_TIMEOUT_MS;
    if (len == 0)
        return kvp_conn_error(c, -EINVAL, "empty socket path");
    if (len >= sizeof(addr.sun_path))
        return kvp_conn_error(c, -ENAMETOOLONG, "socket path is longer than %zu bytes",
                              sizeof(addr.sun_path) - 1);
    memcpy(addr.sun_path, path, len + 1);
    rc = check_default_dir(c, path);
    if (rc < 0)
        return rc;

    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return kvp_conn_error(c, -errno, "socket: %s", kvp_strerror(-errno));

    struct timeval tv = {
        .tv_sec = (time_t)(c->timeout_ms / 1000),
        .tv_usec = (suseconds_t)(c->timeout_ms % 1000) * 1000,
    };
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0) {
        rc = kvp_conn_error(c, -errno, "setsockopt: %s", kvp_strerror(-errno));
        goto out_close_fd;
    }

    /* A timed-out connect (full backlog) reports EAGAIN; EINTR leaves the connect running in
     * the background, so wait for it by retrying, which reports EALREADY/EISCONN. */
    do {
        rc = connect(fd, (const struct sockaddr *)&addr, sizeof(addr));
    } while (rc < 0 && (errno == EINTR || errno == EALREADY));
    if (rc < 0 && errno != EISCONN) {
        rc = io_errno(errno);
        kvp_conn_error(c, rc, "cannot connect to %s: %s", path, kvp_strerror(rc));
        goto out_close_fd;
    }
    rc = check_peer(c, fd, path);
    if (rc < 0)
        goto out_close_fd;

    c->fd = fd;
    c->broken = 0;
    return 0;

out_close_fd:
    close(fd);
    return rc;
}

/* Closing the socket is the whole protocol for leaving: the daemon then releases everything
 * this connection held. No goodbye message is needed or sent. The error state (broken, the
 * messages) and the connection settings stay, so that a reconnect can report and reuse them;
 * a new connection numbers its requests from 1 again. */
void kvp_conn_close(struct kvp_conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->next_id = 1;
    c->payload_left = 0;
    c->in_pos = c->in_len = 0;
    if (c->passed_fd >= 0)
        close(c->passed_fd);
    c->passed_fd = -1;
    kvp_wbuf_free(&c->req);
    free(c->body);
    c->body = NULL;
    c->body_cap = c->body_len = 0;
}

/*
 * Protocol disagreements are not worth a new connection: a peer that sent a malformed or
 * mismatched frame, spoke another version or announced a slot outside the pool would most
 * likely do it again, and reconnecting after each would hide the fault behind a stream of
 * fresh connections. Everything else that breaks a stream (the daemon closed it, died or was
 * restarted, a timeout, a refused connect, no memory for a reply) is a lost connection.
 */
bool kvp_conn_reconnectable(const struct kvp_conn *c)
{
    switch (c->broken) {
    case 0:
        return c->fd < 0;
    case KVP_EPROTO:
    case KVP_EVERSION:
    case KVP_EBADSLOT:
    case -EPROTO:
        return false;
    default:
        return true;
    }
}

/* Every public call starts here, so a broken connection fails fast (no I/O, no timeout) and
 * kvp_last_error() still says what originally broke it. */
int kvp_conn_begin(struct kvp_conn *c)
{
    c->errmsg[0] = '\0';
    if (c->broken || c->fd < 0) {
        snprintf(c->errmsg, sizeof(c->errmsg), "connection to kvpoold unusable after: %.400s",
                 c->broken_msg[0] ? c->broken_msg : "no connection");
        return -ENOTCONN;
    }
    /* A reply payload that nobody read would be taken for the next reply header. */
    if (c->payload_left)
        return kvp_conn_fail(c, KVP_EPROTO, "unread reply payload left on the connection");
    /* Do not keep a multi-megabyte token list around between calls. */
    if (c->req.cap > KVP_KEEP_BUFFER)
        kvp_wbuf_free(&c->req);
    if (c->body_cap > KVP_KEEP_BUFFER) {
        free(c->body);
        c->body = NULL;
        c->body_cap = c->body_len = 0;
    }
    kvp_wbuf_reset(&c->req);
    return 0;
}

/*
 * Sends (or receives) every byte of iov[0..n); the array is consumed: bases and lengths are
 * advanced. At most IOV_MAX entries go to one call; short transfers resume where they stopped.
 * Receiving, EOF is -ECONNRESET.
 */
static int xfer_all(int fd, struct iovec *iov, size_t n, bool send)
{
    size_t i = kvp_iov_advance(iov, n, 0, 0);

    while (i < n) {
        struct msghdr msg = {
            .msg_iov = iov + i,
            .msg_iovlen = n - i < IOV_MAX ? n - i : IOV_MAX,
        };
        ssize_t r = send ? sendmsg(fd, &msg, MSG_NOSIGNAL) : recvmsg(fd, &msg, MSG_WAITALL);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return io_errno(errno);
        }
        if (r == 0 && !send)
            return -ECONNRESET;
        i = kvp_iov_advance(iov, n, i, (size_t)r);
    }
    return 0;
}

static int send_all(int fd, struct iovec *iov, size_t n)
{
    return xfer_all(fd, iov, n, true);
}

static int recv_all(int fd, struct iovec *iov, size_t n)
{
    return xfer_all(fd, iov, n, false);
}

/* Moves up to the iovecs' bytes read ahead into them, advancing them; returns how many. */
static size_t take_ahead(struct kvp_conn *c, struct iovec *iov, size_t n)
{
    size_t moved = 0;
    for (size_t i = 0; i < n && c->in_pos < c->in_len; i++) {
        if (iov[i].iov_len == 0) /* its base may be NULL */
            continue;
        size_t k = c->in_len - c->in_pos;
        if (k > iov[i].iov_len)
            k = iov[i].iov_len;
        memcpy(iov[i].iov_base, c->in + c->in_pos, k);
        iov[i].iov_base = (uint8_t *)iov[i].iov_base + k;
        iov[i].iov_len -= k;
        c->in_pos += (uint32_t)k;
        moved += k;
    }
    if (c->in_pos == c->in_len)
        c->in_pos = c->in_len = 0;
    return moved;
}

/* Reads exactly the iovecs' bytes of the reply: the read-ahead first, then the socket. */
static int recv_reply_bytes(struct kvp_conn *c, struct iovec *iov, size_t n)
{
    take_ahead(c, iov, n);
    return recv_all(c->fd, iov, n);
}

static int recv_buf(struct kvp_conn *c, void *p, size_t len)
{
    struct iovec iov = {.iov_base = p, .iov_len = len};
    return recv_reply_bytes(c, &iov, 1);
}

int kvp_conn_take_fd(struct kvp_conn *c)
{
    int fd = c->passed_fd;
    c->passed_fd = -1;
    return fd;
}

/*
 * One recvmsg() of whatever reply bytes have arrived, up to the read-ahead buffer (flags:
 * MSG_DONTWAIT or 0), so that a descriptor the daemon attached to a reply's first byte
 * (SCM_RIGHTS, MAP_SEGMENT) lands in c->passed_fd instead of being dropped. Returns the byte
 * count, 0 at EOF, or -errno.
 */
static ssize_t fill_ahead(struct kvp_conn *c, int flags)
{
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;

    if (c->in_pos) { /* not expected: the last reply was read whole */
        memmove(c->in, c->in + c->in_pos, c->in_len - c->in_pos);
        c->in_len -= c->in_pos;
        c->in_pos = 0;
    }
    struct iovec iov = {c->in + c->in_len, sizeof(c->in) - c->in_len};
    struct msghdr mh = {.msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = ctl.buf,
                        .msg_controllen = sizeof(ctl.buf)};
    ssize_t n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC | flags);
    if (n < 0)
        return -errno;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS ||
            cm->cmsg_len != CMSG_LEN(sizeof(int)))
            continue;
        int fd;
        memcpy(&fd, CMSG_DATA(cm), sizeof(fd));
        if (c->passed_fd >= 0)
            close(c->passed_fd);
        c->passed_fd = fd;
    }
    c->in_len += (uint32_t)n;
    return n;
}

/*
 * Reads a reply header, and with it whatever else has arrived (fill_ahead): the body of most
 * replies, which then costs no recv() of its own. Returns 0 or a negative errno (-ECONNRESET on
 * EOF).
 */
static int recv_header(struct kvp_conn *c, uint8_t *raw)
{
    while (c->in_len - c->in_pos < KVP_HEADER_SIZE) {
        ssize_t n = fill_ahead(c, 0);
        if (n == -EINTR)
            continue;
        if (n < 0)
            return io_errno((int)-n);
        if (n == 0)
            return -ECONNRESET;
    }
    memcpy(raw, c->in + c->in_pos, KVP_HEADER_SIZE);
    c->in_pos += KVP_HEADER_SIZE;
    if (c->in_pos == c->in_len)
        c->in_pos = c->in_len = 0;
    return 0;
}

/*
 * Reads and checks the reply header to request (op, id). Returns 0 or a broken-stream error.
 * Requests are answered in order, so a reply for another opcode or request id means the two
 * sides disagree about the stream position; nothing after it can be trusted.
 */
static int read_reply_header(struct kvp_conn *c, uint16_t op, uint64_t id, struct kvp_header *h)
{
    uint8_t raw[KVP_HEADER_SIZE];
    const char *name = kvp_opcode_name(op);
    int rc = recv_header(c, raw);

    if (rc == -ECONNRESET)
        return kvp_conn_fail(c, rc, "kvpoold closed the connection instead of answering %s", name);
    if (rc < 0)
        return kvp_conn_fail(c, rc, "no reply to %s: %s", name, kvp_strerror(rc));

    rc = kvp_header_decode(raw, h);
    if (rc == -EPROTONOSUPPORT)
        return kvp_conn_fail(c, KVP_EVERSION,
                             "kvpoold answered %s with protocol version %u, "
                             "this library speaks %u",
                             name, h->version, KVP_PROTO_VERSION);
    if (rc < 0)
        return kvp_conn_fail(c, KVP_EPROTO,
                             "malformed reply header to %s (magic 0x%08x, "
                             "opcode 0x%04x, body %u bytes)",
                             name, h->magic, h->opcode, h->body_len);
    if (h->opcode != (op | KVP_REPLY_FLAG) || h->request_id != id)
        return kvp_conn_fail(c, KVP_EPROTO,
                             "reply does not match request %s #%llu "
                             "(got opcode 0x%04x #%llu)",
                             name, (unsigned long long)id, h->opcode,
                             (unsigned long long)h->request_id);
    if (h->status > 0)
        return kvp_conn_fail(c, KVP_EPROTO, "reply to %s has positive status %d", name,
                             (int)h->status);
    return 0;
}

/*
 * After a failed send: returns the status of an error reply to (op, id) that the daemon sent
 * before closing, with its message in errmsg, or send_rc when there is none. The connection is
 * already broken; this only reads what is left in the receive queue.
 */
static int salvage_error_reply(struct kvp_conn *c, uint16_t op, uint64_t id, int send_rc)
{
    uint8_t raw[KVP_HEADER_SIZE];
    uint8_t body[KVP_MAX_ERRMSG + 2];
    char msg[KVP_MAX_ERRMSG + 1];
    struct kvp_header h;

    if (recv_buf(c, raw, sizeof(raw)) < 0 || kvp_header_decode(raw, &h) < 0)
        return send_rc;
    if (h.opcode != (op | KVP_REPLY_FLAG) || h.request_id != id || h.status >= 0 ||
        h.payload_len != 0 || h.body_len > sizeof(body))
        return send_rc;
    if (recv_buf(c, body, h.body_len) < 0 ||
        kvp_decode_error(body, h.body_len, msg, sizeof(msg)) < 0)
        return send_rc;
    snprintf(c->errmsg, sizeof(c->errmsg), "%s", msg);
    memcpy(c->broken_msg, c->errmsg, sizeof(c->broken_msg));
    return h.status;
}

/* The placement hint of a request: this thread's CPU + 1, 0 when unknown (wire.h). */
static uint32_t cpu_hint(void)
{
    int cpu = sched_getcpu();
    return cpu >= 0 && cpu <= (int)KVP_REQ_CPU_MAX ? (uint32_t)(cpu + 1) << KVP_REQ_CPU_SHIFT : 0;
}

/*
 * Sends request op (body c->req, payload iov[0..niov)) with the given flags and the placement
 * hint. Returns 0 with the request id in *idp, or an error after which the connection is broken
 * (the daemon's own error reply, when it sent one before closing).
 */
static int send_request(struct kvp_conn *c, uint16_t op, const struct iovec *iov, size_t niov,
                        uint32_t flags, uint64_t *idp)
{
    struct iovec stack_iov[KVP_STACK_IOV + 2];
    struct iovec *v = stack_iov;
    uint8_t raw[KVP_HEADER_SIZE];
    struct kvp_header h;
    const char *name = kvp_opcode_name(op);
    uint64_t id = c->next_id++;
    uint64_t payload = 0;
    int rc;

    if (c->req.err) {
        rc = c->req.err;
        kvp_wbuf_reset(&c->req);
        return kvp_conn_error(c, rc, "cannot encode %s request: %s", name, kvp_strerror(rc));
    }
    if (c->req.len > KVP_MAX_BODY) {
        kvp_wbuf_reset(&c->req);
        return kvp_conn_error(c, -EMSGSIZE, "%s request body exceeds %u bytes", name, KVP_MAX_BODY);
    }
    for (size_t i = 0; i < niov; i++)
        payload += iov[i].iov_len;

    /* Header, body and payload go out as one gathered write: no copy of the payload, and the
     * daemon sees the frame without gaps between its parts. */
    if (niov > KVP_STACK_IOV) {
        v = malloc((niov + 2) * sizeof(*v));
        if (!v) {
            kvp_wbuf_reset(&c->req);
            return kvp_conn_error(c, -ENOMEM, "out of memory");
        }
    }
    h = (struct kvp_header){
        .magic = KVP_MAGIC,
        .version = KVP_PROTO_VERSION,
        .opcode = op,
        .request_id = id,
        .body_len = (uint32_t)c->req.len,
        .flags = flags | cpu_hint(),
        .payload_len = payload,
    };
    kvp_header_encode(&h, raw);
    v[0] = (struct iovec){.iov_base = raw, .iov_len = sizeof(raw)};
    v[1] = (struct iovec){.iov_base = c->req.data, .iov_len = c->req.len};
    if (niov)
        memcpy(v + 2, iov, niov * sizeof(*v));

    rc = send_all(c->fd, v, niov + 2);
    if (v != stack_iov)
        free(v);
    /* The next request of this call (prepare then store, say) starts from an empty body. */
    kvp_wbuf_reset(&c->req);
    if (rc < 0) {
        kvp_conn_fail(c, rc, "cannot send %s: %s", name, kvp_strerror(rc));
        /*
         * The daemon may have rejected the request and closed before reading all of it (an
         * inline payload it does not want). Its error reply can still be waiting in our
         * receive queue and explains the failure better than EPIPE does.
         */
        if (rc == -EPIPE || rc == -ECONNRESET)
            rc = salvage_error_reply(c, op, id, rc);
        return rc;
    }
    *idp = id;
    return 0;
}

static uint64_t mono_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000u + (uint64_t)t.tv_nsec / 1000u;
}

/*
 * Whether more threads are runnable than the machine has CPUs, the caller included: the fourth
 * field of /proc/loadavg ("running/total"). Read only after a long yield. Unknown: true.
 */
static bool cpus_oversubscribed(void)
{
    char buf[128];
    int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return true;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return true;
    buf[n] = '\0';
    unsigned long running;
    if (sscanf(buf, "%*s %*s %*s %lu/", &running) != 1)
        return true;
    int cpus = get_nprocs();
    return cpus <= 0 || running > (unsigned long)cpus;
}

/* Yields the CPU until the reply starts to arrive, for at most c->poll_us (see the top). */
static void await_reply(struct kvp_conn *c)
{
    if (!c->poll_us || c->in_len)
        return;
    uint64_t t0 = mono_us();
    if (t0 < c->poll_off_until_us)
        return;
    for (unsigned i = 0; i < KVP_POLL_YIELDS; i++) {
        uint64_t t = mono_us();
        /* First the CPU, then the check: the reply cannot be there yet. */
        sched_yield();
        uint64_t now = mono_us();
        if (now - t >= KVP_POLL_SLOW_YIELD_US && cpus_oversubscribed())
            c->poll_off_until_us = now + KVP_POLL_BACKOFF_US;
        /* Data (read ahead already), EOF or an error: the read that follows handles each. */
        ssize_t n = fill_ahead(c, MSG_DONTWAIT);
        if (n >= 0 || (n != -EAGAIN && n != -EWOULDBLOCK && n != -EINTR))
            return;
        if (now - t0 >= c->poll_us || now < c->poll_off_until_us)
            return;
    }
}

int kvp_conn_post(struct kvp_conn *c, uint16_t op)
{
    uint64_t id;
    return send_request(c, op, NULL, 0, KVP_REQ_NOREPLY, &id);
}

int kvp_conn_call(struct kvp_conn *c, uint16_t op, const struct iovec *iov, size_t niov,
                  bool reply_payload)
{
    const char *name = kvp_opcode_name(op);
    struct kvp_header h;
    uint64_t id;

    int rc = send_request(c, op, iov, niov, 0, &id);
    if (rc < 0)
        return rc;
    await_reply(c);
    rc = read_reply_header(c, op, id, &h);
    if (rc < 0)
        return rc;
    if (h.payload_len && (!reply_payload || h.status < 0))
        return kvp_conn_fail(c, KVP_EPROTO, "unexpected %llu-byte payload in reply to %s",
                             (unsigned long long)h.payload_len, name);

    /* The header check bounds body_len to KVP_MAX_BODY, so this allocation is bounded too. */
    if (h.body_len > c->body_cap) {
        free(c->body);
        c->body_cap = 0;
        c->body = malloc(h.body_len);
        if (!c->body)
            return kvp_conn_fail(c, -ENOMEM, "out of memory for a %u-byte reply", h.body_len);
        c->body_cap = h.body_len;
    }
    c->body_len = h.body_len;
    rc = recv_buf(c, c->body, h.body_len);
    if (rc < 0)
        return kvp_conn_fail(c, rc, "cannot read reply to %s: %s", name, kvp_strerror(rc));

    if (h.status < 0) {
        char msg[KVP_MAX_ERRMSG + 1];
        if (kvp_decode_error(c->body, c->body_len, msg, sizeof(msg)) < 0)
            return kvp_conn_fail(c, KVP_EPROTO, "malformed error reply to %s", name);
        /* After a framing error the daemon closes the connection: mirror that. */
        if (h.status == -EPROTO || h.status == -EPROTONOSUPPORT)
            return kvp_conn_fail(c, h.status == -EPROTO ? h.status : KVP_EVERSION, "%s", msg);
        return kvp_conn_error(c, h.status, "%s", msg);
    }
    c->payload_left = h.payload_len;
    return 0;
}

/* The caller's buffers must take the whole payload: a partial read would leave bytes that the
 * next call would parse as a header. */
int kvp_conn_read_payload(struct kvp_conn *c, const struct iovec *iov, size_t niov)
{
    uint64_t total = 0;
    struct iovec *v;
    int rc;

    for (size_t i = 0; i < niov; i++)
        total += iov[i].iov_len;
    if (total != c->payload_left)
        return kvp_conn_fail(c, KVP_EPROTO, "reply payload is %llu bytes, expected %llu",
                             (unsigned long long)c->payload_left, (unsigned long long)total);
    if (niov == 0)
        return 0;

    v = malloc(niov * sizeof(*v));
    if (!v)
        return kvp_conn_fail(c, -ENOMEM, "out of memory");
    memcpy(v, iov, niov * sizeof(*v));
    rc = recv_reply_bytes(c, v, niov);
    free(v);
    if (rc < 0)
        return kvp_conn_fail(c, rc, "cannot read reply payload: %s", kvp_strerror(rc));
    c->payload_left = 0;
    return 0;
}
