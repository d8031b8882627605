/*
 * test_identity.c - instance identity through the real kvpoold: an instance id names one
 * registration of one connection.
 *
 *   - A namesake with another model or layout (llama vs mistral) is refused with EEXIST and the
 *     differing field; the first worker keeps working and its chunks stay intact.
 *   - Identical parameters from another live connection (a forked worker) are refused with
 *     EBUSY naming that worker's pid; once it has closed, the id can be registered again.
 *   - The owning connection registering again gets its registration back.
 *   - Keys come from the caller's own registration: another connection's handle is unknown to
 *     a connection, so it can neither look up, retrieve, store nor unregister through it.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/msg.h"
#include "common/wire.h"
#include "harness.h"

#define C 16 /* --chunk-size */
#define NCHUNKS 4

static struct kvpt_daemon daemon_;

static int setup(void **state)
{
    const char *args[] = {"--l1-size", "64MiB", "--chunk-size", "16", NULL};
    return kvpt_group_start(state, &daemon_, args);
}

/* The first worker's layout: llama, 2 layers, hidden 64, float16. */
static kvp_register_opts llama(const char *id)
{
    kvp_register_opts o = kvpt_layout(id, KVP_TRANSPORT_AUTO);
    o.model_name = "llama-3-8b";
    return o;
}

/* The namesake's: another model with another layout. */
static kvp_register_opts mistral(const char *id)
{
    kvp_register_opts o = kvpt_layout(id, KVP_TRANSPORT_AUTO);
    o.model_name = "mistral-7b";
    o.num_layers = 4;
    o.hidden_dim = 128;
    o.dtype = "bfloat16";
    return o;
}

/* Stores NCHUNKS chunks of sequence seq filled for seed. Returns 0, or -1 (usable in a child). */
static int store_seq(kvp_instance *inst, uint32_t seq, uint32_t seed)
{
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
    uint32_t *tok = kvpt_tokens(seq, NCHUNKS * C);
    kvp_tokens t = {.ids = tok, .count = NCHUNKS * C};
    void *in[NCHUNKS] = {0};
    int rc = 0;
    for (uint32_t i = 0; i < NCHUNKS; i++) {
        in[i] = malloc(bytes);
        if (!in[i])
            rc = -1;
        else
            kvpt_fill(in[i], bytes, seed, i);
    }
    if (rc == 0 && kvp_store(inst, &t, 0, t.count, (const void *const *)in, NULL) != NCHUNKS)
        rc = -1;
    for (uint32_t i = 0; i < NCHUNKS; i++)
        free(in[i]);
    free(tok);
    return rc;
}

/* Checks that sequence seq is fully cached and reads back exactly seed's bytes. Returns 0 or -1
 * (usable in a child). */
static int check_seq(kvp_instance *inst, uint32_t seq, uint32_t seed)
{
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
    uint32_t *tok = kvpt_tokens(seq, NCHUNKS * C);
    kvp_tokens t = {.ids = tok, .count = NCHUNKS * C};
    void *out[NCHUNKS] = {0};
    int rc = kvp_lookup(inst, &t) == NCHUNKS ? 0 : -1;
    for (uint32_t i = 0; i < NCHUNKS; i++)
        if (!(out[i] = calloc(1, bytes)))
            rc = -1;
    if (rc == 0 && kvp_retrieve(inst, &t, 0, t.count, out) != NCHUNKS)
        rc = -1;
    for (uint32_t i = 0; rc == 0 && i < NCHUNKS; i++)
        if (!kvpt_check(out[i], bytes, seed, i))
            rc = -1;
    for (uint32_t i = 0; i < NCHUNKS; i++)
        free(out[i]);
    free(tok);
    return rc;
}

/* llama registered, mistral under the same id refused: EEXIST naming model_name, then a
 * layout-only difference naming its field; the first worker and its chunks are unaffected. */
