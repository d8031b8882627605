/*
 * test_client_offline.c - libkvpool without a real daemon: connection failures, error names,
 * socket path rules, NULL handling, version, and the connection's reaction to a misbehaving
 * peer (wrong version, garbage, silence, wrong request id, error replies, hang-ups), played by
 * the scripted fake daemon: a lost connection is replaced at the next call, a confused peer's
 * is not.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/fake_daemon.h"
#include "common/kvp_assert.h"
#include "kvpool.h"

static int setup_fake(void **state)
{
    struct fake_daemon *f = malloc(sizeof(*f));
    assert_non_null(f);
    fake_init(f);
    *state = f;
    return 0;
}

static int teardown_fake(void **state)
{
    fake_cleanup(*state);
    free(*state);
    return 0;
}

/* Opens a client on the fake's socket. */
static int open_fake(struct fake_daemon *f, uint32_t timeout_ms, kvp_client **c)
{
    kvp_opts o = {.socket_path = f->path, .timeout_ms = timeout_ms};
    return kvp_client_open(&o, c);
}

static void test_open_no_socket(void **state)
{
    struct fake_daemon *f = *state; /* only for its empty temporary directory */
    kvp_opts o = {.socket_path = f->path, .timeout_ms = 200};
    kvp_client *c = (kvp_client *)&o;
    uint64_t t0 = fake_now_ms();

    assert_rc(kvp_client_open(&o, &c), -ENOENT);
    assert_null(c);
    assert_true(fake_now_ms() - t0 < 1000);
}

