/*
 * test_warm_refusals.c - pools a new kvpoold must not adopt. A daemon stores chunks and is
 * SIGKILLed; the next one on the same socket finds its index and refuses the pool, with exactly
 * one WARN line "Not adopting the pool left in /dev/shm/<name>: <reason>; starting empty" (its
 * reason also in the status's "warm_restart"), no adoption line, and a cold start that serves
 * on both transports:
 *
 *   - another --l1-size (the reason names both sizes), another --chunk-size, an index whose
 *     format version was changed (written into its header, warm_index.h);
 *   - a pool whose owner still runs: simulated by holding the pool segment's flock from this
 *     process (a second kvpoold on the socket would stop at the socket's lock first); both
 *     daemons have default (random) segment names, so the new one finds the pool through the
 *     index alone; it serves from a segment of its own and writes neither file;
 *   - files of another user (root only, else skipped with the reason): both files are given to
 *     a test user (created with useradd when missing); they keep their owner and bytes.
 *
 * Where the index itself cannot be trusted (another format version, another user's file), the
 * refusal may name the index rather than the segment recorded in it.
 */
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "warm_fixture.h"

#define C KVPW_C

/*
 * After a restart: exactly one refusal "Not adopting the pool left in /dev/shm/<name>: <reason>;
 * starting empty" at WARN, <name> one of names (NULL-terminated: the pool segment, and where
 * the index itself cannot be trusted, the index), its reason containing each of the words
 * (NULL-terminated, may be NULL), no adoption; the reason into out.
 */
static void assert_refused(const struct kvpt_daemon *d, const char *const *names,
                           const char *const *words, char *out, size_t size)
{
    char line[2048], want[256];
    kvpw_assert_log_count(d, KVPW_REFUSED, 1);
    kvpw_assert_log_count(d, KVPW_ADOPTED, 0);
    assert_true(kvpw_log_line(d, KVPW_REFUSED, line, sizeof(line)));
    print_message("%s\n", line);
    assert_non_null(strstr(line, "WARN"));
    const char *reason = NULL;
    for (int i = 0; names[i] && !reason; i++) {
        snprintf(want, sizeof(want), KVPW_REFUSED "%s: ", names[i]);
        if (strstr(line, want))
            reason = strstr(line, want) + strlen(want);
    }
    if (!reason)
        fail_msg("the refusal names neither the pool segment %s nor the index: %s", names[0], line);
    const char *end = strstr(reason, "; starting empty");
    if (!end)
        fail_msg("the refusal does not end with '; starting empty': %s", line);
    assert_true(end > reason);
    snprintf(out, size, "%.*s", (int)(end - reason), reason);
    for (int i = 0; words && words[i]; i++)
        if (!strstr(out, words[i]))
            fail_msg("the reason '%s' does not mention '%s'", out, words[i]);
}

/* The names a refusal of d's pool may give: its segment only. */
#define SEGMENT_ONLY(d) ((const char *const[]){(d)->shm_name, NULL})

static void test_refuse_other_pool_size(void **state)
{
    (void)state;
    struct kvpt_daemon *d = kvpw_fresh_daemon();
    char reason[512];
    kvpw_crashed_with_data(d);
    const char *args[] = {"--l1-size", "32MiB", "--chunk-size", "16", NULL};
    kvpt_daemon_restart(d, args);
    const char *words[] = {"67108864", "33554432", NULL};
    assert_refused(d, SEGMENT_ONLY(d), words, reason, sizeof(reason));
    kvpw_assert_cold_and_serving(d, 1);
    struct kvpw_workers w;
    kvpw_workers_open(d, &w);
    json_t *doc = kvpw_status(w.c);
    const char *r = json_string_value(json_object_get(kvpw_warm_of(doc), "reason"));
    assert_non_null(r);
    assert_string_equal(r, reason);
    json_decref(doc);
    kvp_client_close(w.c);
    kvpt_daemon_stop(d);
    assert_false(kvpt_shm_exists(d->shm_name));
}

