/*
 * test_client_register.c - libkvpool's registration against the scripted fake daemon: which
 * transport the library asks for and why (no shm offered, shm, inline by request), every way a
 * segment can be unusable (wrong nonce, no kvpool header, missing, shorter than announced) with
 * auto falling back and strict shm failing locally, the daemon's refusals, argument validation
 * before anything is sent, and a reply whose sizes contradict each other.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client/transfer_fixture.h"
#include "common/kvp_assert.h"

/* ---- registration ----------------------------------------------------------------------- */

/* No SHM offered: auto goes inline with the daemon's reason; strict SHM fails locally. */
static void test_register_no_shm(void **state)
{
    struct xfer_fixture *x = *state;
    struct kvp_register_reply r = xfer_register_reply(KVP_WIRE_INLINE, NULL, "no room in /dev/shm");
    struct kvp_hello_reply h = fake_hello_msg(NULL, 0, NULL, "no room in /dev/shm");
    kvp_register_opts o = xfer_reg_opts(KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;

    fake_add_hello_msg(&x->f, &h);
    xfer_add_register_reply(x, &r);
    xfer_start_and_open(x);

    assert_rc(kvp_register(x->c, &o, &inst), 0);
    const kvp_instance_info *info = kvp_instance_get_info(inst);
    assert_int_equal(info->transport, KVP_TRANSPORT_INLINE);
    assert_int_equal(info->chunk_tokens, CT);
    assert_int_equal(info->ndim, 4);
    assert_int_equal(info->shape[0], 2);
    assert_int_equal(info->shape[3], 4);
    assert_int_equal(info->chunk_bytes, CHUNK);
    assert_int_equal(info->dtype_size, 2);
    assert_string_equal(info->dtype, "float16");
    assert_string_equal(info->shm_name, "");
    assert_string_equal(info->reason, "no room in /dev/shm");

    o = xfer_reg_opts(KVP_TRANSPORT_SHM);
    o.instance_id = "worker-1";
    kvp_instance *strict = (kvp_instance *)&o;
    assert_rc(kvp_register(x->c, &o, &strict), KVP_ENOSHM);
    assert_null(strict);
    assert_non_null(strstr(kvp_last_error(x->c), "no room in /dev/shm"));
    xfer_finish(x);

    /* HELLO and one REGISTER: the strict request never reached the daemon. */
    assert_rc(x->f.nreqs, 2);
    struct kvp_register_req q = xfer_sent_register(x, 1);
    assert_string_equal(q.instance_id, "worker-0");
    assert_string_equal(q.model_name, "tiny");
    assert_string_equal(q.dtype, "float16");
    assert_int_equal(q.world_size, 1);
    assert_int_equal(q.block_size, 16);
    assert_int_equal(q.num_layers, 1);
    assert_int_equal(q.hidden_dim, 4);
    assert_int_equal(q.transport, KVP_WIRE_INLINE);
    assert_string_equal(q.reason, "no room in /dev/shm");
}

static void test_register_shm(void **state)
{
    struct xfer_fixture *x = *state;
    kvp_register_opts o = xfer_reg_opts(KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;

    xfer_seg_create(x, xfer_nonce_a, SEG_SIZE);
    xfer_add_hello_shm(x, xfer_nonce_a);
    struct kvp_register_reply r = xfer_register_reply(KVP_WIRE_SHM, x->seg_name, NULL);
    xfer_add_register_reply(x, &r);
    fake_add_reply(&x->f, KVP_OP_UNREGISTER, NULL);
    xfer_start_and_open(x);

    assert_rc(kvp_register(x->c, &o, &inst), 0);
    assert_int_equal(kvp_instance_get_info(inst)->transport, KVP_TRANSPORT_SHM);
    assert_string_equal(kvp_instance_get_info(inst)->shm_name, x->seg_name);
    assert_rc(kvp_unregister(inst), 0);
    xfer_finish(x);

    struct kvp_register_req q = xfer_sent_register(x, 1);
    assert_int_equal(q.transport, KVP_WIRE_SHM);
    assert_string_equal(q.reason, "");
    struct kvp_ref_req u = xfer_sent_ref(x, 2, KVP_OP_UNREGISTER);
    assert_int_equal(u.handle, HANDLE);
    assert_int_equal(u.id, 0);
}

static void test_register_requested_inline(void **state)
{
    struct xfer_fixture *x = *state;
    kvp_register_opts o = xfer_reg_opts(KVP_TRANSPORT_INLINE);
    kvp_instance *inst = NULL;

    xfer_seg_create(x, xfer_nonce_a, SEG_SIZE);
    xfer_add_hello_shm(x, xfer_nonce_a);
    struct kvp_register_reply r = xfer_register_reply(KVP_WIRE_INLINE, NULL, "requested by worker");
    xfer_add_register_reply(x, &r);
    xfer_start_and_open(x);
    assert_rc(kvp_register(x->c, &o, &inst), 0);
    assert_int_equal(kvp_instance_get_info(inst)->transport, KVP_TRANSPORT_INLINE);
    xfer_finish(x);

    struct kvp_register_req q = xfer_sent_register(x, 1);
    assert_int_equal(q.transport, KVP_WIRE_INLINE);
    assert_string_equal(q.reason, "requested by worker");
}

/* Runs auto and strict registrations against a segment that cannot be used and checks that
 * auto falls back with a reason containing `why` and strict fails without a request. */
static void check_unusable_segment(struct xfer_fixture *x, const char *why)
{
    kvp_register_opts o = xfer_reg_opts(KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;

    struct kvp_register_reply r = xfer_register_reply(KVP_WIRE_INLINE, NULL, "whatever it said");
    xfer_add_register_reply(x, &r);
    xfer_start_and_open(x);
    assert_rc(kvp_register(x->c, &o, &inst), 0);
    assert_int_equal(kvp_instance_get_info(inst)->transport, KVP_TRANSPORT_INLINE);

    o = xfer_reg_opts(KVP_TRANSPORT_SHM);
    assert_rc(kvp_register(x->c, &o, &inst), KVP_ENOSHM);
    if (!strstr(kvp_last_error(x->c), why))
        fail_msg("last error \"%s\" does not mention \"%s\"", kvp_last_error(x->c), why);
    xfer_finish(x);

    assert_rc(x->f.nreqs, 2);
    struct kvp_register_req q = xfer_sent_register(x, 1);
    assert_int_equal(q.transport, KVP_WIRE_INLINE);
    if (!strstr(q.reason, why))
        fail_msg("reason \"%s\" does not mention \"%s\"", q.reason, why);
}

static void test_register_nonce_mismatch(void **state)
{
    struct xfer_fixture *x = *state;
    xfer_seg_create(x, xfer_nonce_b, SEG_SIZE);
    xfer_add_hello_shm(x, xfer_nonce_a);
    check_unusable_segment(x, "segment nonce mismatch: not this daemon's pool");
}

static void test_register_bad_magic(void **state)
{
    struct xfer_fixture *x = *state;
    xfer_seg_create(x, xfer_nonce_a, SEG_SIZE);
    memcpy(x->seg, "NOTKVPOO", 8);
    xfer_add_hello_shm(x, xfer_nonce_a);
    check_unusable_segment(x, "no kvpool header");
}

static void test_register_missing_segment(void **state)
{
    struct xfer_fixture *x = *state;
    struct kvp_hello_reply h = fake_hello_msg("kvpool_l1_pool_does_not_exist_42", SEG_SIZE,
                                              xfer_nonce_a, NULL);
    fake_add_hello_msg(&x->f, &h);
    check_unusable_segment(x, "cannot open /dev/shm/kvpool_l1_pool_does_not_exist_42: "
                              "No such file or directory");
}

/* A file shorter than announced must not be mapped (touching it would be SIGBUS). */
static void test_register_short_segment(void **state)
{
    struct xfer_fixture *x = *state;
    xfer_seg_create(x, xfer_nonce_a, 4096);
    xfer_add_hello_shm(x, xfer_nonce_a);
    check_unusable_segment(x, "daemon announced");
}

/* A daemon refusing shm for a strict request: KVP_ENOSHM, not -EOPNOTSUPP. */
static void test_register_eopnotsupp(void **state)
{
    struct xfer_fixture *x = *state;
    kvp_register_opts o = xfer_reg_opts(KVP_TRANSPORT_SHM);
    kvp_instance *inst = NULL;

    xfer_seg_create(x, xfer_nonce_a, SEG_SIZE);
    xfer_add_hello_shm(x, xfer_nonce_a);
    fake_add_error(&x->f, KVP_OP_REGISTER, -EOPNOTSUPP, "SHM is disabled");
    xfer_start_and_open(x);
    assert_rc(kvp_register(x->c, &o, &inst), KVP_ENOSHM);
    assert_string_equal(kvp_last_error(x->c), "SHM is disabled");
    xfer_finish(x);
}

static void test_register_daemon_error(void **state)
{
    struct xfer_fixture *x = *state;
    kvp_register_opts o = xfer_reg_opts(KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;

    fake_add_hello(&x->f);
    fake_add_error(&x->f, KVP_OP_REGISTER, -EINVAL, "num_layers must be >= 1");
    xfer_start_and_open(x);
    o.num_layers = 0;
    assert_rc(kvp_register(x->c, &o, &inst), -EINVAL);
    assert_null(inst);
    assert_string_equal(kvp_last_error(x->c), "num_layers must be >= 1");
    xfer_finish(x);
}

static void test_register_validation(void **state)
{
    struct xfer_fixture *x = *state;
    char long_id[200];
    kvp_register_opts o;
    kvp_instance *inst = NULL;

    memset(long_id, 'i', sizeof(long_id) - 1);
    long_id[128] = '\0';
    fake_add_hello(&x->f);
    xfer_start_and_open(x);

    o = xfer_reg_opts(0);
    o.instance_id = long_id;
    assert_rc(kvp_register(x->c, &o, &inst), -ENAMETOOLONG);
    o = xfer_reg_opts(0);
    o.model_name = NULL;
    assert_rc(kvp_register(x->c, &o, &inst), -EINVAL);
    o = xfer_reg_opts(0);
    o.dtype = "";
    assert_rc(kvp_register(x->c, &o, &inst), -EINVAL);
    o = xfer_reg_opts(0);
    o.transport = 3;
    assert_rc(kvp_register(x->c, &o, &inst), -EINVAL);
    assert_rc(kvp_register(x->c, NULL, &inst), -EINVAL);
    assert_rc(kvp_register(NULL, &o, &inst), -EINVAL);
    assert_rc(kvp_register(x->c, &o, NULL), -EINVAL);
    xfer_finish(x);
    assert_rc(x->f.nreqs, 1);
}

/* A reply whose chunk_bytes does not match its own shape and dtype cannot size copies. */
static void test_register_inconsistent_reply(void **state)
{
    struct xfer_fixture *x = *state;
    kvp_register_opts o = xfer_reg_opts(KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    struct kvp_register_reply r = xfer_register_reply(KVP_WIRE_INLINE, NULL, "x");

    r.chunk_bytes = CHUNK * 2;
    fake_add_hello(&x->f);
    xfer_add_register_reply(x, &r);
    xfer_start_and_open(x);
    assert_rc(kvp_register(x->c, &o, &inst), KVP_EPROTO);
    assert_null(inst);
    xfer_finish(x);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, xfer_setup, xfer_teardown)
    const struct CMUnitTest tests[] = {
        T(test_register_no_shm),
        T(test_register_shm),
        T(test_register_requested_inline),
        T(test_register_nonce_mismatch),
        T(test_register_bad_magic),
        T(test_register_missing_segment),
        T(test_register_short_segment),
        T(test_register_eopnotsupp),
        T(test_register_daemon_error),
        T(test_register_validation),
        T(test_register_inconsistent_reply),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
