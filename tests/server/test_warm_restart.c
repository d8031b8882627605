/*
 * test_warm_restart.c - warm restart's life cycle (src/server/core/warm_restart.h) over real
 * /dev/shm files, without a daemon: a child process plays the previous kvpoold (a new pool and
 * its index, chunks committed through the store, one store left in progress) and dies (SIGKILL)
 * or stops (planned: both files left; plain: both removed); this process then plays the next
 * one: kvp_warm_find(), kvp_store_init() over what it adopted, kvp_warm_attach().
 *
 *   - after a crash and after a planned stop: the chunks are adopted with their keys and
 *     checksums, the report says so (pid, planned), the index is this process's now, and the
 *     pages of the store in progress are held back until kvp_warm_tick() releases them;
 *   - after a plain stop nothing is left, and nothing is found;
 *   - another pool size: set aside (reason), index and segment removed, a fresh index made;
 *   - the sweep of orphan indexes: one whose pool is gone goes, one whose pool is there stays,
 *     and so does one whose lock is held.
 *
 * Names carry the test's pid; the teardown removes them whatever happened.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/log.h"
#include "common/kvp_assert.h"
#include "core/segment.h"
#include "core/shm_gate.h"
#include "core/store.h"
#include "core/warm_restart.h"

#define MIB (1ull << 20)
#define POOL (4 * MIB)
#define CHUNK (64 * 1024ull)
#define NSTORED 3u

enum life { CRASH, PLANNED, PLAIN };

struct names {
    struct kvp_config cfg;
    char index[KVP_WARM_NAME_MAX]; /* with its '/' */
};

static struct names names;

static int setup(void **state)
{
    static int seq;
    (void)state;
    kvp_log_threshold = KVP_LOG_ERROR;
    kvp_config_defaults(&names.cfg);
    snprintf(names.cfg.socket_path, sizeof(names.cfg.socket_path), "/tmp/kvp-warm-ut-%ld-%d/sock",
             (long)getpid(), seq);
    snprintf(names.cfg.shm_name, sizeof(names.cfg.shm_name), "kvpool_l1_pool_wut_%ld_%d",
             (long)getpid(), seq++);
    names.cfg.shm_name_given = true;
    names.cfg.l1_size = POOL;
    names.cfg.chunk_tokens = 16;
    names.cfg.reserve_timeout_s = 1;
    return kvp_warm_index_name(names.cfg.socket_path, names.index, sizeof(names.index));
}

static int teardown(void **state)
{
    char shm[160];
    (void)state;
    snprintf(shm, sizeof(shm), "/%s", names.cfg.shm_name);
    shm_unlink(shm);
    shm_unlink(names.index);
    return 0;
}

static bool shm_exists(const char *name)
{
    char path[192];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%.150s", KVP_SHM_DIR, name[0] == '/' ? name + 1 : name);
    return stat(path, &st) == 0;
}

static void key_of(uint8_t *k, uint32_t i)
{
    memset(k, (int)(0x3c ^ i), KVP_KEY_SIZE);
    memcpy(k, &i, sizeof(i));
}

/* The previous daemon, in a child: a fresh pool and index, NSTORED chunks committed (bytes
 * 0x60 + i), one more reserved and left in progress, then the end of its life. Exits non-zero
 * (with the step on stderr) when a step fails. */
static void previous_daemon(enum life how)
{
    struct kvp_warm w;
    struct kvp_segment seg = KVP_SEGMENT_INIT;
    struct kvp_store st;
    char why[256];

    kvp_warm_init(&w, &names.cfg);
    if (kvp_warm_find(&w, &names.cfg, &seg) != 0 || seg.shared)
        _exit(10);
    if (kvp_segment_create_shared(&seg, names.cfg.shm_name, KVP_SEG_HEADER + POOL, 0600, why,
                                  sizeof(why)) != 0) {
        fprintf(stderr, "child: %s\n", why);
        _exit(11);
    }
    if (kvp_store_init(&st, KVP_SEG_HEADER, POOL, kvp_segment_pool_bytes(seg.reserved)) != 0)
        _exit(12);
    kvp_warm_attach(&w, &seg, &st);
    if (!w.has_index || !w.report.enabled || w.report.adopted)
        _exit(13);
    for (uint32_t i = 0; i <= NSTORED; i++) {
        uint8_t key[KVP_KEY_SIZE];
        struct kvp_obj *o;
        uint32_t idx;
        struct kvp_prepare_result r;
        key_of(key, i);
        if (kvp_store_prepare(&st, key, 1, CHUNK, 0, &o, &idx, &r) != 0 || r.nslots != 1)
            _exit(14);
        memset(seg.base + o->offset, 0x60 + (int)i, CHUNK);
        o->sum = kvp_widx_data_sum(seg.base + o->offset, CHUNK);
        if (i < NSTORED && kvp_store_commit_sealed(&st, &o, 1) != 1)
            _exit(15);
    }
    if (how == CRASH)
        raise(SIGKILL);
    bool leave = kvp_warm_stop(&w, &seg, &st, how == PLANNED);
    if (leave != (how == PLANNED))
        _exit(16);
    kvp_store_destroy(&st);
    if (leave)
        kvp_segment_leave(&seg);
    else
        kvp_segment_destroy(&seg);
    kvp_warm_close(&w);
    _exit(0);
}