static void test_open_refused(void **state)
{
    struct fake_daemon *f = *state;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    kvp_client *c = NULL;

    /* A socket file nobody listens on, as left behind by a dead daemon. */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", f->path);
    assert_rc(bind(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    assert_rc(open_fake(f, 200, &c), -ECONNREFUSED);
    assert_null(c);
    close(fd);
}

static void test_open_path_too_long(void **state)
{
    (void)state;
    char path[200];
    kvp_opts o = {.socket_path = path};
    kvp_client *c = NULL;

    memset(path, 'p', sizeof(path) - 1);
    path[0] = '/';
    path[sizeof(path) - 1] = '\0';
    assert_rc(kvp_client_open(&o, &c), -ENAMETOOLONG);
    assert_null(c);
}

static void test_strerror(void **state)
{
    (void)state;
#define CHECK_MSG(name, val, msg)                        \
    assert_string_equal(kvp_strerror(KVP_E##name), msg); \
    assert_rc(KVP_E##name, val);
    KVP_ERRNO_MAP(CHECK_MSG)
#undef CHECK_MSG
    assert_string_equal(kvp_strerror(-EINVAL), "Invalid argument");
    assert_string_equal(kvp_strerror(-ETIMEDOUT), "Connection timed out");
    assert_string_equal(kvp_strerror(-ENOENT), "No such file or directory");
    assert_string_equal(kvp_strerror(0), "success");
    /* Unknown codes are named, with their number, never NULL. */
    assert_non_null(strstr(kvp_strerror(-99999), "99999"));
    assert_non_null(kvp_strerror(INT_MIN));
    assert_non_null(kvp_strerror(-10000));
    /* kvpool codes are distinct from each other and outside the errno range. */
    assert_true(KVP_EPROTO != KVP_EVERSION && KVP_EBADSLOT != KVP_ENOSHM);
    assert_true(-KVP_EPROTO > 4095);
}

static void test_default_socket_path(void **state)
{
    (void)state;
    char buf[108], expect[64], small[8];
    char *saved = getenv("XDG_RUNTIME_DIR") ? strdup(getenv("XDG_RUNTIME_DIR")) : NULL;

    setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
    assert_rc(kvp_default_socket_path(buf, sizeof(buf)),
              strlen("/run/user/1234/kvpool/kvpool.sock"));
    assert_string_equal(buf, "/run/user/1234/kvpool/kvpool.sock");
    assert_rc(kvp_default_socket_path(small, sizeof(small)), -ENAMETOOLONG);

    unsetenv("XDG_RUNTIME_DIR");
    snprintf(expect, sizeof(expect), "/tmp/kvpool-%lu/kvpool.sock", (unsigned long)getuid());
    assert_rc(kvp_default_socket_path(buf, sizeof(buf)), strlen(expect));
    assert_string_equal(buf, expect);

    /* Set but empty counts as unset. */
    setenv("XDG_RUNTIME_DIR", "", 1);
    assert_rc(kvp_default_socket_path(buf, sizeof(buf)), strlen(expect));
    assert_string_equal(buf, expect);

    assert_rc(kvp_default_socket_path(NULL, 10), -EINVAL);
    if (saved) {
        setenv("XDG_RUNTIME_DIR", saved, 1);
        free(saved);
    } else {
        unsetenv("XDG_RUNTIME_DIR");
    }
}

/* $KVPOOL_SOCKET is used when no path is given, and an explicit path wins over it. */
static void test_env_socket(void **state)
{
    struct fake_daemon *f = *state;
    kvp_client *c = NULL;
    kvp_opts o = {.socket_path = f->path, .timeout_ms = 2000};

    fake_add_hello(f);
    fake_start(f);
    setenv("KVPOOL_SOCKET", f->path, 1);
    assert_rc(kvp_client_open(NULL, &c), 0);
    assert_non_null(c);
    kvp_client_close(c);
    fake_join(f);
    assert_rc(f->nreqs, 1);
    fake_cleanup(f);

    fake_init(f);
    fake_add_hello(f);
    fake_start(f);
    o.socket_path = f->path;
    setenv("KVPOOL_SOCKET", "/nonexistent/kvpool.sock", 1);
    assert_rc(kvp_client_open(&o, &c), 0);
    kvp_client_close(c);
    unsetenv("KVPOOL_SOCKET");
    fake_join(f);
}

static void test_null_args(void **state)
{
    (void)state;
    kvp_client_close(NULL);
    assert_rc(kvp_unregister(NULL), 0);
    /* Without a handle, kvp_last_error(NULL) says why this thread's last open failed. */
    kvp_client *c = NULL;
    kvp_opts o = {.socket_path = "/nonexistent-kvpool-dir/s.sock"};
    assert_rc(kvp_client_open(&o, &c), -ENOENT);
    assert_null(c);
    assert_non_null(strstr(kvp_last_error(NULL), "/nonexistent-kvpool-dir/s.sock"));
    /* Reserved option fields must be zero: a later version's field is never misread. */
    o.reserved_[3] = 1;
    assert_rc(kvp_client_open(&o, &c), -EINVAL);
    assert_non_null(strstr(kvp_last_error(NULL), "kvp_opts.reserved_[3] is not zero"));
    assert_null(kvp_instance_get_info(NULL));
    assert_rc(kvp_client_open(NULL, NULL), -EINVAL);
    assert_rc(kvp_ping(NULL), -EINVAL);
    assert_rc(kvp_stats(NULL, NULL, 0), -EINVAL);
    assert_rc(kvp_lookup(NULL, NULL), -EINVAL);
    kvp_store_plan sp;
    kvp_retrieve_plan rp;
    assert_rc(kvp_prepare_store(NULL, NULL, 0, 0, &sp), -EINVAL);
    assert_null(sp.slots);
    assert_rc(kvp_prepare_retrieve(NULL, NULL, 0, 0, &rp), -EINVAL);
    assert_null(rp.slots);
    assert_rc(kvp_commit_store(NULL, &sp), -EINVAL);
    assert_rc(kvp_store(NULL, NULL, 0, 0, NULL, NULL), -EINVAL);
    assert_rc(kvp_retrieve(NULL, NULL, 0, 0, NULL), -EINVAL);
}

static void test_version(void **state)
{
    (void)state;
    uint32_t v = kvp_version();
    assert_int_equal(v >> 16, KVP_VERSION_MAJOR);
    assert_int_equal((v >> 8) & 0xff, KVP_VERSION_MINOR);
    assert_int_equal(v & 0xff, KVP_VERSION_PATCH);
}

static void test_hello_wrong_major(void **state)
{
    struct fake_daemon *f = *state;
    struct kvp_hello_reply h = fake_hello_msg(NULL, 0, NULL, "");
    kvp_client *c = NULL;

    /* HELLO's major is the protocol's, not the library's ABI major. */
    h.major = KVP_PROTO_VERSION + 1;
    fake_add_hello_msg(f, &h);
    fake_start(f);
    assert_rc(open_fake(f, 2000, &c), KVP_EVERSION);
    assert_null(c);
    char want[128];
    snprintf(want, sizeof(want), "speaks protocol %d.0, this library speaks protocol %d.%d",
             KVP_PROTO_VERSION + 1, KVP_PROTO_VERSION, KVP_PROTO_MINOR);
    assert_non_null(strstr(kvp_last_error(NULL), want));
    fake_join(f);
    assert_rc(f->nreqs, 1);
    assert_int_equal(f->reqs[0].h.opcode, KVP_OP_HELLO);
    assert_int_equal(f->reqs[0].h.body_len, 0);
}

static void test_reply_wrong_protocol_version(void **state)
{
    struct fake_daemon *f = *state;
    kvp_client *c = NULL;

    fake_add_hello(f);
    f->steps[0].action = FAKE_BAD_VERSION;
    fake_start(f);
    assert_rc(open_fake(f, 2000, &c), KVP_EVERSION);
    assert_null(c);
    fake_join(f);
}

/* A reply that is not a frame: KVP_EPROTO, then the connection is unusable. */
static void test_garbage_header(void **state)
{
    struct fake_daemon *f = *state;
    kvp_client *c = NULL;

    fake_add_hello(f);
    fake_add(f, KVP_OP_PING, FAKE_GARBAGE);
    fake_start(f);
    assert_rc(open_fake(f, 2000, &c), 0);
    assert_rc(kvp_ping(c), KVP_EPROTO);
    assert_non_null(strstr(kvp_last_error(c), "malformed reply header"));
    /* A confused peer is not reconnected to: later calls fail at once. */
    uint64_t t0 = fake_now_ms();
    assert_rc(kvp_ping(c), -ENOTCONN);
    assert_true(fake_now_ms() - t0 < 100);
    assert_non_null(strstr(kvp_last_error(c), "malformed reply header"));
    kvp_client_close(c);
    fake_join(f);
    /* The second ping never reached the wire, nor did a second connection. */
    assert_rc(f->nreqs, 2);
    assert_rc(f->nconns, 1);
}

/* A daemon that never answers HELLO: -ETIMEDOUT after about timeout_ms. */
static void test_no_answer_times_out(void **state)
{
    struct fake_daemon *f = *state;
    kvp_client *c = NULL;

    fake_add(f, KVP_OP_HELLO, FAKE_SILENT);
    fake_start(f);
    uint64_t t0 = fake_now_ms();
    assert_rc(open_fake(f, 200, &c), -ETIMEDOUT);
    uint64_t dt = fake_now_ms() - t0;
    assert_null(c);
    if (dt < 150 || dt > 2000)
        fail_msg("open took %llu ms with a 200 ms timeout", (unsigned long long)dt);
    fake_join(f);
}

/*
 * A request that times out leaves the stream position unknown: the connection is given up, and
 * the next call makes a new one (HELLO again) instead of failing forever.
 */
static void test_ping_times_out(void **state)
{
    struct fake_daemon *f = *state;
    kvp_client *c = NULL;

    fake_add_hello(f);
    fake_add(f, KVP_OP_PING, FAKE_SILENT);
    fake_add_hello(f);
    fake_add_reply(f, KVP_OP_PING, NULL);
    fake_start(f);
    assert_rc(open_fake(f, 200, &c), 0);
    uint64_t t0 = fake_now_ms();
    assert_rc(kvp_ping(c), -ETIMEDOUT);
    assert_true(fake_now_ms() - t0 < 2000);
    assert_rc(kvp_ping(c), 0);
    assert_string_equal(kvp_last_error(c), "");
    kvp_client_close(c);
    fake_join(f);
    assert_rc(f->nconns, 2);
    assert_rc(f->nreqs, 4);
    assert_int_equal(f->reqs[2].h.opcode, KVP_OP_HELLO);
    /* Request ids start over on the new connection. */
    assert_int_equal(f->reqs[2].h.request_id, 1);
}

static void test_wrong_request_id(void **state)
{
    struct fake_daemon *f = *state;
    kvp_client *c = NULL;

    fake_add_hello(f);
    fake_add_reply(f, KVP_OP_PING, NULL)->action = FAKE_BAD_ID;
    fake_start(f);
    assert_rc(open_fake(f, 2000, &c), 0);
    assert_rc(kvp_ping(c), KVP_EPROTO);
    assert_rc(kvp_ping(c), -ENOTCONN);
    kvp_client_close(c);
    fake_join(f);
    assert_rc(f->nconns, 1);
    /* Request ids increase along the connection. */
    assert_true(f->reqs[1].h.request_id > f->reqs[0].h.request_id);
}

/* An error reply returns the daemon's status and message; the connection stays usable. */
static void test_error_reply_keeps_connection(void **state)
{
    struct fake_daemon *f = *state;
    kvp_client *c = NULL;

    fake_add_hello(f);
    fake_add_error(f, KVP_OP_PING, -EBUSY, "try again later");
    fake_add_reply(f, KVP_OP_PING, NULL);
    fake_start(f);
    assert_rc(open_fake(f, 2000, &c), 0);
    assert_string_equal(kvp_last_error(c), "");
    assert_rc(kvp_ping(c), -EBUSY);
    assert_string_equal(kvp_last_error(c), "try again later");
    assert_rc(kvp_ping(c), 0);
    assert_string_equal(kvp_last_error(c), "");
    kvp_client_close(c);
    fake_join(f);
    assert_rc(f->nreqs, 3);
}

/* After a framing error the daemon closes the connection; the library does not try again. */
static void test_protocol_error_reply_breaks(void **state)
{
    struct fake_daemon *f = *state;
    kvp_client *c = NULL;

    fake_add_hello(f);
    fake_add_error(f, KVP_OP_PING, -EPROTO, "malformed PING body");
    fake_start(f);
    assert_rc(open_fake(f, 2000, &c), 0);
    assert_rc(kvp_ping(c), -EPROTO);
    assert_string_equal(kvp_last_error(c), "malformed PING body");
    assert_rc(kvp_ping(c), -ENOTCONN);
    assert_non_null(strstr(kvp_last_error(c), "malformed PING body"));
    kvp_client_close(c);
    fake_join(f);
    assert_rc(f->nconns, 1);
}

/* A daemon that hangs up (it exited or was restarted): the call in flight fails, the next call
 * connects again, says HELLO and goes on. */
static void test_daemon_hangs_up(void **state)
{
    struct fake_daemon *f = *state;
    kvp_client *c = NULL;

    fake_add_hello(f);
    fake_add(f, KVP_OP_PING, FAKE_CLOSE);
    fake_add_hello(f);
    fake_add_reply(f, KVP_OP_PING, NULL);
    fake_add_count(f, KVP_OP_STATS, 0);
    fake_start(f);
    assert_rc(open_fake(f, 2000, &c), 0);
    int rc = kvp_ping(c);
    assert_true(rc == -ECONNRESET || rc == -EPIPE);
    assert_true(kvp_last_error(c)[0] != '\0');
    assert_rc(kvp_ping(c), 0);
    assert_rc(kvp_stats(c, NULL, 0), 0);
    kvp_client_close(c);
    fake_join(f);
    assert_rc(f->nconns, 2);
    assert_rc(f->nreqs, 5);
    assert_int_equal(f->reqs[2].h.opcode, KVP_OP_HELLO);
}

/* While nobody listens, each call makes one attempt, fails with the connect error naming the
 * socket, and the next call tries again: no -ENOTCONN, no waiting. */
static void test_daemon_gone(void **state)
{
    struct fake_daemon *f = *state;
    kvp_client *c = NULL;

    fake_add_hello(f);
    fake_add(f, KVP_OP_PING, FAKE_CLOSE);
    fake_start(f);
    assert_rc(open_fake(f, 2000, &c), 0);
    int rc = kvp_ping(c);
    assert_true(rc == -ECONNRESET || rc == -EPIPE);
    fake_join(f);
    close(f->listen_fd);
    f->listen_fd = -1;
    unlink(f->path);

    for (int i = 0; i < 3; i++) {
        uint64_t t0 = fake_now_ms();
        assert_rc(kvp_ping(c), -ENOENT);
        assert_true(fake_now_ms() - t0 < 500);
        assert_non_null(strstr(kvp_last_error(c), f->path));
        assert_non_null(strstr(kvp_last_error(c), "reconnect"));
    }
    assert_rc(kvp_stats(c, NULL, 0), -ENOENT);
    kvp_client_close(c);
    assert_rc(f->nconns, 1);
}

/* A reconnect that reaches a confused peer (garbage instead of a HELLO reply) fails with the
 * protocol error and is not tried again. */
static void test_reconnect_to_confused_peer(void **state)
{
    struct fake_daemon *f = *state;
    kvp_client *c = NULL;

    fake_add_hello(f);
    fake_add(f, KVP_OP_PING, FAKE_CLOSE);
    fake_add(f, KVP_OP_HELLO, FAKE_GARBAGE);
    fake_start(f);
    assert_rc(open_fake(f, 2000, &c), 0);
    int rc = kvp_ping(c);
    assert_true(rc == -ECONNRESET || rc == -EPIPE);
    assert_rc(kvp_ping(c), KVP_EPROTO);
    assert_non_null(strstr(kvp_last_error(c), "could not reconnect"));
    assert_non_null(strstr(kvp_last_error(c), "malformed reply header"));
    uint64_t t0 = fake_now_ms();
    assert_rc(kvp_ping(c), -ENOTCONN);
    assert_rc(kvp_stats(c, NULL, 0), -ENOTCONN);
    assert_true(fake_now_ms() - t0 < 100);
    kvp_client_close(c);
    fake_join(f);
    assert_rc(f->nconns, 2);
    assert_rc(f->nreqs, 3);
}

/* A payload on a reply that takes none cannot be skipped safely. */
static void test_unexpected_payload(void **state)
{
    struct fake_daemon *f = *state;
    kvp_client *c = NULL;

    fake_add_hello(f);
    struct fake_step *s = fake_add_reply(f, KVP_OP_PING, NULL);
    s->payload = calloc(1, 8);
    s->payload_len = 8;
    fake_start(f);
    assert_rc(open_fake(f, 2000, &c), 0);
    assert_rc(kvp_ping(c), KVP_EPROTO);
    assert_rc(kvp_ping(c), -ENOTCONN);
    kvp_client_close(c);
    fake_join(f);
    assert_rc(f->nconns, 1);
}

#define PING_THREADS 4
#define PINGS_PER_THREAD 12

struct pinger {
    kvp_client *c;
    int failures;
};

static void *ping_loop(void *arg)
{
    struct pinger *p = arg;
    for (int i = 0; i < PINGS_PER_THREAD; i++)
        if (kvp_ping(p->c) != 0)
            p->failures++;
    return NULL;
}

/* Threads sharing one client: every call gets its own reply, requests never interleave. */
static void test_concurrent_calls(void **state)
{
    struct fake_daemon *f = *state;
    struct pinger p[PING_THREADS];
    pthread_t t[PING_THREADS];
    kvp_client *c = NULL;

    fake_add_hello(f);
    for (int i = 0; i < PING_THREADS * PINGS_PER_THREAD; i++)
        fake_add_reply(f, KVP_OP_PING, NULL);
    fake_start(f);
    assert_rc(open_fake(f, 2000, &c), 0);
    for (int i = 0; i < PING_THREADS; i++) {
        p[i] = (struct pinger){.c = c};
        assert_rc(pthread_create(&t[i], NULL, ping_loop, &p[i]), 0);
    }
    for (int i = 0; i < PING_THREADS; i++) {
        pthread_join(t[i], NULL);
        assert_rc(p[i].failures, 0);
    }
    kvp_client_close(c);
    fake_join(f);
    assert_rc(f->nreqs, 1 + PING_THREADS * PINGS_PER_THREAD);
    for (int i = 1; i < f->nreqs; i++)
        assert_true(f->reqs[i].h.request_id > f->reqs[i - 1].h.request_id);
}

static void test_stats(void **state)
{
    struct fake_daemon *f = *state;
    struct kvp_stat_entry e[3] = {{"requests", 7}, {"l1_used_bytes", 1ull << 40}, {"z", 0}};
    kvp_stat out[3];
    struct kvp_wbuf w;
    kvp_client *c = NULL;

    kvp_wbuf_init(&w);
    kvp_encode_stats_reply(&w, e, 3);
    fake_add_hello(f);
    fake_add_reply(f, KVP_OP_STATS, &w);
    kvp_encode_stats_reply(&w, e, 3);
    fake_add_reply(f, KVP_OP_STATS, &w);
    fake_start(f);
    assert_rc(open_fake(f, 2000, &c), 0);

    assert_rc(kvp_stats(c, out, 3), 3);
    assert_string_equal(out[0].name, "requests");
    assert_int_equal(out[0].value, 7);
    assert_string_equal(out[1].name, "l1_used_bytes");
    assert_int_equal(out[1].value, 1ull << 40);
    /* Too small an array: the count is still the daemon's, only cap entries are written. */
    memset(out, 0x55, sizeof(out));
    assert_rc(kvp_stats(c, out, 1), 3);
    assert_string_equal(out[0].name, "requests");
    assert_int_equal(out[1].value, 0x5555555555555555ull);
    assert_rc(kvp_stats(c, NULL, 1), -EINVAL);
    kvp_client_close(c);
    fake_join(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_open_no_socket, setup_fake, teardown_fake),
        cmocka_unit_test_setup_teardown(test_open_refused, setup_fake, teardown_fake),
        cmocka_unit_test(test_open_path_too_long),
        cmocka_unit_test(test_strerror),
        cmocka_unit_test(test_default_socket_path),
        cmocka_unit_test_setup_teardown(test_env_socket, setup_fake, teardown_fake),
        cmocka_unit_test(test_null_args),
        cmocka_unit_test(test_version),
        cmocka_unit_test_setup_teardown(test_hello_wrong_major, setup_fake, teardown_fake),
        cmocka_unit_test_setup_teardown(test_reply_wrong_protocol_version, setup_fake,
                                        teardown_fake),
        cmocka_unit_test_setup_teardown(test_garbage_header, setup_fake, teardown_fake),
        cmocka_unit_test_setup_teardown(test_no_answer_times_out, setup_fake, teardown_fake),
        cmocka_unit_test_setup_teardown(test_ping_times_out, setup_fake, teardown_fake),
        cmocka_unit_test_setup_teardown(test_wrong_request_id, setup_fake, teardown_fake),
        cmocka_unit_test_setup_teardown(test_error_reply_keeps_connection, setup_fake,
                                        teardown_fake),
        cmocka_unit_test_setup_teardown(test_protocol_error_reply_breaks, setup_fake,
                                        teardown_fake),
        cmocka_unit_test_setup_teardown(test_daemon_hangs_up, setup_fake, teardown_fake),
        cmocka_unit_test_setup_teardown(test_daemon_gone, setup_fake, teardown_fake),
        cmocka_unit_test_setup_teardown(test_reconnect_to_confused_peer, setup_fake, teardown_fake),
        cmocka_unit_test_setup_teardown(test_unexpected_payload, setup_fake, teardown_fake),
        cmocka_unit_test_setup_teardown(test_concurrent_calls, setup_fake, teardown_fake),
        cmocka_unit_test_setup_teardown(test_stats, setup_fake, teardown_fake),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
