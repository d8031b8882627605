/*
 * server.h - the daemon's life cycle: start-up in order, the main loop, reload, stop and
 * shutdown (server.c). The context it builds is struct kvp_server (daemon.h).
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
 * Builds everything the daemon needs before serving, in this order: the front ends opened
 * (kvpool's socket lock and bound socket, the HTTP endpoint, LMCache's address), removal of
 * dead daemons' segments, capacity gate, segment (or private memory), store, L2 tier, registry,
 * then the front ends and threads started (kvpool's socket listening, the expiry thread,
 * LMCache's front end, the warm-up). Logs the start-up line. Returns 0,
 * -ECANCELED when kvp_server_stop() was called meanwhile (not an error: nothing was logged), or
 * another negative errno after logging exactly one ERROR line that says why.
 * kvp_server_destroy() undoes any part.
 */
int kvp_server_start(struct kvp_server *s);

#define KVP_SERVER_RELOAD 1 /* kvp_server_run(): a reload was requested */

/*
 * The main loop: accepts kvpool's connections until kvp_server_stop() (returns 0) or
 * kvp_server_request_reload() (returns KVP_SERVER_RELOAD: the caller reloads and calls it again;
 * the daemon serves meanwhile, on its front ends' threads). A negative errno on failure.
 */
int kvp_server_run(struct kvp_server *s);

/* Asks the server to stop. Async-signal-safe. */
void kvp_server_stop(struct kvp_server *s);

/* Asks the server to stop for a planned restart (SIGUSR2): as kvp_server_stop(), but the pool
 * and its warm-restart index stay in /dev/shm for the next kvpoold (warm_restart.h).
 * Async-signal-safe. */
void kvp_server_stop_planned(struct kvp_server *s);

/* Asks the main loop to return KVP_SERVER_RELOAD. Async-signal-safe. */
void kvp_server_request_reload(struct kvp_server *s);

/*
 * Applies a configuration read again (SIGHUP) to the running server, on the main thread: logs
 * every option whose value differs between cur (in effect) and next, one INFO line for each that
 * the option table marks reloadable (then in effect: the log level and format, the timeouts,
 * follow-cpu, the allowed uids and gids, the L2 ttl and timeout) and one WARN line for each
 * other one (it waits for a restart), then a summary line. cur takes the reloadable values.
 */
void kvp_server_reconfigure(struct kvp_server *s, struct kvp_config *cur,
                            const struct kvp_config *next);

/* Stops every front end (every client told to go, KVP_OWNER_DROP, and waited for), releases
 * memory, unlinks segment (and its warm-restart index) unless kvp_server_stop_planned() asked
 * to leave them, unlinks the socket, and releases the socket's lock last. Safe after a failed
 * or partial start. */
void kvp_server_destroy(struct kvp_server *s);

#endif /* KVP_SERVER_H */
