/*
 * owner.c - who holds reservations, pins and registrations (see owner.h).
 *
 * Design. The core never asks what an owner is on the wire: a front end makes one per client
 * (a kvpool connection, an LMCache worker), passes it to every operation (ops.h), and releases
 * it when the client goes away. Releasing is the one path by which a client's state ends: its
 * reservations are aborted (never published), its pins dropped, then its instances unregistered,
 * so a dead worker leaves nothing reserved, pinned or registered, whichever protocol it spoke.
 *
 * Ids come from one counter for all front ends, so an instance's owner id never names a client
 * of another protocol. The list of owners exists for the status report (snapshot.c): an owner
 * joins it at init and leaves it at destroy, under owners.lock, a leaf lock held for list work
 * only.
 *
 * Daemon-wide events (the shared segment lost, shutdown) reach the front ends through the
 * owners: the core finds the owners concerned (the registry knows whose instances are on shared
 * memory) and calls their front end's callbacks (struct kvp_owner_ops) under the list's lock;
 * each front end hands the event to the thread that serves the owner. No front end keeps its
 * own copy of what the registry decided.
 *
 * Threads: an owner's fields, holds and scratch are used by the one thread serving it at a time;
 * the list, and each owner's ops, by any thread under its lock.
 */
#include "core/owner.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "core/daemon.h"

void kvp_owners_init(struct kvp_owners *l)
{
    *l = (struct kvp_owners){.head = NULL};
    pthread_mutex_init(&l->lock, NULL);
}

void kvp_owners_destroy(struct kvp_owners *l)
{
    pthread_mutex_destroy(&l->lock);
}

void kvp_owner_init(struct kvp_owner *o, struct kvp_server *s, const char *frontend, int32_t pid,
                    uint32_t uid)
{
    *o = (struct kvp_owner){
        .srv = s,
        .pid = pid,
        .uid = pid > 0 ? uid : 0,
        .connected_since_ms = kvp_wall_ms(),
        .max_instances = s->cfg.max_instances_per_client,
    };
    snprintf(o->frontend, sizeof(o->frontend), "%s", frontend);
    kvp_holds_init(&o->holds, &s->store);

    /* Newest first, as the status report lists clients. */
    struct kvp_owners *l = &s->owners;
    pthread_mutex_lock(&l->lock);
    o->id = ++l->next_id;
    o->next = l->head;
    if (l->head)
        l->head->prev = o;
    l->head = o;
    l->n++;
    o->listed = true;
    pthread_mutex_unlock(&l->lock);
}

void kvp_owner_set_ops(struct kvp_owner *o, const struct kvp_owner_ops *ops)
{
    struct kvp_owners *l = &o->srv->owners;
    pthread_mutex_lock(&l->lock);
    o->ops = ops;
    pthread_mutex_unlock(&l->lock);
}

/* The callback of ev in ops, NULL when there is none. */
static void (*event_callback(const struct kvp_owner_ops *ops,
                             enum kvp_owner_event ev))(struct kvp_owner *)
{
    if (!ops)
        return NULL;
    switch (ev) {
    case KVP_OWNER_SHM_LOST:
        return ops->shm_lost;
    case KVP_OWNER_DROP:
        return ops->drop;
    }
    return NULL;
}

uint32_t kvp_owners_notify(struct kvp_owners *l, enum kvp_owner_event ev, const uint64_t *ids,
                           uint32_t n)
{
    uint32_t called = 0;
    pthread_mutex_lock(&l->lock);
    for (struct kvp_owner *o = l->head; o; o = o->next) {
        void (*cb)(struct kvp_owner *) = event_callback(o->ops, ev);
        if (!cb)
            continue;
        bool named = ids == NULL;
        for (uint32_t i = 0; i < n && !named; i++)
            named = ids[i] == o->id;
        if (named) {
            cb(o);
            called++;
        }
    }
    pthread_mutex_unlock(&l->lock);
    return called;
}

