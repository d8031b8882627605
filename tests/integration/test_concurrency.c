/*
 * test_concurrency.c - many workers at once, and no head-of-line blocking: a worker paused in the
 * middle of a large inline upload must not delay anybody else; reservations that are never
 * committed expire after --reserve-timeout.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/msg.h"
#include "common/wire.h"
#include "harness.h"

#define C 16
#define WORKERS 24

static struct kvpt_daemon daemon_;

static int setup(void **state)
{
    const char *args[] = {"--l1-size", "64MiB", "--chunk-size", "16", "--io-timeout",
                          "20000",     NULL};
    return kvpt_group_start(state, &daemon_, args);
}

/* One worker process: its own sequences, both transports, every byte checked. */
static int worker(int w)
{
    kvp_client *c = NULL;
    kvp_instance *inst = NULL;
    kvp_opts o = {.socket_path = daemon_.socket, .timeout_ms = 20000};
    char id[32];
    snprintf(id, sizeof(id), "worker-%d", w);
    kvp_register_opts ro = kvpt_layout(id, w % 2 ? KVP_TRANSPORT_INLINE : KVP_TRANSPORT_AUTO);
    ro.world_size = WORKERS;
    ro.worker_rank = (uint32_t)w;
    if (kvp_client_open(&o, &c) || kvp_register(c, &ro, &inst))
        return 1;
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
    void *bufs[8];
    for (int i = 0; i < 8; i++)
        bufs[i] = malloc(bytes);
    for (uint32_t round = 0; round < 20; round++) {
        uint32_t seq = 1000 + round % 5; /* the same prompts across workers: ranks separate keys */
        uint32_t *tok = kvpt_tokens(seq, 8 * C);
        kvp_tokens t = {.ids = tok, .count = 8 * C};
        for (uint32_t i = 0; i < 8; i++)
            kvpt_fill(bufs[i], bytes, seq * 100 + (uint32_t)w, i);
        if (kvp_store(inst, &t, 0, 8 * C, (const void *const *)bufs, NULL) < 0)
            return 2;
        for (uint32_t i = 0; i < 8; i++)
            memset(bufs[i], 0, bytes);
        if (kvp_retrieve(inst, &t, 0, 8 * C, bufs) != 8)
            return 3;
        for (uint32_t i = 0; i < 8; i++)
            if (!kvpt_check(bufs[i], bytes, seq * 100 + (uint32_t)w, i))
                return 4;
        free(tok);
    }
    kvp_client_close(c);
    return 0;
}

