/*
 * test_client_admin.c - kvp_get_status(), kvp_get_metrics(), kvp_clear() and kvp_free() against
 * the scripted fake daemon: what they send, what they return and who frees it, how they treat
 * an error reply, a malformed text reply, and a daemon of protocol 1.0 that has none of these
 * requests (nothing is sent to it, and the connection stays usable).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* A HELLO step of a daemon speaking protocol 1.minor. */
static void add_hello(struct fake_daemon *f, uint16_t minor)
{
    struct kvp_hello_reply h = fake_hello_msg(NULL, 0, NULL, "SHM disabled by configuration");
    h.minor = minor;
    fake_add_hello_msg(f, &h);
}

/* A success reply to op carrying text (len bytes). */
static void add_text(struct fake_daemon *f, uint16_t op, const char *text, uint32_t len)
{
    struct kvp_wbuf w;
    kvp_wbuf_init(&w);
    kvp_encode_text_reply(&w, text, len);
    fake_add_reply(f, op, &w);
}

static kvp_client *open_fake(struct fake_daemon *f)
{
    kvp_opts o = {.socket_path = f->path, .timeout_ms = 2000};
    kvp_client *c = NULL;
    assert_rc(kvp_client_open(&o, &c), 0);
    return c;
}

static void test_status_metrics_clear(void **state)
{
    struct fake_daemon *f = *state;
    static const char json[] = "{\n  \"version\": \"1.0.0\"\n}";
    static const char metrics[] = "# TYPE kvpool_objects gauge\nkvpool_objects 3\n";
    char *text = (char *)1;

    add_hello(f, KVP_PROTO_MINOR);
    add_text(f, KVP_OP_STATUS, json, (uint32_t)strlen(json));
    add_text(f, KVP_OP_METRICS, metrics, (uint32_t)strlen(metrics));
    fake_add_count(f, KVP_OP_CLEAR, 5);
    add_text(f, KVP_OP_STATUS, "", 0);
    fake_start(f);
    kvp_client *c = open_fake(f);

    assert_rc(kvp_get_status(c, &text), strlen(json));
    assert_string_equal(text, json);
    assert_string_equal(kvp_last_error(c), "");
    kvp_free(text);
    assert_rc(kvp_get_metrics(c, &text), strlen(metrics));
    assert_string_equal(text, metrics);
    kvp_free(text);
    assert_rc(kvp_clear(c), 5);
    /* An empty document is still a string to free. */
    assert_rc(kvp_get_status(c, &text), 0);
    assert_non_null(text);
    assert_string_equal(text, "");
    kvp_free(text);
    kvp_free(NULL);
    kvp_client_close(c);

    fake_join(f);
    assert_rc(f->nreqs, 5);
    static const uint16_t ops[] = {KVP_OP_HELLO, KVP_OP_STATUS, KVP_OP_METRICS, KVP_OP_CLEAR,
                                   KVP_OP_STATUS};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(f->reqs[i].h.opcode, ops[i]);
        assert_int_equal(f->reqs[i].h.body_len, 0);
        assert_int_equal(f->reqs[i].h.payload_len, 0);
    }
}

/* A 1.0 daemon would close the connection on an unknown opcode: the library does not ask. */
static void test_old_daemon(void **state)
{
    struct fake_daemon *f = *state;
    char *text = (char *)1;

    add_hello(f, 0);
    fake_add(f, KVP_OP_PING, FAKE_REPLY);
    fake_start(f);
    kvp_client *c = open_fake(f);

    assert_rc(kvp_get_status(c, &text), -EOPNOTSUPP);
    assert_null(text);
    assert_non_null(strstr(kvp_last_error(c), "protocol 1.0, which has no STATUS request"));
    assert_rc(kvp_get_metrics(c, &text), -EOPNOTSUPP);
    assert_null(text);
    assert_non_null(strstr(kvp_last_error(c), "METRICS"));
    assert_rc(kvp_clear(c), -EOPNOTSUPP);
    assert_non_null(strstr(kvp_last_error(c), "CLEAR"));
    assert_rc(kvp_ping(c), 0);
    kvp_client_close(c);
    fake_join(f);
    assert_rc(f->nreqs, 2);
    assert_int_equal(f->reqs[1].h.opcode, KVP_OP_PING);
}

/* An error reply is the daemon's answer: its status and message, nothing to free, and the
 * connection goes on. */
static void test_error_reply(void **state)
{
    struct fake_daemon *f = *state;
    char *text = (char *)1;

    add_hello(f, KVP_PROTO_MINOR);
    fake_add_error(f, KVP_OP_STATUS, -ENOMEM, "out of memory while rendering the status");
    fake_add_error(f, KVP_OP_CLEAR, -EPERM, "not allowed");
    fake_add(f, KVP_OP_PING, FAKE_REPLY);
    fake_start(f);
    kvp_client *c = open_fake(f);
    assert_rc(kvp_get_status(c, &text), -ENOMEM);
    assert_null(text);
    assert_string_equal(kvp_last_error(c), "out of memory while rendering the status");
    assert_rc(kvp_clear(c), -EPERM);
    assert_string_equal(kvp_last_error(c), "not allowed");
    assert_rc(kvp_ping(c), 0);
    kvp_client_close(c);
    fake_join(f);
}

/* A text reply that does not decode (here: a NUL inside) is a protocol error, final. */
static void test_malformed_text(void **state)
{
    struct fake_daemon *f = *state;
    char *text = (char *)1;

    add_hello(f, KVP_PROTO_MINOR);
    add_text(f, KVP_OP_METRICS, "abc\0def", 7);
    fake_start(f);
    kvp_client *c = open_fake(f);
    assert_rc(kvp_get_metrics(c, &text), KVP_EPROTO);
    assert_null(text);
    assert_non_null(strstr(kvp_last_error(c), "malformed METRICS reply"));
    assert_rc(kvp_get_status(c, &text), -ENOTCONN);
    kvp_client_close(c);
    fake_join(f);
}

static void test_null_arguments(void **state)
{
    (void)state;
    char *text = (char *)1;
    assert_rc(kvp_get_status(NULL, &text), -EINVAL);
    assert_null(text);
    text = (char *)1;
    assert_rc(kvp_get_metrics(NULL, &text), -EINVAL);
    assert_null(text);
    assert_rc(kvp_get_status(NULL, NULL), -EINVAL);
    assert_rc(kvp_clear(NULL), -EINVAL);
    kvp_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_status_metrics_clear, setup_fake, teardown_fake),
        cmocka_unit_test_setup_teardown(test_old_daemon, setup_fake, teardown_fake),
        cmocka_unit_test_setup_teardown(test_error_reply, setup_fake, teardown_fake),
        cmocka_unit_test_setup_teardown(test_malformed_text, setup_fake, teardown_fake),
        cmocka_unit_test(test_null_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
