/*
 * warmup.h - the pool's background reservation: the part of the pool that start-up did not
 * reserve is reserved on a thread of its own while the daemon serves, and handed to the store
 * step by step.
 */
#ifndef KVP_WARMUP_H
#define KVP_WARMUP_H

struct kvp_server;

/*
 * Starts the reservation thread when the segment is not wholly reserved yet. Returns 0 or the
 * positive error of pthread_create (the pool then stays at its reserved part, which is logged).
 */
int kvp_warmup_start(struct kvp_server *s);

/* Waits for the reservation thread, which stops between two steps once s->stopping is set. */
void kvp_warmup_join(struct kvp_server *s);

#endif /* KVP_WARMUP_H */
