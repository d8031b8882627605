/*
 * reconnect.c - a client outlives its daemon: the next call after a lost connection connects
 * again, says HELLO, registers every live instance again and goes on.
 *
 * When. Only at the start of a public call (kvp_client_begin(), kvp_instance_begin()), and
 * only when the connection was lost: the daemon closed it, died or was restarted (EOF, EPIPE,
 * ECONNRESET), a request timed out, or an earlier reconnect found no daemon (ECONNREFUSED,
 * ENOENT) or an untrusted one. A protocol error (KVP_EPROTO, KVP_EVERSION, KVP_EBADSLOT,
 * -EPROTO) is final: the peer disagrees with us about the protocol and would do so again, so
 * every later call fails with -ENOTCONN, as kvp_conn_reconnectable() decides. The call that
 * saw the connection die fails with that error; nothing is retried behind the caller's back,
 * because a request may have been carried out before the reply was lost.
 *
 * Between calls nothing may arrive on the socket (every reply belongs to a call), so a call
 * first probes it without blocking (kvp_client_probe(): one poll()): a daemon that exited or
 * was restarted while the worker was idle has left an EOF there, and the call reconnects before
 * sending anything instead of failing with EPIPE. Bytes nobody asked for are a protocol error.
 *
 * How much. One attempt per call, bounded by kvp_opts.timeout_ms per step like any request: no
 * thread, no sleep, no loop. A failed attempt returns its error (its message names the socket)
 * and leaves the connection lost, so the next call tries again.
 *
 * Instances. Each is registered again with the parameters it was registered with (instance.c
 * keeps a copy), on the transport a fresh registration would get: the new segment is mapped,
 * or the instance falls back to inline and the daemon logs it as usual. Its kvp_instance and
 * kvp_instance_info stay where they are; handle, transport and segment name are updated. An
 * instance the new daemon refuses (-EEXIST, -EBUSY, KVP_ENOSHM, ...) stays unregistered: its
 * own calls try again, once each, and fail with the daemon's answer; the other instances go
 * on. A daemon that now uses another chunk size would change the size of every chunk buffer
 * the worker holds, so such an instance is dropped for good (-ESTALE, instance.c).
 *
 * Old plans and old mappings. Reservation and pin ids are per connection: a plan prepared on
 * an earlier connection is refused (-ESTALE, transfer.c) and never committed on the new one.
 * Its slot pointers may still be in use, though: a worker thread can be copying into a slot
 * while another call notices the restart. Unmapping the old segment would turn that copy into
 * a segfault; keeping it mapped would keep the dead daemon's pool (or, after a timeout, the
 * living daemon's reused memory) reachable. So a mapping that plans still point into is
 * detached instead (kvp_shm_map_detach(): same addresses, private anonymous pages, late writes
 * land harmlessly, late reads see zeros) and kept on c->retired until its last plan is
 * released, or until kvp_client_close(); a mapping no plan points into is simply unmapped. This
 * happens before the old socket is closed, so by the time the daemon frees our reservations
 * no pointer of ours reaches them. A new segment is always mapped afresh: pointers from an old
 * mapping are never handed out again.
 *
 * Threads: everything here runs with the client's lock held.
 */
#include "client.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

int kvp_client_retire_map(kvp_client *c)
{
    struct kvp_retired_map *r;

    if (!c->shm.base)
        return 0;
    if (c->shm_plans == 0) {
        kvp_shm_map_close(&c->shm);
        return 0;
    }
    r = malloc(sizeof(*r));
    if (!r)
        return kvp_conn_error(&c->conn, -ENOMEM, "out of memory");
    /* If the kernel refuses to detach it, the mapping stays as it is: still no segfault for a
     * late writer, only the old pool kept alive until the plans are gone. */
    (void)kvp_shm_map_detach(&c->shm);
    *r = (struct kvp_retired_map){
        .next = c->retired,
        .map = c->shm,
        .gen = c->shm_gen,
        .plans = c->shm_plans,
    };
    c->retired = r;
    c->shm = (struct kvp_shm_map){0};
    c->shm_plans = 0;
    return 0;
}

