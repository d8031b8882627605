/*
 * test_http.c - the HTTP endpoint (http.c) inside the test process, over real TCP: the --http
 * option (its values: test_listen_addr.c), every path's answer while starting, serving and
 * stopping, the methods and paths that are refused, a port in use, and the status page's
 * Content-Security-Policy (the hashes it names are those of the page's own style and script).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <sodium.h>

#include "base/config.h"
#include "common/kvp_assert.h"
#include "core/stats.h"
#include "http/http.h"
#include "http_client.h"
#include "server_fixture.h"

/* Runs the option parser on args; returns its result, with what it printed in out and err. */
static int parse(struct kvp_config *cfg, const char *const *args, char **out, char **err)
{
    char *argv[16];
    int argc = 0;
    size_t on, en;
    argv[argc++] = (char *)"kvpoold";
    for (; args[argc - 1]; argc++)
        argv[argc] = (char *)args[argc - 1];
    argv[argc] = NULL;
    FILE *fo = open_memstream(out, &on), *fe = open_memstream(err, &en);
    kvp_config_defaults(cfg);
    int rc = kvp_config_parse(cfg, argc, argv, fo, fe);
    fclose(fo);
    fclose(fe);
    return rc;
}

static void test_option(void **state)
{
    (void)state;
    struct kvp_config cfg;
    char *out, *err;

    kvp_config_defaults(&cfg);
    assert_string_equal(cfg.http, KVP_HTTP_DEFAULT);
    assert_string_equal(KVP_HTTP_DEFAULT, "127.0.0.1:9190");

    unsetenv("KVPOOL_HTTP");
    assert_rc(parse(&cfg, (const char *const[]){"--http", "off", NULL}, &out, &err), 0);
    assert_string_equal(cfg.http, "off");
    free(out), free(err);

    setenv("KVPOOL_HTTP", "[::1]:0", 1);
    assert_rc(parse(&cfg, (const char *const[]){NULL}, &out, &err), 0);
    assert_string_equal(cfg.http, "[::1]:0");
    free(out), free(err);
    /* The command line wins over the environment. */
    assert_rc(parse(&cfg, (const char *const[]){"--http", "9999", NULL}, &out, &err), 0);
    assert_string_equal(cfg.http, "9999");
    free(out), free(err);
    unsetenv("KVPOOL_HTTP");

    assert_rc(parse(&cfg, (const char *const[]){"--http", "example.org:80", NULL}, &out, &err),
              -EINVAL);
    assert_non_null(strstr(err, "invalid http 'example.org:80'"));
    free(out), free(err);

    assert_rc(parse(&cfg, (const char *const[]){"--help", NULL}, &out, &err), 1);
    assert_non_null(strstr(out, "--http ADDR:PORT"));
    assert_non_null(strstr(out, "KVPOOL_HTTP"));
    assert_non_null(strstr(out, "Default: 127.0.0.1:9190"));
    free(out), free(err);
}

/* A request; returns the status code, the body in *body (caller frees) if body is non-NULL and
 * the Content-Type in ctype (128 bytes) if ctype is non-NULL. */
static int get(uint16_t port, const char *method, const char *path, char **body, char *ctype)
{
    struct kvpt_http_reply r;
    assert_rc(kvpt_http_request(port, method, path, &r), 0);
    if (ctype && !kvpt_http_header(&r, "Content-Type", ctype, 128))
        snprintf(ctype, 128, "(none)");
    if (body)
        *body = strdup(r.body);
    kvpt_http_free(&r);
    return r.status;
}

