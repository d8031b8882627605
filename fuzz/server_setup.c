/*
 * server_setup.c - the server context shared by the daemon, http and lmc fuzz drivers (see
 * server_setup.h). The segment is plain heap memory: nothing is mapped or named in /dev/shm, and
 * a driver that wants a fresh pool per input calls fuzz_server_pool() again.
 */
#include "server_setup.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/log.h"
#include "fuzz.h"

void fuzz_server_init(struct kvp_server *srv, uint64_t pool_size, uint32_t chunk_tokens)
{
    kvp_log_threshold = (enum kvp_log_level)(KVP_LOG_ERROR + 1); /* silence */
    kvp_config_defaults(&srv->cfg);
    srv->cfg.l1_size = pool_size;
    srv->cfg.chunk_tokens = chunk_tokens;
    srv->wake_fds[0] = srv->wake_fds[1] = -1;
}

void fuzz_server_pool(struct kvp_server *srv, const char *shm_name)
{
    uint64_t pool = srv->cfg.l1_size;
    uint8_t *mem = malloc(KVP_SEG_HEADER + pool);
    FUZZ_CHECK(mem != NULL);
    srv->seg = (struct kvp_segment)KVP_SEGMENT_INIT;
    srv->seg.base = mem;
    srv->seg.size = KVP_SEG_HEADER + pool;
    if (shm_name) {
        srv->seg.shared = true;
        snprintf(srv->seg.name, sizeof(srv->seg.name), "%s", shm_name);
    }
    FUZZ_CHECK(kvp_store_init(&srv->store, KVP_SEG_HEADER, pool, pool) == 0);
}

struct kvp_offer fuzz_shm_offer(const char *shm_name, uint64_t pool_size, uint32_t chunk_tokens)
{
    return (struct kvp_offer){
        .shm_enabled = true,
        .shm_name = shm_name,
        .shm_reason = "",
        .pool_size = pool_size,
        .chunk_tokens = chunk_tokens,
    };
}
