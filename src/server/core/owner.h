/*
 * owner.h - who holds reservations, pins and registrations, whatever protocol it speaks.
 *
 * An owner is one client of the daemon as the core sees it: a kvpool connection (kvp/), or an
 * LMCache worker known by its instance id and ZeroMQ identity. It has an id (unique in the
 * daemon's lifetime, shared by every front end, and what kvp_registration.owner names), the
 * name of its front end, its peer's pid and uid when known, when it connected, its holds
 * (holds.h) and how many instances it may register at once. What ends it is the front end's
 * business (a socket that closes, a liveness timeout that fires); the front end then calls
 * kvp_owner_release() or kvp_owner_destroy(), which abort its reservations, drop its pins and
 * unregister its instances at once.
 *
 * Threads: an owner is used by one thread at a time (its holds and scratch have no lock); the
 * front end serialises the requests of one owner. The server's list of owners (for the status
 * report) is guarded by owners.lock, a leaf lock.
 */
#ifndef KVP_OWNER_H
#define KVP_OWNER_H

#include <stdint.h>
#include <sys/uio.h>

#include "core/holds.h"
#include "core/registry.h"

struct kvp_server;
struct kvp_owners;
struct kvp_owner;

/*
 * The daemon-wide events an owner's front end hears of (as h2o's connection callbacks or
 * haproxy's mux ops): the core decides what happened and to whom, each front end reacts in its
 * own terms. Called through kvp_owners_notify() on the thread that found the event (the expiry
 * thread, the main thread at shutdown), with the owners' lock held: a callback must not block,
 * take another lock of the core, or end the owner itself; it hands the event to the thread that
 * serves the owner (shut a socket down, set an atomic flag), which then ends or changes the owner
 * as usual (kvp_owner_release(), kvp_owner_destroy()). A NULL callback ignores the event.
 * Lifetime: a callback may run until kvp_owner_destroy() or kvp_owner_set_ops(o, NULL) has
 * returned (both take the lock), so whatever it touches (a socket, a flag) must live until then:
 * unlist the owner before closing or freeing it.
 */
struct kvp_owner_ops {
    /* The shared segment is lost (seg_guard.h): the owner has an instance on shared memory,
     * whose chunks can no longer travel there. The registry has stopped offering the segment;
     * the front end moves the owner's workers to its transport without it. */
    void (*shm_lost)(struct kvp_owner *o);
    /* The daemon ends the owner's client (shutdown): the front end closes it. */
    void (*drop)(struct kvp_owner *o);
};

enum kvp_owner_event {
    KVP_OWNER_SHM_LOST,
    KVP_OWNER_DROP,
};

struct kvp_owner {
    struct kvp_server *srv;
    uint64_t id;                         /* unique among all owners of the daemon, never 0 */
    char frontend[KVP_MAX_FRONTEND + 1]; /* "kvpool", "lmcache" */
    int32_t pid;                         /* the peer's pid, -1 when unknown */
    uint32_t uid;                        /* the peer's uid, when pid is known */
    int64_t connected_since_ms;          /* wall clock, ms since the epoch */
    uint32_t max_instances;              /* it may register (--max-instances-per-client) */
    struct kvp_holds holds;              /* its reservations and pins */
    const struct kvp_owner_ops *ops;     /* its front end's callbacks (owners.lock), or NULL */

    /* Scratch of the operations (ops.c), KVP_MAX_CHUNKS entries each, allocated on first use:
     * the keys of the request being served, the objects it reserved or pinned, their chunk
     * indices, and the iovecs of an inline transfer. */
    uint8_t *keys;
    struct kvp_obj **objs;
    uint32_t *idx;
    struct iovec *iov;

    struct kvp_owner *prev, *next; /* the server's list */
    bool listed;
};

/* The server's list of owners (struct kvp_owners, daemon.h): init and destroy. */
void kvp_owners_init(struct kvp_owners *l);
void kvp_owners_destroy(struct kvp_owners *l);

/*
 * Makes o an owner of server s for front end frontend ("kvpool", "lmcache"), with peer pid and
 * uid (pid -1: unknown): gives it the next id, the current wall-clock time, the instance limit
 * of s->cfg (--max-instances-per-client; 0 there: none), an empty hold table, and adds it to
 * s->owners. Allocates nothing and cannot fail; buffers come on first use. Undo with
 * kvp_owner_destroy().
 */
void kvp_owner_init(struct kvp_owner *o, struct kvp_server *s, const char *frontend, int32_t pid,
                    uint32_t uid);

/* Gives o the callbacks of its front end (under the owners' lock: an event may be delivered
 * from another thread as soon as it is set). NULL: o ignores every event. */
void kvp_owner_set_ops(struct kvp_owner *o, const struct kvp_owner_ops *ops);

/*
 * Delivers event ev to every owner of l whose id is one of ids[0..n) (every owner when ids is
 * NULL) and whose ops have a callback for it, under the lock (see struct kvp_owner_ops).
 * Returns how many callbacks were called.
 */
uint32_t kvp_owners_notify(struct kvp_owners *l, enum kvp_owner_event ev, const uint64_t *ids,
                           uint32_t n);

/*
 * Allocates the scratch the operations use, once. Returns 0 or -ENOMEM (the operations call it
 * themselves; a front end may call it early to fail at connection time instead).
 */
int kvp_owner_alloc(struct kvp_owner *o);

/*
 * The owner went away: aborts its reservations and drops its pins (counted under why,
 * normally KVP_DROP_DISCONNECT), then unregisters every instance it registered. Returns how
 * many instances were unregistered. The owner stays usable (and listed): this is also what a
 * liveness timeout does to an owner that may come back.
 */
uint32_t kvp_owner_release(struct kvp_owner *o, enum kvp_drop_cause why);

/* kvp_owner_release(o, KVP_DROP_DISCONNECT), then leaves s->owners and frees the buffers.
 * Safe on a zeroed owner. */
void kvp_owner_destroy(struct kvp_owner *o);

/* A connected owner as the status report shows it. */
struct kvp_owner_view {
    uint64_t id;
    char frontend[KVP_MAX_FRONTEND + 1];
    int32_t pid; /* -1 when unknown */
    uint32_t uid;
    int64_t connected_since_ms;
};

/* Copies up to cap owners of l, newest first, into out; returns how many. Lock held for the
 * copy only. */
uint32_t kvp_owners_list(struct kvp_owners *l, struct kvp_owner_view *out, uint32_t cap);

/* How many owners one front end has. */
struct kvp_owner_group {
    char frontend[KVP_MAX_FRONTEND + 1];
    uint32_t count;
};

/* Counts the owners of l by front end: up to cap groups into out, ordered by front-end name;
 * returns how many. Owners of a front end beyond cap are left out (front-end names are the
 * daemon's own: a cap of a few is never reached). Lock held for the count only. */
uint32_t kvp_owners_count_groups(struct kvp_owners *l, struct kvp_owner_group *out, uint32_t cap);

/* How many owners l has (an upper bound for kvp_owners_list(): allocate before copying). */
uint32_t kvp_owners_count(struct kvp_owners *l);

#endif /* KVP_OWNER_H */