/* Sized for the largest request once, not per request. */
int kvp_owner_alloc(struct kvp_owner *o)
{
    if (o->keys && o->objs && o->idx && o->iov)
        return 0;
    if (!o->keys)
        o->keys = malloc((size_t)KVP_MAX_CHUNKS * KVP_KEY_SIZE);
    if (!o->objs)
        o->objs = malloc(sizeof(*o->objs) * KVP_MAX_CHUNKS);
    if (!o->idx)
        o->idx = malloc(sizeof(*o->idx) * KVP_MAX_CHUNKS);
    if (!o->iov)
        o->iov = malloc(sizeof(*o->iov) * KVP_MAX_CHUNKS);
    return o->keys && o->objs && o->idx && o->iov ? 0 : -ENOMEM;
}

/* Holds first: an instance's reservations must not outlive it (its layout sized them). */
uint32_t kvp_owner_release(struct kvp_owner *o, enum kvp_drop_cause why)
{
    if (!o->srv)
        return 0;
    kvp_holds_release_all(&o->holds, 0, true, why);
    return kvp_registry_remove_owner(&o->srv->registry, o->id);
}

void kvp_owner_destroy(struct kvp_owner *o)
{
    if (!o->srv)
        return;
    kvp_owner_release(o, KVP_DROP_DISCONNECT);
    if (o->listed) {
        struct kvp_owners *l = &o->srv->owners;
        pthread_mutex_lock(&l->lock);
        if (o->prev)
            o->prev->next = o->next;
        else
            l->head = o->next;
        if (o->next)
            o->next->prev = o->prev;
        l->n--;
        pthread_mutex_unlock(&l->lock);
        o->listed = false;
    }
    kvp_holds_destroy(&o->holds);
    free(o->keys);
    free(o->objs);
    free(o->idx);
    free(o->iov);
    o->keys = NULL;
    o->objs = NULL;
    o->idx = NULL;
    o->iov = NULL;
    o->srv = NULL;
}

uint32_t kvp_owners_list(struct kvp_owners *l, struct kvp_owner_view *out, uint32_t cap)
{
    uint32_t n = 0;
    pthread_mutex_lock(&l->lock);
    for (const struct kvp_owner *o = l->head; o && n < cap; o = o->next) {
        out[n] = (struct kvp_owner_view){
            .id = o->id,
            .pid = o->pid,
            .uid = o->uid,
            .connected_since_ms = o->connected_since_ms,
        };
        memcpy(out[n].frontend, o->frontend, sizeof(out[n].frontend));
        n++;
    }
    pthread_mutex_unlock(&l->lock);
    return n;
}

/* Order of the groups: by front end. */
static int group_cmp(const void *a, const void *b)
{
    return strcmp(((const struct kvp_owner_group *)a)->frontend,
                  ((const struct kvp_owner_group *)b)->frontend);
}

uint32_t kvp_owners_count_groups(struct kvp_owners *l, struct kvp_owner_group *out, uint32_t cap)
{
    uint32_t n = 0;
    pthread_mutex_lock(&l->lock);
    for (const struct kvp_owner *o = l->head; o; o = o->next) {
        uint32_t g = 0;
        while (g < n && strncmp(out[g].frontend, o->frontend, sizeof(out[g].frontend)) != 0)
            g++;
        if (g == n) {
            if (n == cap)
                continue;
            out[n] = (struct kvp_owner_group){.count = 0};
            memcpy(out[n].frontend, o->frontend, sizeof(out[n].frontend));
            out[n].frontend[KVP_MAX_FRONTEND] = '\0';
            n++;
        }
        out[g].count++;
    }
    pthread_mutex_unlock(&l->lock);
    qsort(out, n, sizeof(*out), group_cmp); /* by front end, outside the lock */
    return n;
}

uint32_t kvp_owners_count(struct kvp_owners *l)
{
    pthread_mutex_lock(&l->lock);
    uint32_t n = l->n;
    pthread_mutex_unlock(&l->lock);
    return n;
}
