/*
 * sessions.h - the set of client connections: accept into the server's list, one thread each,
 * the request loop and the end of a connection (sessions.c).
 */
#ifndef KVP_SESSIONS_H
#define KVP_SESSIONS_H

#include <stdint.h>

struct kvp_server;
struct kvp_session;

/*
 * Serves a new connection on fd in a thread of its own. Returns 0 (the connection owns fd from
 * here on), -EUSERS when --max-clients connections are being served, or another negative errno
 * (ENOMEM, or from pthread_create); on failure the caller still owns fd.
 */
int kvp_session_spawn(struct kvp_server *s, int fd);

/* The allocation step of kvp_session_spawn() alone, for a caller that runs kvp_session_main()
 * itself (the daemon fuzz driver). Returns NULL when out of memory or at --max-clients. */
struct kvp_session *kvp_session_new(struct kvp_server *s, int fd);

/* Thread entry: serves c until EOF, error or server stop, then releases everything it held,
 * leaves the server's list and frees c (closing its socket). */
void *kvp_session_main(void *arg);

/* Shuts the sockets of the connections whose ids are ids[0..n) down (those still there): their
 * threads see EOF and end them as usual. Does not wait. */
void kvp_sessions_drop(struct kvp_server *s, const uint64_t *ids, uint32_t n);

/* Shuts every connection's socket down and waits until all their threads have left. */
void kvp_sessions_close_all(struct kvp_server *s);

#endif /* KVP_SESSIONS_H */