static void test_other_model_refused(void **state)
{
    (void)state;
    kvp_client *c1 = kvpt_connect(&daemon_);
    kvp_client *c2 = kvpt_connect(&daemon_);
    kvp_register_opts o1 = llama("rank0"), o2 = mistral("rank0");
    kvp_instance *a = NULL, *b = NULL;

    assert_int_equal(kvp_register(c1, &o1, &a), 0);
    assert_int_equal(kvp_instance_get_info(a)->existing, 0);
    assert_int_equal(store_seq(a, 1, 11), 0);
    uint64_t instances = kvpt_stat(c1, "instances");

    assert_int_equal(kvp_register(c2, &o2, &b), -EEXIST);
    assert_null(b);
    assert_string_equal(kvp_last_error(c2),
                        "instance id rank0 is registered with model_name 'llama-3-8b', not "
                        "'mistral-7b'");
    assert_true(kvpt_log_wait(&daemon_,
                              "refused: instance id rank0 is registered with model_name "
                              "'llama-3-8b', not 'mistral-7b'",
                              5000));

    /* Same model, another layout: the first differing field is named. */
    o2 = llama("rank0");
    o2.hidden_dim = 128;
    assert_int_equal(kvp_register(c2, &o2, &b), -EEXIST);
    assert_string_equal(kvp_last_error(c2),
                        "instance id rank0 is registered with hidden_dim 64, not 128");
    o2 = llama("rank0");
    o2.use_mla = 1;
    assert_int_equal(kvp_register(c2, &o2, &b), -EEXIST);
    assert_non_null(strstr(kvp_last_error(c2), "use_mla 0, not 1"));
    /* A reserved field that is not zero is refused by the library, before the daemon. */
    o2 = mistral("rank0");
    o2.reserved_[7] = 5;
    assert_int_equal(kvp_register(c2, &o2, &b), -EINVAL);
    assert_non_null(strstr(kvp_last_error(c2), "kvp_register_opts.reserved_[7] is not zero"));
    /* The refused connection stays usable. */
    assert_int_equal(kvp_ping(c2), 0);

    /* Nothing of the first registration changed. */
    assert_int_equal(kvpt_stat(c1, "instances"), instances);
    assert_int_equal(check_seq(a, 1, 11), 0);
    assert_int_equal(kvpt_log_count(&daemon_, "Instance rank0 non-GPU context"), 1);
    assert_int_equal(kvpt_log_count(&daemon_, "Instance rank0 unregistered"), 0);

    /* The owner registering again gets its own registration back, with one warning. */
    kvp_instance *again = NULL;
    assert_int_equal(kvp_register(c1, &o1, &again), 0);
    assert_int_equal(kvp_instance_get_info(again)->existing, 1);
    assert_int_equal(kvp_instance_get_info(again)->chunk_bytes,
                     kvp_instance_get_info(a)->chunk_bytes);
    assert_true(
        kvpt_log_wait(&daemon_, "Instance rank0 is already registered by this connection", 5000));
    assert_int_equal(kvpt_log_count(&daemon_, "Instance rank0 is already registered"), 1);
    assert_int_equal(check_seq(again, 1, 11), 0);
    assert_int_equal(kvpt_stat(c1, "instances"), instances);

    kvp_client_close(c2);
    kvp_client_close(c1);
    assert_true(kvpt_log_wait(&daemon_, "Instance rank0 unregistered (connection closed)", 5000));
}

/*
 * The owner, in a child process: registers id, stores sequence 2, reports 'R' (or 'F') on
 * out, waits for a byte on in, checks its chunks are intact, closes and exits 0 (1 on failure).
 */
