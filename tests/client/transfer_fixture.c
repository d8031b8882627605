/*
 * transfer_fixture.c - the fixture of the client transfer tests (see transfer_fixture.h): a
 * fake daemon scripted step by step, a real shared-memory segment made by the test where the
 * daemon would make it, and the client under test.
 *
 * Each case gets a fresh fixture from xfer_setup() and loses it in xfer_teardown(), which also
 * closes whatever the case left open and unlinks its segment, so a failed assertion leaks
 * nothing into the next case.
 */
#include "client/transfer_fixture.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/kvp_assert.h"
#include "common/seg_header.h"

const uint8_t xfer_nonce_a[KVP_NONCE_SIZE] = "0123456789abcdef";
const uint8_t xfer_nonce_b[KVP_NONCE_SIZE] = "fedcba9876543210";

void xfer_seg_create(struct xfer_fixture *x, const uint8_t *nonce, size_t file_size)
{
    static int counter;
    char path[80];

    snprintf(x->seg_name, sizeof(x->seg_name), "kvpool_l1_pool_test%d_%d", (int)getpid(),
             counter++);
    snprintf(path, sizeof(path), "/%s", x->seg_name);
    int fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_rc(ftruncate(fd, (off_t)file_size), 0);
    x->seg = mmap(NULL, file_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(x->seg != MAP_FAILED);
    close(fd);
    x->seg_size = file_size;
    if (file_size >= KVP_SEG_HEADER)
        kvp_seg_header_write(x->seg, nonce, SEG_SIZE, (uint32_t)getpid());
    else
        memcpy(x->seg, KVP_SEG_MAGIC, 8);
}

int xfer_setup(void **state)
{
    struct xfer_fixture *x = calloc(1, sizeof(*x));
    assert_non_null(x);
    fake_init(&x->f);
    for (uint32_t i = 0; i < 256; i++)
        x->ids[i] = i * 3 + 1;
    *state = x;
    return 0;
}

int xfer_teardown(void **state)
{
    struct xfer_fixture *x = *state;
    char path[80];

    kvp_client_close(x->c);
    fake_cleanup(&x->f);
    if (x->seg) {
        munmap(x->seg, x->seg_size);
        snprintf(path, sizeof(path), "/%s", x->seg_name);
        shm_unlink(path);
    }
    free(x);
    return 0;
}

void xfer_add_hello_shm(struct xfer_fixture *x, const uint8_t *nonce)
{
    struct kvp_hello_reply h = fake_hello_msg(x->seg_name, SEG_SIZE, nonce, NULL);
    fake_add_hello_msg(&x->f, &h);
}

struct kvp_register_reply xfer_register_reply(uint8_t transport, const char *shm_name,
                                              const char *reason)
{
    struct kvp_register_reply r = {
        .handle = HANDLE,
        .transport = transport,
        .ndim = 4,
        .chunk_tokens = CT,
        .shape = {2, 1, CT, 4},
        .chunk_bytes = CHUNK,
        .dtype_size = 2,
        .segment_size = shm_name ? SEG_SIZE : 0,
    };
    snprintf(r.dtype, sizeof(r.dtype), "float16");
    snprintf(r.shm_name, sizeof(r.shm_name), "%s", shm_name ? shm_name : "");
    snprintf(r.reason, sizeof(r.reason), "%s", reason ? reason : "");
    return r;
}

void xfer_add_register_reply(struct xfer_fixture *x, const struct kvp_register_reply *r)
{
    struct kvp_wbuf w;
    kvp_wbuf_init(&w);
    kvp_encode_register_reply(&w, r);
    fake_add_reply(&x->f, KVP_OP_REGISTER, &w);
}

void xfer_add_slots_reply(struct xfer_fixture *x, uint16_t op, struct kvp_slots_reply *m)
{
    struct kvp_wbuf w;
    kvp_wbuf_init(&w);
    kvp_encode_slots_reply(&w, m);
    fake_add_reply(&x->f, op, &w);
}

kvp_register_opts xfer_reg_opts(uint32_t transport)
{
    return (kvp_register_opts){
        .instance_id = "worker-0",
        .model_name = "tiny",
        .world_size = 1,
        .worker_rank = 0,
        .block_size = 16,
        .num_layers = 1,
        .hidden_dim = 4,
        .dtype = "float16",
        .transport = transport,
    };
}

void xfer_start_and_open(struct xfer_fixture *x)
{
    kvp_opts o = {.socket_path = x->f.path, .timeout_ms = 2000};
    fake_start(&x->f);
    assert_rc(kvp_client_open(&o, &x->c), 0);
}

void xfer_finish(struct xfer_fixture *x)
{
    kvp_client_close(x->c);
    x->c = NULL;
    fake_join(&x->f);
}

struct kvp_register_req xfer_sent_register(struct xfer_fixture *x, int i)
{
    struct kvp_register_req r;
    assert_true(i < x->f.nreqs);
    assert_int_equal(x->f.reqs[i].h.opcode, KVP_OP_REGISTER);
    assert_rc(kvp_decode_register_req(x->f.reqs[i].body, x->f.reqs[i].h.body_len, &r), 0);
    return r;
}

struct kvp_ref_req xfer_sent_ref(struct xfer_fixture *x, int i, uint16_t op)
{
    struct kvp_ref_req r;
    assert_true(i < x->f.nreqs);
    assert_int_equal(x->f.reqs[i].h.opcode, op);
    assert_rc(kvp_decode_ref_req(x->f.reqs[i].body, x->f.reqs[i].h.body_len, &r), 0);
    return r;
}

kvp_instance *xfer_register_shm(struct xfer_fixture *x)
{
    kvp_register_opts o = xfer_reg_opts(KVP_TRANSPORT_SHM);
    kvp_instance *inst = NULL;

    assert_rc(kvp_register(x->c, &o, &inst), 0);
    assert_int_equal(kvp_instance_get_info(inst)->transport, KVP_TRANSPORT_SHM);
    return inst;
}

void xfer_script_shm(struct xfer_fixture *x)
{
    xfer_seg_create(x, xfer_nonce_a, SEG_SIZE);
    xfer_add_hello_shm(x, xfer_nonce_a);
    struct kvp_register_reply r = xfer_register_reply(KVP_WIRE_SHM, x->seg_name, NULL);
    xfer_add_register_reply(x, &r);
}

kvp_instance *xfer_register_inline(struct xfer_fixture *x)
{
    kvp_register_opts o = xfer_reg_opts(KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;

    assert_rc(kvp_register(x->c, &o, &inst), 0);
    assert_int_equal(kvp_instance_get_info(inst)->transport, KVP_TRANSPORT_INLINE);
    return inst;
}

void xfer_script_inline(struct xfer_fixture *x)
{
    fake_add_hello(&x->f);
    struct kvp_register_reply r = xfer_register_reply(KVP_WIRE_INLINE, NULL, "SHM disabled");
    xfer_add_register_reply(x, &r);
}
