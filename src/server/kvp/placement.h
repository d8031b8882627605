/*
 * placement.h - running a connection's thread on the CPU of the worker it serves.
 */
#ifndef KVP_PLACEMENT_H
#define KVP_PLACEMENT_H

#include <stdbool.h>
#include <stdint.h>

struct kvp_session;

/*
 * Binds the calling connection thread to the CPU a request came from (hint: CPU + 1 from the
 * request's flags, 0 when unknown), when on (--follow-cpu, as the connection's set has it now)
 * and the CPU differs from the one it is bound to. A CPU the daemon may not use turns following
 * off for this connection.
 */
void kvp_placement_follow(struct kvp_session *c, uint32_t hint, bool on);

#endif /* KVP_PLACEMENT_H */
