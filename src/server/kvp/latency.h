/*
 * latency.h - the request latencies of kvpool's own protocol: the histogram family
 * kvpool_request_duration_seconds{op}, one series per opcode, declared here by the front end
 * that knows the opcodes and registered with the core's reports at start-up (stats.h).
 */
#ifndef KVP_LATENCY_H
#define KVP_LATENCY_H

#include <stddef.h>
#include <stdint.h>

#include "core/histogram.h"

/* The family: op = the opcode's name in lower case ("prepare_store"), every opcode from the
 * start (at 0); its series are also the status JSON's "requests". */
extern const struct kvp_hist_family kvp_request_latency_family;

/*
 * Registers the family with the reports (kvp_hist_family_register()); called by
 * kvp_server_init(). Safe to call again, from any thread. Returns 0 or -ENOSPC.
 */
int kvp_request_latency_register(void);

/* Records one request of opcode op that took ns nanoseconds: from the end of its header to the
 * end of its reply. Unknown opcodes are ignored. No lock. */
void kvp_latency_record(uint16_t op, uint64_t ns);

/* The name of opcode op in lower case ("prepare_store"), truncated to size - 1 bytes: the op
 * label of the family. */
void kvp_op_label(uint16_t op, char *out, size_t size);

#endif /* KVP_LATENCY_H */
