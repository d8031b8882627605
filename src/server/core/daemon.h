/*
 * daemon.h - the daemon's shared context: configuration, pool memory, store, registry, owners,
 * the front ends (each behind one pointer to its own state: kvpool's, LMCache's, HTTP), the L2
 * tier and the housekeeping thread. Every module that works on the daemon includes this header;
 * only main.c includes server.h, the life cycle that builds and tears it down.
 */
#ifndef KVP_DAEMON_H
#define KVP_DAEMON_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/clock.h"
#include "base/config.h"
#include "base/thread.h"
#include "core/registry.h"
#include "core/segment.h"
#include "core/store.h"
#include "core/transport.h"
#include "core/warm_restart.h"

struct kvp_listener;
struct kvp_http;
struct kvp_l2;
struct lmc_listener;
struct kvp_owner;

/* Every owner (owner.h) of the daemon, of any front end: a list for the reports, and the source
 * of owner ids. */
struct kvp_owners {
    pthread_mutex_t lock; /* guards head, n, next_id (a leaf lock) */
    struct kvp_owner *head;
    uint32_t n;
    uint64_t next_id;
};

struct kvp_server {
    struct kvp_config cfg;
    struct kvp_segment seg;
    struct kvp_warm warm; /* warm restart: the pool's index, what this start adopted */
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
    struct kvp_listener *kvp; /* kvpool's own front end (kvp/listener.h) */
    struct kvp_http *http;    /* the HTTP endpoint (http.c), NULL with --http off */
    struct kvp_l2 *l2;        /* the L2 tier (l2.h), NULL with --l2 off */
    struct lmc_listener *lmc; /* the LMCache front end (lmc/listener.h), NULL without --lmcache */
    /* kvp_mono_ms() when a request last named an instance this daemon has not registered (0:
     * never): a worker that did not register again after a restart (kvp_note_unknown_instance,
     * read by the health check). */
    _Atomic uint64_t unknown_instance_ms;

    int wake_fds[2]; /* self-pipe: stop and reload requests */
    atomic_bool stopping;
    atomic_bool planned_restart;  /* SIGUSR2: the stop leaves the pool for the next kvpoold */
    atomic_bool reload_requested; /* SIGHUP: the main loop returns to main() to reload */

    /* An option SIGHUP changes (config.c's table says which) that a thread of the core reads:
     * stored by the main thread (kvp_server_reconfigure), loaded relaxed where it is used. The
     * front ends keep their own (kvp_listener_reconfigure). cfg keeps the values of start-up. */
    _Atomic uint32_t reserve_timeout_s;

    struct kvp_owners owners; /* the clients of every front end (owner.c) */

    /* The housekeeping thread (expiry.c); expiry_lock guards its sleep, with expiry_cv. */
    pthread_t expiry_thread;
    bool expiry_started;
    pthread_mutex_t expiry_lock;
    pthread_cond_t expiry_cv;
    pthread_t warmup_thread;    /* reserves the rest of the pool (warmup.c) */
    uint64_t reserved_at_start; /* seg.reserved before that thread started (it writes it) */
    bool warmup_started;
};

/* A request of s named an instance this daemon has not registered: counted
 * (unknown_instance_requests) and remembered for the health check. Any thread. */
void kvp_note_unknown_instance(struct kvp_server *s);

#endif /* KVP_DAEMON_H */
