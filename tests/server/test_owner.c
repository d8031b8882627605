/*
 * test_owner.c - the daemon-wide events of owners (src/server/core/owner.h): kvp_owner_set_ops()
 * and kvp_owners_notify(), and the core's decision that feeds them when the shared segment is
 * lost (kvp_registry_lose_shm()). A daemon core is built by hand (a store over a heap "segment",
 * a registry offering shm, the owners), without any front end; owners stand for clients and
 * their callbacks only record what they were told.
 *
 *   - an event reaches exactly the named owners that have a callback for it, each once, and the
 *     count returned says so; NULL ids reaches every owner with a callback;
 *   - an owner without ops, whose ops were taken back, or whose ops lack that event's callback
 *     is skipped;
 *   - a destroyed owner is never called, named or not;
 *   - a callback runs with the owners' lock held (the rule that keeps a front end's socket open
 *     while its owner is listed);
 *   - a lost segment: the registry names each owner with an instance on shm once, leaves every
 *     registration's transport as it is (an LMCache instance is not made "inline"), gives new
 *     claims of shm the inline transport with the reason, keeps in-band transports as asked;
 *     only the named owners with a callback hear of it.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/log.h"
#include "common/kvp_assert.h"
#include "common/seg_header.h"
#include "core/daemon.h"
#include "core/ops.h"
#include "core/owner.h"

#define C 16u           /* tokens per chunk */
#define POOL (1u << 20) /* 1 MiB */
#define LOST "the segment shrank under kvpoold (test)"

/* A daemon core without front ends: store, registry offering shm, owners, a heap segment. */
static struct kvp_server *core_new(void)
{
    struct kvp_server *s = calloc(1, sizeof(*s));
    assert_non_null(s);
    kvp_log_threshold = KVP_LOG_ERROR;
    kvp_config_defaults(&s->cfg);
    s->cfg.chunk_tokens = C;
    s->cfg.l1_size = POOL;
    s->seg = (struct kvp_segment)KVP_SEGMENT_INIT;
    s->seg.size = KVP_SEG_HEADER + POOL;
    s->seg.base = calloc(1, s->seg.size);
    s->seg.shared = true;
    assert_non_null(s->seg.base);
    assert_rc(kvp_store_init(&s->store, KVP_SEG_HEADER, POOL, POOL), 0);
    struct kvp_offer offer = {
        .shm_enabled = true,
        .shm_name = "kvpool_l1_pool_test_owner",
        .shm_reason = "",
        .pool_size = POOL,
        .chunk_tokens = C,
    };
    kvp_registry_init(&s->registry, &offer);
    kvp_owners_init(&s->owners);
    return s;
}

static void core_free(struct kvp_server *s)
{
    kvp_owners_destroy(&s->owners);
    kvp_registry_destroy(&s->registry);
    kvp_store_destroy(&s->store);
    free(s->seg.base);
    free(s);
}

/* An owner whose callbacks count what reached it. */
struct client {
    struct kvp_owner owner;
    int shm_lost, drop;
    int unlocked; /* callbacks that found the owners' lock free: must stay 0 */
};

static struct client *of(struct kvp_owner *o)
{
    return (struct client *)((char *)o - offsetof(struct client, owner));
}

/* The owners' lock is held around every callback: trylock must fail (it is not recursive). */
static void check_locked(struct kvp_owner *o)
{
    if (pthread_mutex_trylock(&o->srv->owners.lock) == 0) {
        pthread_mutex_unlock(&o->srv->owners.lock);
        of(o)->unlocked++;
    }
}

static void on_shm_lost(struct kvp_owner *o)
{
    check_locked(o);
    of(o)->shm_lost++;
}

static void on_drop(struct kvp_owner *o)
{
    check_locked(o);
    of(o)->drop++;
}

static const struct kvp_owner_ops both = {.shm_lost = on_shm_lost, .drop = on_drop};
static const struct kvp_owner_ops drop_only = {.drop = on_drop};

static void client_init(struct client *c, struct kvp_server *s, const char *frontend,
                        const struct kvp_owner_ops *ops)
{
    memset(c, 0, sizeof(*c));
    kvp_owner_init(&c->owner, s, frontend, -1, 0);
    if (ops)
        kvp_owner_set_ops(&c->owner, ops);
}

