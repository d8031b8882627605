/*
 * stats.h - the daemon's counters and gauges, each defined once and rendered from that one
 * definition to every report: the STATS reply (`kvpool stats`, kvp/handlers.c), the status JSON
 * (report/status_json.c) and the Prometheus metrics (report/metrics.c); and the registry of the
 * histogram families those reports render (histogram.h), with the core's own, the store lock's
 * hold time.
 *
 * A row of KVP_COUNTER_MAP or KVP_GAUGE_MAP is
 *
 *   XX(name, family, label, value, help)
 *
 *   name    the statistic's name in STATS and in the status JSON, and its C identifier;
 *   family  its Prometheus metric, without the "kvpool_" prefix (and, for counters, without the
 *           "_total" suffix, which metrics.c adds); rows of one family are adjacent and differ
 *           by the value of their label. NULL for a total that is only the sum of a labelled
 *           family (Prometheus users sum() it; STATS keeps the name it always had), and for
 *           the rows metrics.c renders from the snapshot's groups instead, with a front_end
 *           label (the instances by front end and transport:
 *           kvpool_instances{front_end,transport}; the clients by front end:
 *           kvpool_connected_clients{front_end});
 *   label   the family's label name ("" for none): "transport" or "cause";
 *   value   this row's value of that label;
 *   help    one line; the first row of a family gives the family's HELP text.
 *
 * Counters are relaxed atomics, incremented where the event happens: each is independent and
 * only ever read for reporting. Gauges are not stored: snapshot.c reads them from their owners
 * (store, registry, owner list) when a report is made.
 *
 * Rows by transport name every transport of registry.h (shm, inline, pickle, envelope), each
 * counted under the transport of the instance it concerns (core/ops.c), never folded into
 * another: an LMCache pickle commit is a store_chunks_pickle, not a store_chunks_inline.
 */
#ifndef KVP_STATS_H
#define KVP_STATS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/histogram.h"

