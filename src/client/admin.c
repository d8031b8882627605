/*
 * admin.c - library calls for operators rather than workers: the daemon's status document, its
 * metrics, and clearing the cache (STATUS, METRICS and CLEAR in docs/PROTOCOL.md). They are
 * what the `kvpool` command line is made of, and work on any client, with or without
 * instances.
 *
 * Design. STATUS and METRICS answer with text in the reply body (at most KVP_MAX_TEXT bytes,
 * checked by the decoder); the library copies it into a NUL-terminated string of its own, which
 * the caller frees with kvp_free(), so that a program linked against another C runtime (or
 * Python's ctypes) never has to call our free(). These requests came with protocol 1.1. A 1.0
 * daemon would take them for a malformed frame and close the connection, so they are never
 * sent to one: HELLO told us its minor version, and the call fails with -EOPNOTSUPP instead.
 *
 * Threads: like every call, each takes the client's lock for its round trip.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

/* Refuses, without sending anything, a request the daemon's protocol does not have. Caller
 * holds the lock and has started the call (HELLO of the current connection is known). */
static int check_minor(kvp_client *c, uint16_t op)
{
    if (c->hello.minor >= KVP_MINOR_ADMIN)
        return 0;
    return kvp_conn_error(&c->conn, -EOPNOTSUPP,
                          "kvpoold speaks protocol %u.%u, which has no %s request (%u.%u or "
                          "later needed)",
                          c->hello.major, c->hello.minor, kvp_opcode_name(op), KVP_PROTO_VERSION,
                          KVP_MINOR_ADMIN);
}

/* STATUS or METRICS: the reply's text as a string of our own. Returns its length or an error. */
static int fetch_text(kvp_client *c, uint16_t op, char **out)
{
    const char *text;
    uint32_t n;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (!c)
        return -EINVAL;
    pthread_mutex_lock(&c->lock);
    rc = kvp_client_begin(c);
    if (rc == 0)
        rc = check_minor(c, op);
    if (rc == 0)
        rc = kvp_conn_call(&c->conn, op, NULL, 0, false);
    if (rc == 0 && kvp_decode_text_reply(c->conn.body, c->conn.body_len, &text, &n) != 0)
        rc = kvp_conn_fail(&c->conn, KVP_EPROTO, "malformed %s reply", kvp_opcode_name(op));
    if (rc == 0) {
        char *copy = malloc((size_t)n + 1);
        if (copy) {
            memcpy(copy, text, n);
            copy[n] = '\0';
            *out = copy;
            _Static_assert(KVP_MAX_TEXT <= INT_MAX, "a text length must fit the return value");
            rc = (int)n;
        } else {
            rc = kvp_conn_error(&c->conn, -ENOMEM, "out of memory for a %u-byte %s reply", n,
                                kvp_opcode_name(op));
        }
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

KVP_EXPORT int kvp_get_status(kvp_client *c, char **json_out)
{
    return fetch_text(c, KVP_OP_STATUS, json_out);
}

KVP_EXPORT int kvp_get_metrics(kvp_client *c, char **text_out)
{
    return fetch_text(c, KVP_OP_METRICS, text_out);
}

KVP_EXPORT int kvp_clear(kvp_client *c)
{
    struct kvp_count_reply m;
    int rc;

    if (!c)
        return -EINVAL;
    pthread_mutex_lock(&c->lock);
    rc = kvp_client_begin(c);
    if (rc == 0)
        rc = check_minor(c, KVP_OP_CLEAR);
    if (rc == 0)
        rc = kvp_conn_call(&c->conn, KVP_OP_CLEAR, NULL, 0, false);
    if (rc == 0 && kvp_decode_count_reply(c->conn.body, c->conn.body_len, &m) != 0)
        rc = kvp_conn_fail(&c->conn, KVP_EPROTO, "malformed CLEAR reply");
    if (rc == 0)
        rc = m.count > INT_MAX ? INT_MAX : (int)m.count;
    pthread_mutex_unlock(&c->lock);
    return rc;
}

KVP_EXPORT void kvp_free(void *p)
{
    free(p);
}
