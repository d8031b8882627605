/*
 * status_json.h - the daemon's status as one JSON document: the body of GET /api/status (http.c),
 * and what the command line shows (docs/HTTP.md lists every field).
 */
#ifndef KVP_STATUS_JSON_H
#define KVP_STATUS_JSON_H

struct kvp_server;
struct kvp_snapshot;

/*
 * Renders the status of s: version, uptime, pool, the SHM decision, every instance with its
 * transport, the clients, every counter and gauge (stats.h) and the request latencies. No lock
 * is held while the text is formatted (snapshot.h). While kvp_server_start() has not finished,
 * a short document with "state": "starting" and no pool (any thread may call it from
 * kvp_server_init() on). Returns a malloc'd NUL-terminated JSON document, indented for people;
 * the caller frees it with free(). NULL when out of memory.
 */
char *kvp_status_json(struct kvp_server *s);

/*
 * The body of a health check while the daemon serves but its L2 tier is not up (down, or
 * refusing the password): {"status": "healthy", "degraded": true, "reasons": ["l2 down: ..."]},
 * one reason per part of the daemon that is degraded. The daemon is still healthy (a liveness
 * probe must not restart it: it serves from L1). NULL when nothing is degraded (no --l2, or L2
 * up), or when out of memory. A malloc'd JSON text without a final newline; free() it.
 */
char *kvp_status_health_degraded(struct kvp_server *s);

/*
 * The document of a serving s from a snapshot the caller took with KVP_SNAP_LISTS and still
 * owns: what kvp_status_json() renders, and what a test renders from a snapshot it completed by
 * hand. s gives what start-up fixed (configuration, the segment). Returns a malloc'd document
 * or NULL when out of memory.
 */
char *kvp_status_json_render(struct kvp_server *s, const struct kvp_snapshot *snap);

#endif /* KVP_STATUS_JSON_H */