static void test_many_workers(void **state)
{
    (void)state;
    pid_t pids[WORKERS];
    for (int w = 0; w < WORKERS; w++) {
        pids[w] = fork();
        assert_true(pids[w] >= 0);
        if (pids[w] == 0)
            _exit(worker(w));
    }
    for (int w = 0; w < WORKERS; w++) {
        int st;
        assert_int_equal(waitpid(pids[w], &st, 0), pids[w]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
    kvp_client *c = kvpt_connect(&daemon_);
    assert_int_equal(kvpt_stat(c, "objects_reserved"), 0);
    assert_int_equal(kvpt_stat(c, "objects_pinned"), 0);
    assert_int_equal(kvpt_stat(c, "instances"), 0);
    kvp_client_close(c);
}

static void send_all(int fd, const void *p, size_t n)
{
    assert_int_equal(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

static int raw_connect(void)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%.100s", daemon_.socket);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

static void frame(int fd, uint16_t op, const struct kvp_wbuf *w, uint64_t payload)
{
    uint8_t hdr[KVP_HEADER_SIZE];
    struct kvp_header h = {.magic = KVP_MAGIC,
                           .version = KVP_PROTO_VERSION,
                           .opcode = op,
                           .request_id = 1,
                           .body_len = (uint32_t)w->len,
                           .payload_len = payload};
    kvp_header_encode(&h, hdr);
    send_all(fd, hdr, sizeof(hdr));
    if (w->len)
        send_all(fd, w->data, w->len);
}

static uint8_t *reply(int fd, struct kvp_header *h)
{
    uint8_t hdr[KVP_HEADER_SIZE];
    assert_int_equal(recv(fd, hdr, sizeof(hdr), MSG_WAITALL), (ssize_t)sizeof(hdr));
    assert_int_equal(kvp_header_decode(hdr, h), 0);
    uint8_t *b = malloc(h->body_len + 1);
    if (h->body_len)
        assert_int_equal(recv(fd, b, h->body_len, MSG_WAITALL), (ssize_t)h->body_len);
    return b;
}

/*
 * A raw client reserves 32 chunks inline and sends only half of the payload, then pauses. While
 * it is paused, other workers (with a 3 s timeout) must be served: with a shared lock held
 * across the upload, or a single-threaded loop, they would time out.
 */
static void test_no_head_of_line_blocking(void **state)
{
    (void)state;
    struct kvp_wbuf w;
    struct kvp_header h;
    kvp_wbuf_init(&w);
    int fd = raw_connect();

    frame(fd, KVP_OP_HELLO, &w, 0);
    free(reply(fd, &h));
    struct kvp_register_req rr = {.world_size = 1,
                                  .block_size = 16,
                                  .num_layers = 8,
                                  .hidden_dim = 1024,
                                  .transport = KVP_WIRE_INLINE};
    snprintf(rr.instance_id, sizeof(rr.instance_id), "slow-uploader");
    snprintf(rr.model_name, sizeof(rr.model_name), "m");
    snprintf(rr.dtype, sizeof(rr.dtype), "float32");
    kvp_encode_register_req(&w, &rr);
    frame(fd, KVP_OP_REGISTER, &w, 0);
    uint8_t *b = reply(fd, &h);
    assert_int_equal(h.status, 0);
    struct kvp_register_reply reg;
    assert_int_equal(kvp_decode_register_reply(b, h.body_len, &reg), 0);
    free(b);

    uint32_t n = 32, *tok = kvpt_tokens(77, n * C);
    kvp_wbuf_reset(&w);
    kvp_encode_key_req(&w, reg.handle, 0, n * C, tok, n * C, NULL, 0);
    frame(fd, KVP_OP_PREPARE_STORE, &w, 0);
    b = reply(fd, &h);
    assert_int_equal(h.status, 0);
    static struct kvp_wire_slot slots[KVP_MAX_CHUNKS];
    struct kvp_slots_reply sr = {.slots = slots};
    assert_int_equal(kvp_decode_slots_reply(b, h.body_len, &sr), 0);
    free(b);
    assert_int_equal(sr.nslots, n);

    uint64_t total = (uint64_t)n * reg.chunk_bytes; /* 32 x 1 MiB */
    kvp_wbuf_reset(&w);
    struct kvp_ref_req ref = {.handle = reg.handle, .id = sr.id};
    kvp_encode_ref_req(&w, &ref);
    frame(fd, KVP_OP_STORE_INLINE, &w, total);
    uint8_t *half = calloc(1, total / 2);
    send_all(fd, half, total / 2);

    /* Meanwhile: other workers store, retrieve and ping. */
    kvp_client *c = NULL;
    kvp_opts o = {.socket_path = daemon_.socket, .timeout_ms = 3000};
    assert_int_equal(kvp_client_open(&o, &c), 0);
    for (int i = 0; i < 20; i++)
        assert_int_equal(kvp_ping(c), 0);
    kvp_register_opts ro = kvpt_layout("fast", KVP_TRANSPORT_INLINE);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &ro, &inst), 0);
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
    uint32_t *t2 = kvpt_tokens(78, 4 * C);
    kvp_tokens t = {.ids = t2, .count = 4 * C};
    void *bufs[4];
    for (uint32_t i = 0; i < 4; i++) {
        bufs[i] = malloc(bytes);
        kvpt_fill(bufs[i], bytes, 78, i);
    }
    assert_int_equal(kvp_store(inst, &t, 0, 4 * C, (const void *const *)bufs, NULL), 4);
    assert_int_equal(kvp_retrieve(inst, &t, 0, 4 * C, bufs), 4);
    for (uint32_t i = 0; i < 4; i++) {
        assert_true(kvpt_check(bufs[i], bytes, 78, i));
        free(bufs[i]);
    }
    /* The half-uploaded chunks are invisible to everyone. */
    kvp_register_opts peek = {.instance_id = "peek",
                              .model_name = "m",
                              .world_size = 1,
                              .block_size = 16,
                              .num_layers = 8,
                              .hidden_dim = 1024,
                              .dtype = "float32",
                              .transport = KVP_TRANSPORT_INLINE};
    kvp_instance *pi = NULL;
    kvp_tokens tt = {.ids = tok, .count = n * C};
    assert_int_equal(kvp_register(c, &peek, &pi), 0);
    assert_int_equal(kvp_lookup(pi, &tt), 0);

    /* Finish the upload: it commits and becomes visible. */
    send_all(fd, half, total / 2);
    b = reply(fd, &h);
    assert_int_equal(h.status, 0);
    free(b);
    assert_int_equal(kvp_lookup(pi, &tt), (int)n);

    free(half);
    free(tok);
    free(t2);
    kvp_wbuf_free(&w);
    close(fd);
    kvp_client_close(c);
}

/*
 * A reservation not committed within --reserve-timeout is cancelled. Its late commit fails with
 * -ETIMEDOUT: at once with KVP_OPT_SYNC_COMMIT; pipelined (the default), the commit returns as
 * sent and the writer's next call is refused with KVP_EPIPELINED naming it, without being
 * performed, after which the connection serves as before.
 */
static void reservation_expires(bool sync)
{
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "4MiB", "--chunk-size", "16", "--reserve-timeout",
                          "1",         NULL};
    kvpt_daemon_start(&d, args);
    kvp_opts opts = {.socket_path = d.socket, .flags = sync ? KVP_OPT_SYNC_COMMIT : 0};
    kvp_client *a = NULL;
    assert_int_equal(kvp_client_open(&opts, &a), 0);
    kvp_client *b = kvpt_connect(&d);
    kvp_register_opts oa = kvpt_layout("slow-writer", KVP_TRANSPORT_AUTO);
    kvp_register_opts ob = kvpt_layout("other-writer", KVP_TRANSPORT_AUTO);
    kvp_instance *ia = NULL, *ib = NULL;
    kvp_store_plan sp;
    kvp_store_result r;
    uint32_t *tok = kvpt_tokens(90, 2 * C);
    kvp_tokens t = {.ids = tok, .count = 2 * C};

    assert_int_equal(kvp_register(a, &oa, &ia), 0);
    assert_int_equal(kvp_register(b, &ob, &ib), 0);
    size_t bytes = kvp_instance_get_info(ia)->chunk_bytes;
    assert_int_equal(kvp_prepare_store(ia, &t, 0, 2 * C, &sp), 2);

    /* While reserved, another writer sees "busy", not "cached" and not "no space". */
    void *bufs[2] = {malloc(bytes), malloc(bytes)};
    kvpt_fill(bufs[0], bytes, 90, 0);
    kvpt_fill(bufs[1], bytes, 90, 1);
    assert_int_equal(kvp_store(ib, &t, 0, 2 * C, (const void *const *)bufs, &r), 0);
    assert_int_equal(r.busy, 2);

    /* After --reserve-timeout (1 s) the reservation is cancelled. */
    assert_true(kvpt_log_wait(&d, "not committed within 1 s", 5000));
    if (sync) {
        assert_int_equal(kvp_commit_store(ia, &sp), -ETIMEDOUT);
    } else {
        assert_int_equal(kvp_commit_store(ia, &sp), 2);
        assert_int_equal(kvp_lookup(ia, &t), KVP_EPIPELINED);
        const char *msg = kvp_last_error(a);
        if (!strstr(msg, "COMMIT_STORE #") || !strstr(msg, "ETIMEDOUT") ||
            !strstr(msg, "this LOOKUP was not performed"))
            fail_msg("unexpected message: %s", msg);
        assert_int_equal(kvp_lookup(ia, &t), 0);
    }
    assert_int_equal(kvp_lookup(ib, &t), 0);
    assert_int_equal(kvp_store(ib, &t, 0, 2 * C, (const void *const *)bufs, &r), 2);
    /* b's commit may still be on its way: any round trip of b's is applied after it. */
    assert_int_equal(kvp_ping(b), 0);
    assert_int_equal(kvp_retrieve(ia, &t, 0, 2 * C, bufs), 2);
    assert_true(kvpt_check(bufs[0], bytes, 90, 0));
    assert_true(kvpt_check(bufs[1], bytes, 90, 1));
    assert_true(kvpt_stat(a, "reservations_expired") >= 2);
    assert_int_equal(kvpt_stat(a, "objects_expired"), 0);
    free(bufs[0]);
    free(bufs[1]);
    free(tok);
    kvp_client_close(b);
    kvp_client_close(a);
    kvpt_daemon_stop(&d);
}

static void test_reservation_expires(void **state)
{
    (void)state;
    reservation_expires(false);
}

static void test_reservation_expires_sync(void **state)
{
    (void)state;
    reservation_expires(true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_many_workers),
        cmocka_unit_test(test_no_head_of_line_blocking),
        cmocka_unit_test(test_reservation_expires),
        cmocka_unit_test(test_reservation_expires_sync),
    };
    return cmocka_run_group_tests(tests, setup, kvpt_group_stop);
}
