/*
 * server.h - the daemon's life cycle: start-up in order, the accept loop, stop and shutdown
 * (server.c). The context it builds is struct kvp_server (daemon.h).
 */
#ifndef KVP_SERVER_H
#define KVP_SERVER_H

#include "core/daemon.h"

/*
 * Initialises s with a copy of cfg: nothing is acquired but the self-pipe, so that
 * kvp_server_stop() works from here on. Returns 0 or a negative errno after logging why.
 */
int kvp_server_init(struct kvp_server *s, const struct kvp_config *cfg);

/*
 * Builds everything the daemon needs before serving, in this order: the socket's owner lock,
 * the bound socket, removal of dead daemons' segments, capacity gate, segment (or private
 * memory), store, registry, listening, expiry thread. Logs the start-up line. Returns 0,
 * -ECANCELED when kvp_server_stop() was called meanwhile (not an error: nothing was logged), or
 * another negative errno after logging exactly one ERROR line that says why.
 * kvp_server_destroy() undoes any part.
 */
int kvp_server_start(struct kvp_server *s);

/* Accepts and serves connections until kvp_server_stop(). Returns 0 or a negative errno. */
int kvp_server_run(struct kvp_server *s);

/* Asks the server to stop. Async-signal-safe. */
void kvp_server_stop(struct kvp_server *s);

/* Closes every connection, waits for their threads, releases memory, unlinks segment and
 * socket. Safe after a failed or partial start. */
void kvp_server_destroy(struct kvp_server *s);

#endif /* KVP_SERVER_H */
