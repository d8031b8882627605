/*
 * test_ops.c - the operations under every front end (src/server/core/ops.h), called directly:
 * no socket, no thread, no front end. A daemon core is built by hand (a store over a heap
 * "segment", a registry offering shm, no L2), and owners stand for clients.
 *
 *   - registration: conflicts (EEXIST, EBUSY), the owner's own registration back, invalid
 *     fields, the per-owner limit (EDQUOT) and room again after an unregister; connected_since
 *     and the front end recorded; handles of another owner unknown to every operation;
 *   - prepare -> commit on both transports, abort, and a commit of the wrong transport;
 *   - an owner's release (its client died): reservations aborted, pins dropped, instances
 *     unregistered, keys free for others;
 *   - the hold limit, reservation expiry, clear while pinned, a pinning lookup;
 *   - key sources: chunk ids in their own namespace, salts, and the core's limits on both;
 *   - a commit through shared memory once the segment is lost (seg_guard.h): refused and its
 *     reservation dropped, nothing published (in a child process: the guard is process-wide);
 *   - the counters by the instance's transport: an LMCache pickle (or envelope) instance's
 *     registration, commit and retrieve count under "pickle" ("envelope"), never "inline",
 *     also after it left shm; the instance gauges by transport; the connections gauge is the
 *     kvpool front end's owners, not the other front ends'.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/log.h"
#include "common/kvp_assert.h"
#include "common/seg_header.h"
#include "core/daemon.h"
#include "core/ops.h"
#include "core/owner.h"
#include "core/seg_guard.h"
#include "core/stats.h"

#define C 16u                       /* tokens per chunk */
#define POOL (1u << 20)             /* 1 MiB: 128 chunks of 8 KiB */
#define CHUNK (2u * 2 * C * 64 * 2) /* K and V, 2 layers, hidden 64, float16 */
#define LIMIT 4u                    /* --max-instances-per-client of the fixture */

static char msg[KVP_MAX_ERRMSG + 1];
#define M msg, sizeof(msg)

