/*
 * warm_fixture.c - the helpers of the warm-restart tests (warm_fixture.h).
 *
 * Everything here fails the test through cmocka when something is not as expected: not for a
 * forked child. The index is read through its layout in src/server/core/warm_index.h; the daemon
 * is not linked in.
 */
#include "warm_fixture.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <xxhash.h>

#define C KVPW_C

const char *const kvpw_args64[] = {"--l1-size", "64MiB", "--chunk-size", "16", NULL};

/* ---------------------------------------------------------------------------------------- */
/* Files in /dev/shm                                                                         */

/* The index's name for a socket path: kvpool_widx_<euid>_<16 hex digits of XXH3-64(path)>. */
void kvpw_widx_name(const char *socket, char *out, size_t size)
{
    snprintf(out, size, "kvpool_widx_%u_%016llx", (unsigned)geteuid(),
             (unsigned long long)XXH3_64bits(socket, strlen(socket)));
}

/* Fails the test when the index of d's socket is not in /dev/shm, listing what is there. */
void kvpw_assert_widx_exists(const struct kvpt_daemon *d)
{
    char name[96];
    kvpw_widx_name(d->socket, name, sizeof(name));
    if (kvpt_shm_exists(name))
        return;
    if (system("ls -l /dev/shm | grep kvpool_widx >&2") != 0)
        fprintf(stderr, "(no kvpool_widx_* file in /dev/shm)\n");
    fail_msg("no index /dev/shm/%s for socket %s", name, d->socket);
}

/* Removes what a test may leave behind: the index of d's socket and the named segments. */
void kvpw_remove_leftovers(const struct kvpt_daemon *d, const char *const *segments)
{
    char name[96], path[160];
    kvpw_widx_name(d->socket, name, sizeof(name));
    snprintf(path, sizeof(path), "/dev/shm/%s", name);
    unlink(path);
    for (int i = 0; segments && segments[i]; i++) {
        snprintf(path, sizeof(path), "/dev/shm/%s", segments[i]);
        unlink(path);
    }
}

/* The daemon of the running test (static: a failed test's teardown still finds it). */
static struct kvpt_daemon kvpw_the_daemon;

struct kvpt_daemon *kvpw_fresh_daemon(void)
{
    memset(&kvpw_the_daemon, 0, sizeof(kvpw_the_daemon));
    return &kvpw_the_daemon;
}

