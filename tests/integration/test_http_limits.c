/*
 * test_http_limits.c - what an HTTP client can do wrong, against a real kvpoold: methods and
 * paths it does not serve, malformed and oversized requests, a client that stalls in the middle
 * of its request, more connections than the endpoint takes, a crowd of idle connections, clients
 * that trickle their headers a byte at a time. Each gets a 4xx (or is closed by the daemon once
 * its request is late), never a crash, never delays a worker, and never keeps a health check
 * from being answered. Also the start-up: a port in use is one ERROR line before the pool is
 * reserved, an invalid --http a usage error, a non-loopback address a warning.
 */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/kvp_assert.h"
#include "harness.h"
#include "http_client.h"

#define C 16
#define HTTP_REQUEST_TIMEOUT_S 3 /* KVP_HTTP_REQUEST_TIMEOUT_S */
#define HTTP_CONNECTIONS 256     /* KVP_HTTP_MAX_CONNECTIONS */
#define PROBE_MS 5000            /* a probe's receive timeout: generous, a functional bound */

static struct kvpt_daemon d;
static uint16_t port;

static int group_setup(void **state)
{
    const char *args[] = {"--l1-size",   "16MiB", "--chunk-size", "16", "--http",
                          "127.0.0.1:0", NULL};
    kvpt_group_start(state, &d, args);
    port = kvpt_http_port_in_log(d.log, 5000);
    return port ? 0 : -1;
}

/* Sends req as is; returns the status of the reply (0: closed without one). */
static int raw(const char *req, size_t len)
{
    struct kvpt_http_reply r;
    int rc = kvpt_http_raw(port, req, len, 10000, &r);
    if (rc == -ECONNRESET)
        return 0;
    assert_rc(rc, 0);
    int status = r.status;
    kvpt_http_free(&r);
    return status;
}

static int raw_str(const char *req)
{
    return raw(req, strlen(req));
}

/* The daemon still serves both sides: a worker's round trip and a health check. */
static void assert_serving(void)
{
    struct kvpt_http_reply r;
    kvpt_assert_serves(&d);
    assert_rc(kvpt_http_request(port, "GET", "/api/healthcheck", &r), 0);
    assert_int_equal(r.status, 200);
    kvpt_http_free(&r);
}

static void test_refused_requests(void **state)
{
    (void)state;
    /* Methods: only GET and HEAD, with a JSON reason and Allow. */
    assert_int_equal(raw_str("BREW /api/status HTTP/1.1\r\nHost: x\r\n\r\n"), 405);
    assert_int_equal(raw_str("DELETE / HTTP/1.1\r\nHost: x\r\n\r\n"), 405);
    /* A body is never read: a huge announced one is refused at once. */
    assert_int_equal(raw_str("POST /api/status HTTP/1.1\r\nHost: x\r\n"
                             "Content-Length: 1000000000\r\n\r\n"),
                     405);
    /* Paths. */
    assert_int_equal(raw_str("GET /api HTTP/1.1\r\nHost: x\r\n\r\n"), 404);
    assert_int_equal(raw_str("GET /api/../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n"), 404);
    /* Escapes are not decoded: they cannot make another path, nor end one early. */
    assert_int_equal(raw_str("GET /%00 HTTP/1.1\r\nHost: x\r\n\r\n"), 404);
    assert_int_equal(raw_str("GET /api%2Fstatus HTTP/1.1\r\nHost: x\r\n\r\n"), 404);
    assert_int_equal(raw_str("GET /metrics?x=%00 HTTP/1.1\r\nHost: x\r\n\r\n"), 200);
    /* Malformed requests. */
    assert_int_equal(raw_str("GET /api/status HTTP/1.1\r\n\r\n"), 400); /* no Host */
    assert_int_equal(raw_str("GET /api/status HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n"), 400);
    assert_int_equal(raw_str("GET /api/status HTTP/9.9\r\nHost: x\r\n\r\n"), 505);
    /* Not HTTP at all (a TLS hello): closed, or answered 400. */
    static const unsigned char tls[] = {0x16, 0x03, 0x01, 0x00, 0xa5, 0x01, 0x00, 0x00,
                                        0xa1, 0x03, 0x03, '\r', '\n', '\r', '\n'};
    int s = raw((const char *)tls, sizeof(tls));
    assert_true(s == 0 || s == 400);
    assert_serving();
}

/* The request line and the headers must fit KVP_HTTP_MEMORY_LIMIT (16 KiB). */
static void test_oversized_requests(void **state)
{
    (void)state;
    size_t big = 20000;
    char *req = malloc(big + 256);
    char *fill = malloc(big + 1);
    memset(fill, 'a', big);
    fill[big] = '\0';

    snprintf(req, big + 256, "GET /api/status HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", fill);
    assert_int_equal(raw_str(req), 431);
    snprintf(req, big + 256, "GET /%s HTTP/1.1\r\nHost: x\r\n\r\n", fill);
    assert_int_equal(raw_str(req), 414);
    /* Many small headers add up too. */
    size_t off = (size_t)snprintf(req, big + 256, "GET / HTTP/1.1\r\nHost: x\r\n");
    while (off + 32 < big)
        off += (size_t)snprintf(req + off, big + 256 - off, "X-%zu: yes\r\n", off);
    snprintf(req + off, big + 256 - off, "\r\n");
    assert_int_equal(raw_str(req), 431);
    free(req);
    free(fill);
    assert_serving();
}

