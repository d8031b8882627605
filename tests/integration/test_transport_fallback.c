/*
 * test_transport_fallback.c - a worker that cannot map the daemon's segment falls back to the
 * inline transport by itself, tells the daemon why, and the daemon's log names the transport
 * actually used. The worker runs in its own mount namespace with a different /dev/shm, which
 * is what a worker in another container sees.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/seg_header.h"
#include "harness.h"

#define C 16

static struct kvpt_daemon daemon_;

static int setup(void **state)
{
    const char *args[] = {"--l1-size", "16MiB", "--chunk-size", "16", NULL};
    return kvpt_group_start(state, &daemon_, args);
}

/* Exit codes of the worker child. */
enum { WORKER_OK = 0, WORKER_NO_NS = 77, WORKER_FAIL = 1 };

/*
 * Worker in a private /dev/shm. With fake_segment, a namesake segment is planted there first: a
 * valid header of the right size, as another daemon would write it, but with another nonce.
 * Registers with transport, checks the outcome, round-trips data.
 */
static int worker(const char *id, bool fake_segment, uint32_t transport, int want_rc,
                  const char *want_reason)
{
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=64m") != 0)
        return WORKER_NO_NS;
    if (fake_segment) {
        char path[128];
        snprintf(path, sizeof(path), "/%s", daemon_.shm_name);
        int fd = shm_open(path, O_RDWR | O_CREAT, 0600);
        const uint64_t size = (16 << 20) + KVP_SEG_HEADER;
        static uint8_t page[KVP_SEG_HEADER];
        const uint8_t other_nonce[KVP_SEG_NONCE_SIZE] = {0x6b, 0x76, 0x70};
        if (fd < 0 || ftruncate(fd, (off_t)size) != 0)
            return WORKER_FAIL;
        kvp_seg_header_write(page, other_nonce, size, 1);
        if (write(fd, page, sizeof(page)) != (ssize_t)sizeof(page))
            return WORKER_FAIL;
        close(fd);
    }

    kvp_client *c = NULL;
    kvp_instance *inst = NULL;
    kvp_opts o = {.socket_path = daemon_.socket, .timeout_ms = 5000};
    kvp_register_opts ro = kvpt_layout(id, transport);
    if (kvp_client_open(&o, &c) != 0)
        return WORKER_FAIL;
    int rc = kvp_register(c, &ro, &inst);
    if (rc != want_rc) {
        fprintf(stderr, "register: %d (%s), want %d\n", rc, kvp_strerror(rc), want_rc);
        return WORKER_FAIL;
    }
    if (rc != 0)
        return WORKER_OK;
    const kvp_instance_info *info = kvp_instance_get_info(inst);
    if (info->transport != KVP_TRANSPORT_INLINE || !strstr(info->reason, want_reason)) {
        fprintf(stderr, "transport %u reason '%s'\n", info->transport, info->reason);
        return WORKER_FAIL;
    }

    size_t bytes = info->chunk_bytes;
    uint32_t *tok = kvpt_tokens(21, 4 * C);
    kvp_tokens t = {.ids = tok, .count = 4 * C};
    void *bufs[4];
    for (int i = 0; i < 4; i++) {
        bufs[i] = malloc(bytes);
        kvpt_fill(bufs[i], bytes, 21, (uint32_t)i);
    }
    if (kvp_store(inst, &t, 0, 4 * C, (const void *const *)bufs, NULL) < 0)
        return WORKER_FAIL;
    for (int i = 0; i < 4; i++)
        memset(bufs[i], 0, bytes);
    if (kvp_retrieve(inst, &t, 0, 4 * C, bufs) != 4)
        return WORKER_FAIL;
    for (int i = 0; i < 4; i++)
        if (!kvpt_check(bufs[i], bytes, 21, (uint32_t)i))
            return WORKER_FAIL;
    kvp_client_close(c);
    return WORKER_OK;
}

static void run_worker(const char *id, bool fake, uint32_t transport, int want_rc,
                       const char *want_reason)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(worker(id, fake, transport, want_rc, want_reason));
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == WORKER_NO_NS)
        skip();
    assert_int_equal(WEXITSTATUS(st), WORKER_OK);
}

static void test_cannot_open_segment(void **state)
{
    (void)state;
    run_worker("elsewhere", false, KVP_TRANSPORT_AUTO, 0, "cannot open /dev/shm/");
    char line[256];
    snprintf(line, sizeof(line),
             "Instance elsewhere non-GPU context using inline transport (cannot open /dev/shm/%s",
             daemon_.shm_name);
    assert_true(kvpt_log_wait(&daemon_, line, 5000));
    assert_int_equal(kvpt_log_count(&daemon_, "Instance elsewhere non-GPU context using SHM"), 0);
}

static void test_namesake_segment_rejected(void **state)
{
    (void)state;
    run_worker("namesake", true, KVP_TRANSPORT_AUTO, 0, "not this daemon's pool");
    assert_true(kvpt_log_wait(&daemon_,
                              "Instance namesake non-GPU context using inline transport "
                              "(segment nonce mismatch",
                              5000));
}

static void test_shm_required_but_unmappable(void **state)
{
    (void)state;
    run_worker("strict", false, KVP_TRANSPORT_SHM, KVP_ENOSHM, "");
    /* Nothing was registered for it. */
    assert_int_equal(kvpt_log_count(&daemon_, "Instance strict "), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cannot_open_segment),
        cmocka_unit_test(test_namesake_segment_rejected),
        cmocka_unit_test(test_shm_required_but_unmappable),
    };
    return cmocka_run_group_tests(tests, setup, kvpt_group_stop);
}
