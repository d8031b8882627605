/*
 * test_http_page.c - the status page (GET /) in a real browser: Debian's chromium, headless,
 * loads it from a real kvpoold with one worker on the shm transport and one that forced inline,
 * lets its script fetch /api/status (under the page's own Content-Security-Policy), and dumps
 * the DOM it rendered: both instances must be there with their transports, the inline one with
 * its reason, next to the SHM decision and the pool usage, each with its front end. A daemon
 * without shared memory shows why; one whose L2 tier cannot be reached says so, and why.
 * Instances of another front end and transports the page has no style for are also rendered
 * from a copy served by a small static server (python3's http.server) with a real status
 * document completed by hand, to show that it names them as the daemon does. How the daemon
 * started: a fresh one says it started cold; one started again after a SIGKILL says it adopted
 * the chunks of the dead one (of its pid, after a crash) and how many are still to verify.
 *
 * chromium runs with --no-sandbox because the tests run as root, where its sandbox refuses to
 * start. Exit 77 (skipped) only when chromium is not installed (scripts/install-deps.sh check
 * installs it).
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
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
    assert_non_null(strstr(row, "<td class=\"front-end\">kvpool</td>"));
    row_of(dom, "page-worker-inline", row, sizeof(row));
    assert_non_null(strstr(row, "data-transport=\"inline\">inline</td>"));
    assert_non_null(strstr(row, "requested by worker"));
    assert_non_null(strstr(row, "<td class=\"front-end\">kvpool</td>"));
    /* The SHM decision, the pool, the count of instances. */
    assert_non_null(strstr(dom, "<span id=\"shm-state\" class=\"on\">SHM enabled</span>"));
    assert_non_null(strstr(dom, d.shm_name));
    assert_non_null(strstr(dom, "<span id=\"instance-count\">2</span>"));
    assert_non_null(strstr(dom, "5 chunks stored"));
    /* A fresh daemon: nothing was left to adopt. */
    assert_non_null(strstr(dom, "<p id=\"warm-restart\" data-kind=\"cold\">Warm restart: on, "
                                "cold start ("));
    /* Every refresh succeeded: the error line is still hidden and empty. */
    assert_non_null(strstr(dom, "<p class=\"error\" id=\"error\" hidden=\"\"></p>"));
    free(dom);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

/* A daemon started again after a SIGKILL adopts the dead one's chunks: the page says so, with
 * the dead daemon's pid, and counts the chunks not read since (all of them). */
static void test_page_shows_warm_restart(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "16MiB", "--chunk-size", "16", NULL};
    const char *again[] = {"--l1-size",   "16MiB", "--chunk-size", "16", "--http",
                           "127.0.0.1:0", NULL};
    kvpt_daemon_start(&d, args);
    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts o = kvpt_layout("page-warm", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_rc(kvp_register(c, &o, &inst), 0);
    assert_int_equal(kvpt_store_seq(inst, 1, 3), 3);
    kvp_client_close(c);
    int dead = (int)d.pid;
    assert_int_equal(kvpt_daemon_signal_wait(&d, SIGKILL), 128 + SIGKILL);
    kvpt_daemon_restart(&d, again);
    uint16_t port = kvpt_http_port_in_log(d.log, 5000);
    assert_true(port > 0);

    char *dom = render(port), want[256];
    /* 3 chunks of 8 KiB (kvpt_layout at --chunk-size 16). */
    snprintf(want, sizeof(want),
             "<p id=\"warm-restart\" data-kind=\"adopted\">Warm restart: adopted 3 chunks "
             "(24.0 KiB) of pid %d after a crash in ",
             dead);
    if (!strstr(dom, want))
        fail_msg("the page does not show '%s':\n%s", want, dom);
    assert_non_null(strstr(dom, " ms, 0 dropped; 3 to verify, 0 corrupt</p>"));
    free(dom);
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
    /* Without --lmcache: says so, and how to turn it on; the totals of every front end. */
    assert_non_null(
        strstr(dom, "<p id=\"lmcache-state\">Off (kvpoold --lmcache ADDR serves it)</p>"));
    assert_non_null(strstr(dom, "Since the start: "));
    /* Turned off by the configuration: not degraded. */
    assert_non_null(strstr(dom, "<div class=\"box\" id=\"health-box\" hidden=\"\">"));
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
    /* The daemon is degraded, and the page says why at the top. */
    assert_non_null(strstr(dom, "<div class=\"box\" id=\"health-box\">"));
    assert_non_null(strstr(dom, "<li class=\"health-reason\">l2 down: connect: "));
    free(dom);
    kvpt_daemon_stop(&d);
}

