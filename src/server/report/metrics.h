/*
 * metrics.h - the daemon's metrics in the Prometheus text exposition format 0.0.4: the body of
 * GET /metrics (http.c). docs/HTTP.md lists every metric.
 */
#ifndef KVP_METRICS_H
#define KVP_METRICS_H

#include <stddef.h>

struct kvp_server;
struct kvp_snapshot;

/* The Content-Type of the format. */
#define KVP_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/*
 * Renders the metrics of s, which must have started (kvp_server_start() returned 0): every
 * counter and gauge of stats.h as kvpool_* families with HELP and TYPE, the build info, the
 * instances by front end and transport and the clients by front end
 * (kvpool_instances{front_end,transport}, kvpool_connected_clients{front_end}) and every
 * registered histogram family (stats.h: kvpool_request_duration_seconds{op}, ...). No lock is
 * held while the text
 * is formatted (snapshot.h). Returns a malloc'd NUL-terminated text and its length (without the
 * NUL) in *len; the caller frees it with free(). NULL when out of memory.
 */
char *kvp_metrics_text(struct kvp_server *s, size_t *len);

/*
 * The same text from a snapshot the caller took (kvp_snapshot_take(), any flags) and still
 * owns: what kvp_metrics_text() renders, and what a test renders from a snapshot it completed
 * by hand. Returns a malloc'd text and its length as above, or NULL when out of memory.
 */
char *kvp_metrics_render(const struct kvp_snapshot *snap, size_t *len);

#endif /* KVP_METRICS_H */