void kvp_client_plan_unmapped(kvp_client *c, uint32_t gen)
{
    if (c->shm.base && (uint32_t)c->shm_gen == gen) {
        if (c->shm_plans)
            c->shm_plans--;
        return;
    }
    for (struct kvp_retired_map **p = &c->retired; *p; p = &(*p)->next) {
        struct kvp_retired_map *r = *p;
        if ((uint32_t)r->gen != gen)
            continue;
        if (r->plans && --r->plans == 0) {
            kvp_shm_map_close(&r->map);
            *p = r->next;
            free(r);
        }
        return;
    }
}

void kvp_client_free_retired(kvp_client *c)
{
    while (c->retired) {
        struct kvp_retired_map *r = c->retired;
        c->retired = r->next;
        kvp_shm_map_close(&r->map);
        free(r);
    }
}

/*
 * One reconnect attempt. The old mapping is retired before the old socket is closed (see the
 * file comment); the old HELLO is forgotten so that nothing of the old daemon's segment can be
 * mapped again. An instance refused by the new daemon does not fail the attempt, a connection
 * that breaks again does.
 */
static int do_reconnect(kvp_client *c)
{
    struct kvp_conn *conn = &c->conn;
    char why[KVP_ERRMSG_SIZE];
    int rc;

    rc = kvp_client_retire_map(c);
    if (rc < 0)
        return rc;
    kvp_conn_close(conn);
    c->hello = (struct kvp_hello_reply){0};

    rc = kvp_client_connect(c);
    if (rc < 0) {
        snprintf(why, sizeof(why), "%s", conn->errmsg[0] ? conn->errmsg : kvp_strerror(rc));
        /* A protocol error has marked the connection broken for good already; anything else
         * leaves it lost, for the next call to try again. */
        if (kvp_conn_reconnectable(conn))
            conn->broken = rc;
        snprintf(conn->errmsg, sizeof(conn->errmsg),
                 "lost the connection to kvpoold and could not reconnect: %.440s", why);
        memcpy(conn->broken_msg, conn->errmsg, sizeof(conn->broken_msg));
        return rc;
    }

    /* Oldest first (the list is newest first): a fresh daemon then hands out the handles in
     * the order the worker's first daemon did, and logs the instances in that order. */
    kvp_instance *inst = c->instances;
    while (inst && inst->next)
        inst = inst->next;
    for (; inst; inst = inst->prev) {
        rc = kvp_instance_register_again(inst);
        if (rc < 0 && conn->broken)
            return rc;
    }
    return 0;
}

int kvp_client_probe(kvp_client *c)
{
    struct kvp_conn *conn = &c->conn;
    struct pollfd p = {.fd = conn->fd, .events = POLLIN};
    char byte;
    ssize_t n;

    if (conn->broken || conn->fd < 0 || poll(&p, 1, 0) != 1)
        return 0;
    n = recv(conn->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0)
        return kvp_conn_fail(conn, KVP_EPROTO,
                             "kvpoold sent data nobody asked for between requests");
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        return kvp_conn_fail(conn, n == 0 ? -ECONNRESET : -errno,
                             "kvpoold closed the connection: it exited or was restarted");
    return 0;
}

int kvp_client_begin(kvp_client *c)
{
    int rc;

    c->conn.errmsg[0] = '\0';
    rc = kvp_client_probe(c);
    if (rc < 0 && !kvp_conn_reconnectable(&c->conn))
        return rc;
    if (c->conn.broken && kvp_conn_reconnectable(&c->conn)) {
        rc = do_reconnect(c);
        if (rc < 0)
            return rc;
    }
    return kvp_conn_begin(&c->conn);
}
