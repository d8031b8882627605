/*
 * refusals.h - answering the connections the daemon will not or cannot serve (a peer the
 * credential policy refuses, --max-clients reached, no memory or no thread for the connection)
 * with one error reply, without ever making the accept loop wait (refusals.c).
 */
#ifndef KVP_REFUSALS_H
#define KVP_REFUSALS_H

#include <stdint.h>

#define KVP_REFUSALS_MAX 128    /* refused connections waiting for their first request */
#define KVP_REFUSAL_WAIT_MS 200 /* how long one may take to send it */

struct kvp_refusals;

/* Starts the thread that answers refused connections. Returns 0 or a negative errno (logged by
 * the caller); *out is NULL on failure, and kvp_refusals_add() then answers what it can at once. */
int kvp_refusals_start(struct kvp_refusals **out);

/*
 * Refuses connection fd (taking it over: it is closed in every case) with status (a negative
 * errno) and msg: its first request is answered with that error reply, then it is closed.
 * Never blocks: a request already there is answered at once; otherwise the connection waits on
 * the refusals thread, up to KVP_REFUSAL_WAIT_MS, for its first request. When
 * KVP_REFUSALS_MAX connections are waiting already (or r is NULL), it is closed at once without
 * an answer. Called by the accept loop and by connection threads; r may be NULL.
 */
void kvp_refusals_add(struct kvp_refusals *r, int fd, int status, const char *msg);

/* Stops the thread and closes the connections still waiting. NULL is fine. */
void kvp_refusals_stop(struct kvp_refusals *r);

#endif /* KVP_REFUSALS_H */
