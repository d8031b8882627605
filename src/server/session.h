/*
 * session.h - the daemon side of one client connection (a session), served by its own thread:
 * framing, I/O with timeouts, and the reservations and pins ("holds", holds.h) the connection owns.
 */
#ifndef KVP_SESSION_H
#define KVP_SESSION_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "common/msg.h"
#include "common/wire.h"
#include "holds.h"
#include "store.h"

struct kvp_server;

struct kvp_session {
    struct kvp_server *srv;
    int fd;
    uint64_t id;
    struct ucred peer;               /* set before the connection joins the server's list */
    int64_t connected_since_ms;      /* wall clock of the accept */
    struct kvp_session *prev, *next; /* server's connection list */

    uint8_t *body; /* current request body */
    size_t body_cap;
    struct kvp_wbuf out; /* reply body being built */
    char errmsg[KVP_MAX_ERRMSG + 1];

    uint8_t *keys;               /* KVP_MAX_CHUNKS keys of the current request */
    struct kvp_obj **objs;       /* KVP_MAX_CHUNKS */
    uint32_t *idx;               /* KVP_MAX_CHUNKS */
    struct kvp_wire_slot *slots; /* KVP_MAX_CHUNKS, a slots reply being encoded */

    struct kvp_holds holds; /* reservations and pins of this connection */
};

/*
 * Serves a new connection on fd in a thread of its own. Returns 0 (the connection owns fd from
 * here on), -EUSERS when --max-clients connections are being served, or another negative errno
 * (ENOMEM, or from pthread_create); on failure the caller still owns fd.
 */
int kvp_session_spawn(struct kvp_server *s, int fd);

/* The allocation step of kvp_session_spawn() alone, for a caller that runs kvp_session_main()
 * itself (the daemon fuzz driver). Returns NULL when out of memory or at --max-clients. */
struct kvp_session *kvp_session_new(struct kvp_server *s, int fd);

/* Thread entry: serves c until EOF, error or server stop, then releases everything it held,
 * leaves the server's list and frees c (closing its socket). */
void *kvp_session_main(void *arg);

/* Shuts every connection's socket down and waits until all their threads have left. */
void kvp_sessions_close_all(struct kvp_server *s);

/* Receives exactly len bytes. Returns 0, -ECONNRESET on EOF, -ETIMEDOUT, or -errno. */
int kvp_session_recv(struct kvp_session *c, void *buf, size_t len);

/*
 * Sends a reply: header (with status and payload_len), the body built in c->out (for status 0)
 * or c->errmsg (status < 0), then the payload iovecs. Returns 0 or a negative errno.
 */
int kvp_session_reply(struct kvp_session *c, const struct kvp_header *req, int status,
                      const struct iovec *payload, int npayload, uint64_t payload_len);

/* Sends an empty success reply with fd attached (SCM_RIGHTS). Returns 0 or a negative errno. */
int kvp_session_reply_fd(struct kvp_session *c, const struct kvp_header *req, int fd);

#endif /* KVP_SESSION_H */