static void owner_child(const char *id, int in, int out)
{
    kvp_client *c = NULL;
    kvp_opts co = {.socket_path = daemon_.socket, .timeout_ms = 10000};
    kvp_register_opts o = llama(id);
    kvp_instance *inst = NULL;
    char go;
    int ok = kvp_client_open(&co, &c) == 0 && kvp_register(c, &o, &inst) == 0 &&
             store_seq(inst, 2, 22) == 0;
    if (write(out, ok ? "R" : "F", 1) != 1 || !ok)
        _exit(1);
    if (read(in, &go, 1) != 1)
        _exit(1);
    ok = check_seq(inst, 2, 22) == 0;
    kvp_client_close(c);
    _exit(ok ? 0 : 1);
}

/* Identical parameters from another live connection: EBUSY with the owner's pid. Once the owner
 * has closed, the id is free, and the same layout finds the same chunks. */
static void test_busy_names_owner_pid(void **state)
{
    (void)state;
    const char *id = "rank0-busy";
    int to_child[2], from_child[2];
    char ready = 0, want[160];

    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(from_child), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(to_child[1]);
        close(from_child[0]);
        owner_child(id, to_child[0], from_child[1]);
    }
    close(to_child[0]);
    close(from_child[1]);
    assert_int_equal(read(from_child[0], &ready, 1), 1);
    assert_int_equal(ready, 'R');

    kvp_client *c2 = kvpt_connect(&daemon_);
    kvp_register_opts o = llama(id);
    kvp_instance *b = NULL;
    assert_int_equal(kvp_register(c2, &o, &b), -EBUSY);
    assert_null(b);
    snprintf(want, sizeof(want), "instance id %s in use by another connection, pid %d", id,
             (int)pid);
    assert_string_equal(kvp_last_error(c2), want);
    assert_true(kvpt_log_wait(&daemon_, want, 5000));

    /* Asking for another transport does not make it another registration. */
    o.transport = KVP_TRANSPORT_INLINE;
    assert_int_equal(kvp_register(c2, &o, &b), -EBUSY);
    /* A namesake with another model is told about the model, not the owner. */
    kvp_register_opts m = mistral(id);
    assert_int_equal(kvp_register(c2, &m, &b), -EEXIST);
    assert_non_null(strstr(kvp_last_error(c2), "model_name 'llama-3-8b', not 'mistral-7b'"));

    /* The owner's chunks are intact; then it closes. */
    assert_int_equal(write(to_child[1], "G", 1), 1);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    close(to_child[1]);
    close(from_child[0]);
    char gone[96];
    snprintf(gone, sizeof(gone), "Instance %s unregistered (connection closed)", id);
    assert_true(kvpt_log_wait(&daemon_, gone, 5000));

    /* Now the second connection can register the id: a new registration, same namespace. */
    o = llama(id);
    assert_int_equal(kvp_register(c2, &o, &b), 0);
    assert_int_equal(kvp_instance_get_info(b)->existing, 0);
    assert_int_equal(check_seq(b, 2, 22), 0);
    kvp_client_close(c2);
}

/* Raw STORE of sequence seq (NCHUNKS chunks filled for seed) through an inline instance. */
static void raw_store(int fd, uint32_t handle, uint64_t chunk_bytes, uint32_t seq, uint32_t seed)
{
    static struct kvp_wire_slot slots[KVP_MAX_CHUNKS];
    struct kvp_slots_reply sr = {.slots = slots};
    struct kvpt_reply r;
    struct kvp_wbuf w;

    assert_int_equal(kvpt_raw_prepare(fd, KVP_OP_PREPARE_STORE, handle, seq, NCHUNKS * C, &sr), 0);
    assert_int_equal(sr.nslots, NCHUNKS);

    struct kvp_ref_req ref = {.handle = handle, .id = sr.id};
    kvp_wbuf_init(&w);
    kvp_encode_ref_req(&w, &ref);
    assert_int_equal(kvpt_raw_send(fd, KVP_OP_STORE_INLINE, w.data, (uint32_t)w.len,
                                   NCHUNKS * chunk_bytes),
                     0);
    uint8_t *buf = malloc(chunk_bytes);
    assert_non_null(buf);
    for (uint32_t i = 0; i < NCHUNKS; i++) {
        kvpt_fill(buf, chunk_bytes, seed, i);
        assert_int_equal(send(fd, buf, chunk_bytes, MSG_NOSIGNAL), (ssize_t)chunk_bytes);
    }
    free(buf);
    assert_int_equal(kvpt_raw_recv(fd, &r), 0);
    assert_int_equal(r.status, 0);
    free(r.body);
    kvp_wbuf_free(&w);
}

