/*
 * conn.h - the client's socket to kvpoold: connect, framed request/reply, zero-copy payloads.
 *
 * Internal to libkvpool. A struct kvp_conn is owned by one kvp_client and used only under that
 * client's mutex, so nothing here locks.
 */
#ifndef KVP_CLIENT_CONN_H
#define KVP_CLIENT_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "common/wire.h"

#define KVP_DEFAULT_TIMEOUT_MS 30000u
#define KVP_ERRMSG_SIZE 512
#define KVP_POLL_US_DEFAULT 50u /* KVPOOL_POLL_US */
#define KVP_POLL_US_MAX 10000u
#define KVP_POLL_YIELDS 2u          /* yields for a reply before the caller sleeps */
#define KVP_POLL_SLOW_YIELD_US 20u  /* a yield this long: the CPU has other work ... */
#define KVP_POLL_BACKOFF_US 100000u /* ... so sleep for replies for this long */
#define KVP_CONN_READAHEAD 4096u    /* reply bytes read with the header */

struct kvp_conn {
    int fd;     /* -1 when not connected */
    int broken; /* 0, or the error that left the stream unusable */
    uint32_t timeout_ms;
    uint64_t next_id;      /* request id of the next request */
    uint64_t payload_left; /* reply payload bytes the caller still has to read */
    struct kvp_wbuf req;   /* request body under construction */
    uint8_t *body;         /* body of the last reply */
    size_t body_len;
    size_t body_cap;
    char errmsg[KVP_ERRMSG_SIZE];     /* message of the last failed call, "" if none */
    char broken_msg[KVP_ERRMSG_SIZE]; /* what broke the stream */
    int passed_fd;              /* descriptor received with the last reply (SCM_RIGHTS), or -1 */
    int64_t trust_uid;          /* a daemon uid trusted besides ours and root (kvp_opts), or -1 */
    uint32_t poll_us;           /* how long to yield-poll for a reply before sleeping (conn.c) */
    uint64_t poll_off_until_us; /* CLOCK_MONOTONIC: sleep for replies until then */
    /* Reply bytes read with the header (conn.c): a small reply is one recvmsg(). Empty between
     * calls, since only one reply is ever outstanding. */
    uint32_t in_pos, in_len;
    uint8_t in[KVP_CONN_READAHEAD];
};

#define KVP_CONN_INIT                                                                            \
    {                                                                                            \
        .fd = -1, .next_id = 1, .passed_fd = -1, .trust_uid = -1, .poll_us = KVP_POLL_US_DEFAULT \
    }

/*
 * Connects to the Unix socket at path with SO_RCVTIMEO/SO_SNDTIMEO set to timeout_ms (0: the
 * default). When path is the default socket, its directory must be private first
 * (kvp_socket_dir_check); once connected, the daemon's uid must be ours, root, c->trust_uid or
 * in $KVPOOL_TRUST_UID. Returns 0, -ENAMETOOLONG, -ENOENT / -ECONNREFUSED when nobody listens,
 * -ETIMEDOUT, -EPERM (the default directory is not private), KVP_EPEER (untrusted daemon uid),
 * -EINVAL (malformed $KVPOOL_TRUST_UID), or another negative errno; errmsg says what failed.
 */
int kvp_conn_connect(struct kvp_conn *c, const char *path, uint32_t timeout_ms);

/* Closes the socket and frees the buffers. Safe on a zeroed or KVP_CONN_INIT connection.
 * Keeps broken, errmsg, broken_msg and the settings; the next connection starts at request
 * id 1. */
void kvp_conn_close(struct kvp_conn *c);

/*
 * Whether c is unusable because the connection was lost (closed, reset, timed out, refused,
 * never made), so that a new connection may replace it; false while it is usable and after a
 * protocol error (KVP_EPROTO, KVP_EVERSION, KVP_EBADSLOT, -EPROTO), which stays final.
 */
bool kvp_conn_reconnectable(const struct kvp_conn *c);

/*
 * Starts a call: clears errmsg and resets the request body buffer for the caller to encode
 * into. Returns 0, or -ENOTCONN when an earlier error broke the stream.
 */
int kvp_conn_begin(struct kvp_conn *c);

/*
 * Sends request `op` (body: c->req, emptied once sent so that one call can make several
 * requests; payload: iov[0..niov), sent straight from the caller's buffers) and reads the reply
 * header and body into c->body. reply_payload says whether the reply may carry a payload; its
 * length is left in c->payload_left for kvp_conn_read_payload().
 *
 * Returns 0 for a success reply, the daemon's negative status for an error reply (message in
 * errmsg; the connection stays usable unless the daemon closes it after such errors), or a
 * local error after which the connection is broken: KVP_EPROTO, KVP_EVERSION, -ETIMEDOUT,
 * -ECONNRESET, ... A local -ENOMEM while encoding leaves the connection usable.
 */
int kvp_conn_call(struct kvp_conn *c, uint16_t op, const struct iovec *iov, size_t niov,
                  bool reply_payload);

/*
 * Sends request op (body: c->req) with KVP_REQ_NOREPLY and returns without waiting: the daemon
 * sends no reply, and a failure answers the next request that expects one (KVP_EPIPELINED).
 * Only for COMMIT_STORE and COMMIT_RETRIEVE, to a daemon of protocol minor >= 2. Returns 0, or
 * a send error after which the connection is broken.
 */
int kvp_conn_post(struct kvp_conn *c, uint16_t op);

/*
 * Reads the pending reply payload into iov[0..niov), whose lengths must add up to exactly
 * c->payload_left. Returns 0 or a negative error (the connection is then broken).
 */
int kvp_conn_read_payload(struct kvp_conn *c, const struct iovec *iov, size_t niov);

/* Takes the descriptor that came with the last reply: the caller owns it. -1 if none. */
int kvp_conn_take_fd(struct kvp_conn *c);

/* Marks the stream unusable (the caller could not make sense of a reply) and returns err. The
 * message goes to errmsg. */
int kvp_conn_fail(struct kvp_conn *c, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Marks the stream unusable, keeping the current errmsg, and returns err. */
int kvp_conn_break(struct kvp_conn *c, int err);

/* Sets errmsg for a failure that leaves the connection usable, and returns err. */
int kvp_conn_error(struct kvp_conn *c, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* KVP_CLIENT_CONN_H */
