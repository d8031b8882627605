/*
 * server_setup.h - the server context the daemon, http and lmc fuzz drivers build in-process.
 *
 * Each driver owns one static struct kvp_server; these calls give it the parts every driver sets
 * up the same way. What differs (timeouts, owners, registered instances, the front end) stays in
 * the driver.
 */
#ifndef KVP_FUZZ_SERVER_SETUP_H
#define KVP_FUZZ_SERVER_SETUP_H

#include <stdint.h>

#include "core/daemon.h"

/* Silences the log and gives srv default settings with a pool of pool_size bytes cut into
 * chunks of chunk_tokens, no front end and no wake pipe. */
void fuzz_server_init(struct kvp_server *srv, uint64_t pool_size, uint32_t chunk_tokens);

/* Gives srv a fresh heap-backed segment of cfg.l1_size bytes and an empty store over it. With a
 * shm_name, the segment is marked shared under that name. */
void fuzz_server_pool(struct kvp_server *srv, const char *shm_name);

/* The registry offer of an SHM-enabled server with that segment name, pool and chunk size. */
struct kvp_offer fuzz_shm_offer(const char *shm_name, uint64_t pool_size, uint32_t chunk_tokens);

#endif /* KVP_FUZZ_SERVER_SETUP_H */
