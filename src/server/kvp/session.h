/*
 * session.h - the daemon side of one client connection (a session), served by its own thread:
 * framing, I/O with timeouts, and the owner (owner.h) that holds its reservations, pins and
 * instances.
 */
#ifndef KVP_SESSION_H
#define KVP_SESSION_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "common/msg.h"
#include "common/wire.h"
#include "core/owner.h"

struct kvp_server;
struct kvp_sessions;

/* Bytes a session reads ahead with a request's header (a lookup's body is 1 KiB of tokens). */
#define KVP_SESSION_READAHEAD 4096u

struct kvp_session {
    struct kvp_server *srv;
    struct kvp_sessions *set; /* the set it belongs to (sessions.h) */
    /* Its socket: open while the owner is listed, since the owner's callbacks shut it down from
     * other threads (sessions.c). */
    int fd;
    /* The connection as the core knows it: its id (also the connection's), the peer's pid and
     * uid (SO_PEERCRED), when it connected, its reservations, pins and scratch. Set before the
     * connection joins its set's list. */
    struct kvp_owner owner;
    struct kvp_session *prev, *next; /* its set's list, under the set's lock */

    /* Bytes read ahead of the current frame (session.c): a request's header and a small body
     * come in one recv(), and what follows them waits here for the next read. */
    uint8_t in[KVP_SESSION_READAHEAD];
    uint32_t in_pos, in_len;

    uint8_t *body; /* current request body */
    size_t body_cap;
    struct kvp_wbuf out; /* reply body being built */
    char errmsg[KVP_MAX_ERRMSG + 1];

    struct kvp_wire_slot *slots; /* KVP_MAX_CHUNKS, a slots reply being encoded */

    bool noreply; /* the request being served is a commit sent with KVP_REQ_NOREPLY */
    /* The first failure of a commit sent with KVP_REQ_NOREPLY, kept for the next request that
     * expects a reply (deferred_status 0: none); later ones only count. */
    int deferred_status;
    uint16_t deferred_opcode;
    uint64_t deferred_id;
    uint32_t deferred_more;
    char deferred_msg[KVP_MAX_ERRMSG + 1];

    /* The segment's descriptor was passed to this connection (MAP_SEGMENT): the evidence that
     * its worker can map a memfd segment (transport.c). */
    bool sent_segment_fd;

    int cpu; /* CPU this connection's thread is bound to (placement.c), -1: none */
    bool placement_off;
};

/* Receives exactly len bytes. Returns 0, -ECONNRESET on EOF, -ETIMEDOUT, or -errno. */
int kvp_session_recv(struct kvp_session *c, void *buf, size_t len);

/*
 * Sends a reply: header (with status and payload_len), the body built in c->out (for status 0)
 * or c->errmsg (status < 0), then the payload iovecs. Returns 0 or a negative errno.
 */
int kvp_session_reply(struct kvp_session *c, const struct kvp_header *req, int status,
                      const struct iovec *payload, int npayload, uint64_t payload_len);

/* Sends an empty success reply with the segment's descriptor fd attached (SCM_RIGHTS), and
 * records that it was sent (sent_segment_fd). Returns 0 or a negative errno. */
int kvp_session_reply_fd(struct kvp_session *c, const struct kvp_header *req, int fd);

/* Waits for and reads a request header (KVP_HEADER_SIZE bytes). Idle time is unlimited; a
 * started header is not. Returns 0, -ENOTCONN when the client closed the connection between
 * requests (a normal end), -ECONNRESET on an EOF inside a header, -ETIMEDOUT, -ESHUTDOWN at a
 * stop. */
int kvp_session_recv_header(struct kvp_session *c, uint8_t *hdr);

/* Allocates the per-request scratch buffers (the session's and its owner's). 0 or -ENOMEM
 * (free still works). */
int kvp_session_alloc_buffers(struct kvp_session *c);

/* Frees a session, releasing what its owner still holds, and closes its socket. */
void kvp_session_free(struct kvp_session *c);

#endif /* KVP_SESSION_H */