#define KVP_COUNTER_MAP(XX)                                                                       \
    XX(connections_accepted, "connections_accepted", "", "", "connections accepted")              \
    XX(connections_rejected, "connections_rejected", "", "",                                      \
       "connections refused (--max-clients, --allow-uid, no thread or memory for them)")          \
    XX(requests, "requests", "", "", "requests answered")                                         \
    XX(request_errors, "request_errors", "", "", "requests answered with an error")               \
    XX(protocol_errors, "protocol_errors", "", "", "connections closed for a malformed frame")    \
    XX(registrations, NULL, "", "", "instances registered")                                       \
    XX(registrations_shm, "registrations", "transport", "shm",                                    \
       "instances registered, by the transport they use")                                         \
    XX(registrations_inline, "registrations", "transport", "inline",                              \
       "instances registered on the inline transport")                                            \
    XX(registrations_pickle, "registrations", "transport", "pickle",                              \
       "instances registered on LMCache's pickle transport")                                      \
    XX(registrations_envelope, "registrations", "transport", "envelope",                          \
       "instances registered on LMCache's tensor envelope transport")                             \
    XX(lookups, "lookups", "", "", "lookup requests")                                             \
    XX(lookup_chunks, "lookup_chunks", "", "", "full chunks asked about by lookups")              \
    XX(lookup_hit_chunks, "lookup_hit_chunks", "", "", "chunks found cached by lookups")          \
    XX(store_chunks_reserved, "store_chunks_reserved", "", "",                                    \
       "chunk slots reserved by prepare-store")                                                   \
    XX(store_chunks_committed, NULL, "", "", "chunks published by commit")                        \
    XX(store_chunks_shm, "store_chunks", "transport", "shm",                                      \
       "chunks stored (published by commit), by the transport that carried them")                 \
    XX(store_chunks_inline, "store_chunks", "transport", "inline",                                \
       "chunks stored through the socket (STORE_INLINE)")                                         \
    XX(store_chunks_pickle, "store_chunks", "transport", "pickle",                                \
       "chunks stored inside LMCache messages (pickle transport)")                                \
    XX(store_chunks_envelope, "store_chunks", "transport", "envelope",                            \
       "chunks stored inside LMCache messages (tensor envelope transport)")                       \
    XX(store_bytes_shm, "store_bytes", "transport", "shm",                                        \
       "chunk bytes stored (published by commit), by the transport that carried them")            \
    XX(store_bytes_inline, "store_bytes", "transport", "inline",                                  \
       "chunk bytes stored through the socket")                                                   \
    XX(store_bytes_pickle, "store_bytes", "transport", "pickle",                                  \
       "chunk bytes stored on the pickle transport")                                              \
    XX(store_bytes_envelope, "store_bytes", "transport", "envelope",                              \
       "chunk bytes stored on the tensor envelope transport")                                     \
    XX(store_chunks_cached, "store_chunks_cached", "", "",                                        \
       "chunks skipped by prepare-store because cached")                                          \
    XX(store_chunks_busy, "store_chunks_busy", "", "",                                            \
       "chunks skipped because another store was in progress")                                    \
    XX(store_chunks_no_space, "allocation_failures", "", "",                                      \
       "chunks not stored for lack of evictable space in the pool")                               \
    XX(store_chunks_aborted, NULL, "", "",                                                        \
       "reserved chunks dropped (abort, unregister, disconnect)")                                 \
    XX(store_chunks_aborted_abort, "reserved_chunks_dropped", "cause", "abort",                   \
       "reserved chunks dropped without being published, by cause")                               \
    XX(store_chunks_aborted_unregister, "reserved_chunks_dropped", "cause", "unregister",         \
       "reserved chunks dropped because their instance was unregistered")                         \
    XX(store_chunks_aborted_disconnect, "reserved_chunks_dropped", "cause", "disconnect",         \
       "reserved chunks dropped because their connection closed")                                 \
    XX(reservations_expired, "reserved_chunks_dropped", "cause", "timeout",                       \
       "reserved chunks cancelled by --reserve-timeout")                                          \
    XX(retrieve_chunks, NULL, "", "", "chunks pinned or sent by retrieves")                       \
    XX(retrieve_chunks_shm, "retrieve_chunks", "transport", "shm",                                \
       "chunks retrieved (pinned for a copy out of the mapping, or sent), by transport")          \
    XX(retrieve_chunks_inline, "retrieve_chunks", "transport", "inline",                          \
       "chunks sent through the socket (RETRIEVE_INLINE)")                                        \
    XX(retrieve_chunks_pickle, "retrieve_chunks", "transport", "pickle",                          \
       "chunks sent inside LMCache messages (pickle transport)")                                  \
    XX(retrieve_chunks_envelope, "retrieve_chunks", "transport", "envelope",                      \
       "chunks sent inside LMCache messages (tensor envelope transport)")                         \
    XX(retrieve_bytes_shm, "retrieve_bytes", "transport", "shm",                                  \
       "chunk bytes retrieved, by transport")                                                     \
    XX(retrieve_bytes_inline, "retrieve_bytes", "transport", "inline",                            \
       "chunk bytes sent through the socket")                                                     \
    XX(retrieve_bytes_pickle, "retrieve_bytes", "transport", "pickle",                            \
       "chunk bytes sent on the pickle transport")                                                \
    XX(retrieve_bytes_envelope, "retrieve_bytes", "transport", "envelope",                        \
       "chunk bytes sent on the tensor envelope transport")                                       \
    XX(evictions, "evictions", "", "", "committed chunks evicted to make room")                   \
    XX(l2_write_queued, "l2_write_queued", "", "", "chunks queued for a copy to L2")              \
    XX(l2_written_chunks, "l2_written_chunks", "", "", "chunks copied to L2 (write-behind)")      \
    XX(l2_written_bytes, "l2_written_bytes", "", "", "bytes written to L2, headers included")     \
    XX(l2_write_dropped, "l2_write_dropped", "", "",                                              \
       "queued copies dropped, oldest first, because the queue was full (--l2-queue)")            \
    XX(l2_write_evicted, "l2_write_evicted", "", "",                                              \
       "queued copies skipped: the chunk left L1 before it could be sent")                        \
    XX(l2_write_failed, "l2_write_failed", "", "", "copies to L2 that failed")                    \
    XX(l2_lookup_hit_chunks, "l2_lookup_hit_chunks", "", "",                                      \
       "chunks that lookups found in L2 after the chunks found in L1")                            \
    XX(l2_hits, "l2_hits", "", "", "chunks loaded from L2 into L1")                               \
    XX(l2_misses, "l2_misses", "", "", "loads that found no value in L2")                         \
    XX(l2_read_bytes, "l2_read_bytes", "", "", "bytes read from L2, headers included")            \
    XX(l2_corrupt, "l2_corrupt_values", "", "",                                                   \
       "values in L2 that failed a check (discarded, never served)")                              \
    XX(l2_errors, "l2_errors", "", "", "failed L2 operations (timeouts, error replies)")          \
    XX(l2_outages, "l2_outages", "", "", "times the L2 tier became unreachable")                  \
    XX(l2_redirects, "l2_redirects", "", "", "Redis Cluster MOVED and ASK redirections")          \
    XX(inline_bytes_in, "inline_received_bytes", "", "",                                          \
       "payload bytes received inline (committed or not)")                                        \
    XX(inline_bytes_out, "inline_sent_bytes", "", "", "payload bytes sent inline")                \
    XX(http_requests, "http_requests", "", "", "HTTP requests answered (http.c)")                 \
    XX(http_errors, "http_errors", "", "", "HTTP requests answered with a 4xx or 5xx status")     \
    XX(lmcache_requests, "lmcache_requests", "", "",                                              \
       "requests answered by the LMCache front end (--lmcache)")                                  \
    XX(lmcache_malformed, "lmcache_malformed_requests", "", "",                                   \
       "LMCache requests that did not decode (answered with their negative reply)")               \
    XX(lmcache_unsupported, "lmcache_unsupported_requests", "", "",                               \
       "LMCache requests of an operation kvpoold does not serve (GPU, CacheBlend, P2P, unknown)") \
    XX(lmcache_dropped, "lmcache_dropped_messages", "", "",                                       \
       "LMCache messages that could not be answered (fewer than 3 frames, stream control of "     \
       "no open stream)")                                                                         \
    XX(lmcache_replies_lost, "lmcache_replies_lost", "", "",                                      \
       "LMCache replies not delivered (the client had gone or stopped reading)")                  \
    XX(lmcache_reaped, "lmcache_reaped_instances", "", "",                                        \
       "LMCache instances unregistered because they fell silent (--lmcache-reap-timeout)")        \
    XX(lmcache_clears_refused, "lmcache_refused_clears", "", "",                                  \
       "LMCache clear requests refused (--lmcache-clear off)")                                    \
    XX(lmcache_replies_refused, "lmcache_refused_replies", "", "",                                \
       "LMCache replies answered negatively: replies its clients had not read filled the memory " \
       "for them (--lmcache-reply-memory)")                                                       \
    XX(lmcache_connections_refused, "lmcache_refused_connections", "", "",                        \
       "LMCache connections closed at the handshake (--lmcache-max-connections)")                 \
    XX(lmcache_instances_refused, "lmcache_refused_registrations", "", "",                        \
       "LMCache registrations refused: their client had --max-instances-per-client instances, "   \
       "or the LMCache front end its share of the instance table")                                \
    XX(lmcache_foreign_commits, "lmcache_foreign_commits", "", "",                                \
       "LMCache commits refused because another connection made their prepare")                   \
    XX(unknown_instance_requests, "unknown_instance_requests", "", "",                            \
       "requests that named an instance this kvpoold has not registered (a worker that did not "  \
       "register again after a restart)")                                                         \
    XX(lmcache_unknown_pings, "lmcache_unknown_instance_pings", "", "",                           \
       "pings of LMCache instances this kvpoold had not registered (a worker from before a "      \
       "restart), answered false once so that the worker registers again")                        \
    XX(lmcache_kv_event_subscriptions, "lmcache_kv_event_subscriptions", "", "",                  \
       "LMCache KV event subscriptions (0.5.7), each answered that kvpoold records no KV "        \
       "events, then ended")                                                                      \
    XX(warm_restart_verified_chunks, "warm_restart_verified_chunks", "", "",                      \
       "chunks adopted from a previous kvpoold's pool whose bytes matched their checksum at "     \
       "their first read")                                                                        \
    XX(warm_restart_corrupt_chunks, "warm_restart_corrupt_chunks", "", "",                        \
       "chunks adopted from a previous kvpoold's pool whose bytes did not match their checksum "  \
       "at their first read (dropped, never served)")