static void run_previous(enum life how)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        previous_daemon(how);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (how == CRASH) {
        assert_true(WIFSIGNALED(status));
        assert_int_equal(WTERMSIG(status), SIGKILL);
    } else {
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
}

/* The next daemon: find, the store over what it adopted, attach. */
static void next_daemon(struct kvp_warm *w, struct kvp_segment *seg, struct kvp_store *st)
{
    *seg = (struct kvp_segment)KVP_SEGMENT_INIT;
    kvp_warm_init(w, &names.cfg);
    assert_rc(kvp_warm_find(w, &names.cfg, seg), 0);
    if (!seg->shared) {
        char why[256];
        assert_rc(kvp_segment_create_shared(seg, names.cfg.shm_name, KVP_SEG_HEADER + POOL, 0600,
                                            why, sizeof(why)),
                  0);
    }
    assert_rc(kvp_store_init(st, KVP_SEG_HEADER, POOL, kvp_segment_pool_bytes(seg->reserved)), 0);
    kvp_warm_attach(w, seg, st);
}

static void shutdown_next(struct kvp_warm *w, struct kvp_segment *seg, struct kvp_store *st)
{
    assert_false(kvp_warm_stop(w, seg, st, false));
    kvp_store_destroy(st);
    kvp_segment_destroy(seg);
    kvp_warm_close(w);
    assert_false(shm_exists(names.cfg.shm_name));
    assert_false(shm_exists(names.index));
}

static void adopted_after(enum life how)
{
    struct kvp_warm w;
    struct kvp_segment seg;
    struct kvp_store st;
    struct kvp_store_gauges g;

    run_previous(how);
    assert_true(shm_exists(names.cfg.shm_name));
    assert_true(shm_exists(names.index));
    next_daemon(&w, &seg, &st);
    assert_true(w.report.enabled);
    assert_true(w.report.adopted);
    assert_int_equal(w.report.planned, how == PLANNED);
    assert_true(w.report.previous_pid != 0 && w.report.previous_pid != (uint32_t)getpid());
    assert_string_equal(w.report.reason, "");
    assert_int_equal(w.report.adopted_chunks, NSTORED);
    assert_int_equal(w.report.adopted_bytes, NSTORED * CHUNK);
    assert_int_equal(w.report.dropped_chunks, 0);
    assert_true(kvp_store_indexed(&st));

    /* The chunks, with their checksums: each verifies against its bytes. */
    for (uint32_t i = 0; i < NSTORED; i++) {
        uint8_t key[KVP_KEY_SIZE];
        struct kvp_obj *o;
        key_of(key, i);
        assert_int_equal(kvp_store_pin(&st, key, 1, &o), 1);
        assert_true(kvp_obj_unverified(o));
        assert_int_equal(seg.base[o->offset], 0x60 + i);
        assert_true(
            kvp_store_verified(&st, o,
                               kvp_widx_data_sum(seg.base + o->offset, o->length) == o->sum));
        kvp_store_unpin(&st, &o, 1);
    }
    uint8_t key[KVP_KEY_SIZE];
    key_of(key, NSTORED);
    assert_int_equal(kvp_store_lookup(&st, key, 1), 0); /* the store in progress: not a chunk */

    /* Its pages are held back, until the tick after --reserve-timeout. */
    kvp_store_get_gauges(&st, &g);
    assert_int_equal(g.held_back, CHUNK);
    assert_int_equal(g.pool_used, (NSTORED + 1) * CHUNK);
    assert_int_equal(g.indexed, NSTORED);
    assert_true(w.hold_until_ms > 0);
    kvp_warm_tick(&w, &st, w.hold_until_ms - 1);
    kvp_store_get_gauges(&st, &g);
    assert_int_equal(g.held_back, CHUNK);
    kvp_warm_tick(&w, &st, w.hold_until_ms);
    kvp_store_get_gauges(&st, &g);
    assert_int_equal(g.held_back, 0);
    assert_int_equal(g.pool_used, NSTORED * CHUNK);

    /* The index is this process's now: the next find would see it locked. */
    int fd = shm_open(names.index, O_RDONLY | O_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), -1);
    close(fd);
    struct kvp_widx_header h;
    assert_rc(kvp_widx_header_read(w.base, w.len, &h), 0);
    assert_int_equal(h.pid, (uint32_t)getpid());
    assert_int_equal(h.flags & KVP_WIDX_CLEAN, 0);
    assert_string_equal(h.segment, names.cfg.shm_name);
    shutdown_next(&w, &seg, &st);
}

