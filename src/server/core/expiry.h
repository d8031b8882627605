/*
 * expiry.h - the daemon's housekeeping thread (expiry.c): once a second it cancels overdue
 * reservations, reports the counts of rate-limited log lines and handles a shared segment lost
 * under the daemon (seg_guard.h).
 */
#ifndef KVP_EXPIRY_H
#define KVP_EXPIRY_H

struct kvp_server;

/*
 * Starts the thread (thread name "kvp-expiry") over the store, registry and owners of s, which
 * are ready. Returns 0 or a negative errno (from pthread_create; the caller logs it).
 */
int kvp_expiry_start(struct kvp_server *s);

/* Wakes the thread early and joins it (s->stopping is set). Nothing to do when it was not
 * started. */
void kvp_expiry_stop(struct kvp_server *s);

#endif /* KVP_EXPIRY_H */