/* Before kvp_server_start() has finished, and once a stop is asked: 503 with the reason. */
static void test_starting_and_stopping(void **state)
{
    (void)state;
    struct kvp_server s;
    struct kvp_config cfg;
    char *body, ctype[128];

    fx_config(&cfg, false, "127.0.0.1:0");
    assert_rc(kvp_server_init(&s, &cfg), 0);
    assert_rc(kvp_http_start(&s), 0);
    uint16_t port = kvp_http_port(&s);
    assert_true(port > 0);

    assert_int_equal(get(port, "GET", "/api/healthcheck", &body, ctype), 503);
    assert_string_equal(ctype, "application/json");
    assert_non_null(strstr(body, "\"status\": \"unhealthy\""));
    assert_non_null(strstr(body, "starting"));
    free(body);
    assert_int_equal(get(port, "GET", "/api/status", &body, NULL), 503);
    json_t *st = json_loads(body, 0, NULL);
    assert_non_null(st);
    assert_string_equal(json_string_value(json_object_get(st, "state")), "starting");
    assert_null(json_object_get(st, "pool"));
    json_decref(st);
    free(body);
    assert_int_equal(get(port, "GET", "/metrics", NULL, NULL), 503);
    assert_int_equal(get(port, "GET", "/", NULL, ctype), 200);
    assert_string_equal(ctype, "text/html; charset=utf-8");

    atomic_store(&s.stopping, true);
    assert_int_equal(get(port, "GET", "/api/healthcheck", &body, NULL), 503);
    assert_non_null(strstr(body, "\"reason\": \"stopping\""));
    free(body);

    kvp_http_stop(&s);
    assert_int_equal(kvp_http_port(&s), 0);
    assert_rc(kvpt_http_connect(port), -ECONNREFUSED);
    fx_server_stop(&s);
}

static void test_serving(void **state)
{
    (void)state;
    struct kvp_server s;
    char *body, ctype[128], h[256];
    struct kvpt_http_reply r;

    fx_server_start_http(&s, true, "127.0.0.1:0");
    uint16_t port = kvp_http_port(&s);
    uint64_t c0[KVP_NCOUNTERS], c1[KVP_NCOUNTERS];
    kvp_counters_read(c0);

    assert_int_equal(get(port, "GET", "/api/healthcheck", &body, ctype), 200);
    assert_string_equal(body, "{\"status\": \"healthy\"}\n");
    assert_string_equal(ctype, "application/json");
    free(body);

    assert_int_equal(get(port, "GET", "/api/status", &body, ctype), 200);
    json_t *st = json_loads(body, 0, NULL);
    assert_non_null(st);
    assert_string_equal(json_string_value(json_object_get(st, "state")), "serving");
    assert_int_equal(json_integer_value(
                         json_object_get(json_object_get(st, "pool"), "capacity_bytes")),
                     FX_POOL);
    json_decref(st);
    free(body);

    assert_int_equal(get(port, "GET", "/metrics", &body, ctype), 200);
    assert_string_equal(ctype, "text/plain; version=0.0.4; charset=utf-8");
    assert_non_null(strstr(body, "\nkvpool_pool_capacity_bytes 1048576\n"));
    free(body);

    /* HEAD: the headers of GET, no body. */
    assert_rc(kvpt_http_request(port, "HEAD", "/api/status", &r), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, 0);
    kvpt_http_free(&r);

    /* A query string does not change the path. */
    assert_int_equal(get(port, "GET", "/api/healthcheck?verbose=1", NULL, NULL), 200);

    assert_int_equal(get(port, "GET", "/nope", &body, ctype), 404);
    assert_string_equal(ctype, "application/json");
    assert_non_null(strstr(body, "/api/status"));
    free(body);
    assert_int_equal(get(port, "GET", "/api/status/", NULL, NULL), 404);
    assert_int_equal(get(port, "GET", "/../etc/passwd", NULL, NULL), 404);

    for (const char *m = "POST\0PUT\0DELETE\0PATCH\0OPTIONS\0BREW\0"; *m; m += strlen(m) + 1) {
        assert_rc(kvpt_http_request(port, m, "/api/status", &r), 0);
        if (r.status != 405)
            fail_msg("%s answered %d", m, r.status);
        assert_non_null(kvpt_http_header(&r, "Allow", h, sizeof(h)));
        assert_string_equal(h, "GET, HEAD");
        kvpt_http_free(&r);
    }

    kvp_counters_read(c1);
    assert_int_equal(c1[KVP_CTR_http_requests] - c0[KVP_CTR_http_requests], 14);
    assert_int_equal(c1[KVP_CTR_http_errors] - c0[KVP_CTR_http_errors], 9);
    fx_server_stop(&s);
}

