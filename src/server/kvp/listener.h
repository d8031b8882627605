/*
 * listener.h - kvpool's own front end on its Unix socket: the socket's owner lock, the bound and
 * listening socket, accepting connections under the peer-credential policy and --max-clients,
 * and the front end's life cycle (listener.c).
 *
 * Life cycle (server.c calls these in order): kvp_listener_open() takes the lock and binds,
 * before the pool is reserved, so that a second daemon, a bad path or a socket in use fail at
 * once; kvp_listener_start() listens once the store and the registry exist; the main loop polls
 * kvp_listener_fd() and calls kvp_listener_accept(); kvp_listener_stop() closes the socket,
 * kvp_listener_drain() waits for the connections (which the server ends through their owners,
 * KVP_OWNER_DROP), and kvp_listener_close() releases the lock, last of all.
 */
#ifndef KVP_LISTENER_H
#define KVP_LISTENER_H

#include <stdint.h>

struct kvp_server;
struct kvp_config;
struct kvp_listener;
struct kvp_sessions;

/*
 * Takes the owner lock of s->cfg.socket_path (<socket>.lock, flocked until
 * kvp_listener_close(); the default socket directory is created or checked first) and binds
 * the socket, without listening (a client gets ECONNREFUSED until kvp_listener_start(), never
 * a hang). Copies the peer policy (--allow-uid, --allow-gid) of s->cfg. Returns 0 with *out
 * set, or a negative errno after logging exactly one ERROR line; then *out is NULL and nothing
 * is held.
 */
int kvp_listener_open(struct kvp_server *s, struct kvp_listener **out);

/*
 * Starts serving (the store and the registry of l's server are ready): the thread that answers
 * refused connections (refusals.h), the set of connections (sessions.h), then listen(). Returns
 * 0 or a negative errno after logging why.
 */
int kvp_listener_start(struct kvp_listener *l);

/* The listening socket, for the main loop's poll() (POLLIN: kvp_listener_accept()); -1 before
 * kvp_listener_start() and after kvp_listener_stop(). */
int kvp_listener_fd(const struct kvp_listener *l);

/*
 * Accepts one connection and serves it in a thread of its own, or refuses it (a peer the policy
 * refuses, --max-clients reached, no thread): refusals are answered by the refusals thread, so
 * this never waits for a peer. Call on the thread that calls kvp_listener_reconfigure().
 */
void kvp_listener_accept(struct kvp_listener *l);

/* Applies a configuration read again (SIGHUP): the peer policy (--allow-uid, --allow-gid) for
 * the connections accepted from now on, --io-timeout and --follow-cpu (sessions.h). */
void kvp_listener_reconfigure(struct kvp_listener *l, const struct kvp_config *cfg);

/* The set of connections (NULL before kvp_listener_start()): for the tests that hand it a
 * connection of their own. */
struct kvp_sessions *kvp_listener_sessions(struct kvp_listener *l);

/* No new connections: closes the listening socket and unlinks its file if it is still the one
 * this daemon bound (same device and inode). Live connections go on. NULL is fine. */
void kvp_listener_stop(struct kvp_listener *l);

/* After kvp_listener_stop() and KVP_OWNER_DROP: waits until every connection has ended, then
 * stops the refusals thread (a connection without buffers hands its socket to it until then).
 * NULL is fine. */
void kvp_listener_drain(struct kvp_listener *l);

/* Releases the socket's owner lock (the lock file stays) and frees l; last, so that until then
 * a new daemon on this socket finds it in use. Stops and drains first if that was not done.
 * NULL is fine. */
void kvp_listener_close(struct kvp_listener *l);

#endif /* KVP_LISTENER_H */
