/*
 * client.h - the objects behind the opaque kvp_client and kvp_instance handles.
 *
 * Internal to libkvpool. Lock order: there is one lock, kvp_client.lock. It protects the
 * connection, the shm mapping, the slot scratch array and the instance list. Instances have no
 * lock of their own: every call on an instance takes its client's lock. Copies into and out of
 * pinned or reserved shm slots run without the lock.
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
    kvp_instance *prev, *next; /* the client's list of live instances */
    uint32_t handle;           /* the daemon's instance handle */
    bool shm;                  /* bytes move through the mapping (else inline) */
    kvp_instance_info info;
};

struct kvp_client {
    pthread_mutex_t lock;
    struct kvp_conn conn;
    struct kvp_hello_reply hello;
    struct kvp_shm_map shm;         /* mapped by the first shm registration, kept until close */
    struct kvp_wire_slot *slot_buf; /* KVP_MAX_CHUNKS decode scratch, allocated on first use */
    kvp_instance *instances;
    char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

/* Frees every instance of the client without telling the daemon (instance.c). */
void kvp_instances_free_all(kvp_client *c);

#endif /* KVP_CLIENT_CLIENT_H */
