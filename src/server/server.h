/*
 * server.h - the daemon object: configuration, pool memory, store, registry, listener and the
 * set of live connections.
 */
#ifndef KVP_SERVER_H
#define KVP_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "config.h"
#include "registry.h"
#include "segment.h"
#include "store.h"
#include "transport.h"

struct kvp_session;
struct kvp_http;
struct kvp_l2;

struct kvp_server {
    struct kvp_config cfg;
    struct kvp_segment seg;
    struct kvp_store store;
    struct kvp_registry registry;
    bool store_ready, registry_ready;
    char shm_reason[KVP_MAX_REASON + 1]; /* why SHM is off, "" when on */
    struct kvp_gate_seen gate;           /* what the capacity gate measured */
    uint64_t started_mono_ms;            /* kvp_server_init(): uptime is counted from here */
    int64_t started_wall_ms;
    /* Set (release) once start-up is complete: from then on, until kvp_server_destroy(), the
     * store, registry and segment may be read by the reporting threads (acquire). */
    atomic_bool serving;
    struct kvp_http *http; /* the HTTP endpoint (http.c), NULL with --http off */
    struct kvp_l2 *l2;     /* the L2 tier (l2.h), NULL with --l2 off */

    int lock_fd; /* <socket>.lock, flocked for our lifetime */
    int listen_fd;
    bool socket_bound; /* the socket file at cfg.socket_path is ours ... */
    dev_t socket_dev;  /* ... as long as it is this inode */
    ino_t socket_ino;
    int wake_fds[2]; /* self-pipe: stop request and expiry wake-up */
    atomic_bool stopping;

    pthread_mutex_t conns_lock; /* guards conns, nconns, next_conn_id (session.c) */
    pthread_cond_t conns_cv;    /* signalled when a connection thread exits */
    struct kvp_session *conns;
    uint32_t nconns;
    uint64_t next_conn_id;

    pthread_t expiry_thread;
    bool expiry_started;
    pthread_mutex_t expiry_lock;
    pthread_cond_t expiry_cv;
};

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

/* Milliseconds of CLOCK_MONOTONIC: the clock of reservation ages and their expiry. */
uint64_t kvp_mono_ms(void);

/* Nanoseconds of CLOCK_MONOTONIC: the clock of request latencies. */
uint64_t kvp_mono_ns(void);

/* Milliseconds since the epoch (CLOCK_REALTIME): the clock of the times the status shows. */
int64_t kvp_wall_ms(void);

/* pthread_create() with SIGINT, SIGTERM, SIGHUP and SIGPIPE blocked in the new thread, so that
 * only the main thread handles the stop signals. Returns 0 or a positive errno. */
int kvp_thread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);

#endif /* KVP_SERVER_H */
