/*
 * test_log.c - the daemon's logger (src/server/base/log.h): line format (text, and json decoded
 * with jansson) and the per-call-site rate limit of log_warn_rl() and friends.
 *
 * Log lines go to stderr with one write(2) each; every case redirects stderr into a pipe
 * (dup2) for the time of the calls, then reads back what was written and counts lines.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "common/kvp_assert.h"

/* Captured stderr. */
struct capture {
    int pipe_rd, saved_fd;
    char text[65536];
};

static void capture_begin(struct capture *c)
{
    int p[2];
    assert_rc(pipe2(p, O_CLOEXEC), 0);
    /* Read only at the end of a case: the pipe must hold everything written until then. */
    assert_rc(fcntl(p[1], F_SETPIPE_SZ, 1 << 20) >= 0, 1);
    c->saved_fd = dup(STDERR_FILENO);
    assert_true(c->saved_fd >= 0);
    assert_rc(dup2(p[1], STDERR_FILENO), STDERR_FILENO);
    close(p[1]);
    c->pipe_rd = p[0];
}

/* Restores stderr; the pipe's last write end is then closed, so the read ends at EOF. */
static void capture_end(struct capture *c)
{
    assert_rc(dup2(c->saved_fd, STDERR_FILENO), STDERR_FILENO);
    close(c->saved_fd);
    size_t len = 0;
    for (;;) {
        ssize_t n = read(c->pipe_rd, c->text + len, sizeof(c->text) - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    c->text[len] = '\0';
    close(c->pipe_rd);
}

static int count(const char *text, const char *s)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, s)); p += strlen(s))
        n++;
    return n;
}

static int lines(const char *text)
{
    return count(text, "\n");
}

static void test_line_format(void **state)
{
    (void)state;
    struct capture c;
    kvp_log_threshold = KVP_LOG_INFO;
    capture_begin(&c);
    log_info("hello %d", 42);
    log_debug("not shown");
    log_warn("careful");
    capture_end(&c);
    assert_rc(lines(c.text), 2);
    /* 2026-12-02T12:00:00.123Z INFO  hello 42 */
    assert_rc(c.text[4] == '-' && c.text[10] == 'T' && c.text[23] == 'Z', 1);
    assert_non_null(strstr(c.text, "Z INFO  hello 42\n"));
    assert_non_null(strstr(c.text, "Z WARN  careful\n"));
    assert_null(strstr(c.text, "not shown"));
}

/*
 * A value a worker chose (instance id, model name, fallback reason) cannot forge a line: every
 * control byte, C1 control and invalid byte of the message is escaped, the line stays one line.
 */
static void test_text_escapes(void **state)
{
    (void)state;
    struct capture c;
    const char *model = "m\n2026-12-02T12:00:00.000Z ERROR forged\r\x1b[31mred\x7f";
    kvp_log_threshold = KVP_LOG_INFO;
    capture_begin(&c);
    log_info("Instance %s registered", model);
    log_warn("%s", "csi \xc2\x9b"
                   "31m, bad \xff\xc3 end, bidi \xe2\x80\xae, tab\t, back\\slash");
    log_info("%s", "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80");
    capture_end(&c);
    assert_rc(lines(c.text), 3);
    assert_null(strchr(c.text, '\r'));
    assert_null(strchr(c.text, '\x1b'));
    assert_null(strchr(c.text, '\x7f'));
    assert_null(strstr(c.text, "\xc2\x9b"));
    assert_null(strstr(c.text, "\xff"));
    assert_non_null(strstr(c.text, "Z INFO  Instance m\\n2026-12-02T12:00:00.000Z ERROR forged"
                                   "\\r\\x1b[31mred\\x7f registered\n"));
    assert_non_null(strstr(c.text, "Z WARN  csi \\u009b31m, bad \\xff\\xc3 end, bidi \\u202e, "
                                   "tab\\t, back\\\\slash\n"));
    /* Well-formed UTF-8 text is left alone. */
    assert_non_null(strstr(c.text, "Z INFO  caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac "
                                   "\xf0\x9f\x98\x80\n"));
}

