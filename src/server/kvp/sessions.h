/*
 * sessions.h - the set of kvpool connections (sessions): one thread each, the request loop, the
 * end of a connection, and the owner callbacks through which the core reaches a connection
 * (sessions.c). The listener (listener.h) accepts connections into a set; the fuzz driver and
 * the tests make one of their own.
 */
#ifndef KVP_SESSIONS_H
#define KVP_SESSIONS_H

#include <stdbool.h>
#include <stdint.h>

struct kvp_server;
struct kvp_session;
struct kvp_sessions;
struct kvp_refusals;

/*
 * Makes an empty set of connections of server s: at most s->cfg.max_clients at once, served
 * with s->cfg.io_timeout_ms and s->cfg.follow_cpu until kvp_sessions_configure(). A connection
 * that gets no memory for its buffers is handed to refusals (NULL: closed unanswered). Returns
 * 0 with *out set, or -ENOMEM. Free with kvp_sessions_free() once kvp_sessions_wait() returned.
 */
int kvp_sessions_new(struct kvp_server *s, struct kvp_refusals *refusals,
                     struct kvp_sessions **out);

/* Frees an empty set. NULL is fine. */
void kvp_sessions_free(struct kvp_sessions *set);

/* The options SIGHUP may change: --io-timeout (for connections opened from now on) and
 * --follow-cpu (from each connection's next request). Any thread; lock-free. */
void kvp_sessions_configure(struct kvp_sessions *set, uint32_t io_timeout_ms, bool follow_cpu);

/* How many connections set has: those whose thread has not ended yet. */
uint32_t kvp_sessions_count(struct kvp_sessions *set);

/*
 * Serves a new connection on fd in a thread of its own. Returns 0 (the connection owns fd from
 * here on), -EUSERS when --max-clients connections are being served, or another negative errno
 * (ENOMEM, or from pthread_create); on failure the caller still owns fd.
 */
int kvp_session_spawn(struct kvp_sessions *set, int fd);

/* The allocation step of kvp_session_spawn() alone, for a caller that runs kvp_session_main()
 * itself (the daemon fuzz driver). Returns NULL when out of memory or at --max-clients. */
struct kvp_session *kvp_session_new(struct kvp_sessions *set, int fd);

/* Thread entry: serves c until EOF, error or server stop, then releases everything it held,
 * leaves its set and frees c (closing its socket). */
void *kvp_session_main(void *arg);

/*
 * Waits until every connection of set has ended. It does not end them: at shutdown the server
 * tells every owner to go first (KVP_OWNER_DROP, owner.h), and a connection's callback shuts
 * its socket down, so that its thread sees EOF, releases what it held and leaves.
 */
void kvp_sessions_wait(struct kvp_sessions *set);

#endif /* KVP_SESSIONS_H */
