/*
 * latency.c - the LMCache front end's request-latency family (see latency.h).
 *
 * Design. LMCache's operations and their names are this front end's (the LMC_OPS table of
 * lmc/messages.h), so the family that names them is declared here: one histogram per operation
 * id, the names taken from that table at compile time (an id beyond LMC_LATENCY_IDS does not
 * compile), the core's latency scale (kvp_latency_bounds). The core's reports copy and render
 * it as every registered family, showing only the operations served at least once, so the
 * family is absent until the first LMCache request.
 *
 * Threads: the front end's thread records (relaxed atomics, no lock); any thread reports.
 */
#include "lmc/latency.h"

#include "core/stats.h"
#include "lmc/messages.h"

static const char *const names[LMC_LATENCY_IDS] = {
#define LMC_LATENCY_NAME(sym, id, name) [id] = name,
    LMC_OPS(LMC_LATENCY_NAME)
#undef LMC_LATENCY_NAME
};

static struct kvp_hist series[LMC_LATENCY_IDS];

const struct kvp_hist_family lmc_latency_family = {
    .name = "kvpool_lmcache_request_duration_seconds",
    .help = "Time from an LMCache request's arrival on the front end's thread to its reply "
            "handed to ZeroMQ, by operation",
    .label = "op",
    .values = names,
    .nseries = LMC_LATENCY_IDS,
    .series = series,
    .bounds = &kvp_latency_bounds,
    .always = false,
};

int lmc_latency_register(void)
{
    return kvp_hist_family_register(&lmc_latency_family);
}

void kvp_lmc_latency_record(unsigned op, const char *name, uint64_t ns)
{
    (void)name; /* the table's name is the label: it is the same string for a known id */
    kvp_hist_family_record(&lmc_latency_family, op, ns);
}
