/*
 * test_shm_claim.c - a worker's claim to use shared memory is checked against evidence.
 *
 * A worker of another uid, admitted with --allow-uid but unable to open the owner-only segment,
 * claims the shm transport anyway, prepares a store, commits it without writing (it cannot
 * write: it has no mapping) and retrieves the chunks inline. Were the claim believed, the
 * commit would publish whatever the slots held before: another worker's KV. The daemon decides
 * on the peer's credentials against the segment's owner, group and mode (posix backend), or on
 * having passed it the descriptor (memfd backend), so the claim gets the inline transport and
 * the commit is refused. The parts that need a second user run a child as nobody (65534) and
 * are skipped when the test does not run as root.
 */
#include <errno.h>
#include <grp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/msg.h"
#include "common/wire.h"
#include "harness.h"

#define C 16
#define NCHUNK 4
#define NOBODY 65534
#define VICTIM_SEQ 1
#define THIEF_SEQ 2

/* Child exit codes. */
enum { CHILD_OK = 0, CHILD_FAIL = 1, CHILD_LEAKED = 2, CHILD_NOPRIV = 77 };

/* Reads exactly n bytes. Returns 0 or -1. */
static int recv_all(int fd, void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t r = recv(fd, p, n, 0);
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* HELLO and REGISTER claiming the given wire transport; *reg is the decoded reply. Returns the
 * status or a socket error. */
static int register_claim(int fd, uint8_t transport, struct kvp_register_reply *reg)
{
    struct kvpt_reply r = {.body = NULL};
    struct kvp_register_req req = {.world_size = 1,
                                   .block_size = 16,
                                   .num_layers = 2,
                                   .hidden_dim = 64,
                                   .transport = transport};
    snprintf(req.instance_id, sizeof(req.instance_id), "thief");
    snprintf(req.model_name, sizeof(req.model_name), "thief-model");
    snprintf(req.dtype, sizeof(req.dtype), "float16");
    int rc = kvpt_raw_call(fd, KVP_OP_HELLO, NULL, 0, &r);
    free(r.body);
    if (rc)
        return rc;
    struct kvp_wbuf w;
    kvp_wbuf_init(&w);
    kvp_encode_register_req(&w, &req);
    r.body = NULL;
    rc = w.err ? w.err : kvpt_raw_call(fd, KVP_OP_REGISTER, w.data, (uint32_t)w.len, &r);
    kvp_wbuf_free(&w);
    if (rc == 0 && kvp_decode_register_reply(r.body, r.body_len, reg) != 0)
        rc = -EPROTO;
    if (rc)
        fprintf(stderr, "register: %d %s\n", rc, r.msg);
    free(r.body);
    return rc;
}

/*
 * The attack, in a child: claim shm (after MAP_SEGMENT when map_first), prepare a store of
 * NCHUNK chunks, commit without writing, retrieve inline. Returns CHILD_LEAKED if any chunk
 * that comes back holds the victim's bytes, CHILD_FAIL if the daemon accepted the claim
 * (want_shm false) or overruled it (want_shm true) or anything else went wrong, CHILD_OK
 * otherwise.
 */
static int thief(const struct kvpt_daemon *d, bool map_first, bool want_shm)
{
    struct kvp_register_reply reg;
    struct kvpt_reply r = {.body = NULL};
    if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0)
        return CHILD_NOPRIV;
    int fd = kvpt_raw_connect(d);
    if (fd < 0)
        return CHILD_FAIL;
    if (map_first) {
        /* The descriptor arrives as SCM_RIGHTS and is simply left unreceived here: sending it
         * is what counts as evidence. */
        int rc = kvpt_raw_call(fd, KVP_OP_MAP_SEGMENT, NULL, 0, &r);
        free(r.body);
        if (rc)
            return CHILD_FAIL;
    }
    if (register_claim(fd, KVP_WIRE_SHM, &reg) != 0)
        return CHILD_FAIL;
    fprintf(stderr, "claimed shm, got transport %u (%s)\n", reg.transport, reg.reason);
    /* The attack goes on whatever the answer, so that a leak shows as one. */
    bool as_wanted = (reg.transport == KVP_WIRE_SHM) == want_shm;

    static struct kvp_wire_slot slots[KVP_MAX_CHUNKS];
    struct kvp_slots_reply sr = {.slots = slots};
    int rc = kvpt_raw_keyed(fd, KVP_OP_PREPARE_STORE, reg.handle, THIEF_SEQ, NCHUNK * C, &r);
    if (rc != 0 || kvp_decode_slots_reply(r.body, r.body_len, &sr) != 0 || sr.nslots != NCHUNK)
        return CHILD_FAIL;
    free(r.body);
    rc = kvpt_raw_ref(fd, KVP_OP_COMMIT_STORE, reg.handle, sr.id, &r);
    free(r.body);
    fprintf(stderr, "commit without writing: %d %s\n", rc, r.msg);
    if (reg.transport == KVP_WIRE_SHM ? rc != 0 : rc != -EOPNOTSUPP)
        as_wanted = false;

    rc = kvpt_raw_keyed(fd, KVP_OP_RETRIEVE_INLINE, reg.handle, THIEF_SEQ, NCHUNK * C, &r);
    free(r.body);
    if (rc != 0)
        return CHILD_FAIL;
    uint8_t *buf = malloc(reg.chunk_bytes ? reg.chunk_bytes : 1);
    int verdict = CHILD_OK;
    for (uint64_t got = 0; got < r.payload_len; got += reg.chunk_bytes) {
        if (!buf || recv_all(fd, buf, reg.chunk_bytes) != 0) {
            verdict = CHILD_FAIL;
            break;
        }
        for (uint32_t i = 0; i < NCHUNK; i++)
            if (kvpt_check(buf, reg.chunk_bytes, VICTIM_SEQ, i))
                verdict = CHILD_LEAKED;
    }
    fprintf(stderr, "retrieved %llu bytes inline\n", (unsigned long long)r.payload_len);
    /* With no commit, nothing may come back at all. */
    if (verdict == CHILD_OK && (!as_wanted || (!want_shm && r.payload_len != 0)))
        verdict = CHILD_FAIL;
    free(buf);
    close(fd);
    return verdict;
}

