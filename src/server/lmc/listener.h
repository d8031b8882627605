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

/* A parsed --lmcache address. */
struct lmc_addr {
    bool ipc;        /* ipc:///PATH, else tcp://HOST:PORT */
    char path[108];  /* ipc: the socket file (an absolute path that fits sun_path) */
    char host[64];   /* tcp: an IPv4 address, localhost, *, or an IPv6 address in brackets */
    uint16_t port;   /* tcp: 1..65535 */
    bool loopback;   /* tcp: 127.0.0.0/8, localhost or [::1]: no WARN at start-up */
};

/*
 * Parses "tcp://HOST:PORT" or "ipc:///PATH" into *out (out may be NULL: validation only).
 * Returns 0 or -EINVAL.
 */
int lmc_addr_parse(const char *s, struct lmc_addr *out);

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