/* A client that stops in the middle of its request holds nothing but its own connection: the
 * workers and the other HTTP clients are served meanwhile, and the daemon closes it once its
 * request is late. */
static void test_slow_client(void **state)
{
    (void)state;
    int fd = kvpt_http_connect(port);
    assert_true(fd >= 0);
    const char part[] = "GET /api/status HTTP/1.1\r\nHo";
    assert_int_equal(send(fd, part, sizeof(part) - 1, MSG_NOSIGNAL), (ssize_t)sizeof(part) - 1);
    uint64_t t0 = kvpt_now_ms();

    /* A worker's store and retrieve, and another HTTP client, at once. */
    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts o = kvpt_layout("slow-http", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_rc(kvp_register(c, &o, &inst), 0);
    size_t bytes = kvp_instance_get_info(inst)->chunk_bytes;
    uint32_t *tok = kvpt_tokens(7, 2 * C);
    kvp_tokens t = {.ids = tok, .count = 2 * C};
    void *bufs[2] = {malloc(bytes), malloc(bytes)};
    kvpt_fill(bufs[0], bytes, 7, 0);
    kvpt_fill(bufs[1], bytes, 7, 1);
    assert_rc(kvp_store(inst, &t, 0, 2 * C, (const void *const *)bufs, NULL), 2);
    assert_rc(kvp_retrieve(inst, &t, 0, 2 * C, bufs), 2);
    assert_true(kvpt_check(bufs[1], bytes, 7, 1));
    assert_serving();
    assert_true(kvpt_now_ms() - t0 < 2000); /* well within the 3 s the stalled one may last */
    free(bufs[0]);
    free(bufs[1]);
    free(tok);
    kvp_client_close(c);

    /* Closed by the daemon, without a reply, after about the request timeout. */
    assert_true(kvpt_raw_closed(fd, (HTTP_REQUEST_TIMEOUT_S + 5) * 1000));
    uint64_t waited = kvpt_now_ms() - t0;
    assert_true(waited >= (HTTP_REQUEST_TIMEOUT_S - 1) * 1000);
    close(fd);
}

/* A health check, as a liveness probe makes it: answered 200 within PROBE_MS. */
static void assert_probe_answered(void)
{
    static const char req[] = "GET /api/healthcheck HTTP/1.1\r\nHost: x\r\n"
                              "Connection: close\r\n\r\n";
    struct kvpt_http_reply r;
    assert_rc(kvpt_http_raw(port, req, sizeof(req) - 1, PROBE_MS, &r), 0);
    assert_int_equal(r.status, 200);
    kvpt_http_free(&r);
}

/* 200 connections that send nothing: the probe is answered at once, and the daemon closes them
 * all once their requests are late. */
static void test_idle_crowd(void **state)
{
    (void)state;
    enum { N = 200 };
    int fds[N];
    for (int i = 0; i < N; i++) {
        fds[i] = kvpt_http_connect(port);
        assert_true(fds[i] >= 0);
    }
    kvpt_sleep_ms(200); /* the daemon has accepted them */
    assert_probe_answered();
    kvpt_assert_serves(&d);
    for (int i = 0; i < N; i++) {
        assert_true(kvpt_raw_closed(fds[i], (HTTP_REQUEST_TIMEOUT_S + 5) * 1000));
        close(fds[i]);
    }
    assert_probe_answered();
}

/* Clients that send their headers one byte every 3 s (slowloris) while probes come. */
struct trickle {
    int fds[16];
    atomic_bool stop;
};

static void *trickle_main(void *arg)
{
    struct trickle *t = arg;
    static const char req[] = "GET /api/status HTTP/1.1\r\nHost: x\r\nX-Slow: yes\r\n";
    for (size_t k = 0; k < sizeof(req) - 1 && !atomic_load(&t->stop); k++) {
        for (int i = 0; i < 16; i++)
            send(t->fds[i], req + k, 1, MSG_NOSIGNAL);
        for (int ms = 0; ms < 3000 && !atomic_load(&t->stop); ms += 50)
            kvpt_sleep_ms(50);
    }
    return NULL;
}

static void test_trickling_headers(void **state)
{
    (void)state;
    struct trickle t;
    atomic_init(&t.stop, false);
    pthread_t th;
    for (int i = 0; i < 16; i++) {
        t.fds[i] = kvpt_http_connect(port);
        assert_true(t.fds[i] >= 0);
    }
    assert_int_equal(pthread_create(&th, NULL, trickle_main, &t), 0);
    /* Probes while they trickle: before, at and after the time their requests are late. */
    for (int i = 0; i < 4; i++) {
        assert_probe_answered();
        kvpt_sleep_ms(1000);
    }
    /* However often a byte comes, a request late by the timeout is closed. */
    for (int i = 0; i < 16; i++)
        assert_true(kvpt_raw_closed(t.fds[i], (HTTP_REQUEST_TIMEOUT_S + 5) * 1000));
    atomic_store(&t.stop, true);
    pthread_join(th, NULL);
    for (int i = 0; i < 16; i++)
        close(t.fds[i]);
    assert_probe_answered();
}

/* More connections than the endpoint takes: the extra ones wait or are closed, the workers
 * never notice, and the endpoint serves again once the crowd leaves. */
static void test_connection_limit(void **state)
{
    (void)state;
    int fds[HTTP_CONNECTIONS + 8];
    const char part[] = "GET /metrics HTTP/1.1\r\n";
    for (int i = 0; i < HTTP_CONNECTIONS + 8; i++) {
        fds[i] = kvpt_http_connect(port);
        assert_true(fds[i] >= 0);
        send(fds[i], part, sizeof(part) - 1, MSG_NOSIGNAL);
    }
    uint64_t t0 = kvpt_now_ms();
    kvpt_assert_serves(&d);
    kvp_client *c = kvpt_connect(&d);
    for (int i = 0; i < 100; i++)
        assert_rc(kvp_ping(c), 0);
    kvp_client_close(c);
    assert_true(kvpt_now_ms() - t0 < 2000); /* well within the 3 s the stalled ones may last */

    for (int i = 0; i < HTTP_CONNECTIONS + 8; i++)
        close(fds[i]);
    /* Served again at once (connections are released as their sockets close). */
    struct kvpt_http_reply r;
    int ok = 0;
    for (int i = 0; i < 50 && !ok; i++) {
        if (kvpt_http_request(port, "GET", "/api/healthcheck", &r) == 0) {
            ok = r.status == 200;
            kvpt_http_free(&r);
        }
        if (!ok)
            kvpt_sleep_ms(100);
    }
    assert_true(ok);
}

/* A port another process holds: one ERROR line that says so, exit 1, nothing reserved. */
static void test_port_in_use(void **state)
{
    (void)state;
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof(a);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(fd, 1), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    char spec[32], line[160];
    snprintf(spec, sizeof(spec), "127.0.0.1:%u", (unsigned)ntohs(a.sin_port));

    struct kvpt_daemon x;
    const char *args[] = {"--l1-size", "64MiB", "--http", spec, NULL};
    kvpt_daemon_spawn(&x, NULL, args);
    assert_int_equal(kvpt_daemon_wait_exit(&x, 10000), 1);
    snprintf(line, sizeof(line), "ERROR Cannot start: the HTTP address %s is already in use", spec);
    assert_true(kvpt_log_wait(&x, line, 1000));
    assert_int_equal(kvpt_log_count(&x, "ERROR"), 1);
    assert_int_equal(kvpt_log_count(&x, "Reserving"), 0);
    assert_false(kvpt_shm_exists(x.shm_name));
    kvpt_daemon_stop(&x);
    close(fd);
}

static void test_bad_value_and_non_loopback(void **state)
{
    (void)state;
    struct kvpt_daemon x;
    const char *bad[] = {"--http", "example.org:80", NULL};
    kvpt_daemon_spawn(&x, NULL, bad);
    assert_int_equal(kvpt_daemon_wait_exit(&x, 10000), 2);
    assert_true(kvpt_log_wait(&x, "invalid http 'example.org:80'", 1000));
    kvpt_daemon_stop(&x);

    /* All interfaces: allowed when asked for, with a warning; loopback is one of them. */
    const char *any[] = {"--l1-size", "16MiB", "--http", "0.0.0.0:0", NULL};
    kvpt_daemon_start(&x, any);
    assert_true(kvpt_log_wait(&x, "is reachable from other hosts: it is unauthenticated", 1000));
    FILE *f = fopen(x.log, "re");
    char buf[512];
    unsigned p = 0;
    while (f && fgets(buf, sizeof(buf), f))
        if (strstr(buf, "HTTP endpoint on http://0.0.0.0:"))
            p = (unsigned)atoi(strstr(buf, "0.0.0.0:") + 8);
    if (f)
        fclose(f);
    assert_true(p > 0);
    struct kvpt_http_reply r;
    assert_rc(kvpt_http_request((uint16_t)p, "GET", "/api/healthcheck", &r), 0);
    assert_int_equal(r.status, 200);
    kvpt_http_free(&r);
    kvpt_daemon_stop(&x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_requests), cmocka_unit_test(test_oversized_requests),
        cmocka_unit_test(test_slow_client),      cmocka_unit_test(test_connection_limit),
        cmocka_unit_test(test_idle_crowd),       cmocka_unit_test(test_trickling_headers),
        cmocka_unit_test(test_port_in_use),      cmocka_unit_test(test_bad_value_and_non_loopback),
    };
    return cmocka_run_group_tests(tests, group_setup, kvpt_group_stop);
}