static void test_refuse_other_chunk_size(void **state)
{
    (void)state;
    struct kvpt_daemon *d = kvpw_fresh_daemon();
    char reason[512];
    kvpw_crashed_with_data(d);
    const char *args[] = {"--l1-size", "64MiB", "--chunk-size", "32", NULL};
    kvpt_daemon_restart(d, args);
    const char *words[] = {"chunk", "16", "32", NULL};
    assert_refused(d, SEGMENT_ONLY(d), words, reason, sizeof(reason));
    /* The workers' layout is of 16 tokens: check only that it serves, cold. */
    kvp_client *c = kvpt_connect(d);
    assert_int_equal(kvpt_stat(c, "objects_committed"), 0);
    kvp_instance *inst = kvpw_register(c, kvpt_layout("warm-32", KVP_TRANSPORT_AUTO));
    assert_int_equal(kvp_instance_get_info(inst)->chunk_tokens, 32);
    assert_int_equal(kvpt_store_seq(inst, 101, 4), 4);
    kvpt_assert_seq(inst, 101, 4, 4);
    kvp_client_close(c);
    kvpt_daemon_stop(d);
}

static void test_refuse_other_format_version(void **state)
{
    (void)state;
    struct kvpt_daemon *d = kvpw_fresh_daemon();
    char name[96], reason[512];
    kvpw_crashed_with_data(d);
    kvpw_widx_name(d->socket, name, sizeof(name));
    struct kvpw_map m;
    kvpw_map_shm(name, &m);
    assert_int_equal(kvpw_widx_header(&m)->version, KVP_WIDX_VERSION);
    kvpw_widx_header(&m)->version = KVP_WIDX_VERSION + 1;
    kvpw_unmap_shm(&m);
    kvpt_daemon_restart(d, kvpw_args64);
    /* An index of another format: its record of the segment's name cannot be read, so the
     * refusal may name the index instead. */
    const char *words[] = {"version", NULL};
    const char *names[] = {d->shm_name, name, NULL};
    assert_refused(d, names, words, reason, sizeof(reason));
    kvpw_assert_cold_and_serving(d, 1);
    kvpt_daemon_stop(d);
    assert_false(kvpt_shm_exists(d->shm_name));
    assert_false(kvpt_shm_exists(name));
}

/*
 * The pool's owner still runs: simulated by holding the pool segment's lock from this process
 * (a second kvpoold on the socket would be refused at the socket's lock before that). Both
 * daemons have default segment names (random at every start), so the new one finds the old
 * pool through the index alone, refuses it, touches neither file, and serves from a segment of
 * its own.
 */
static void test_refuse_live_owner(void **state)
{
    (void)state;
    struct kvpt_daemon *d = kvpw_fresh_daemon();
    struct kvpw_workers w;
    char name[96], reason[512], path[160], old[96];
    kvpw_start_default_name(d, kvpw_args64);
    kvpw_workers_open(d, &w);
    kvpw_store_data_set(&w);
    kvp_client_close(w.c);
    assert_int_equal(kvpt_daemon_signal_wait(d, SIGKILL), 128 + SIGKILL);
    snprintf(old, sizeof(old), "%s", d->shm_name);
    kvpw_note_leftover(old);
    kvpw_widx_name(d->socket, name, sizeof(name));
    snprintf(path, sizeof(path), "/dev/shm/%s", old);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
    uint64_t pool_sum = kvpw_file_sum(old), index_sum = kvpw_file_sum(name);

    kvpw_start_default_name(d, kvpw_args64);
    assert_string_not_equal(d->shm_name, old);
    const char *names[] = {old, NULL};
    assert_refused(d, names, NULL, reason, sizeof(reason));
    kvpw_assert_cold_and_serving(d, 1);
    /* Left as they were. */
    assert_true(kvpt_shm_exists(old));
    assert_true(kvpt_shm_exists(name));
    assert_true(kvpw_file_sum(old) == pool_sum);
    assert_true(kvpw_file_sum(name) == index_sum);
    char mine[96];
    snprintf(mine, sizeof(mine), "%s", d->shm_name);
    kvpt_daemon_stop(d);
    /* Still not touched by the stop, which removes the new daemon's segment. */
    assert_false(kvpt_shm_exists(mine));
    assert_true(kvpt_shm_exists(old));
    assert_true(kvpw_file_sum(old) == pool_sum);
    assert_true(kvpw_file_sum(name) == index_sum);
    close(fd);
    const char *leftovers[] = {old, NULL};
    kvpw_remove_leftovers(d, leftovers);
}