/* Registers id for o on transport; fails the test unless it is new. Returns the registration. */
static struct kvp_registration reg(struct kvp_owner *o, const char *id, uint8_t transport)
{
    struct kvp_reg_spec q;
    struct kvp_registration inst;
    char msg[KVP_MAX_ERRMSG + 1];
    bool existing = true;
    memset(&q, 0, sizeof(q));
    snprintf(q.instance_id, sizeof(q.instance_id), "%s", id);
    snprintf(q.model_name, sizeof(q.model_name), "owner-model");
    snprintf(q.dtype, sizeof(q.dtype), "float16");
    q.world_size = 1;
    q.block_size = 16;
    q.num_layers = 2;
    q.hidden_dim = 64;
    q.transport = transport;
    assert_rc(kvp_op_register(o, &q, NULL, &inst, &existing, msg, sizeof(msg)), 0);
    assert_false(existing);
    return inst;
}

/* The transport instance handle h has in the registry now. */
static uint8_t transport_of(struct kvp_server *s, uint32_t h)
{
    struct kvp_registration inst;
    assert_rc(kvp_registry_get(&s->registry, h, &inst), 0);
    return inst.transport;
}

/* An event reaches exactly the owners named that have a callback, each once. */
static void test_notify_named(void **state)
{
    (void)state;
    struct kvp_server *s = core_new();
    struct client a, b, c;
    client_init(&a, s, "kvpool", &both);
    client_init(&b, s, "kvpool", &both);
    client_init(&c, s, "lmcache", &both);

    /* A repeated id, and one no owner has, change nothing. */
    uint64_t ids[] = {c.owner.id, a.owner.id, c.owner.id, 999999};
    assert_int_equal(kvp_owners_notify(&s->owners, KVP_OWNER_SHM_LOST, ids, 4), 2);
    assert_int_equal(a.shm_lost, 1);
    assert_int_equal(b.shm_lost, 0);
    assert_int_equal(c.shm_lost, 1);
    assert_int_equal(a.drop + b.drop + c.drop, 0);

    uint64_t one = b.owner.id;
    assert_int_equal(kvp_owners_notify(&s->owners, KVP_OWNER_DROP, &one, 1), 1);
    assert_int_equal(b.drop, 1);
    assert_int_equal(a.drop + c.drop, 0);
    assert_int_equal(a.shm_lost + b.shm_lost + c.shm_lost, 2);

    /* No ids: nobody. */
    assert_int_equal(kvp_owners_notify(&s->owners, KVP_OWNER_DROP, ids, 0), 0);
    assert_int_equal(a.drop + b.drop + c.drop, 1);
    assert_int_equal(a.unlocked + b.unlocked + c.unlocked, 0);

    kvp_owner_destroy(&a.owner);
    kvp_owner_destroy(&b.owner);
    kvp_owner_destroy(&c.owner);
    core_free(s);
}

/* NULL ids: every owner with a callback for the event, whatever its front end. */
static void test_notify_all(void **state)
{
    (void)state;
    struct kvp_server *s = core_new();
    struct client a, b, c;
    client_init(&a, s, "kvpool", &both);
    client_init(&b, s, "lmcache", &both);
    client_init(&c, s, "kvpool", &both);

    assert_int_equal(kvp_owners_notify(&s->owners, KVP_OWNER_DROP, NULL, 0), 3);
    assert_int_equal(a.drop, 1);
    assert_int_equal(b.drop, 1);
    assert_int_equal(c.drop, 1);
    assert_int_equal(a.shm_lost + b.shm_lost + c.shm_lost, 0);
    /* n is ignored without ids. */
    assert_int_equal(kvp_owners_notify(&s->owners, KVP_OWNER_SHM_LOST, NULL, 7), 3);
    assert_int_equal(a.shm_lost + b.shm_lost + c.shm_lost, 3);
    assert_int_equal(a.unlocked + b.unlocked + c.unlocked, 0);

    kvp_owner_destroy(&a.owner);
    kvp_owner_destroy(&b.owner);
    kvp_owner_destroy(&c.owner);
    core_free(s);
}