/* 'sha256-<base64>' of the text between open and close in page. */
static void inline_hash(const char *page, const char *open, const char *close, char *out)
{
    const char *a = strstr(page, open);
    assert_non_null(a);
    a += strlen(open);
    const char *b = strstr(a, close);
    assert_non_null(b);
    unsigned char d[crypto_hash_sha256_BYTES];
    char b64[64];
    crypto_hash_sha256(d, (const unsigned char *)a, (unsigned long long)(b - a));
    sodium_bin2base64(b64, sizeof(b64), d, sizeof(d), sodium_base64_VARIANT_ORIGINAL);
    sprintf(out, "'sha256-%s'", b64);
}

static int count(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + 1, what))
        n++;
    return n;
}

static void test_page_and_csp(void **state)
{
    (void)state;
    struct kvp_server s;
    struct kvpt_http_reply r;
    char csp[1024], h[256], script[80], style[80];

    fx_server_start_http(&s, true, "127.0.0.1:0");
    assert_rc(kvpt_http_request(kvp_http_port(&s), "GET", "/", &r), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(kvpt_http_header(&r, "Content-Security-Policy", csp, sizeof(csp)));
    assert_int_equal(sodium_init() < 0, 0);
    inline_hash(r.body, "<script>", "</script>", script);
    inline_hash(r.body, "<style>", "</style>", style);
    assert_non_null(strstr(csp, "default-src 'none'"));
    char want[200];
    snprintf(want, sizeof(want), "script-src %s;", script);
    assert_non_null(strstr(csp, want));
    snprintf(want, sizeof(want), "style-src %s;", style);
    assert_non_null(strstr(csp, want));
    assert_non_null(strstr(csp, "connect-src 'self'"));
    assert_non_null(strstr(csp, "frame-ancestors 'none'"));
    assert_null(strstr(csp, "unsafe"));
    assert_non_null(kvpt_http_header(&r, "X-Frame-Options", h, sizeof(h)));
    /* Self-contained: one style and one script of its own, nothing loaded from elsewhere. */
    assert_int_equal(count(r.body, "<script"), 1);
    assert_int_equal(count(r.body, "<style"), 1);
    assert_int_equal(count(r.body, "src="), 0);
    assert_int_equal(count(r.body, "href="), 0);
    assert_int_equal(count(r.body, "@import"), 0);
    assert_int_equal(count(r.body, "url("), 0);
    assert_non_null(strstr(r.body, "fetch(\"/api/status\""));
    kvpt_http_free(&r);
    fx_server_stop(&s);
}

/* A port that cannot be bound fails kvp_http_start() (the start-up) with the errno. */
static void test_port_in_use(void **state)
{
    (void)state;
    struct kvp_server s;
    struct kvp_config cfg;
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof(a);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(fd, 1), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    char spec[32];
    snprintf(spec, sizeof(spec), "127.0.0.1:%u", (unsigned)ntohs(a.sin_port));

    kvp_log_threshold = (enum kvp_log_level)(KVP_LOG_ERROR + 1); /* the ERROR is expected */
    fx_config(&cfg, false, spec);
    assert_rc(kvp_server_init(&s, &cfg), 0);
    assert_rc(kvp_http_start(&s), -EADDRINUSE);
    assert_null(s.http);
    fx_server_stop(&s);
    close(fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_option),      cmocka_unit_test(test_starting_and_stopping),
        cmocka_unit_test(test_serving),     cmocka_unit_test(test_page_and_csp),
        cmocka_unit_test(test_port_in_use),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