/* The escape is cut at a whole character or escape, and always NUL-terminated. */
static void test_escape_bounds(void **state)
{
    (void)state;
    char out[8];
    assert_rc(kvp_log_escape(out, sizeof(out), "abc\n\n", 5), 7);
    assert_string_equal(out, "abc\\n\\n");
    assert_rc(kvp_log_escape(out, sizeof(out), "abcd\x01", 5), 4);
    assert_string_equal(out, "abcd");
    assert_rc(kvp_log_escape(out, sizeof(out), "abcde\xc3\xa9", 7), 7);
    assert_string_equal(out, "abcde\xc3\xa9");
    assert_rc(kvp_log_escape(out, sizeof(out), "abcdef\xc3\xa9", 8), 6);
    assert_string_equal(out, "abcdef");
    /* A truncated sequence at the end of the message is bytes, not a character. */
    assert_rc(kvp_log_escape(out, sizeof(out), "\xe6\x97", 2), 4);
    assert_string_equal(out, "\\xe6");
    /* Overlong forms and surrogates are not UTF-8. */
    assert_rc(kvp_log_escape(out, sizeof(out), "\xc0\xaf", 2), 4);
    assert_string_equal(out, "\\xc0");
}

/* The next line of text (advancing *p), decoded as a JSON object; fails the test otherwise. */
static json_t *next_json(const char **p)
{
    json_error_t e;
    const char *nl = strchr(*p, '\n');
    assert_non_null(nl);
    json_t *o = json_loadb(*p, (size_t)(nl - *p), 0, &e);
    if (!o || !json_is_object(o))
        fail_msg("not a JSON object (%s): %.*s", e.text, (int)(nl - *p), *p);
    *p = nl + 1;
    return o;
}

static const char *str_of(json_t *o, const char *key)
{
    const char *v = json_string_value(json_object_get(o, key));
    if (!v)
        fail_msg("no string \"%s\" in the object", key);
    return v;
}

/* ts is ISO 8601 in UTC with milliseconds, the text lines' stamp. */
static void assert_ts(const char *ts)
{
    int y, mo, d, h, mi, s, ms;
    char z;
    assert_rc(strlen(ts), 24);
    assert_rc(sscanf(ts, "%4d-%2d-%2dT%2d:%2d:%2d.%3d%c", &y, &mo, &d, &h, &mi, &s, &ms, &z), 8);
    assert_true(z == 'Z' && y >= 2024 && mo >= 1 && mo <= 12 && ms >= 0 && ms <= 999);
}

