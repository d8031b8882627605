/*
 * test_http_page.c - the status page (GET /) in a real browser: Debian's chromium, headless,
 * loads it from a real kvpoold with one worker on the shm transport and one that forced inline,
 * lets its script fetch /api/status (under the page's own Content-Security-Policy), and dumps
 * the DOM it rendered: both instances must be there with their transports, the inline one with
 * its reason, next to the SHM decision and the pool usage. A daemon without shared memory
 * shows why; one whose L2 tier cannot be reached says so, and why.
 *
 * chromium runs with --no-sandbox because the tests run as root, where its sandbox refuses to
 * start. Exit 77 (skipped) only when chromium is not installed (scripts/install-deps.sh check
 * installs it).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/kvp_assert.h"
#include "harness.h"
#include "http_client.h"

#define C 16

static char browser[256];

/* The DOM chromium rendered from http://127.0.0.1:port/ after 5 s of virtual time. */
static char *render(uint16_t port)
{
    char dir[] = "/tmp/kvpt-chromium-XXXXXX", cmd[1024];
    assert_non_null(mkdtemp(dir));
    snprintf(cmd, sizeof(cmd),
             "HOME=%s timeout 120 %s --headless --disable-gpu --no-sandbox --no-first-run "
             "--disable-extensions --user-data-dir=%s --virtual-time-budget=5000 --dump-dom "
             "http://127.0.0.1:%u/ 2>%s/stderr",
             dir, browser, dir, (unsigned)port, dir);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, len = 0;
    char *dom = malloc(cap);
    for (size_t n; (n = fread(dom + len, 1, cap - len - 1, p)) > 0;) {
        len += n;
        if (cap - len < 2) {
            char *bigger = realloc(dom, cap * 2);
            assert_non_null(bigger);
            dom = bigger;
            cap *= 2;
        }
    }
    dom[len] = '\0';
    int status = pclose(p);
    if (status != 0 || len == 0) {
        snprintf(cmd, sizeof(cmd), "tail -n 20 %s/stderr >&2", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "(no chromium stderr)\n");
        fail_msg("chromium exited with status %d and %zu bytes of DOM", status, len);
    }
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
    return dom;
}

/* The <tr> of instance id in the rendered DOM, copied into row. */
static void row_of(const char *dom, const char *id, char *row, size_t size)
{
    char mark[160];
    snprintf(mark, sizeof(mark), "<tr data-instance=\"%s\">", id);
    const char *a = strstr(dom, mark);
    if (!a)
        fail_msg("the page shows no row for instance %s:\n%s", id, dom);
    const char *b = strstr(a, "</tr>");
    assert_non_null(b);
    snprintf(row, size, "%.*s", (int)(b - a), a);
}

static void test_page_shows_both_transports(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size",   "16MiB", "--chunk-size", "16", "--http",
                          "127.0.0.1:0", NULL};
    kvpt_daemon_start(&d, args);
    uint16_t port = kvpt_http_port_in_log(d.log, 5000);
    assert_true(port > 0);

    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts os = kvpt_layout("page-worker-shm", KVP_TRANSPORT_AUTO);
    kvp_register_opts oi = kvpt_layout("page-worker-inline", KVP_TRANSPORT_INLINE);
    kvp_instance *is = NULL, *ii = NULL;
    assert_rc(kvp_register(c, &os, &is), 0);
    assert_rc(kvp_register(c, &oi, &ii), 0);
    assert_int_equal(kvp_instance_get_info(is)->transport, KVP_TRANSPORT_SHM);
    assert_int_equal(kvpt_store_seq(is, 1, 3), 3);
    assert_int_equal(kvpt_store_seq(ii, 2, 2), 2);

    char *dom = render(port);
    char row[4096];
    row_of(dom, "page-worker-shm", row, sizeof(row));
    assert_non_null(strstr(row, "data-transport=\"shm\">shm</td>"));
    assert_non_null(strstr(row, "class=\"instance-id\">page-worker-shm</td>"));
    row_of(dom, "page-worker-inline", row, sizeof(row));
    assert_non_null(strstr(row, "data-transport=\"inline\">inline</td>"));
    assert_non_null(strstr(row, "requested by worker"));
    /* The SHM decision, the pool, the count of instances. */
    assert_non_null(strstr(dom, "<span id=\"shm-state\" class=\"on\">SHM enabled</span>"));
    assert_non_null(strstr(dom, d.shm_name));
    assert_non_null(strstr(dom, "<span id=\"instance-count\">2</span>"));
    assert_non_null(strstr(dom, "5 chunks stored"));
    /* Every refresh succeeded: the error line is still hidden and empty. */
    assert_non_null(strstr(dom, "<p class=\"error\" id=\"error\" hidden=\"\"></p>"));
    free(dom);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

static void test_page_shows_why_shm_is_off(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "16MiB",  "--chunk-size", "16", "--shm-name",
                          "",          "--http", "127.0.0.1:0",  NULL};
    kvpt_daemon_start(&d, args);
    uint16_t port = kvpt_http_port_in_log(d.log, 5000);
    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts o = kvpt_layout("page-no-shm", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_rc(kvp_register(c, &o, &inst), 0);

    char *dom = render(port);
    char row[4096];
    assert_non_null(strstr(dom, "<span id=\"shm-state\" class=\"off\">SHM disabled</span>"));
    assert_non_null(strstr(dom, "<span id=\"shm-reason\">SHM disabled by configuration</span>"));
    row_of(dom, "page-no-shm", row, sizeof(row));
    assert_non_null(strstr(row, "data-transport=\"inline\">inline</td>"));
    assert_non_null(strstr(row, "SHM disabled by configuration"));
    free(dom);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

/* An L2 tier that cannot be reached: the page says so, with the reason. */
static void test_page_shows_l2_down(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    char url[160];
    snprintf(url, sizeof(url), "unix:///tmp/kvpt-no-redis-%d/redis.sock", (int)getpid());
    const char *args[] = {"--l1-size", "16MiB",  "--chunk-size", "16", "--l2",
                          url,         "--http", "127.0.0.1:0",  NULL};
    kvpt_daemon_start(&d, args);
    uint16_t port = kvpt_http_port_in_log(d.log, 5000);
    assert_true(kvpt_log_wait(&d, "unreachable", 5000));

    char *dom = render(port);
    assert_non_null(
        strstr(dom, "<span id=\"l2-state\" class=\"off\" data-state=\"down\">L2 down</span>"));
    assert_non_null(strstr(dom, "<span id=\"l2-reason\">connect: "));
    assert_non_null(strstr(dom, "<h2 id=\"l2-title\">L2 tier</h2>"));
    free(dom);
    kvpt_daemon_stop(&d);
}

int main(void)
{
    FILE *p = popen("command -v chromium || command -v chromium-browser", "r");
    if (!p || !fgets(browser, sizeof(browser), p) || !browser[0]) {
        fprintf(stderr, "skipped: chromium not found; it renders the status page (Debian "
                        "package chromium: scripts/install-deps.sh check installs it)\n");
        if (p)
            pclose(p);
        return 77;
    }
    pclose(p);
    browser[strcspn(browser, "\n")] = '\0';
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_page_shows_both_transports),
        cmocka_unit_test(test_page_shows_why_shm_is_off),
        cmocka_unit_test(test_page_shows_l2_down),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