/* The uid of TEST_USER, or -1 when there is none. */
static int user_uid(void)
{
    struct passwd pw, *found = NULL;
    char buf[4096];
    if (getpwnam_r(KVPW_TEST_USER, &pw, buf, sizeof(buf), &found) != 0 || !found)
        return -1;
    return (int)pw.pw_uid;
}

/* The uid of the test user, created with useradd when missing; -1 when that fails. */
static int test_user_uid(void)
{
    if (user_uid() < 0) {
        int rc = system(
            "useradd --system --no-create-home --shell /usr/sbin/nologin " KVPW_TEST_USER
            " >/dev/null 2>&1");
        if (rc != 0)
            fprintf(stderr, "note: useradd %s failed (status %d)\n", KVPW_TEST_USER, rc);
    }
    return user_uid();
}

/* Files of another user: never adopted, never touched (default segment names, as above). */
static void test_refuse_other_user(void **state)
{
    (void)state;
    struct kvpt_daemon *d = kvpw_fresh_daemon();
    struct kvpw_workers w;
    char name[96], reason[512], path[160], old[96];
    struct stat st;

    if (geteuid() != 0) {
        fprintf(stderr, "skipped: the other-user refusal needs root (to give the pool's files to "
                        "another user)\n");
        skip();
    }
    int uid = test_user_uid();
    if (uid < 0) {
        fprintf(stderr, "skipped: no user %s and useradd cannot create one\n", KVPW_TEST_USER);
        skip();
    }
    kvpw_start_default_name(d, kvpw_args64);
    kvpw_workers_open(d, &w);
    kvpw_store_data_set(&w);
    kvp_client_close(w.c);
    assert_int_equal(kvpt_daemon_signal_wait(d, SIGKILL), 128 + SIGKILL);
    snprintf(old, sizeof(old), "%s", d->shm_name);
    kvpw_note_leftover(old);
    kvpw_widx_name(d->socket, name, sizeof(name));
    const char *files[] = {old, name};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "/dev/shm/%s", files[i]);
        assert_int_equal(chown(path, (uid_t)uid, (gid_t)-1), 0);
    }
    uint64_t pool_sum = kvpw_file_sum(old), index_sum = kvpw_file_sum(name);

    kvpw_start_default_name(d, kvpw_args64);
    /* Another user's index is not read: the refusal may name it rather than the segment. */
    const char *names[] = {old, name, NULL};
    assert_refused(d, names, NULL, reason, sizeof(reason));
    /* Its own index would take the other user's file's name: it may run without one, and then
     * report warm restart as not enabled for this run. */
    kvpw_assert_cold_and_serving(d, -1);
    kvpt_daemon_stop(d);
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "/dev/shm/%s", files[i]);
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal(st.st_uid, (uid_t)uid);
    }
    assert_true(kvpw_file_sum(old) == pool_sum);
    assert_true(kvpw_file_sum(name) == index_sum);
    const char *leftovers[] = {old, NULL};
    kvpw_remove_leftovers(d, leftovers);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_refuse_other_pool_size, kvpw_teardown),
        cmocka_unit_test_teardown(test_refuse_other_chunk_size, kvpw_teardown),
        cmocka_unit_test_teardown(test_refuse_other_format_version, kvpw_teardown),
        cmocka_unit_test_teardown(test_refuse_live_owner, kvpw_teardown),
        cmocka_unit_test_teardown(test_refuse_other_user, kvpw_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