#define KVP_GAUGE_MAP(XX)                                                                     \
    XX(pool_size, "pool_capacity_bytes", "", "", "bytes of the L1 pool")                      \
    XX(pool_reserved, "pool_reserved_bytes", "", "",                                          \
       "pool bytes reserved so far (the rest is reserved in the background after start-up)")  \
    XX(pool_used, "pool_used_bytes", "", "", "pool bytes held by objects")                    \
    XX(pool_largest_free, "pool_largest_free_bytes", "", "",                                  \
       "largest run of free pool bytes (the largest chunk that fits without eviction)")       \
    XX(objects_committed, "objects", "", "", "committed chunks (visible to lookups)")         \
    XX(objects_reserved, "reserved_objects", "", "", "chunks reserved by stores in progress") \
    XX(objects_expired, "expired_objects", "", "",                                            \
       "reservations cancelled by --reserve-timeout whose owner has not ended them")          \
    XX(objects_pinned, "pinned_objects", "", "", "committed chunks pinned by retrieves")      \
    XX(instances, NULL, "", "", "registered instances")                                       \
    XX(instances_shm, NULL, "", "", "registered instances on the shm transport")              \
    XX(instances_inline, NULL, "", "", "registered instances on the inline transport")        \
    XX(instances_pickle, NULL, "", "", "registered instances on the pickle transport")        \
    XX(instances_envelope, NULL, "", "", "registered instances on the envelope transport")    \
    XX(l2_up, "l2_up", "", "", "1 when the L2 tier answers, 0 when it is unreachable or off") \
    XX(l2_backlog_chunks, "l2_backlog_chunks", "", "", "chunks waiting for a copy to L2")     \
    XX(l2_backlog_bytes, "l2_backlog_bytes", "", "", "bytes waiting for a copy to L2")        \
    XX(connections, NULL, "", "",                                                             \
       "connections of kvpool's own protocol being served (what --max-clients bounds)")       \
    XX(max_clients, "max_clients", "", "", "connections allowed at once (--max-clients)")     \
    XX(shm_enabled, "shm_enabled", "", "",                                                    \
       "1 when the pool is shared memory (workers may use the shm transport), else 0")        \
    XX(chunk_tokens, "chunk_tokens", "", "", "tokens per KV chunk")                           \
    XX(uptime_seconds, "uptime_seconds", "", "", "seconds since kvpoold started")             \
    XX(warm_restart_unverified_chunks, "warm_restart_unverified_chunks", "", "",              \
       "chunks adopted from a previous kvpoold's pool not read yet (each is checked against " \
       "its checksum at its first read)")

