/*
 * conn.h - one client connection, served by its own thread: framing, I/O with timeouts, and the
 * reservations and pins ("holds") the connection owns.
 */
#ifndef KVP_CONN_H
#define KVP_CONN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "common/wire.h"
#include "store.h"

struct kvp_server;

#define KVP_MAX_HOLDS 1024

/* A reservation (prepare-store) or a pin set (prepare-retrieve) owned by one connection. */
struct kvp_hold {
    uint64_t id;
    uint32_t handle; /* instance it was made for */
    bool is_pin;
    uint32_t n;
    uint64_t chunk_bytes;
    struct kvp_obj **objs;
};

struct kvp_conn {
    struct kvp_server *srv;
    int fd;
    uint64_t id;
    struct ucred peer;
    struct kvp_conn *prev, *next; /* server's connection list */

    uint8_t *body; /* current request body */
    size_t body_cap;
    struct kvp_wbuf out; /* reply body being built */
    char errmsg[KVP_MAX_ERRMSG + 1];

    uint8_t *keys;         /* KVP_MAX_CHUNKS keys of the current request */
    struct kvp_obj **objs; /* KVP_MAX_CHUNKS */
    uint32_t *idx;         /* KVP_MAX_CHUNKS */

    struct kvp_hold *holds;
    uint32_t nholds;
    uint64_t next_hold_id;
};

/* Thread entry: serves c until EOF, error or server stop, then releases everything it held. */
void *kvp_conn_main(void *arg);

/* Receives exactly len bytes. Returns 0, -ECONNRESET on EOF, -ETIMEDOUT, or -errno. */
int kvp_conn_recv(struct kvp_conn *c, void *buf, size_t len);

/*
 * Sends a reply: header (with status and payload_len), the body built in c->out (for status 0)
 * or c->errmsg (status < 0), then the payload iovecs. Returns 0 or a negative errno.
 */
int kvp_conn_reply(struct kvp_conn *c, const struct kvp_header *req, int status,
                   const struct iovec *payload, int npayload, uint64_t payload_len);

/* Sends an empty success reply with fd attached (SCM_RIGHTS). Returns 0 or a negative errno. */
int kvp_conn_reply_fd(struct kvp_conn *c, const struct kvp_header *req, int fd);

/* Hold table. */
struct kvp_hold *kvp_conn_hold_add(struct kvp_conn *c, uint32_t handle, bool is_pin,
                                   struct kvp_obj **objs, uint32_t n, uint64_t chunk_bytes);
struct kvp_hold *kvp_conn_hold_find(struct kvp_conn *c, uint64_t id, uint32_t handle, bool is_pin);
/* Releases (abort or unpin) and removes a hold. */
void kvp_conn_hold_release(struct kvp_conn *c, struct kvp_hold *h);
/* Removes a hold whose objects were already committed. */
void kvp_conn_hold_drop(struct kvp_conn *c, struct kvp_hold *h);
/* Releases every hold of handle (all holds when all is true). */
void kvp_conn_release_holds(struct kvp_conn *c, uint32_t handle, bool all);

/* Dispatches one decoded request (handlers.c). Returns 0 to keep the connection, <0 to close. */
int kvp_handle_request(struct kvp_conn *c, const struct kvp_header *h);

#endif /* KVP_CONN_H */
