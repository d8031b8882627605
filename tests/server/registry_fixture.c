/*
 * registry_fixture.c - the registry tests' shared offers, registry and requests (see
 * registry_fixture.h). Single-threaded, like the tests.
 */
#include "registry_fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "common/kvp_assert.h"

const struct kvp_offer offer_shm = {
    .shm_enabled = true,
    .shm_name = SHM_NAME,
    .shm_reason = "",
    .pool_size = 1ull << 30,
    .chunk_tokens = 256,
};

const struct kvp_offer offer_inline = {
    .shm_enabled = false,
    .shm_name = "",
    .shm_reason = NO_SHM_REASON,
    .pool_size = 1ull << 30,
    .chunk_tokens = 256,
};

struct kvp_registry *new_registry(const struct kvp_offer *offer)
{
    struct kvp_registry *r = malloc(sizeof(*r));
    assert_non_null(r);
    /* Garbage first: init must not depend on a zeroed struct. */
    memset(r, 0xa5, sizeof(*r));
    kvp_registry_init(r, offer);
    assert_int_equal(kvp_registry_count(r), 0);
    return r;
}

void free_registry(struct kvp_registry *r)
{
    kvp_registry_destroy(r);
    free(r);
}

int quiet_log(void **state)
{
    (void)state;
    kvp_log_threshold = KVP_LOG_ERROR;
    return 0;
}

struct kvp_reg_spec good_req(const char *id)
{
    struct kvp_reg_spec q;
    memset(&q, 0, sizeof(q));
    snprintf(q.instance_id, sizeof(q.instance_id), "%s", id);
    snprintf(q.model_name, sizeof(q.model_name), "llama-3-8b");
    snprintf(q.dtype, sizeof(q.dtype), "bfloat16");
    q.world_size = 2;
    q.worker_rank = 1;
    q.block_size = 16;
    q.num_layers = 32;
    q.hidden_dim = 1024;
    q.use_mla = 0;
    q.transport = KVP_REG_SHM;
    return q;
}

int try_add(struct kvp_registry *r, uint64_t owner, const struct kvp_reg_spec *q, bool *existing,
            struct kvp_registration *out, char *msg, size_t msg_size)
{
    struct kvp_registration inst;
    assert_rc(kvp_registry_validate(r, q, &inst, msg, msg_size), 0);
    assert_rc(kvp_registry_choose_transport(r, &inst, NULL, msg, msg_size), 0);
    msg[0] = '\0';
    inst.owner = owner;
    inst.owner_pid = PID_OF(owner);
    int rc = kvp_registry_add(r, &inst, 0, existing, msg, msg_size);
    if (out)
        *out = inst;
    return rc;
}

uint32_t must_add(struct kvp_registry *r, uint64_t owner, const struct kvp_reg_spec *q,
                  bool *existing, struct kvp_registration *out)
{
    struct kvp_registration inst;
    char msg[512];
    assert_rc(try_add(r, owner, q, existing, &inst, msg, sizeof(msg)), 0);
    if (out)
        *out = inst;
    return inst.handle;
}