/* Keys come from the caller's own registration: a connection naming another connection's
 * handle gets ENOENT for every request, and the owner's chunks and instance are unaffected. */
static void test_foreign_handle_unknown(void **state)
{
    (void)state;
    int fd1 = kvpt_raw_connect(&daemon_), fd2 = kvpt_raw_connect(&daemon_);
    assert_true(fd1 >= 0 && fd2 >= 0);
    kvp_register_opts o1 = llama("rank0-keys"), o2 = mistral("rank0-keys-m");
    o1.transport = o2.transport = KVP_TRANSPORT_INLINE;
    uint32_t h1, h2;
    uint64_t bytes1, bytes2;
    struct kvpt_reply r;

    assert_int_equal(kvpt_raw_register(fd1, &o1, &h1, &bytes1), 0);
    raw_store(fd1, h1, bytes1, 3, 33);
    assert_int_equal(kvpt_raw_lookup(fd1, h1, 3, NCHUNKS * C), NCHUNKS);

    assert_int_equal(kvpt_raw_register(fd2, &o2, &h2, &bytes2), 0);
    assert_int_not_equal(h2, h1);
    /* Its own namespace holds nothing of the llama chunks. */
    assert_int_equal(kvpt_raw_lookup(fd2, h2, 3, NCHUNKS * C), 0);

    static const uint16_t ops[] = {KVP_OP_LOOKUP, KVP_OP_PREPARE_STORE, KVP_OP_PREPARE_RETRIEVE,
                                   KVP_OP_RETRIEVE_INLINE};
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        int rc = kvpt_raw_keyed(fd2, ops[i], h1, 3, NCHUNKS * C, &r);
        if (rc != -ENOENT)
            fail_msg("%s through another connection's handle: status %d, expected -ENOENT",
                     kvp_opcode_name(ops[i]), rc);
        assert_non_null(strstr(r.msg, "unknown instance handle"));
        free(r.body);
    }
    assert_int_equal(kvpt_raw_ref(fd2, KVP_OP_UNREGISTER, h1, 0, &r), -ENOENT);
    free(r.body);

    /* The owner still has its instance and its chunks, byte for byte. */
    assert_int_equal(kvpt_raw_lookup(fd1, h1, 3, NCHUNKS * C), NCHUNKS);
    assert_int_equal(kvpt_raw_keyed(fd1, KVP_OP_RETRIEVE_INLINE, h1, 3, NCHUNKS * C, &r), 0);
    assert_int_equal(r.payload_len, NCHUNKS * bytes1);
    free(r.body);
    uint8_t *buf = malloc(bytes1);
    assert_non_null(buf);
    for (uint32_t i = 0; i < NCHUNKS; i++) {
        size_t got = 0;
        while (got < bytes1) {
            ssize_t n = recv(fd1, buf + got, bytes1 - got, 0);
            assert_true(n > 0);
            got += (size_t)n;
        }
        assert_true(kvpt_check(buf, bytes1, 33, i));
    }
    free(buf);
    assert_int_equal(kvpt_log_count(&daemon_, "Instance rank0-keys unregistered"), 0);
    close(fd2);
    close(fd1);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_other_model_refused),
        cmocka_unit_test(test_busy_names_owner_pid),
        cmocka_unit_test(test_foreign_handle_unknown),
    };
    return cmocka_run_group_tests(tests, setup, kvpt_group_stop);
}