/* Stores the victim's chunks as root and clears them: the slots are free, their bytes stay. */
static void plant_victim(const struct kvpt_daemon *d)
{
    kvp_client *c = kvpt_connect(d);
    kvp_register_opts o = kvpt_layout("victim", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    assert_int_equal(kvpt_store_seq(inst, VICTIM_SEQ, NCHUNK), NCHUNK);
    assert_int_equal(kvp_clear(c), NCHUNK);
    kvp_client_close(c);
}

static void run_thief(const struct kvpt_daemon *d, bool map_first, bool want_shm)
{
    if (geteuid() != 0)
        skip();
    assert_int_equal(chmod(d->dir, 0755), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(thief(d, map_first, want_shm));
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == CHILD_NOPRIV)
        skip();
    if (WEXITSTATUS(st) == CHILD_LEAKED)
        fail_msg("a worker that cannot map the pool read another worker's chunks");
    assert_int_equal(WEXITSTATUS(st), CHILD_OK);
}

/* posix backend, mode 0600: nobody's claim is overruled, the commit refused, nothing leaks. */
static void test_posix_claim_without_access(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "4MiB",        "--chunk-size", "16", "--socket-mode",
                          "0666",      "--allow-uid", "65534",        NULL};
    kvpt_daemon_start(&d, args);
    plant_victim(&d);
    run_thief(&d, false, false);
    assert_true(kvpt_log_wait(&d, "Instance thief non-GPU context using inline transport", 5000));
    assert_true(kvpt_log_wait(&d, "uid 65534 cannot open", 5000));
    kvpt_daemon_stop(&d);
}

/* memfd backend: a claim without having been passed the descriptor is overruled. */
static void test_memfd_claim_without_descriptor(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {
        "--l1-size", "4MiB",          "--chunk-size", "16", "--socket-mode", "0666", "--allow-uid",
        "65534",     "--shm-backend", "memfd",        NULL};
    kvpt_daemon_start(&d, args);
    plant_victim(&d);
    run_thief(&d, false, false);
    kvpt_daemon_stop(&d);
}

/* memfd backend: once the descriptor was passed to the connection, the claim stands (the worker
 * can map the pool, so nothing is hidden from it by refusing). */
static void test_memfd_claim_with_descriptor(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {
        "--l1-size", "4MiB",          "--chunk-size", "16", "--socket-mode", "0666", "--allow-uid",
        "65534",     "--shm-backend", "memfd",        NULL};
    kvpt_daemon_start(&d, args);
    if (geteuid() != 0)
        skip();
    assert_int_equal(chmod(d.dir, 0755), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct kvp_register_reply reg;
        struct kvpt_reply r = {.body = NULL};
        if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0)
            _exit(CHILD_NOPRIV);
        int fd = kvpt_raw_connect(&d);
        if (fd < 0 || kvpt_raw_call(fd, KVP_OP_MAP_SEGMENT, NULL, 0, &r) != 0)
            _exit(CHILD_FAIL);
        free(r.body);
        if (register_claim(fd, KVP_WIRE_SHM, &reg) != 0)
            _exit(CHILD_FAIL);
        _exit(reg.transport == KVP_WIRE_SHM ? CHILD_OK : CHILD_FAIL);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == CHILD_NOPRIV)
        skip();
    assert_int_equal(WEXITSTATUS(st), CHILD_OK);
    kvpt_daemon_stop(&d);
}

/* The daemon's own uid is the segment's owner: its claim stands without anything else. */
static void test_owner_claim_stands(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "4MiB", "--chunk-size", "16", NULL};
    kvpt_daemon_start(&d, args);
    int fd = kvpt_raw_connect_or_fail(&d);
    struct kvp_register_reply reg;
    assert_int_equal(register_claim(fd, KVP_WIRE_SHM, &reg), 0);
    assert_int_equal(reg.transport, KVP_WIRE_SHM);
    close(fd);
    kvpt_daemon_stop(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_posix_claim_without_access),
        cmocka_unit_test(test_memfd_claim_without_descriptor),
        cmocka_unit_test(test_memfd_claim_with_descriptor),
        cmocka_unit_test(test_owner_claim_stands),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