/* Maps /dev/shm/<name> read-write, as a worker (or anyone of the daemon's uid) can. */
void kvpw_map_shm(const char *name, struct kvpw_map *m)
{
    char path[160];
    struct stat st;
    snprintf(path, sizeof(path), "/dev/shm/%s", name);
    m->fd = open(path, O_RDWR | O_CLOEXEC);
    if (m->fd < 0) {
        fail_msg("open %s: %s", path, strerror(errno));
        return;
    }
    assert_int_equal(fstat(m->fd, &st), 0);
    m->len = (size_t)st.st_size;
    m->p = mmap(NULL, m->len, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
    assert_true(m->p != MAP_FAILED);
}

void kvpw_unmap_shm(struct kvpw_map *m)
{
    munmap(m->p, m->len);
    close(m->fd);
}

/* The index header of a mapped index. */
struct kvp_widx_header *kvpw_widx_header(const struct kvpw_map *m)
{
    assert_true(m->len >= KVP_WIDX_HEADER);
    return (struct kvp_widx_header *)(void *)m->p;
}

/* The record of pool page i of a mapped index. */
struct kvp_widx_record *kvpw_widx_record(const struct kvpw_map *m, uint64_t i)
{
    size_t off = KVP_WIDX_HEADER + (size_t)i * KVP_WIDX_RECORD;
    assert_true(off + KVP_WIDX_RECORD <= m->len);
    return (struct kvp_widx_record *)(void *)(m->p + off);
}

/* XXH3-64 of a whole file: to tell that nobody wrote it. */
uint64_t kvpw_file_sum(const char *name)
{
    struct kvpw_map m;
    kvpw_map_shm(name, &m);
    uint64_t h = XXH3_64bits(m.p, m.len);
    kvpw_unmap_shm(&m);
    return h;
}

/* ---------------------------------------------------------------------------------------- */
/* The daemon's log                                                                          */

/* The last line of d's log that contains s, into out; false when there is none. */
bool kvpw_log_line(const struct kvpt_daemon *d, const char *s, char *out, size_t size)
{
    FILE *f = fopen(d->log, "re");
    char line[2048];
    bool found = false;
    while (f && fgets(line, sizeof(line), f)) {
        if (strstr(line, s)) {
            line[strcspn(line, "\n")] = '\0';
            snprintf(out, size, "%s", line);
            found = true;
        }
    }
    if (f)
        fclose(f);
    return found;
}

/* Asserts that d's log has exactly n lines that contain s. */
void kvpw_assert_log_count(const struct kvpt_daemon *d, const char *s, int n)
{
    int got = kvpt_log_count(d, s);
    if (got != n) {
        char cmd[256];
        snprintf(cmd, sizeof(cmd), "echo '--- daemon log:' >&2; cat %s >&2", d->log);
        if (system(cmd) != 0)
            fprintf(stderr, "(no daemon log)\n");
        fail_msg("%d lines of the log contain '%s', expected %d", got, s, n);
    }
}

/* The adoption line of the current daemon: pid, chunks and bytes it names, or fails. */
void kvpw_adopted_line(const struct kvpt_daemon *d, int *pid, const char **kind,
                       unsigned long long *chunks, unsigned long long *bytes, char *line,
                       size_t size)
{
    if (!kvpt_log_wait(d, KVPW_ADOPTED, 5000) || !kvpw_log_line(d, KVPW_ADOPTED, line, size))
        fail_msg("no '%s' line", KVPW_ADOPTED);
    const char *p = strstr(line, KVPW_ADOPTED) + strlen(KVPW_ADOPTED);
    char how[32];
    if (sscanf(p, "%d (%31[^)]): %llu chunks, %llu bytes in ", pid, how, chunks, bytes) != 4)
        fail_msg("cannot read the adoption line: %s", line);
    *kind = strcmp(how, "after a crash") == 0     ? "crash"
            : strcmp(how, "planned restart") == 0 ? "planned"
                                                  : "?";
}

/* ---------------------------------------------------------------------------------------- */
/* Workers and the status                                                                    */

kvp_instance *kvpw_register(kvp_client *c, kvp_register_opts o)
{
    kvp_instance *inst = NULL;
    int rc = kvp_register(c, &o, &inst);
    if (rc < 0)
        fail_msg("register %s: %s: %s", o.instance_id, kvp_strerror(rc), kvp_last_error(c));
    return inst;
}

void kvpw_workers_open(const struct kvpt_daemon *d, struct kvpw_workers *w)
{
    kvp_opts o = {.socket_path = d->socket, .timeout_ms = 10000};
    assert_int_equal(kvp_client_open(&o, &w->c), 0);
    w->shm = kvpw_register(w->c, kvpt_layout("warm-shm", KVP_TRANSPORT_AUTO));
    w->inl = kvpw_register(w->c, kvpt_layout("warm-inline", KVP_TRANSPORT_INLINE));
    w->big = kvpw_register(w->c, kvpt_layout_big("warm-big", KVP_TRANSPORT_AUTO));
    assert_int_equal(kvp_instance_get_info(w->shm)->transport, KVP_TRANSPORT_SHM);
    assert_int_equal(kvp_instance_get_info(w->inl)->transport, KVP_TRANSPORT_INLINE);
    assert_int_equal(kvp_instance_get_info(w->big)->transport, KVP_TRANSPORT_SHM);
    assert_int_equal(kvp_instance_get_info(w->shm)->chunk_bytes, KVPW_SMALL);
    assert_int_equal(kvp_instance_get_info(w->big)->chunk_bytes, KVPW_BIG);
}

const struct kvpw_seq kvpw_data_set[KVPW_NDATA] = {
    {101, 8, 0},
    {102, 6, 1},
    {103, 4, 2},
    {104, 3, 0},
};

kvp_instance *kvpw_inst(const struct kvpw_workers *w, int i)
{
    return i == 0 ? w->shm : i == 1 ? w->inl : w->big;
}

uint64_t kvpw_data_set_chunks(void)
{
    uint64_t n = 0;
    for (size_t i = 0; i < KVPW_NDATA; i++)
        n += kvpw_data_set[i].n;
    return n;
}

uint64_t kvpw_data_set_bytes(void)
{
    uint64_t b = 0;
    for (size_t i = 0; i < KVPW_NDATA; i++)
        b += (uint64_t)kvpw_data_set[i].n * (kvpw_data_set[i].inst == 2 ? KVPW_BIG : KVPW_SMALL);
    return b;
}

void kvpw_store_data_set(const struct kvpw_workers *w)
{
    for (size_t i = 0; i < KVPW_NDATA; i++)
        assert_int_equal(kvpt_store_seq(kvpw_inst(w, kvpw_data_set[i].inst), kvpw_data_set[i].seq,
                                        kvpw_data_set[i].n),
                         kvpw_data_set[i].n);
}

/* Every chunk of the data set is cached and byte-exact (lookup, then retrieve). */
void kvpw_check_data_set(const struct kvpw_workers *w)
{
    for (size_t i = 0; i < KVPW_NDATA; i++)
        kvpt_assert_seq(kvpw_inst(w, kvpw_data_set[i].inst), kvpw_data_set[i].seq,
                        kvpw_data_set[i].n, kvpw_data_set[i].n);
}

/* None of the data set is cached. */
void kvpw_check_data_set_gone(const struct kvpw_workers *w)
{
    for (size_t i = 0; i < KVPW_NDATA; i++)
        kvpt_assert_seq(kvpw_inst(w, kvpw_data_set[i].inst), kvpw_data_set[i].seq, 0,
                        kvpw_data_set[i].n);
}

/* The daemon's status document (STATUS over the socket: the one GET /api/status serves). */
json_t *kvpw_status(kvp_client *c)
{
    char *text = NULL;
    json_error_t err;
    int n = kvp_get_status(c, &text);
    if (n <= 0)
        fail_msg("status: %s: %s", kvp_strerror(n), kvp_last_error(c));
    json_t *doc = json_loadb(text, (size_t)n, 0, &err);
    kvp_free(text);
    if (!doc)
        fail_msg("status is not JSON: %s", err.text);
    return doc;
}

json_t *kvpw_warm_of(json_t *doc)
{
    json_t *w = json_object_get(doc, "warm_restart");
    if (!json_is_object(w))
        fail_msg("the status has no \"warm_restart\" object");
    return w;
}

long long kvpw_jint(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        fail_msg("\"%s\" is not an integer", key);
    return json_integer_value(v);
}

/* A cold start that serves: nothing of before is cached, a new store and retrieve work on
 * both transports, and the status says cold with enabled as given. */
void kvpw_assert_cold_and_serving(const struct kvpt_daemon *d, int enabled)
{
    struct kvpw_workers w;
    kvpw_workers_open(d, &w);
    kvpw_check_data_set_gone(&w);
    assert_int_equal(kvpt_stat(w.c, "objects_committed"), 0);
    assert_int_equal(kvpt_stat(w.c, "warm_restart_unverified_chunks"), 0);
    assert_int_equal(kvpt_store_seq(w.shm, 900, 3), 3);
    assert_int_equal(kvpt_store_seq(w.inl, 901, 2), 2);
    kvpt_assert_seq(w.inl, 900, 3, 3);
    kvpt_assert_seq(w.shm, 901, 2, 2);
    json_t *doc = kvpw_status(w.c);
    json_t *warm = kvpw_warm_of(doc);
    assert_string_equal(json_string_value(json_object_get(warm, "kind")), "cold");
    if (enabled >= 0)
        assert_int_equal(json_is_true(json_object_get(warm, "enabled")), enabled);
    assert_int_equal(kvpw_jint(warm, "adopted_chunks"), 0);
    json_decref(doc);
    kvp_client_close(w.c);
}

/* ---------------------------------------------------------------------------------------- */
/* Daemons                                                                                   */

/* Starts a daemon with kvpw_args64, stores the data set, SIGKILLs it. */
void kvpw_crashed_with_data(struct kvpt_daemon *d)
{
    struct kvpw_workers w;
    kvpt_daemon_start(d, kvpw_args64);
    kvpw_workers_open(d, &w);
    kvpw_store_data_set(&w);
    kvp_client_close(w.c);
    assert_int_equal(kvpt_daemon_signal_wait(d, SIGKILL), 128 + SIGKILL);
}

/* The segment name of the last "SHM enabled (shm_name=NAME)" line of d's log, into out. */
static bool ready_shm_name(const struct kvpt_daemon *d, char *out, size_t size)
{
    static const char mark[] = "SHM enabled (shm_name=";
    char line[2048];
    if (!kvpw_log_line(d, mark, line, sizeof(line)))
        return false;
    const char *p = strstr(line, mark) + strlen(mark);
    snprintf(out, size, "%.*s", (int)strcspn(p, ")"), p);
    return out[0] != '\0';
}

void kvpw_start_default_name(struct kvpt_daemon *d, const char *const *args)
{
    const char *argv[64];
    int argc = 0;

    assert_true(d->pid <= 0);
    if (!d->dir[0]) {
        snprintf(d->dir, sizeof(d->dir), "/tmp/kvpt-XXXXXX");
        assert_non_null(mkdtemp(d->dir));
        snprintf(d->socket, sizeof(d->socket), "%s/kvpool.sock", d->dir);
        snprintf(d->log, sizeof(d->log), "%s/kvpoold.log", d->dir);
    }
    argv[argc++] = KVP_TEST_KVPOOLD;
    argv[argc++] = "--socket";
    argv[argc++] = d->socket;
    argv[argc++] = "--log-level";
    argv[argc++] = "debug";
    argv[argc++] = "--http";
    argv[argc++] = "off";
    for (int i = 0; args && args[i] && argc < 63; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;
    kvpt_daemon_exec(d, argv);
    if (!ready_shm_name(d, d->shm_name, sizeof(d->shm_name)))
        fail_msg("no 'SHM enabled (shm_name=' line in %s", d->log);
}

/* Segments of earlier daemons of the running test (kvpw_note_leftover()). */
static char noted[8][96];

void kvpw_note_leftover(const char *name)
{
    for (size_t i = 0; i < sizeof(noted) / sizeof(noted[0]); i++)
        if (!noted[i][0]) {
            snprintf(noted[i], sizeof(noted[i]), "%s", name);
            return;
        }
}

/* After each test: a daemon a failed test left running is killed, and its files (the index of
 * its socket, its segment and the "_b" one some tests use) and directory removed. */
int kvpw_teardown(void **state)
{
    (void)state;
    struct kvpt_daemon *d = &kvpw_the_daemon;
    char other[112], cmd[512];
    if (d->pid > 0) {
        kill(d->pid, SIGKILL);
        kvpt_daemon_wait_exit(d, 10000);
    }
    if (d->socket[0]) {
        snprintf(other, sizeof(other), "%s_b", d->shm_name);
        const char *segments[] = {d->shm_name, other, NULL};
        kvpw_remove_leftovers(d, segments);
    }
    if (d->dir[0]) {
        snprintf(cmd, sizeof(cmd), "rm -rf %s", d->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "cannot remove %s\n", d->dir);
    }
    for (size_t i = 0; i < sizeof(noted) / sizeof(noted[0]); i++) {
        if (noted[i][0]) {
            char path[160];
            snprintf(path, sizeof(path), "/dev/shm/%.96s", noted[i]);
            unlink(path);
        }
        noted[i][0] = '\0';
    }
    memset(d, 0, sizeof(*d));
    return 0;
}
