/*
 * stats.h - the daemon's counters, defined once in KVP_COUNTER_MAP and rendered from that list
 * (STATS reply, `kvpool stats`). Counters are relaxed atomics: each is independent and only
 * ever read for reporting.
 */
#ifndef KVP_STATS_H
#define KVP_STATS_H

#include <stdatomic.h>
#include <stdint.h>

#define KVP_COUNTER_MAP(XX)                                                             \
    XX(connections_accepted, "connections accepted")                                    \
    XX(connections_rejected, "connections refused at --max-clients")                    \
    XX(requests, "requests answered")                                                   \
    XX(request_errors, "requests answered with an error")                               \
    XX(protocol_errors, "connections closed for a malformed frame")                     \
    XX(registrations, "instances registered")                                           \
    XX(registrations_shm, "instances registered on the shm transport")                  \
    XX(registrations_inline, "instances registered on the inline transport")            \
    XX(lookups, "lookup requests")                                                      \
    XX(lookup_hit_chunks, "chunks found cached by lookups")                             \
    XX(store_chunks_reserved, "chunk slots reserved by prepare-store")                  \
    XX(store_chunks_committed, "chunks published by commit")                            \
    XX(store_chunks_cached, "chunks skipped by prepare-store because cached")           \
    XX(store_chunks_busy, "chunks skipped because another store was in progress")       \
    XX(store_chunks_no_space, "chunks not stored for lack of evictable space")          \
    XX(store_chunks_aborted, "reserved chunks dropped (abort, unregister, disconnect)") \
    XX(reservations_expired, "reserved chunks cancelled by --reserve-timeout")          \
    XX(retrieve_chunks, "chunks pinned or sent by retrieves")                           \
    XX(evictions, "committed chunks evicted to make room")                              \
    XX(inline_bytes_in, "payload bytes received inline")                                \
    XX(inline_bytes_out, "payload bytes sent inline")

struct kvp_counters {
#define KVP_COUNTER_FIELD(name, help) _Atomic uint64_t name;
    KVP_COUNTER_MAP(KVP_COUNTER_FIELD)
#undef KVP_COUNTER_FIELD
};

extern struct kvp_counters kvp_counters;

#define KVP_COUNT(name, n) \
    atomic_fetch_add_explicit(&kvp_counters.name, (uint64_t)(n), memory_order_relaxed)

#endif /* KVP_STATS_H */
