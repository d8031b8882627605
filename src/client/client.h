/*
 * client.h - the objects behind the opaque kvp_client and kvp_instance handles.
 *
 * Internal to libkvpool. Lock order: there is one lock, kvp_client.lock. It protects the
 * connection, the shm mappings (current and retired), the plan counts, the slot scratch array,
 * the instance list and every instance's state. Instances have no lock of their own: every call
 * on an instance takes its client's lock. Copies into and out of pinned or reserved shm slots
 * run without the lock.
 *
 * Generations. c->gen numbers the connections of a client: 1 for the one kvp_client_open()
 * made, one more for each reconnect (reconnect.c). An instance's daemon handle is valid only
 * while inst->gen == c->gen, and a plan only while the generation in its slots (transfer.c)
 * is c->gen and the connection is not broken: reservation and pin ids are the daemon's
 * per-connection numbers and mean nothing, or something else, on a new connection.
 */
#ifndef KVP_CLIENT_CLIENT_H
#define KVP_CLIENT_CLIENT_H

#include <pthread.h>
#include <stdbool.h>
#include <sys/un.h>

#include "common/msg.h"
#include "conn.h"
#include "kvpool.h"
#include "shm_map.h"

struct kvp_instance {
    kvp_client *client;
    kvp_instance *prev, *next;   /* the client's list of live instances */
    uint32_t handle;             /* the daemon's instance handle, valid in generation gen */
    bool shm;                    /* bytes move through the mapping (else inline) */
    uint64_t gen;                /* connection generation of handle; != client->gen: unregistered */
    int err;                     /* why the last registration attempt failed, or 0 */
    bool stale;                  /* the daemon's chunk layout changed: never registered again */
    uint32_t want;               /* the kvp_transport asked for */
    struct kvp_register_req req; /* the registration, kept to register again on reconnect */
    char errmsg[KVP_ERRMSG_SIZE]; /* message of err */
    kvp_instance_info info;
};

/* A mapping of an earlier connection's segment that plans may still point into (reconnect.c). */
struct kvp_retired_map {
    struct kvp_retired_map *next;
    struct kvp_shm_map map;
    uint64_t gen;   /* the connection generation whose plans point into it */
    uint32_t plans; /* live plans with pointers into it; unmapped when it drops to 0 */
};

struct kvp_client {
    pthread_mutex_t lock;
    struct kvp_conn conn;
    struct kvp_hello_reply hello;
    bool sync_commit;       /* KVP_OPT_SYNC_COMMIT: no pipelined commits */
    uint64_t gen;           /* connection generation, see above */
    struct kvp_shm_map shm; /* mapped by the first shm registration of a connection */
    uint64_t shm_gen;       /* generation in which shm was mapped */
    uint32_t shm_plans;     /* live plans with pointers into shm */
    struct kvp_retired_map *retired;
    struct kvp_wire_slot *slot_buf; /* KVP_MAX_CHUNKS decode scratch, allocated on first use */
    kvp_instance *instances;
    char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

/* Frees every instance of the client without telling the daemon (instance.c). */
void kvp_instances_free_all(kvp_client *c);

/*
 * Connects to c->socket_path and says HELLO (client.c): the one way to a daemon, for
 * kvp_client_open() and for every reconnect, so that every check on the way applies to both.
 * Returns 0 or a negative error with errmsg set; the connection is left closed on failure.
 */
int kvp_client_connect(kvp_client *c);

/*
 * Checks without blocking that the daemon has not closed the connection since the last call
 * (reconnect.c). Returns 0, or the error that now marks the connection broken: -ECONNRESET
 * (lost), KVP_EPROTO (the daemon sent bytes nobody asked for). Caller holds the lock.
 */
int kvp_client_probe(kvp_client *c);

/*
 * Starts a public call on the client (reconnect.c): replaces a lost connection first (connect,
 * HELLO, register every instance again), then kvp_conn_begin(). Caller holds the lock. Returns
 * 0, -ENOTCONN after a protocol error, or the error of a failed reconnect (errmsg says why).
 */
int kvp_client_begin(kvp_client *c);

/*
 * Starts a public call on an instance (instance.c): kvp_client_begin(), then makes sure the
 * instance is registered on the current connection (one attempt if it is not). Caller holds
 * the lock. Returns 0 or a negative error with errmsg set.
 */
int kvp_instance_begin(kvp_instance *inst);

/*
 * Registers inst again on a new connection with its saved parameters (instance.c). Caller
 * holds the lock and has said HELLO. Returns 0, or a negative error that is also kept in
 * inst->err and inst->errmsg (the connection is broken too if it was an I/O error).
 */
int kvp_instance_register_again(kvp_instance *inst);

/* Unmaps c->shm, or retires it if plans still point into it (reconnect.c). Caller holds the
 * lock. Returns 0 or -ENOMEM (then nothing changed). */
int kvp_client_retire_map(kvp_client *c);

/* A plan with pointers into the mapping of generation gen (its low 32 bits, as plans keep
 * it) is gone (reconnect.c). Caller holds the lock. */
void kvp_client_plan_unmapped(kvp_client *c, uint32_t gen);

/* Unmaps every retired mapping (reconnect.c), at kvp_client_close(). */
void kvp_client_free_retired(kvp_client *c);

#endif /* KVP_CLIENT_CLIENT_H */