static void test_adopt_after_crash(void **state)
{
    (void)state;
    adopted_after(CRASH);
}

static void test_adopt_after_planned_stop(void **state)
{
    (void)state;
    adopted_after(PLANNED);
}

static void test_plain_stop_leaves_nothing(void **state)
{
    (void)state;
    struct kvp_warm w;
    struct kvp_segment seg;
    struct kvp_store st;

    run_previous(PLAIN);
    assert_false(shm_exists(names.cfg.shm_name));
    assert_false(shm_exists(names.index));
    next_daemon(&w, &seg, &st);
    assert_true(w.report.enabled);
    assert_false(w.report.adopted);
    assert_string_equal(w.report.reason, "");
    assert_true(shm_exists(names.index)); /* a fresh one, beside the new pool */
    shutdown_next(&w, &seg, &st);
}

static void test_set_aside_other_size(void **state)
{
    (void)state;
    struct kvp_warm w;
    struct kvp_segment seg;
    struct kvp_store st;

    run_previous(CRASH);
    names.cfg.l1_size = 2 * POOL;
    kvp_warm_init(&w, &names.cfg);
    seg = (struct kvp_segment)KVP_SEGMENT_INIT;
    assert_rc(kvp_warm_find(&w, &names.cfg, &seg), 0);
    assert_false(seg.shared);
    assert_non_null(strstr(w.report.reason, "pool of"));
    /* Both removed: the dead daemon's, of this uid. */
    assert_false(shm_exists(names.cfg.shm_name));
    assert_false(shm_exists(names.index));
    names.cfg.l1_size = POOL;
    kvp_warm_close(&w);
    next_daemon(&w, &seg, &st);
    assert_false(w.report.adopted);
    assert_true(shm_exists(names.index));
    shutdown_next(&w, &seg, &st);
}

/* An index of another socket (name), naming segment (created when with_pool). */
static void orphan(const char *name, const char *segment, bool with_pool)
{
    struct kvp_widx_identity id = {.pool_size = MIB, .page_size = 4096, .chunk_tokens = 16};
    char shm[160];
    int fd;
    void *base;
    size_t len;
    char why[256];
    assert_rc(kvp_widx_open(name, true, kvp_widx_npages(&id), &fd, &base, &len, why, sizeof(why)),
              0);
    assert_rc(kvp_widx_format_named(base, len, &id, 1, (uint32_t)geteuid(), 7, segment), 0);
    kvp_widx_close(fd, base, len);
    if (with_pool) {
        snprintf(shm, sizeof(shm), "/%s", segment);
        fd = shm_open(shm, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        close(fd);
    }
}

static void test_sweep_orphan_indexes(void **state)
{
    (void)state;
    struct kvp_warm w;
    char gone[96], kept[96], locked[96], seg_gone[96], seg_kept[96], shm[112];

    kvp_warm_init(&w, &names.cfg);
    snprintf(gone, sizeof(gone), "/kvpool_widx_%u_%ld_gone", (unsigned)geteuid(), (long)getpid());
    snprintf(kept, sizeof(kept), "/kvpool_widx_%u_%ld_kept", (unsigned)geteuid(), (long)getpid());
    snprintf(locked, sizeof(locked), "/kvpool_widx_%u_%ld_lock", (unsigned)geteuid(),
             (long)getpid());
    snprintf(seg_gone, sizeof(seg_gone), "kvpool_l1_pool_wut_%ld_gone", (long)getpid());
    snprintf(seg_kept, sizeof(seg_kept), "kvpool_l1_pool_wut_%ld_kept", (long)getpid());
    orphan(gone, seg_gone, false);
    orphan(kept, seg_kept, true);
    orphan(locked, seg_gone, false);
    int fd = shm_open(locked, O_RDONLY | O_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0);

    assert_int_equal(kvp_warm_sweep(&w, KVP_SHM_DIR, 10), 1);
    assert_false(shm_exists(gone));
    assert_true(shm_exists(kept));
    assert_true(shm_exists(locked));
    close(fd);
    assert_int_equal(kvp_warm_sweep(&w, KVP_SHM_DIR, 10), 1);
    assert_false(shm_exists(locked));
    assert_true(shm_exists(kept));
    shm_unlink(kept);
    snprintf(shm, sizeof(shm), "/%s", seg_kept);
    shm_unlink(shm);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_adopt_after_crash),         T(test_adopt_after_planned_stop),
        T(test_plain_stop_leaves_nothing), T(test_set_aside_other_size),
        T(test_sweep_orphan_indexes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
