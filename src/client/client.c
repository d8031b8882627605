/*
 * client.c - library entry points that concern the client as a whole: open (connect + HELLO),
 * close, last error, ping and statistics. Version and error names are in src/common/errors.c.
 *
 * Design. kvp_client_open() resolves the socket path (explicit option, $KVPOOL_SOCKET, then
 * kvp_default_socket_path()), connects, and says HELLO before returning: a client that exists
 * has talked to a daemon of a compatible major version and knows whether shared memory is
 * offered. Nothing is mapped here; the first shm registration maps the segment (instance.c).
 * Connect + HELLO is kvp_client_connect(), which a reconnect after a lost connection runs again
 * (reconnect.c); every public call starts with kvp_client_begin() or kvp_instance_begin().
 *
 * Threads. Every call that talks to the daemon takes c->lock for the whole round trip, so calls
 * from several threads on one client are serialised and replies can never be mixed up. Close is
 * not synchronised: the caller must make sure no other call on the client is running.
 */
#include "client.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Why the last kvp_client_open() of this thread failed: there is no handle to carry it. */
static _Thread_local char open_errmsg[KVP_ERRMSG_SIZE];

/* Fills path with the socket to use: the option, $KVPOOL_SOCKET, or the default rule. */
static int resolve_path(const kvp_opts *opts, char *path, size_t size)
{
    const char *p = opts ? opts->socket_path : NULL;

    if (!p) {
        p = getenv("KVPOOL_SOCKET");
        if (p && !p[0])
            p = NULL;
    }
    if (!p)
        return kvp_default_socket_path(path, size);
    size_t n = strlen(p);
    if (n == 0)
        return -EINVAL;
    if (n >= size)
        return -ENAMETOOLONG;
    memcpy(path, p, n + 1);
    return (int)n;
}

/*
 * HELLO: the first request on every connection. Fills c->hello. Only the major number must
 * match: minor versions add things a client may ignore. A chunk size of 0 would make every
 * range computation divide by zero, so it is refused here once.
 */
static int say_hello(kvp_client *c)
{
    struct kvp_conn *conn = &c->conn;
    struct kvp_hello_reply *h = &c->hello;
    int rc;

    rc = kvp_conn_begin(conn);
    if (rc < 0)
        return rc;
    rc = kvp_conn_call(conn, KVP_OP_HELLO, NULL, 0, false);
    if (rc < 0)
        return rc;
    if (kvp_decode_hello_reply(conn->body, conn->body_len, h) < 0)
        return kvp_conn_fail(conn, KVP_EPROTO, "malformed HELLO reply");
    /* The protocol's version, not the library's ABI version: they change for different reasons. */
    if (h->major != KVP_PROTO_VERSION)
        return kvp_conn_fail(conn, KVP_EVERSION,
                             "kvpoold speaks protocol %u.%u, this library speaks protocol %u.%u",
                             h->major, h->minor, KVP_PROTO_VERSION, KVP_PROTO_MINOR);
    if (h->chunk_tokens == 0)
        return kvp_conn_fail(conn, KVP_EPROTO, "kvpoold announced a chunk size of 0 tokens");
    return 0;
}

/* Every successful connect + HELLO starts a new generation: handles, reservations and pins of
 * an earlier connection are recognisable as such (client.h). */
int kvp_client_connect(kvp_client *c)
{
    int rc = kvp_conn_connect(&c->conn, c->socket_path, c->conn.timeout_ms);

    if (rc == 0)
        rc = say_hello(c);
    if (rc < 0) {
        kvp_conn_close(&c->conn);
        return rc;
    }
    c->gen++;
    return 0;
}

/* $KVPOOL_POLL_US: microseconds to yield-poll for a reply before sleeping (conn.c). */
static int read_poll_us(struct kvp_conn *c)
{
    const char *v = getenv("KVPOOL_POLL_US");
    char *end;
    if (!v || !*v)
        return 0;
    errno = 0;
    unsigned long us = strtoul(v, &end, 10);
    if (*end || errno || us > KVP_POLL_US_MAX || v[0] == '-')
        return kvp_conn_error(c, -EINVAL,
                              "KVPOOL_POLL_US must be microseconds from 0 to %u, not '%.40s'",
                              KVP_POLL_US_MAX, v);
    c->poll_us = (uint32_t)us;
    return 0;
}

/*
 * The client is fully built (lock, path, connection, HELLO) before it is returned, and torn down
 * by the ordinary destructor on any failure, so there is exactly one cleanup path. The resolved
 * path and the timeout are kept: a reconnect goes to the same socket, never to whatever
 * $KVPOOL_SOCKET says by then.
 */