/* A daemon core without sockets: store, registry, owners, a heap segment. */
static struct kvp_server *core_new(bool shm)
{
    struct kvp_server *s = calloc(1, sizeof(*s));
    assert_non_null(s);
    kvp_log_threshold = KVP_LOG_ERROR;
    kvp_config_defaults(&s->cfg);
    s->cfg.chunk_tokens = C;
    s->cfg.l1_size = POOL;
    s->cfg.max_instances_per_client = LIMIT;
    s->seg = (struct kvp_segment)KVP_SEGMENT_INIT;
    s->seg.size = KVP_SEG_HEADER + POOL;
    s->seg.base = calloc(1, s->seg.size);
    s->seg.shared = shm;
    assert_non_null(s->seg.base);
    assert_rc(kvp_store_init(&s->store, KVP_SEG_HEADER, POOL, POOL), 0);
    struct kvp_offer offer = {
        .shm_enabled = shm,
        .shm_name = "",
        .shm_reason = shm ? "" : "SHM disabled for the test",
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

static struct kvp_reg_spec spec(const char *id, uint8_t transport)
{
    struct kvp_reg_spec q;
    memset(&q, 0, sizeof(q));
    snprintf(q.instance_id, sizeof(q.instance_id), "%s", id);
    snprintf(q.model_name, sizeof(q.model_name), "ops-model");
    snprintf(q.dtype, sizeof(q.dtype), "float16");
    q.world_size = 1;
    q.block_size = 16;
    q.num_layers = 2;
    q.hidden_dim = 64;
    q.transport = transport;
    return q;
}

/* Registers id for o; fails the test unless it is new. Returns the handle. */
static uint32_t reg(struct kvp_owner *o, const char *id, uint8_t transport)
{
    struct kvp_reg_spec q = spec(id, transport);
    struct kvp_registration inst;
    bool existing = true;
    assert_rc(kvp_op_register(o, &q, NULL, &inst, &existing, M), 0);
    assert_false(existing);
    assert_int_equal(inst.layout.bytes, CHUNK);
    return inst.handle;
}

/* n tokens of sequence seq, little-endian as kvpool's wire carries them. */
static uint8_t toks[64 * C * 4];
static struct kvp_key_src tokens(uint32_t seq, uint32_t n, uint32_t start, uint32_t end)
{
    assert_true(n * 4 <= sizeof(toks));
    for (uint32_t i = 0; i < n; i++) {
        uint32_t v = seq * 100000u + i;
        for (int b = 0; b < 4; b++)
            toks[i * 4 + (uint32_t)b] = (uint8_t)(v >> (8 * b));
    }
    return (struct kvp_key_src){.tokens_le = toks, .ntokens = n, .start = start, .end = end};
}

/* Stores chunks [0, n) of sequence seq through shared memory, each slot filled with its chunk
 * index plus fill; returns the commit's count. */
static int store_shm(struct kvp_owner *o, uint32_t h, uint32_t seq, uint32_t n, uint8_t fill)
{
    struct kvp_key_src src = tokens(seq, n * C, 0, n * C);
    struct kvp_op_slots res;
    assert_rc(kvp_op_prepare_store(o, h, &src, &res, M), 0);
    if (!res.nslots)
        return 0;
    for (uint32_t i = 0; i < res.nslots; i++)
        memset(o->srv->seg.base + res.objs[i]->offset, fill + res.idx[i], res.objs[i]->length);
    return kvp_op_commit_store(o, h, res.id, KVP_VIA_SHM, M);
}

static uint32_t looked_up(struct kvp_owner *o, uint32_t h, uint32_t seq, uint32_t n)
{
    struct kvp_key_src src = tokens(seq, n * C, 0, 0);
    struct kvp_op_slots res;
    assert_rc(kvp_op_lookup(o, h, &src, 0, &res, M), 0);
    assert_int_equal(res.nchunks, n);
    return res.cached;
}

static uint64_t gauge(struct kvp_server *s, const char *name)
{
    struct kvp_store_gauges g;
    kvp_store_get_gauges(&s->store, &g);
    if (strcmp(name, "reserved") == 0)
        return g.reserved;
    if (strcmp(name, "pinned") == 0)
        return g.pinned;
    return g.committed;
}

static void test_register_conflicts_and_limit(void **state)
{
    (void)state;
    struct kvp_server *s = core_new(true);
    struct kvp_owner a, b;
    kvp_owner_init(&a, s, "kvpool", 4242, 1000);
    kvp_owner_init(&b, s, "lmcache", -1, 0);
    assert_true(a.id != b.id);

    struct kvp_reg_spec q = spec("w0", KVP_REG_SHM);
    struct kvp_registration inst, again;
    bool existing;
    assert_rc(kvp_op_register(&a, &q, NULL, &inst, &existing, M), 0);
    assert_false(existing);
    assert_int_equal(inst.owner, a.id);
    assert_int_equal(inst.owner_pid, 4242);
    assert_int_equal(inst.connected_since_ms, a.connected_since_ms);
    assert_true(inst.connected_since_ms > 0);
    assert_string_equal(inst.frontend, "kvpool");
    assert_int_equal(inst.transport, KVP_REG_SHM);

    /* The owner gets its own registration back; another owner is busy; another layout
     * conflicts; a bad field is named. */
    assert_rc(kvp_op_register(&a, &q, NULL, &again, &existing, M), 0);
    assert_true(existing);
    assert_int_equal(again.handle, inst.handle);
    assert_rc(kvp_op_register(&b, &q, NULL, &again, &existing, M), -EBUSY);
    assert_non_null(strstr(msg, "4242"));
    struct kvp_reg_spec other = q;
    other.num_layers = 4;
    assert_rc(kvp_op_register(&b, &other, NULL, &again, &existing, M), -EEXIST);
    assert_non_null(strstr(msg, "num_layers"));
    other = spec("w9", KVP_REG_SHM);
    other.hidden_dim = 0;
    assert_rc(kvp_op_register(&b, &other, NULL, &again, &existing, M), -EINVAL);
    assert_non_null(strstr(msg, "hidden_dim"));

    /* A handle is the registering owner's only: every operation of another owner refuses it. */
    struct kvp_key_src src = tokens(1, 2 * C, 0, 2 * C);
    struct kvp_op_slots res;
    assert_rc(kvp_op_instance(&b, inst.handle, &again, M), -ENOENT);
    assert_rc(kvp_op_lookup(&b, inst.handle, &src, 0, &res, M), -ENOENT);
    assert_rc(kvp_op_prepare_store(&b, inst.handle, &src, &res, M), -ENOENT);
    assert_rc(kvp_op_prepare_retrieve(&b, inst.handle, &src, &res, M), -ENOENT);
    assert_rc(kvp_op_retrieve_inline_begin(&b, inst.handle, &src, &res, M), -ENOENT);
    assert_rc(kvp_op_unregister(&b, inst.handle, M), -ENOENT);
    assert_int_equal(kvp_registry_count(&s->registry), 1);

    /* The per-owner limit: LIMIT instances, not one more, whatever the table has left. */
    uint32_t h[LIMIT];
    h[0] = inst.handle;
    for (uint32_t i = 1; i < LIMIT; i++) {
        char id[16];
        snprintf(id, sizeof(id), "w%u", i);
        h[i] = reg(&a, id, KVP_REG_SHM);
    }
    q = spec("one-more", KVP_REG_SHM);
    assert_rc(kvp_op_register(&a, &q, NULL, &again, &existing, M), -EDQUOT);
    assert_non_null(strstr(msg, "--max-instances-per-client (4)"));
    /* ... the owner's own registration still comes back at the limit ... */
    q = spec("w0", KVP_REG_SHM);
    assert_rc(kvp_op_register(&a, &q, NULL, &again, &existing, M), 0);
    assert_true(existing);
    /* ... another owner is not affected, and an unregister makes room. */
    reg(&b, "b0", KVP_REG_INLINE);
    assert_rc(kvp_op_unregister(&a, h[1], M), 0);
    assert_rc(kvp_op_unregister(&a, h[1], M), -ENOENT);
    reg(&a, "one-more", KVP_REG_SHM);
    assert_int_equal(kvp_registry_count(&s->registry), LIMIT + 1);

    /* Destroying an owner unregisters its instances, and only its. */
    kvp_owner_destroy(&a);
    assert_int_equal(kvp_registry_count(&s->registry), 1);
    kvp_owner_destroy(&b);
    assert_int_equal(kvp_registry_count(&s->registry), 0);
    core_free(s);
}

static void test_prepare_commit_shm(void **state)
{
    (void)state;
    struct kvp_server *s = core_new(true);
    struct kvp_owner a, b;
    kvp_owner_init(&a, s, "kvpool", 1, 1);
    kvp_owner_init(&b, s, "kvpool", 2, 1);
    uint32_t ha = reg(&a, "a", KVP_REG_SHM), hb = reg(&b, "b", KVP_REG_SHM);

    /* Reserved chunks are invisible, and busy for another store of the same keys. */
    struct kvp_key_src src = tokens(1, 4 * C, 0, 4 * C);
    struct kvp_op_slots res, other;
    assert_rc(kvp_op_prepare_store(&a, ha, &src, &res, M), 0);
    assert_int_equal(res.nchunks, 4);
    assert_int_equal(res.nslots, 4);
    assert_true(res.id != 0);
    assert_int_equal(res.chunk_bytes, CHUNK);
    uint64_t id = res.id;
    for (uint32_t i = 0; i < 4; i++)
        memset(s->seg.base + res.objs[i]->offset, 0x40 + (int)res.idx[i], CHUNK);
    assert_int_equal(looked_up(&a, ha, 1, 4), 0);
    assert_int_equal(gauge(s, "reserved"), 4);
    /* Both owners derive the same keys (same model and layout), so b sees a's store busy. */
    src = tokens(1, 4 * C, 0, 4 * C);
    assert_rc(kvp_op_prepare_store(&b, hb, &src, &other, M), 0);
    assert_int_equal(other.busy, 4);
    assert_int_equal(other.nslots, 0);
    assert_int_equal(other.id, 0);

    /* A commit publishes; a second one finds nothing; a pin id never commits a store. */
    assert_rc(kvp_op_commit_store(&a, ha, id, KVP_VIA_SHM, M), 4);
    assert_rc(kvp_op_commit_store(&a, ha, id, KVP_VIA_SHM, M), -ENOENT);
    assert_int_equal(looked_up(&a, ha, 1, 4), 4);
    assert_int_equal(looked_up(&b, hb, 1, 4), 4);

    /* Stored again: all cached, nothing reserved. */
    src = tokens(1, 4 * C, 0, 4 * C);
    assert_rc(kvp_op_prepare_store(&a, ha, &src, &res, M), 0);
    assert_int_equal(res.cached, 4);
    assert_int_equal(res.nslots, 0);

    /* Retrieve chunks [1, 3): pinned, in order, with the bytes written. */
    src = tokens(1, 4 * C, C, 3 * C);
    assert_rc(kvp_op_prepare_retrieve(&a, ha, &src, &res, M), 0);
    assert_int_equal(res.nchunks, 2);
    assert_int_equal(res.nslots, 2);
    assert_true(res.id != 0);
    for (uint32_t i = 0; i < 2; i++)
        assert_int_equal(s->seg.base[res.objs[i]->offset + CHUNK - 1], 0x41 + i);
    assert_int_equal(gauge(s, "pinned"), 2);
    assert_rc(kvp_op_commit_store(&a, ha, res.id, KVP_VIA_SHM, M), -ENOENT);
    assert_rc(kvp_op_commit_retrieve(&a, ha, res.id, M), 2);
    assert_rc(kvp_op_commit_retrieve(&a, ha, res.id, M), -ENOENT);
    assert_int_equal(gauge(s, "pinned"), 0);

    /* Abort: nothing becomes visible, the keys are free again. */
    src = tokens(2, 2 * C, 0, 2 * C);
    assert_rc(kvp_op_prepare_store(&a, ha, &src, &res, M), 0);
    assert_rc(kvp_op_abort_store(&a, ha, res.id, KVP_DROP_ABORT, M), 2);
    assert_rc(kvp_op_abort_store(&a, ha, res.id, KVP_DROP_ABORT, M), -ENOENT);
    assert_int_equal(looked_up(&a, ha, 2, 2), 0);
    assert_int_equal(store_shm(&b, hb, 2, 2, 0), 2);

    /* A range that breaks the chunk rule is refused by the core. */
    src = tokens(1, 4 * C, 1, 2 * C);
    assert_rc(kvp_op_prepare_store(&a, ha, &src, &res, M), -EINVAL);
    kvp_owner_destroy(&a);
    kvp_owner_destroy(&b);
    core_free(s);
}

static void test_inline_transport(void **state)
{
    (void)state;
    struct kvp_server *s = core_new(true);
    struct kvp_owner a;
    kvp_owner_init(&a, s, "kvpool", 1, 1);
    uint32_t h = reg(&a, "inl", KVP_REG_INLINE);
    struct kvp_key_src src = tokens(3, 2 * C, 0, 2 * C);
    struct kvp_op_slots res;

    /* A commit as if the bytes had come through shared memory: refused, reservation dropped. */
    assert_rc(kvp_op_prepare_store(&a, h, &src, &res, M), 0);
    uint64_t id = res.id;
    assert_rc(kvp_op_commit_store(&a, h, id, KVP_VIA_SHM, M), -EOPNOTSUPP);
    assert_rc(kvp_op_commit_store(&a, h, id, KVP_VIA_INLINE, M), -ENOENT);
    assert_int_equal(gauge(s, "reserved"), 0);

    /* A payload of the wrong size drops the reservation too. */
    src = tokens(3, 2 * C, 0, 2 * C);
    assert_rc(kvp_op_prepare_store(&a, h, &src, &res, M), 0);
    id = res.id;
    assert_rc(kvp_op_store_inline_begin(&a, h, id, CHUNK, &res, M), -EINVAL);
    assert_non_null(strstr(msg, "needs"));
    assert_rc(kvp_op_store_inline_begin(&a, h, id, 2 * CHUNK, &res, M), -ENOENT);

    /* The right size: the front end fills the iovecs, then commits inline. */
    src = tokens(3, 2 * C, 0, 2 * C);
    assert_rc(kvp_op_prepare_store(&a, h, &src, &res, M), 0);
    id = res.id;
    assert_rc(kvp_op_store_inline_begin(&a, h, id, 2 * CHUNK, &res, M), 0);
    assert_int_equal(res.nslots, 2);
    for (uint32_t i = 0; i < 2; i++) {
        assert_int_equal(res.iov[i].iov_len, CHUNK);
        memset(res.iov[i].iov_base, 0x70 + (int)i, CHUNK);
    }
    assert_rc(kvp_op_commit_store(&a, h, id, KVP_VIA_INLINE, M), 2);

    /* An inline instance retrieves inline only; the iovecs point at the bytes stored. */
    src = tokens(3, 2 * C, 0, 2 * C);
    assert_rc(kvp_op_prepare_retrieve(&a, h, &src, &res, M), -EOPNOTSUPP);
    assert_rc(kvp_op_retrieve_inline_begin(&a, h, &src, &res, M), 0);
    assert_int_equal(res.nslots, 2);
    assert_int_equal(gauge(s, "pinned"), 2);
    for (uint32_t i = 0; i < 2; i++)
        assert_int_equal(((uint8_t *)res.iov[i].iov_base)[CHUNK / 2], 0x70 + i);
    kvp_op_retrieve_inline_end(&a, h, &res, true);
    assert_int_equal(gauge(s, "pinned"), 0);
    kvp_owner_destroy(&a);
    core_free(s);
}

/* The client died: its owner's release aborts, unpins and unregisters, all at once. */
static void test_owner_release(void **state)
{
    (void)state;
    struct kvp_server *s = core_new(true);
    struct kvp_owner a, b;
    kvp_owner_init(&a, s, "lmcache", 7, 1);
    kvp_owner_init(&b, s, "kvpool", 8, 1);
    uint32_t ha = reg(&a, "a", KVP_REG_SHM), hb = reg(&b, "b", KVP_REG_SHM);
    assert_int_equal(store_shm(&a, ha, 1, 2, 0), 2);

    struct kvp_key_src src = tokens(1, 2 * C, 0, 2 * C);
    struct kvp_op_slots pins, resv;
    assert_rc(kvp_op_prepare_retrieve(&a, ha, &src, &pins, M), 0);
    src = tokens(2, 3 * C, 0, 3 * C);
    assert_rc(kvp_op_prepare_store(&a, ha, &src, &resv, M), 0);
    assert_int_equal(resv.nslots, 3);
    assert_int_equal(gauge(s, "pinned"), 2);
    assert_int_equal(gauge(s, "reserved"), 3);

    assert_int_equal(kvp_owner_release(&a, KVP_DROP_DISCONNECT), 1);
    assert_int_equal(gauge(s, "pinned"), 0);
    assert_int_equal(gauge(s, "reserved"), 0);
    assert_int_equal(kvp_registry_count(&s->registry), 1);
    assert_rc(kvp_op_commit_store(&a, ha, resv.id, KVP_VIA_SHM, M), -ENOENT);
    /* What it stored stays; what it reserved is free for another client. */
    assert_int_equal(looked_up(&b, hb, 1, 2), 2);
    assert_int_equal(store_shm(&b, hb, 2, 3, 0), 3);
    /* A released owner may register again (a front end's liveness timeout, then return). */
    reg(&a, "a", KVP_REG_SHM);
    kvp_owner_destroy(&a);
    kvp_owner_destroy(&b);
    assert_int_equal(kvp_registry_count(&s->registry), 0);
    core_free(s);
}

static void test_hold_limit_and_expiry(void **state)
{
    (void)state;
    struct kvp_server *s = core_new(true);
    struct kvp_owner a;
    kvp_owner_init(&a, s, "kvpool", 1, 1);
    uint32_t h = reg(&a, "a", KVP_REG_SHM);
    assert_int_equal(store_shm(&a, h, 1, 1, 0), 1);

    /* KVP_MAX_HOLDS pin sets of the same chunk, then -EMFILE for every kind of hold. */
    struct kvp_key_src src;
    struct kvp_op_slots res;
    for (int i = 0; i < KVP_MAX_HOLDS; i++) {
        src = tokens(1, C, 0, C);
        assert_rc(kvp_op_prepare_retrieve(&a, h, &src, &res, M), 0);
    }
    src = tokens(1, C, 0, C);
    assert_rc(kvp_op_prepare_retrieve(&a, h, &src, &res, M), -EMFILE);
    src = tokens(5, C, 0, C);
    assert_rc(kvp_op_prepare_store(&a, h, &src, &res, M), -EMFILE);
    assert_rc(kvp_op_lookup(&a, h, &src, KVP_LOOKUP_PIN, &res, M), -EMFILE);
    kvp_owner_release(&a, KVP_DROP_DISCONNECT);
    assert_int_equal(gauge(s, "pinned"), 0);

    /* An expired reservation: its commit fails and stores nothing; the key is free at once. */
    h = reg(&a, "a", KVP_REG_SHM);
    src = tokens(6, 2 * C, 0, 2 * C);
    assert_rc(kvp_op_prepare_store(&a, h, &src, &res, M), 0);
    uint64_t id = res.id;
    assert_int_equal(kvp_store_expire(&s->store, kvp_mono_ms() + 60000, 1000), 2);
    assert_int_equal(store_shm(&a, h, 6, 2, 0), 2); /* the keys are free again */
    assert_rc(kvp_op_commit_store(&a, h, id, KVP_VIA_SHM, M), -ETIMEDOUT);
    assert_non_null(strstr(msg, "expired"));
    assert_rc(kvp_op_commit_store(&a, h, id, KVP_VIA_SHM, M), -ENOENT);
    assert_int_equal(looked_up(&a, h, 6, 2), 2); /* the newer store is intact */
    kvp_owner_destroy(&a);
    core_free(s);
}

/* CLEAR drops what nobody pins; pinned chunks stay visible until unpinned. */
static void test_clear_while_pinned(void **state)
{
    (void)state;
    struct kvp_server *s = core_new(true);
    struct kvp_owner a;
    kvp_owner_init(&a, s, "kvpool", 1, 1);
    uint32_t h = reg(&a, "a", KVP_REG_SHM);
    assert_int_equal(store_shm(&a, h, 1, 4, 0), 4);

    struct kvp_key_src src = tokens(1, 4 * C, 0, 2 * C);
    struct kvp_op_slots pins, found;
    assert_rc(kvp_op_prepare_retrieve(&a, h, &src, &pins, M), 0);
    assert_int_equal(pins.nslots, 2);
    struct kvp_clear_result r;
    kvp_op_clear(&a, &r);
    assert_int_equal(r.dropped, 2);
    assert_int_equal(r.pinned, 2);
    assert_int_equal(r.bytes, 2ull * CHUNK);
    assert_int_equal(looked_up(&a, h, 1, 4), 2);
    assert_int_equal(s->seg.base[pins.objs[1]->offset], 1); /* still chunk 1's bytes */

    /* A pinning lookup holds what it found through a clear, like a prepare-retrieve. */
    src = tokens(1, 4 * C, 0, 0);
    assert_rc(kvp_op_lookup(&a, h, &src, KVP_LOOKUP_PIN, &found, M), 0);
    assert_int_equal(found.cached, 2);
    assert_int_equal(found.nslots, 2);
    assert_rc(kvp_op_commit_retrieve(&a, h, pins.id, M), 2);
    kvp_op_clear(&a, &r);
    assert_int_equal(r.dropped, 0);
    assert_int_equal(r.pinned, 2);
    assert_rc(kvp_op_commit_retrieve(&a, h, found.id, M), 2);
    kvp_op_clear(&a, &r);
    assert_int_equal(r.dropped, 2);
    assert_int_equal(looked_up(&a, h, 1, 4), 0);
    kvp_owner_destroy(&a);
    core_free(s);
}

/* Chunk ids: keys of their own, in the registration's namespace, with the core's limits. */
static void test_key_sources(void **state)
{
    (void)state;
    struct kvp_server *s = core_new(true);
    struct kvp_owner a;
    kvp_owner_init(&a, s, "lmcache", 1, 1);
    uint32_t h = reg(&a, "a", KVP_REG_SHM);
    uint8_t ids[3 * 32];
    for (uint32_t i = 0; i < sizeof(ids); i++)
        ids[i] = (uint8_t)(i * 7);
    struct kvp_key_src src = {.chunk_ids = ids, .nchunk_ids = 3, .id_len = 32};
    struct kvp_op_slots res;

    assert_rc(kvp_op_prepare_store(&a, h, &src, &res, M), 0);
    assert_int_equal(res.nchunks, 3);
    assert_int_equal(res.nslots, 3);
    assert_rc(kvp_op_commit_store(&a, h, res.id, KVP_VIA_SHM, M), 3);
    assert_rc(kvp_op_lookup(&a, h, &src, 0, &res, M), 0);
    assert_int_equal(res.nchunks, 3);
    assert_int_equal(res.cached, 3);
    /* Two ids: the first two chunks; another salt: another namespace. */
    src.nchunk_ids = 2;
    assert_rc(kvp_op_lookup(&a, h, &src, 0, &res, M), 0);
    assert_int_equal(res.cached, 2);
    src.salt = "tenant-b";
    src.salt_len = 8;
    assert_rc(kvp_op_lookup(&a, h, &src, 0, &res, M), 0);
    assert_int_equal(res.cached, 0);
    /* Another model cannot reach them with the same ids. */
    struct kvp_owner b;
    kvp_owner_init(&b, s, "lmcache", 2, 1);
    struct kvp_reg_spec q = spec("b", KVP_REG_SHM);
    snprintf(q.model_name, sizeof(q.model_name), "other-model");
    struct kvp_registration inst;
    bool existing;
    assert_rc(kvp_op_register(&b, &q, NULL, &inst, &existing, M), 0);
    src = (struct kvp_key_src){.chunk_ids = ids, .nchunk_ids = 3, .id_len = 32};
    assert_rc(kvp_op_lookup(&b, inst.handle, &src, 0, &res, M), 0);
    assert_int_equal(res.cached, 0);

    /* The limits hold in the core, whatever a decoder let through. */
    src.id_len = 0;
    assert_rc(kvp_op_lookup(&a, h, &src, 0, &res, M), -EINVAL);
    src.id_len = KVP_MAX_CHUNK_ID + 1;
    assert_rc(kvp_op_prepare_store(&a, h, &src, &res, M), -EINVAL);
    src.id_len = 1;
    src.nchunk_ids = KVP_MAX_CHUNKS + 1;
    assert_rc(kvp_op_prepare_store(&a, h, &src, &res, M), -E2BIG);
    src = tokens(1, C, 0, C);
    src.chunk_ids = ids;
    src.nchunk_ids = 1;
    src.id_len = 32;
    assert_rc(kvp_op_lookup(&a, h, &src, 0, &res, M), -EINVAL);
    src = tokens(1, C, 0, C);
    src.salt = toks;
    src.salt_len = KVP_MAX_SALT + 1;
    assert_rc(kvp_op_prepare_store(&a, h, &src, &res, M), -EINVAL);
    src = tokens(1, C, 0, C);
    src.ntokens = KVP_MAX_TOKENS + 1;
    assert_rc(kvp_op_lookup(&a, h, &src, 0, &res, M), -E2BIG);
    assert_int_equal(gauge(s, "reserved"), 0);

    struct kvp_snapshot snap;
    assert_rc(kvp_op_stats(&a, &snap, M), 0);
    assert_int_equal(snap.gauges[KVP_GAUGE_instances], 2);
    assert_int_equal(snap.gauges[KVP_GAUGE_objects_committed], 3);
    kvp_snapshot_free(&snap);
    kvp_owner_destroy(&a);
    kvp_owner_destroy(&b);
    core_free(s);
}

/* What counter id counts now, less what it counted at before[]. */
static uint64_t delta(const uint64_t *before, enum kvp_counter_id id)
{
    uint64_t now[KVP_NCOUNTERS];
    kvp_counters_read(now);
    return now[id] - before[id];
}

/* Stores chunks [0, 2) of sequence seq the way an in-band front end does (the bytes come in its
 * messages: iovecs, then a commit "via inline"), then retrieves them the same way. */
static void store_and_retrieve_in_band(struct kvp_owner *o, uint32_t h, uint32_t seq)
{
    struct kvp_key_src src = tokens(seq, 2 * C, 0, 2 * C);
    struct kvp_op_slots res;
    assert_rc(kvp_op_prepare_store(o, h, &src, &res, M), 0);
    uint64_t id = res.id;
    assert_int_equal(res.nslots, 2);
    assert_rc(kvp_op_store_inline_begin(o, h, id, 2 * CHUNK, &res, M), 0);
    for (uint32_t i = 0; i < 2; i++)
        memset(res.iov[i].iov_base, 0x30 + (int)i, CHUNK);
    assert_rc(kvp_op_commit_store(o, h, id, KVP_VIA_INLINE, M), 2);
    src = tokens(seq, 2 * C, 0, 2 * C);
    assert_rc(kvp_op_retrieve_inline_begin(o, h, &src, &res, M), 0);
    assert_int_equal(res.nslots, 2);
    kvp_op_retrieve_inline_end(o, h, &res, true);
}

static void test_counts_by_transport(void **state)
{
    (void)state;
    struct kvp_server *s = core_new(true);
    struct kvp_owner lmc, own;
    uint64_t c0[KVP_NCOUNTERS];
    kvp_owner_init(&lmc, s, "lmcache", -1, 0);
    kvp_owner_init(&own, s, "kvpool", 7, 7);

    /* An LMCache pickle instance: every count under "pickle", none under "inline". */
    kvp_counters_read(c0);
    uint32_t hp = reg(&lmc, "lmcache-pickle", KVP_REG_PICKLE);
    assert_int_equal(delta(c0, KVP_CTR_registrations), 1);
    assert_int_equal(delta(c0, KVP_CTR_registrations_pickle), 1);
    assert_int_equal(delta(c0, KVP_CTR_registrations_inline), 0);
    assert_int_equal(delta(c0, KVP_CTR_registrations_shm), 0);
    store_and_retrieve_in_band(&lmc, hp, 20);
    assert_int_equal(delta(c0, KVP_CTR_store_chunks_committed), 2);
    assert_int_equal(delta(c0, KVP_CTR_store_chunks_pickle), 2);
    assert_int_equal(delta(c0, KVP_CTR_store_bytes_pickle), 2 * CHUNK);
    assert_int_equal(delta(c0, KVP_CTR_store_chunks_inline), 0);
    assert_int_equal(delta(c0, KVP_CTR_store_bytes_inline), 0);
    assert_int_equal(delta(c0, KVP_CTR_retrieve_chunks), 2);
    assert_int_equal(delta(c0, KVP_CTR_retrieve_chunks_pickle), 2);
    assert_int_equal(delta(c0, KVP_CTR_retrieve_bytes_pickle), 2 * CHUNK);
    assert_int_equal(delta(c0, KVP_CTR_retrieve_chunks_inline), 0);
    assert_int_equal(delta(c0, KVP_CTR_retrieve_bytes_inline), 0);

    /* The same for the tensor envelope. */
    kvp_counters_read(c0);
    uint32_t he = reg(&lmc, "lmcache-envelope", KVP_REG_ENVELOPE);
    store_and_retrieve_in_band(&lmc, he, 21);
    assert_int_equal(delta(c0, KVP_CTR_registrations_envelope), 1);
    assert_int_equal(delta(c0, KVP_CTR_store_chunks_envelope), 2);
    assert_int_equal(delta(c0, KVP_CTR_store_bytes_envelope), 2 * CHUNK);
    assert_int_equal(delta(c0, KVP_CTR_retrieve_chunks_envelope), 2);
    assert_int_equal(delta(c0, KVP_CTR_retrieve_bytes_envelope), 2 * CHUNK);
    assert_int_equal(delta(c0, KVP_CTR_store_chunks_inline) +
                         delta(c0, KVP_CTR_store_chunks_pickle),
                     0);

    /* kvpool's inline transport keeps its own rows. */
    kvp_counters_read(c0);
    uint32_t hi = reg(&own, "native-inline", KVP_REG_INLINE);
    store_and_retrieve_in_band(&own, hi, 22);
    assert_int_equal(delta(c0, KVP_CTR_registrations_inline), 1);
    assert_int_equal(delta(c0, KVP_CTR_store_chunks_inline), 2);
    assert_int_equal(delta(c0, KVP_CTR_retrieve_chunks_inline), 2);
    assert_int_equal(delta(c0, KVP_CTR_store_chunks_pickle), 0);

    /* Registered on shm, then moved to pickle (a worker that could not map the segment): its
     * registration stays counted under shm, its transfers from then on under pickle. */
    kvp_counters_read(c0);
    uint32_t hm = reg(&lmc, "lmcache-moved", KVP_REG_SHM);
    assert_int_equal(delta(c0, KVP_CTR_registrations_shm), 1);
    assert_rc(kvp_op_leave_shm(&lmc, hm, KVP_REG_PICKLE, "cannot map", M), 1);
    store_and_retrieve_in_band(&lmc, hm, 23);
    assert_int_equal(delta(c0, KVP_CTR_store_chunks_pickle), 2);
    assert_int_equal(delta(c0, KVP_CTR_retrieve_chunks_pickle), 2);
    assert_int_equal(delta(c0, KVP_CTR_store_chunks_shm) + delta(c0, KVP_CTR_store_chunks_inline),
                     0);

    /* The gauges: instances by transport, and the connections of kvpool's protocol are its
     * front end's owners only (one here; the LMCache owner is not a connection). */
    struct kvp_snapshot snap;
    assert_rc(kvp_op_stats(&own, &snap, M), 0);
    assert_int_equal(snap.gauges[KVP_GAUGE_instances], 4);
    assert_int_equal(snap.gauges[KVP_GAUGE_instances_pickle], 2);
    assert_int_equal(snap.gauges[KVP_GAUGE_instances_envelope], 1);
    assert_int_equal(snap.gauges[KVP_GAUGE_instances_inline], 1);
    assert_int_equal(snap.gauges[KVP_GAUGE_instances_shm], 0);
    assert_int_equal(snap.gauges[KVP_GAUGE_connections], 1);
    kvp_snapshot_free(&snap);
    kvp_owner_destroy(&own);
    assert_rc(kvp_op_stats(&lmc, &snap, M), 0);
    assert_int_equal(snap.gauges[KVP_GAUGE_connections], 0);
    kvp_snapshot_free(&snap);
    kvp_owner_destroy(&lmc);
    core_free(s);
}

/* Child of test_commit_after_segment_lost: 0, or the number of the check that failed. */
static int child_commit_after_loss(void)
{
    struct kvp_server *s = core_new(true);
    struct kvp_owner a;
    kvp_owner_init(&a, s, "kvpool", 1, 1);
    uint32_t h = reg(&a, "a", KVP_REG_SHM);
    struct kvp_key_src src = tokens(7, 2 * C, 0, 2 * C);
    struct kvp_op_slots res;
    if (kvp_op_prepare_store(&a, h, &src, &res, M) != 0 || res.nslots != 2)
        return 1;
    /* A segment of its own, truncated under the guard: the guard trips, as it would for the
     * daemon's pool. */
    char path[96];
    snprintf(path, sizeof(path), "/dev/shm/kvpool_ops_guard_%ld", (long)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, 1 << 16) != 0)
        return 2;
    unlink(path);
    void *p = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED || kvp_seg_guard_arm(p, 1 << 16, fd) != 0)
        return 3;
    if (ftruncate(fd, 0) != 0 || !kvp_seg_guard_check() || !kvp_seg_guard_tripped())
        return 4;
    if (kvp_op_commit_store(&a, h, res.id, KVP_VIA_SHM, M) != -EOPNOTSUPP ||
        !strstr(msg, "shared segment is lost"))
        return 5;
    /* Dropped, not published: the keys are free, and the reservation is gone. */
    if (looked_up(&a, h, 7, 2) != 0 || gauge(s, "reserved") != 0)
        return 6;
    if (kvp_op_commit_store(&a, h, res.id, KVP_VIA_SHM, M) != -ENOENT)
        return 7;
    /* An inline commit still publishes: its bytes came through the socket. */
    struct kvp_op_slots in;
    src = tokens(8, C, 0, C);
    if (kvp_op_prepare_store(&a, h, &src, &in, M) != 0 || in.nslots != 1)
        return 8;
    if (kvp_op_commit_store(&a, h, in.id, KVP_VIA_INLINE, M) != 1 || looked_up(&a, h, 8, 1) != 1)
        return 9;
    kvp_seg_guard_disarm();
    kvp_owner_destroy(&a);
    core_free(s);
    return 0;
}

static void test_commit_after_segment_lost(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(child_commit_after_loss());
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_register_conflicts_and_limit),
        cmocka_unit_test(test_prepare_commit_shm),
        cmocka_unit_test(test_inline_transport),
        cmocka_unit_test(test_owner_release),
        cmocka_unit_test(test_hold_limit_and_expiry),
        cmocka_unit_test(test_clear_while_pinned),
        cmocka_unit_test(test_key_sources),
        cmocka_unit_test(test_counts_by_transport),
        cmocka_unit_test(test_commit_after_segment_lost),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