/* Writes len bytes of text to path; fails the test otherwise. */
static void write_file(const char *path, const char *text, size_t len)
{
    FILE *f = fopen(path, "we");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* A status-list entry as the daemon renders it, for the document completed by hand. */
static json_t *fake_instance(const char *id, const char *front_end, const char *transport,
                             const char *reason)
{
    return json_pack("{s:s, s:s, s:i, s:i, s:s, s:s, s:s?, s:s, s:n, s:s, s:i, s:i, s:i, s:i}",
                     "instance_id", id, "model_name", "m", "world_size", 2, "worker_rank", 1,
                     "dtype", "bfloat16", "transport", transport, "fallback_reason", reason,
                     "front_end", front_end, "pid", "connected_since", "2026-12-02T12:31:15.714Z",
                     "stored_chunks", 0, "stored_bytes", 0, "retrieved_chunks", 0,
                     "retrieved_bytes", 0);
}

/*
 * The page names what a second front end registers as the daemon does: an LMCache instance on
 * the pickle transport with its reason, one on a transport no daemon has yet (a name with a
 * space, which must not become two classes), and the LMCache clients in the summary. The page
 * and a real /api/status come from a daemon; the status gets those instances and clients added,
 * and both are served by python3's http.server.
 */
static void test_page_shows_other_front_ends(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    struct kvpt_http_reply r;
    const char *args[] = {"--l1-size",   "16MiB", "--chunk-size", "16", "--http",
                          "127.0.0.1:0", NULL};
    char dir[] = "/tmp/kvpt-page-XXXXXX", path[256], cmd[1024];

    if (system("python3 -c 'import http.server' >/dev/null 2>&1") != 0) {
        fprintf(stderr, "note: python3 with http.server not found; skipping this part\n");
        return;
    }
    kvpt_daemon_start(&d, args);
    uint16_t port = kvpt_http_port_in_log(d.log, 5000);
    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts o = kvpt_layout("page-native", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_rc(kvp_register(c, &o, &inst), 0);

    assert_non_null(mkdtemp(dir));
    assert_rc(kvpt_http_request(port, "GET", "/", &r), 0);
    assert_int_equal(r.status, 200);
    snprintf(path, sizeof(path), "%s/index.html", dir);
    write_file(path, r.body, r.body_len);
    kvpt_http_free(&r);
    int status = 0;
    json_t *st = kvpt_http_json(port, "/api/status", &status);
    assert_non_null(st);
    json_t *list = json_object_get(st, "instances");
    json_array_append_new(list, fake_instance("lmc-pickle", "lmcache", "pickle",
                                              "no shared memory in the worker"));
    json_array_append_new(list, fake_instance("lmc-later", "lmcache", "rdma v2", NULL));
    json_t *clients = json_object_get(json_object_get(st, "clients"), "list");
    for (int i = 0; i < 2; i++)
        json_array_append_new(clients,
                              json_pack("{s:i, s:s, s:n, s:i, s:s, s:i}", "id", 100 + i,
                                        "front_end", "lmcache", "pid", "uid", 0, "connected_since",
                                        "2026-12-02T12:31:15.714Z", "instances", 1));
    /* The count by front end that the page shows, and the front end itself, as a daemon with
     * --lmcache would give them. */
    json_object_set_new(json_object_get(json_object_get(st, "clients"), "by_front_end"), "lmcache",
                        json_integer(2));
    json_object_set_new(st, "lmcache",
                        json_pack("{s:s, s:i, s:i, s:i}", "address", "tcp://127.0.0.1:5555",
                                  "instances", 2, "clients", 2, "requests", 17));
    json_object_set_new(json_object_get(st, "counters"), "lmcache_replies_refused",
                        json_integer(3));
    char *text = json_dumps(st, 0);
    json_decref(st);
    snprintf(path, sizeof(path), "%s/api", dir);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof(path), "%s/api/status", dir);
    write_file(path, text, strlen(text));
    free(text);

    /* The static server, on a port of the kernel's choice that it writes to a file. */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        snprintf(cmd, sizeof(cmd),
                 "import functools, http.server, sys\n"
                 "d = sys.argv[1]\n"
                 "class H(http.server.SimpleHTTPRequestHandler):\n"
                 "    def log_message(self, *a): pass\n"
                 "s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), "
                 "functools.partial(H, directory=d))\n"
                 "open(d + '/port.tmp', 'w').write(str(s.server_address[1]))\n"
                 "__import__('os').rename(d + '/port.tmp', d + '/port')\n"
                 "s.serve_forever()\n");
        execlp("python3", "python3", "-c", cmd, dir, (char *)NULL);
        _exit(127);
    }
    unsigned fake_port = 0;
    snprintf(path, sizeof(path), "%s/port", dir);
    for (int i = 0; i < 1000 && !fake_port; i++) {
        FILE *f = fopen(path, "re");
        if (f) {
            if (fscanf(f, "%u", &fake_port) != 1)
                fake_port = 0;
            fclose(f);
        }
        if (!fake_port)
            usleep(10000);
    }
    if (!fake_port) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        fail_msg("the static server did not start");
    }

    char *dom = render((uint16_t)fake_port);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    char row[4096];
    row_of(dom, "page-native", row, sizeof(row));
    assert_non_null(strstr(row, "<td class=\"front-end\">kvpool</td>"));
    row_of(dom, "lmc-pickle", row, sizeof(row));
    assert_non_null(strstr(row, "<td class=\"front-end\">lmcache</td>"));
    assert_non_null(
        strstr(row, "class=\"transport-pickle\" data-transport=\"pickle\">pickle</td>"));
    assert_non_null(strstr(row, "no shared memory in the worker"));
    row_of(dom, "lmc-later", row, sizeof(row));
    assert_non_null(
        strstr(row, "class=\"transport-other\" data-transport=\"rdma v2\">rdma v2</td>"));
    assert_non_null(strstr(dom, "<span id=\"instance-count\">3</span>"));
    assert_non_null(strstr(dom, "1 of 256 clients connected, lmcache 2, socket "));
    assert_non_null(strstr(dom, "<p id=\"lmcache-state\">Serving tcp://127.0.0.1:5555: 2 "
                                "instances, 17 requests</p>"));
    assert_non_null(strstr(dom, "Refused: 3 prepares (unread replies)"));
    assert_non_null(strstr(dom, "<p class=\"error\" id=\"error\" hidden=\"\"></p>"));
    free(dom);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
    kvp_client_close(c);
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
        cmocka_unit_test(test_page_shows_other_front_ends),
        cmocka_unit_test(test_page_shows_warm_restart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