/* No ops, ops taken back, or no callback for the event: skipped, and not counted. */
static void test_notify_skips_owner_without_callback(void **state)
{
    (void)state;
    struct kvp_server *s = core_new();
    struct client none, cleared, partial, full;
    client_init(&none, s, "lmcache", NULL);
    client_init(&cleared, s, "kvpool", &both);
    client_init(&partial, s, "kvpool", &drop_only);
    client_init(&full, s, "kvpool", &both);
    kvp_owner_set_ops(&cleared.owner, NULL);
    assert_null(cleared.owner.ops);
    assert_ptr_equal(full.owner.ops, &both);

    uint64_t ids[] = {none.owner.id, cleared.owner.id, partial.owner.id, full.owner.id};
    assert_int_equal(kvp_owners_notify(&s->owners, KVP_OWNER_SHM_LOST, ids, 4), 1);
    assert_int_equal(full.shm_lost, 1);
    assert_int_equal(none.shm_lost + cleared.shm_lost + partial.shm_lost, 0);

    /* The partial ops do have a drop. */
    assert_int_equal(kvp_owners_notify(&s->owners, KVP_OWNER_DROP, ids, 4), 2);
    assert_int_equal(partial.drop, 1);
    assert_int_equal(full.drop, 1);
    assert_int_equal(none.drop + cleared.drop, 0);
    assert_int_equal(kvp_owners_notify(&s->owners, KVP_OWNER_DROP, NULL, 0), 2);
    assert_int_equal(none.drop + cleared.drop, 0);

    kvp_owner_destroy(&none.owner);
    kvp_owner_destroy(&cleared.owner);
    kvp_owner_destroy(&partial.owner);
    kvp_owner_destroy(&full.owner);
    core_free(s);
}

/* A destroyed owner has left the list: it is never called, named or not. */
static void test_destroyed_owner_not_called(void **state)
{
    (void)state;
    struct kvp_server *s = core_new();
    struct client gone, stays;
    client_init(&gone, s, "kvpool", &both);
    client_init(&stays, s, "kvpool", &both);
    uint64_t ids[] = {gone.owner.id, stays.owner.id};
    kvp_owner_destroy(&gone.owner);
    assert_int_equal(kvp_owners_count(&s->owners), 1);

    assert_int_equal(kvp_owners_notify(&s->owners, KVP_OWNER_SHM_LOST, ids, 2), 1);
    assert_int_equal(kvp_owners_notify(&s->owners, KVP_OWNER_DROP, NULL, 0), 1);
    assert_int_equal(gone.shm_lost + gone.drop, 0);
    assert_int_equal(stays.shm_lost, 1);
    assert_int_equal(stays.drop, 1);

    /* Once the last one goes, nothing is called at all. */
    kvp_owner_destroy(&stays.owner);
    assert_int_equal(kvp_owners_notify(&s->owners, KVP_OWNER_DROP, NULL, 0), 0);
    assert_int_equal(kvp_owners_notify(&s->owners, KVP_OWNER_SHM_LOST, ids, 2), 0);
    assert_int_equal(stays.drop, 1);
    core_free(s);
}

/*
 * The segment is lost: the core decides (the registry), the owners are told. The registrations
 * keep their transport: no front end's instance is rewritten to a transport it does not have.
 */