static void test_json_format(void **state)
{
    (void)state;
    struct capture c;
    const struct kvp_log_field f[] = {KVP_LOG_STR("socket", "/tmp/\"q\".sock"),
                                      KVP_LOG_NUM("pool_bytes", 1ull << 40)};
    char big[3000];

    memset(big, 'y', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    kvp_log_threshold = KVP_LOG_INFO;
    kvp_log_set_format(KVP_LOG_JSON);
    capture_begin(&c);
    log_info("hello %d", 42);
    log_debug("not shown");
    /* Everything JSON must escape, and a byte that is not UTF-8. */
    log_warn("quote \" backslash \\ tab \t newline \n bell \a bad \xff end");
    kvp_log_fields(KVP_LOG_ERROR, f, "with %s", "fields");
    log_info("%s", big);
    capture_end(&c);
    kvp_log_set_format(KVP_LOG_TEXT);

    assert_rc(lines(c.text), 4);
    const char *p = c.text;
    json_t *o = next_json(&p);
    assert_ts(str_of(o, "ts"));
    assert_string_equal(str_of(o, "level"), "info");
    assert_string_equal(str_of(o, "msg"), "hello 42");
    assert_rc(json_integer_value(json_object_get(o, "pid")), getpid());
    /* The order a reader sees first: ts, level, msg. */
    assert_true(strncmp(c.text, "{\"ts\":", 6) == 0);
    json_decref(o);

    o = next_json(&p);
    assert_string_equal(str_of(o, "level"), "warn");
    assert_string_equal(str_of(o, "msg"), "quote \" backslash \\ tab \t newline \n bell \a bad "
                                          "\xef\xbf\xbd end");
    json_decref(o);

    o = next_json(&p);
    assert_string_equal(str_of(o, "level"), "error");
    assert_string_equal(str_of(o, "msg"), "with fields");
    assert_string_equal(str_of(o, "socket"), "/tmp/\"q\".sock");
    assert_rc(json_integer_value(json_object_get(o, "pool_bytes")), 1ll << 40);
    json_decref(o);

    /* A message too long for a line is cut like a text one, and still valid JSON. */
    o = next_json(&p);
    assert_rc(strlen(str_of(o, "msg")), 2047);
    json_decref(o);
}

/* The rate limiter's report carries its count and kind as fields. */
static void test_json_report(void **state)
{
    (void)state;
    static struct kvp_log_rl rl = KVP_LOG_RL_INIT(KVP_LOG_WARN, "stalled %d");
    struct capture c;

    for (int i = 0; i < KVP_LOG_RL_BURST + 2; i++)
        kvp_log_rl_admit(&rl, 9000);
    kvp_log_set_format(KVP_LOG_JSON);
    capture_begin(&c);
    assert_rc(kvp_log_rl_flush(9000 + KVP_LOG_RL_WINDOW_MS), 1);
    capture_end(&c);
    kvp_log_set_format(KVP_LOG_TEXT);
    const char *p = c.text;
    json_t *o = next_json(&p);
    assert_string_equal(str_of(o, "msg"), "suppressed 2 similar messages (stalled %d)");
    assert_rc(json_integer_value(json_object_get(o, "suppressed")), 2);
    assert_string_equal(str_of(o, "kind"), "stalled %d");
    json_decref(o);
}

static void test_parse_format(void **state)
{
    (void)state;
    enum kvp_log_format f = KVP_LOG_JSON;
    assert_rc(kvp_log_parse_format("text", &f), 0);
    assert_int_equal(f, KVP_LOG_TEXT);
    assert_rc(kvp_log_parse_format("json", &f), 0);
    assert_int_equal(f, KVP_LOG_JSON);
    assert_rc(kvp_log_parse_format("Json", &f), -EINVAL);
    assert_rc(kvp_log_parse_format("", &f), -EINVAL);
    assert_int_equal(f, KVP_LOG_JSON);
}

/* Explicit clock: a burst within one window, then the next window. */
static void test_burst_then_report(void **state)
{
    (void)state;
    static struct kvp_log_rl rl = KVP_LOG_RL_INIT(KVP_LOG_WARN, "bad frame from %d");
    struct capture c;
    int admitted = 0;

    capture_begin(&c);
    for (int i = 0; i < 50; i++)
        admitted += kvp_log_rl_admit(&rl, 1000 + (uint64_t)i);
    capture_end(&c);
    assert_rc(admitted, KVP_LOG_RL_BURST);
    assert_rc(lines(c.text), 0); /* the count waits for the end of the window */

    /* Still inside the window: the flush reports nothing yet. */
    capture_begin(&c);
    assert_rc(kvp_log_rl_flush(1000 + KVP_LOG_RL_WINDOW_MS - 1), 0);
    capture_end(&c);
    assert_rc(lines(c.text), 0);

    /* The next window: one report line, then the line is admitted again. */
    capture_begin(&c);
    assert_true(kvp_log_rl_admit(&rl, 1000 + KVP_LOG_RL_WINDOW_MS));
    capture_end(&c);
    assert_rc(lines(c.text), 1);
    assert_non_null(strstr(c.text, "WARN  suppressed 45 similar messages (bad frame from %d)"));

    /* Nothing is reported twice. */
    capture_begin(&c);
    assert_rc(kvp_log_rl_flush(1000 + 10 * KVP_LOG_RL_WINDOW_MS), 0);
    capture_end(&c);
    assert_rc(lines(c.text), 0);
}

/*
 * A thread reads the clock before it takes the site's lock, so a line can arrive with a clock
 * older than the window another thread has just started: it belongs to that window (the
 * difference must not wrap around into "the window is over"), and so does a flush's.
 */
static void test_clock_older_than_window(void **state)
{
    (void)state;
    static struct kvp_log_rl rl = KVP_LOG_RL_INIT(KVP_LOG_WARN, "late clock %d");
    struct capture c;
    int admitted = 0;

    capture_begin(&c);
    for (int i = 0; i < KVP_LOG_RL_BURST + 3; i++)
        admitted += kvp_log_rl_admit(&rl, 50000);
    /* Older clocks: still the same window, still suppressed. */
    admitted += kvp_log_rl_admit(&rl, 49999);
    admitted += kvp_log_rl_admit(&rl, 40000);
    capture_end(&c);
    assert_rc(admitted, KVP_LOG_RL_BURST);
    assert_rc(lines(c.text), 0);
    capture_begin(&c);
    assert_rc(kvp_log_rl_flush(49999), 0);
    capture_end(&c);
    assert_rc(lines(c.text), 0);
    capture_begin(&c);
    assert_rc(kvp_log_rl_flush(50000 + KVP_LOG_RL_WINDOW_MS), 1);
    capture_end(&c);
    assert_non_null(strstr(c.text, "suppressed 5 similar messages (late clock %d)"));
}

/* A site that floods and then falls silent still gets its count out through the flush. */
static void test_flush_reports_silent_site(void **state)
{
    (void)state;
    static struct kvp_log_rl rl = KVP_LOG_RL_INIT(KVP_LOG_ERROR, "accept failed");
    static struct kvp_log_rl quiet = KVP_LOG_RL_INIT(KVP_LOG_WARN, "quiet site");
    struct capture c;

    assert_true(kvp_log_rl_admit(&quiet, 5000)); /* never drops: never reported */
    for (int i = 0; i < KVP_LOG_RL_BURST + 3; i++)
        kvp_log_rl_admit(&rl, 5000);
    capture_begin(&c);
    assert_rc(kvp_log_rl_flush(5000 + KVP_LOG_RL_WINDOW_MS), 1);
    capture_end(&c);
    assert_rc(lines(c.text), 1);
    assert_non_null(strstr(c.text, "ERROR suppressed 3 similar messages (accept failed)"));
    assert_null(strstr(c.text, "quiet site"));
}

/* The macro: each call site has its own budget; other sites are not starved. */
static void test_macro_per_call_site(void **state)
{
    (void)state;
    struct capture c;
    kvp_log_threshold = KVP_LOG_INFO;
    capture_begin(&c);
    for (int i = 0; i < 100; i++) {
        log_warn_rl("flood %d", i);
        if (i % 10 == 0)
            log_warn_rl("other kind %d", i);
    }
    log_warn("plain warning");
    kvp_log_rl_flush_all();
    capture_end(&c);
    /* Both sites at most a burst each (a window boundary may pass once on a slow machine). */
    int flood = count(c.text, "WARN  flood "), other = count(c.text, "WARN  other kind ");
    assert_true(flood >= KVP_LOG_RL_BURST && flood <= 2 * KVP_LOG_RL_BURST);
    assert_true(other >= KVP_LOG_RL_BURST && other <= 10);
    assert_non_null(strstr(c.text, "WARN  flood 0\n"));
    /* The report quotes the first message dropped, formatted, never the format string. */
    assert_non_null(strstr(c.text, "similar messages, the first: \"flood 5\"\n"));
    assert_null(strstr(c.text, "%d"));
    assert_rc(count(c.text, "plain warning"), 1);
    if (other < 10)
        assert_true(count(c.text, "similar messages, the first: \"other kind ") >= 1);
}

/* Below the threshold nothing is counted or reported. */
static void test_below_threshold(void **state)
{
    (void)state;
    struct capture c;
    kvp_log_threshold = KVP_LOG_ERROR;
    capture_begin(&c);
    for (int i = 0; i < 20; i++)
        log_warn_rl("hidden %d", i);
    kvp_log_rl_flush_all();
    capture_end(&c);
    kvp_log_threshold = KVP_LOG_INFO;
    assert_rc(lines(c.text), 0);
}

#define THREADS 4
#define CALLS 2000
static struct kvp_log_rl shared_rl = KVP_LOG_RL_INIT(KVP_LOG_WARN, "threaded");
static _Atomic int threaded_admitted;

static void *hammer(void *arg)
{
    (void)arg;
    for (int i = 0; i < CALLS; i++)
        if (kvp_log_rl_admit(&shared_rl, 77000))
            threaded_admitted++;
    return NULL;
}

/* Concurrent callers: exactly a burst passes in one window, every drop is counted once. */
static void test_threads(void **state)
{
    (void)state;
    pthread_t t[THREADS];
    struct capture c;
    for (int i = 0; i < THREADS; i++)
        assert_rc(pthread_create(&t[i], NULL, hammer, NULL), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    assert_rc(threaded_admitted, KVP_LOG_RL_BURST);
    capture_begin(&c);
    assert_rc(kvp_log_rl_flush(77000 + KVP_LOG_RL_WINDOW_MS), 1);
    capture_end(&c);
    char want[128];
    snprintf(want, sizeof(want), "suppressed %d similar messages (threaded)",
             THREADS * CALLS - KVP_LOG_RL_BURST);
    assert_non_null(strstr(c.text, want));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_line_format),
        cmocka_unit_test(test_text_escapes),
        cmocka_unit_test(test_escape_bounds),
        cmocka_unit_test(test_json_format),
        cmocka_unit_test(test_json_report),
        cmocka_unit_test(test_parse_format),
        cmocka_unit_test(test_burst_then_report),
        cmocka_unit_test(test_clock_older_than_window),
        cmocka_unit_test(test_flush_reports_silent_site),
        cmocka_unit_test(test_macro_per_call_site),
        cmocka_unit_test(test_below_threshold),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
