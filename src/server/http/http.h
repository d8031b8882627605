/*
 * http.h - the daemon's HTTP endpoint (libmicrohttpd): a health check, the status JSON, the
 * Prometheus metrics and a status page for people. Read-only and unauthenticated; on loopback
 * unless the operator says otherwise (docs/HTTP.md, docs/SECURITY.md).
 *
 *   GET /                 the status page (status_page.html), refreshing from /api/status
 *   GET /api/healthcheck  200 {"status":"healthy"} while serving ("degraded" and its reasons
 *                         added while the L2 tier is not up), else 503 with a reason
 *   GET /api/status       the status JSON (report/status_json.h)
 *   GET /metrics          the Prometheus text format (metrics.h)
 */
#ifndef KVP_HTTP_H
#define KVP_HTTP_H

#include <stdint.h>

#include "base/listen_addr.h"

struct kvp_server;

/* Limits on what an HTTP client can make the daemon hold. */
#define KVP_HTTP_MAX_CONNECTIONS 256     /* at once; more wait in the listen backlog */
#define KVP_HTTP_REQUEST_TIMEOUT_S 3     /* for a request's line and headers, however they come */
#define KVP_HTTP_TIMEOUT_S 5             /* a connection idle (or stalled) this long is closed */
#define KVP_HTTP_MEMORY_LIMIT (16 << 10) /* bytes per connection: request line and headers */

/*
 * Binds and listens on s->cfg.http (an ADDR:PORT value, listen_addr.h) and starts serving from
 * a thread of its own (stop signals blocked), before the pool is reserved: a port that cannot
 * be bound fails the start-up at once, and until kvp_server_start() has finished,
 * /api/healthcheck answers 503 "starting". Logs the URL (with the port the kernel picked for port
 * 0) in an INFO line, and a WARN line when the address is not loopback. Returns 0 (s->http stays
 * NULL for "off"), or a negative errno after logging exactly one ERROR line that says why.
 */
int kvp_http_start(struct kvp_server *s);

/* The port being served, 0 when the endpoint is off. */
uint16_t kvp_http_port(const struct kvp_server *s);

/* Closes every HTTP connection, stops the thread and frees the endpoint. Call before the store
 * and the registry go away. Safe when it never started. */
void kvp_http_stop(struct kvp_server *s);

/*
 * The same endpoint without a thread or a listening socket, for the fuzz driver: it hands over
 * connected sockets (kvp_http_add_connection(), which takes fd: the endpoint closes it) and
 * runs the endpoint itself (kvp_http_run(): what is ready now, without waiting, and the
 * request deadlines; returns how many connections are open). The requests go through the
 * same libmicrohttpd options and handlers as on the network. kvp_http_stop() frees it.
 * Returns 0 or a negative errno.
 */
int kvp_http_start_unthreaded(struct kvp_server *s);
int kvp_http_add_connection(struct kvp_server *s, int fd);
uint32_t kvp_http_run(struct kvp_server *s);

#endif /* KVP_HTTP_H */
