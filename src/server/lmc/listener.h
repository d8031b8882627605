/*
 * listener.h - the LMCache-compatible front end's life cycle: its address, its ZeroMQ ROUTER and
 * the one thread that serves it (listener.c). docs/LMCACHE.md describes the protocol.
 *
 * kvpoold binds the ROUTER where `lmcache server` would (--lmcache ADDR) and answers LMCache's
 * worker and scheduler requests from the same pool, store and statistics as kvpool's own
 * protocol. Start-up order (server.c): lmc_listener_open() binds early, before the pool is
 * reserved, so an address in use fails fast; lmc_listener_start() starts serving once the store
 * and the registry exist; lmc_listener_close() stops the thread, releases every LMCache instance
 * (their reservations aborted, their pins dropped) and closes the socket, before the store goes.
 */
#ifndef KVP_LMC_LISTENER_H
#define KVP_LMC_LISTENER_H

#include <stdbool.h>
#include <stdint.h>

struct kvp_server;
struct lmc_listener;

/* Descriptors beyond --lmcache-max-connections that the front end may hold for a moment: the
 * connections it is closing at their handshake, and libzmq's own. */
#define LMC_FD_SLACK 64

/*
 * Binds the ROUTER at s->cfg.lmcache (a non-loopback TCP address is logged at WARN; an ipc://
 * path must be in a directory private to the daemon's user, and a live socket there is
 * refused). Returns 0 with *out set, or a negative errno after logging why.
 */
int lmc_listener_open(struct kvp_server *s, struct lmc_listener **out);

/* Starts serving (the store and registry of s are ready). Returns 0 or a negative errno. */
int lmc_listener_start(struct lmc_listener *l);

/* Stops serving, releases every LMCache instance, closes the socket (an ipc:// file is
 * removed) and frees l. NULL is fine. */
void lmc_listener_close(struct lmc_listener *l);

#endif /* KVP_LMC_LISTENER_H */