KVP_EXPORT int kvp_client_open(const kvp_opts *opts, kvp_client **ret)
{
    kvp_client *c;
    int rc;

    if (!ret)
        return -EINVAL;
    *ret = NULL;

    c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->conn = (struct kvp_conn)KVP_CONN_INIT;
    rc = pthread_mutex_init(&c->lock, NULL);
    if (rc) {
        free(c);
        return -rc;
    }

    for (size_t i = 0; opts && i < sizeof(opts->reserved_) / sizeof(opts->reserved_[0]); i++) {
        if (opts->reserved_[i]) {
            rc = kvp_conn_error(&c->conn, -EINVAL,
                                "kvp_opts.reserved_[%zu] is not zero: "
                                "zero-initialise kvp_opts",
                                i);
            goto out_free;
        }
    }
    if (opts && (opts->flags & ~KVP_OPT_SYNC_COMMIT)) {
        rc = kvp_conn_error(&c->conn, -EINVAL, "kvp_opts.flags has unknown bits 0x%x",
                            opts->flags & ~KVP_OPT_SYNC_COMMIT);
        goto out_free;
    }
    c->sync_commit = opts && (opts->flags & KVP_OPT_SYNC_COMMIT);
    rc = read_poll_us(&c->conn);
    if (rc < 0)
        goto out_free;
    if (opts && opts->trust_uid)
        c->conn.trust_uid = opts->trust_uid;
    rc = resolve_path(opts, c->socket_path, sizeof(c->socket_path));
    if (rc < 0)
        goto out_free;
    c->conn.timeout_ms = opts ? opts->timeout_ms : 0;
    rc = kvp_client_connect(c);
    if (rc < 0)
        goto out_free;

    *ret = c;
    return 0;

out_free:
    snprintf(open_errmsg, sizeof(open_errmsg), "%s",
             c->conn.errmsg[0] ? c->conn.errmsg : kvp_strerror(rc));
    kvp_client_close(c);
    return rc;
}

KVP_EXPORT void kvp_client_close(kvp_client *c)
{
    if (!c)
        return;
    /* Closing the socket is what releases our reservations, pins and instances daemon-side;
     * the mapping can go afterwards since nothing of ours is reserved any more. */
    kvp_instances_free_all(c);
    kvp_conn_close(&c->conn);
    kvp_shm_map_close(&c->shm);
    kvp_client_free_retired(c);
    free(c->slot_buf);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* Read without the lock: the caller only asks after its own call returned, and the buffer is
 * always NUL-terminated. Concurrent calls on the same client may overwrite it. */
KVP_EXPORT const char *kvp_last_error(const kvp_client *c)
{
    return c ? c->conn.errmsg : open_errmsg;
}

/* PING has empty request and reply bodies; anything else is a confused peer. */
KVP_EXPORT int kvp_ping(kvp_client *c)
{
    int rc;

    if (!c)
        return -EINVAL;
    pthread_mutex_lock(&c->lock);
    rc = kvp_client_begin(c);
    if (rc == 0)
        rc = kvp_conn_call(&c->conn, KVP_OP_PING, NULL, 0, false);
    if (rc == 0 && c->conn.body_len != 0)
        rc = kvp_conn_fail(&c->conn, KVP_EPROTO, "PING reply has a %zu-byte body",
                           c->conn.body_len);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

/* Returns the daemon's count even when it exceeds cap, like snprintf, so that a caller can
 * size its array and ask again. */
KVP_EXPORT int kvp_stats(kvp_client *c, kvp_stat *out, size_t cap)
{
    struct kvp_stat_entry *e = NULL;
    int rc;

    if (!c || (!out && cap))
        return -EINVAL;
    if (cap > KVP_MAX_STATS)
        cap = KVP_MAX_STATS;
    /* kvp_stat and the wire entry have the same fields, but the public struct is not ours to
     * decode into directly: go through a scratch array. */
    if (cap) {
        e = calloc(cap, sizeof(*e));
        if (!e)
            return -ENOMEM;
    }

    pthread_mutex_lock(&c->lock);
    rc = kvp_client_begin(c);
    if (rc == 0)
        rc = kvp_conn_call(&c->conn, KVP_OP_STATS, NULL, 0, false);
    if (rc == 0) {
        rc = kvp_decode_stats_reply(c->conn.body, c->conn.body_len, e, cap);
        if (rc < 0)
            rc = kvp_conn_fail(&c->conn, KVP_EPROTO, "malformed STATS reply");
    }
    pthread_mutex_unlock(&c->lock);

    for (int i = 0; rc > 0 && (size_t)i < cap && i < rc; i++) {
        _Static_assert(sizeof(out[i].name) == sizeof(e[i].name), "stat name sizes differ");
        memcpy(out[i].name, e[i].name, sizeof(out[i].name));
        out[i].value = e[i].value;
    }
    free(e);
    return rc;
}
