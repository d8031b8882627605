/*
 * latency.c - the request-latency family of kvpool's own protocol (see latency.h).
 *
 * Design. The opcodes are this front end's business (common/wire.h), so the family that names
 * them is declared here, not in the core: one histogram per opcode, indexed by opcode (slot 0
 * names nothing), with the core's latency scale (kvp_latency_bounds, 50 us to 10 s). The core's
 * reports copy and render it as they do every registered family, without knowing what an
 * opcode is. The label values are the opcodes' names in lower case, made once, before the
 * family is registered, so a reader never sees a half-written name.
 *
 * Threads: any thread records (relaxed atomics, no lock); registration runs once
 * (pthread_once), normally from kvp_server_init().
 */
#include "kvp/latency.h"

#include <ctype.h>
#include <pthread.h>

#include "common/wire.h"
#include "core/stats.h"

/* Longest opcode name, lower-cased, with its NUL. */
#define OP_LABEL_MAX 32

static char labels[KVP_OP_MAX_][OP_LABEL_MAX];
static const char *values[KVP_OP_MAX_]; /* labels[op], or NULL for slot 0 */
static struct kvp_hist series[KVP_OP_MAX_];

const struct kvp_hist_family kvp_request_latency_family = {
    .name = "kvpool_request_duration_seconds",
    .help = "Time from the end of a request's header to the end of its reply (body, payload and "
            "reply included), by opcode",
    .label = "op",
    .values = values,
    .nseries = KVP_OP_MAX_,
    .series = series,
    .bounds = &kvp_latency_bounds,
    .always = true,
    .status_key = "requests",
};

void kvp_op_label(uint16_t op, char *out, size_t size)
{
    const char *name = kvp_opcode_name(op);
    size_t i = 0;
    for (; name[i] && i + 1 < size; i++)
        out[i] = (char)tolower((unsigned char)name[i]);
    out[i] = '\0';
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int registered;

static void register_once(void)
{
    for (uint16_t op = 1; op < KVP_OP_MAX_; op++) {
        kvp_op_label(op, labels[op], sizeof(labels[op]));
        values[op] = labels[op];
    }
    registered = kvp_hist_family_register(&kvp_request_latency_family);
}

int kvp_request_latency_register(void)
{
    pthread_once(&once, register_once);
    return registered;
}

void kvp_latency_record(uint16_t op, uint64_t ns)
{
    /* By opcode, not through values[]: recording needs no registration. */
    if (op == 0 || op >= KVP_OP_MAX_)
        return;
    kvp_hist_record(&series[op], &kvp_latency_bounds, ns);
}