static void test_shm_lost_names_owners_on_shm(void **state)
{
    (void)state;
    struct kvp_server *s = core_new();
    struct client native, other, lmc_shm, lmc_pickle;
    client_init(&native, s, "kvpool", &both);
    client_init(&other, s, "kvpool", &both);
    client_init(&lmc_shm, s, "lmcache", NULL); /* its front end watches the segment itself */
    client_init(&lmc_pickle, s, "lmcache", &both);
    struct kvp_registration n1 = reg(&native.owner, "native-1", KVP_REG_SHM);
    struct kvp_registration n2 = reg(&native.owner, "native-2", KVP_REG_SHM);
    struct kvp_registration n3 = reg(&native.owner, "native-3", KVP_REG_INLINE);
    struct kvp_registration o1 = reg(&other.owner, "other-1", KVP_REG_INLINE);
    struct kvp_registration l1 = reg(&lmc_shm.owner, "lmcache-1", KVP_REG_SHM);
    struct kvp_registration l2 = reg(&lmc_pickle.owner, "lmcache-2", KVP_REG_PICKLE);
    assert_int_equal(n1.transport, KVP_REG_SHM);
    assert_int_equal(l1.transport, KVP_REG_SHM);
    uint32_t total, shm;
    kvp_registry_count_transports(&s->registry, &total, &shm);
    assert_int_equal(total, 6);
    assert_int_equal(shm, 3);

    uint64_t owners[8] = {0};
    uint32_t nowners = 99;
    assert_int_equal(kvp_registry_lose_shm(&s->registry, LOST, owners, 8, &nowners), 3);
    assert_int_equal(nowners, 2); /* native once, for both of its instances on shm */
    assert_true((owners[0] == native.owner.id && owners[1] == lmc_shm.owner.id) ||
                (owners[1] == native.owner.id && owners[0] == lmc_shm.owner.id));

    /* Nothing was rewritten: each front end moves its own. */
    assert_int_equal(transport_of(s, n1.handle), KVP_REG_SHM);
    assert_int_equal(transport_of(s, n2.handle), KVP_REG_SHM);
    assert_int_equal(transport_of(s, n3.handle), KVP_REG_INLINE);
    assert_int_equal(transport_of(s, o1.handle), KVP_REG_INLINE);
    assert_int_equal(transport_of(s, l1.handle), KVP_REG_SHM);
    assert_int_equal(transport_of(s, l2.handle), KVP_REG_PICKLE);
    kvp_registry_count_transports(&s->registry, &total, &shm);
    assert_int_equal(shm, 3);

    /* Told: the named owners that have a callback; LMCache's has none here. */
    assert_int_equal(kvp_owners_notify(&s->owners, KVP_OWNER_SHM_LOST, owners, nowners), 1);
    assert_int_equal(native.shm_lost, 1);
    assert_int_equal(other.shm_lost + lmc_shm.shm_lost + lmc_pickle.shm_lost, 0);
    assert_int_equal(native.drop + other.drop + lmc_pickle.drop, 0);

    /* A front end moves its instance off shm to a transport it has; the counts follow. */
    assert_int_equal(kvp_registry_leave_shm(&s->registry, l1.handle, lmc_shm.owner.id,
                                            KVP_REG_PICKLE, LOST),
                     1);
    assert_int_equal(transport_of(s, l1.handle), KVP_REG_PICKLE);
    kvp_registry_count_transports(&s->registry, &total, &shm);
    assert_int_equal(shm, 2);
    /* The native connection ends (its thread saw EOF): its instances go, the count with them. */
    assert_int_equal(kvp_owner_release(&native.owner, KVP_DROP_DISCONNECT), 3);
    kvp_registry_count_transports(&s->registry, &total, &shm);
    assert_int_equal(total, 3);
    assert_int_equal(shm, 0);

    /* A second report finds no one on shm, and keeps the first reason. */
    assert_int_equal(kvp_registry_lose_shm(&s->registry, "another reason", owners, 8, &nowners), 0);
    assert_int_equal(nowners, 0);
    assert_string_equal(s->registry.lost_reason, LOST);

    /* From now on shared memory is not offered: a claim of it gets inline with the reason, so
     * does a worker that lets the daemon choose; in-band transports are kept as asked. */
    struct kvp_registration r = reg(&other.owner, "late-shm", KVP_REG_SHM);
    assert_int_equal(r.transport, KVP_REG_INLINE);
    assert_string_equal(r.reason, LOST);
    r = reg(&other.owner, "late-auto", KVP_REG_AUTO);
    assert_int_equal(r.transport, KVP_REG_INLINE);
    assert_string_equal(r.reason, LOST);
    r = reg(&lmc_pickle.owner, "lmcache-late", KVP_REG_ENVELOPE);
    assert_int_equal(r.transport, KVP_REG_ENVELOPE);
    assert_string_equal(r.reason, LOST);
    kvp_registry_count_transports(&s->registry, &total, &shm);
    assert_int_equal(shm, 0);

    kvp_owner_destroy(&native.owner);
    kvp_owner_destroy(&other.owner);
    kvp_owner_destroy(&lmc_shm.owner);
    kvp_owner_destroy(&lmc_pickle.owner);
    assert_int_equal(kvp_registry_count(&s->registry), 0);
    core_free(s);
}

/* At most cap owners are named; the count of instances on shm is still whole. */
static void test_shm_lost_cap(void **state)
{
    (void)state;
    struct kvp_server *s = core_new();
    struct client a, b;
    client_init(&a, s, "kvpool", &both);
    client_init(&b, s, "kvpool", &both);
    reg(&a.owner, "a-1", KVP_REG_SHM);
    reg(&b.owner, "b-1", KVP_REG_SHM);
    uint64_t owners[1] = {0};
    uint32_t nowners = 0;
    assert_int_equal(kvp_registry_lose_shm(&s->registry, LOST, owners, 1, &nowners), 2);
    assert_int_equal(nowners, 1);
    assert_true(owners[0] == a.owner.id || owners[0] == b.owner.id);
    kvp_owner_destroy(&a.owner);
    kvp_owner_destroy(&b.owner);
    core_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_notify_named),
        cmocka_unit_test(test_notify_all),
        cmocka_unit_test(test_notify_skips_owner_without_callback),
        cmocka_unit_test(test_destroyed_owner_not_called),
        cmocka_unit_test(test_shm_lost_names_owners_on_shm),
        cmocka_unit_test(test_shm_lost_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