/* Indices into the value arrays of a snapshot (snapshot.h), in map order. */
enum kvp_counter_id {
#define KVP_COUNTER_ID(name, family, label, value, help) KVP_CTR_##name,
    KVP_COUNTER_MAP(KVP_COUNTER_ID)
#undef KVP_COUNTER_ID
        KVP_NCOUNTERS
};

enum kvp_gauge_id {
#define KVP_GAUGE_ID(name, family, label, value, help) KVP_GAUGE_##name,
    KVP_GAUGE_MAP(KVP_GAUGE_ID)
#undef KVP_GAUGE_ID
        KVP_NGAUGES
};

/* One row of a map, as data. */
struct kvp_stat_desc {
    const char *name;
    const char *family; /* NULL: not a metric of its own (see above) */
    const char *label;  /* "" for none */
    const char *value;
    const char *help;
};

extern const struct kvp_stat_desc kvp_counter_desc[KVP_NCOUNTERS];
extern const struct kvp_stat_desc kvp_gauge_desc[KVP_NGAUGES];

struct kvp_counters {
#define KVP_COUNTER_FIELD(name, family, label, value, help) _Atomic uint64_t name;
    KVP_COUNTER_MAP(KVP_COUNTER_FIELD)
#undef KVP_COUNTER_FIELD
};

extern struct kvp_counters kvp_counters;

#define KVP_COUNT(name, n) \
    atomic_fetch_add_explicit(&kvp_counters.name, (uint64_t)(n), memory_order_relaxed)

/* Copies every counter into v[KVP_NCOUNTERS], in map order (relaxed loads). */
void kvp_counters_read(uint64_t *v);

/* ---- histogram families: what the reports render (histogram.h) ---- */

/* Families one daemon registers at most. */
#define KVP_HIST_FAMILIES 8

/*
 * Adds f to the families the reports render, after those registered before it (the store
 * lock's, kvp_lock_hold_family, is always the first). A front end registers its family at
 * start-up (kvp_server_init()); registering one again does nothing. f and what it points to
 * must outlive the process (static storage). Returns 0, or -ENOSPC when KVP_HIST_FAMILIES
 * are registered.
 */
int kvp_hist_family_register(const struct kvp_hist_family *f);

/* Copies the registered families, at most cap, in registration order into out; returns how
 * many. */
uint32_t kvp_hist_families(const struct kvp_hist_family **out, uint32_t cap);

/* ---- the store lock's hold time: kvpool_store_lock_hold_seconds ---- */

/* Its buckets: 1 us (a lookup) to 1 s. */
extern const struct kvp_hist_bounds kvp_lock_hold_bounds;

/* The family: one histogram without a label, with its maximum beside it
 * (kvpool_store_lock_hold_max_seconds), every series reported from the start. */
extern const struct kvp_hist_family kvp_lock_hold_family;

/* Records one hold of the store lock that lasted ns nanoseconds (store.c, at every release).
 * No lock. */
void kvp_lock_hold_record(uint64_t ns);

#endif /* KVP_STATS_H */
