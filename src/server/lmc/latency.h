/*
 * latency.h - the LMCache front end's request latencies: the histogram family
 * kvpool_lmcache_request_duration_seconds{op}, one series per LMCache operation, declared here
 * by the front end that knows the operations and registered with the core's reports at
 * start-up (stats.h).
 */
#ifndef KVP_LMC_LATENCY_H
#define KVP_LMC_LATENCY_H

#include <stdint.h>

#include "core/histogram.h"

/* Operation ids the family has a series for (LMCache's own end at 105: lmc/messages.h). */
#define LMC_LATENCY_IDS 128

/* The family: op = LMCache's name of the operation ("prepare_store"); a series appears once
 * its operation has been served, the family with the first LMCache request. */
extern const struct kvp_hist_family lmc_latency_family;

/* Registers the family with the reports (kvp_hist_family_register()); called by
 * kvp_server_init(), whether --lmcache is on or not. Returns 0 or -ENOSPC. */
int lmc_latency_register(void);

/*
 * Records one LMCache request of operation id op that took ns nanoseconds: from its arrival on
 * the front end's thread to its reply handed to ZeroMQ. name is the operation's name as the
 * caller knows it; the family's own names (lmc/messages.h) are what the reports show. Ids that
 * name no operation of lmc/messages.h are ignored. No lock.
 */
void kvp_lmc_latency_record(unsigned op, const char *name, uint64_t ns);

#endif /* KVP_LMC_LATENCY_H */
