/*
 * stats.c - storage of the counters declared in stats.h. Gauges (pool usage, objects,
 * instances) are not stored: handlers.c computes them from their owners when STATS is asked.
 */
#include "stats.h"

struct kvp_counters kvp_counters;
