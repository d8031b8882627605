/*
 * daemon.c - the note of a request of an unknown instance (daemon.h). The context itself, struct
 * kvp_server, is built and torn down by server.c.
 */
#include "core/daemon.h"

#include "core/stats.h"

void kvp_note_unknown_instance(struct kvp_server *s)
{
    KVP_COUNT(unknown_instance_requests, 1);
    atomic_store_explicit(&s->unknown_instance_ms, kvp_mono_ms(), memory_order_relaxed);
}
