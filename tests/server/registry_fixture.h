/*
 * registry_fixture.h - what the registry tests (test_registry_*.c) share: the daemon's two
 * offers, a registry on the heap, a valid request, and registering through validation and the
 * transport decision as the daemon's handler does.
 *
 * The registry is about a megabyte (one slot per possible instance), so each case allocates it
 * on the heap. The registry logs one INFO line per registration; quiet_log() raises the
 * threshold so the test output stays readable.
 */
#ifndef KVP_TEST_REGISTRY_FIXTURE_H
#define KVP_TEST_REGISTRY_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/registry.h"

#define SHM_NAME "kvpool_l1_pool_test"
#define NO_SHM_REASON "SHM disabled: insufficient /dev/shm capacity (need 2 bytes, have 1)"

/* The peer pid the tests give connection owner. */
#define PID_OF(owner) ((int32_t)(1000 + (owner)))

/* A daemon with shared memory (a 1 GiB pool, 256 tokens per chunk), and one without. */
extern const struct kvp_offer offer_shm;
extern const struct kvp_offer offer_inline;

/* cmocka group setup: only errors are logged. Returns 0. */
int quiet_log(void **state);

/* A registry for offer, on the heap and initialised over garbage; free with free_registry(). */
struct kvp_registry *new_registry(const struct kvp_offer *offer);
void free_registry(struct kvp_registry *r);

/* A valid request: bfloat16, 32 layers, hidden 1024, rank 1 of 2, worker on shm. */
struct kvp_reg_spec good_req(const char *id);

/* Validates, chooses the transport and tries to register a request for connection owner;
 * returns kvp_registry_add()'s result, with its message in msg. out (may be NULL) gets the
 * instance as validated. */
int try_add(struct kvp_registry *r, uint64_t owner, const struct kvp_reg_spec *q, bool *existing,
            struct kvp_registration *out, char *msg, size_t msg_size);

/* Like try_add(), but fails the test unless the registration succeeds; returns the handle. */
uint32_t must_add(struct kvp_registry *r, uint64_t owner, const struct kvp_reg_spec *q,
                  bool *existing, struct kvp_registration *out);

#endif /* KVP_TEST_REGISTRY_FIXTURE_H */
