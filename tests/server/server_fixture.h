/*
 * server_fixture.h - a real kvp_server started inside the test process (the reports' unit
 * tests: test_status.c, test_metrics.c): the daemon's own start-up on a socket in a temporary
 * directory, a 1 MiB pool, no HTTP endpoint; instances are registered straight into its
 * registry, as the REGISTER handler does, for connection ids that need no real connection.
 */
#ifndef KVP_TEST_SERVER_FIXTURE_H
#define KVP_TEST_SERVER_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>

#include "server.h"

#define FX_POOL (1u << 20)
#define FX_CHUNK_TOKENS 16u

/* Starts s with shared memory (posix backend) or without (--shm-name ""). Fails the test if
 * it does not start. Logs only errors. */
void fx_server_start(struct kvp_server *s, bool shm);

/* Fills the configuration fx_server_start() uses: its socket in a fresh temporary directory,
 * the small pool, shm or not, and --http http. */
void fx_config(struct kvp_config *cfg, bool shm, const char *http);

/* Like fx_server_start(), with --http http ("127.0.0.1:0" for a port of the kernel's choice;
 * kvp_http_port() says which). */
void fx_server_start_http(struct kvp_server *s, bool shm, const char *http);

/* Stops and destroys s, removes its directory. */
void fx_server_stop(struct kvp_server *s);

/* The registration fx_register() makes: instance id, model "fixture-model", world size 2,
 * rank 1, 2 layers, hidden 64, float16, asking for transport with reason (NULL: none). */
void fx_spec(struct kvp_reg_spec *q, const char *id, uint8_t transport, const char *reason);

/*
 * Registers instance id (fx_spec()) for connection owner (pid 1000 + owner) of the kvpool
 * front end, asking for transport (KVP_REG_SHM or KVP_REG_INLINE) with reason. Fails the test
 * unless it is registered. Returns its handle.
 */
uint32_t fx_register(struct kvp_server *s, const char *id, uint64_t owner, uint8_t transport,
                     const char *reason);

/* The text of a file read whole (NUL-terminated); caller frees. NULL if it cannot be read. */
char *fx_read_file(const char *path);

#endif /* KVP_TEST_SERVER_FIXTURE_H */
