/*
 * test_status_view.c - what `kvpool status`, `kvpool instances` and `kvpool watch` make of the
 * instances and clients of several front ends (src/tools/cli/status.c): the FRONT END column,
 * the counts by transport with a transport this program has no case for ("pickle", and one no
 * daemon has yet) shown as itself rather than folded into "inline", the clients of another front
 * end beside kvpool's connections, names with terminal controls escaped, a document of an
 * older daemon (no "front_end") still shown, and the totals summed over every transport's
 * counters (LMCache's pickle and envelope too, absent in an older daemon's); and the warm-restart
 * line: an adopted pool (after a crash, after a planned restart) with the chunks still to verify
 * and those found corrupt, a cold start with its reason (escaped), warm restart off (for this
 * run only, with the reason, when the daemon could keep no index), and nothing for an older
 * daemon.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli.h"

/* A status document with one instance per (id, front end, transport, reason) and the clients
 * of the list, as the daemon renders them. */
static const char doc_text[] =
    "{\"version\": \"1.0.0\", \"state\": \"serving\", \"pid\": 7, \"uptime_s\": 5,"
    " \"chunk_tokens\": 16, \"pool\": {\"capacity_bytes\": 1024, \"used_bytes\": 0},"
    " \"shm\": {\"enabled\": false, \"disabled_reason\": \"off\"},"
    " \"clients\": {\"connected\": 1, \"max\": 256, \"list\": ["
    "   {\"id\": 4, \"front_end\": \"lmcache\", \"pid\": null, \"instances\": 1},"
    "   {\"id\": 3, \"front_end\": \"lmcache\", \"pid\": null, \"instances\": 1},"
    "   {\"id\": 2, \"front_end\": \"x\\u001b[2Jfe\", \"pid\": null, \"instances\": 0},"
    "   {\"id\": 1, \"front_end\": \"kvpool\", \"pid\": 99, \"instances\": 2}]},"
    " \"instances\": ["
    "   {\"instance_id\": \"native-shm\", \"model_name\": \"m\", \"world_size\": 1,"
    "    \"worker_rank\": 0, \"transport\": \"shm\", \"fallback_reason\": null,"
    "    \"front_end\": \"kvpool\", \"pid\": 99},"
    "   {\"instance_id\": \"native-inline\", \"model_name\": \"m\", \"world_size\": 1,"
    "    \"worker_rank\": 0, \"transport\": \"inline\", \"fallback_reason\": \"requested\","
    "    \"front_end\": \"kvpool\", \"pid\": 99},"
    "   {\"instance_id\": \"lmcache-1\", \"model_name\": \"m\", \"world_size\": 2,"
    "    \"worker_rank\": 1, \"transport\": \"pickle\", \"fallback_reason\": \"no segment\","
    "    \"front_end\": \"lmcache\", \"pid\": null},"
    "   {\"instance_id\": \"lmcache-2\", \"model_name\": \"m\", \"world_size\": 2,"
    "    \"worker_rank\": 0, \"transport\": \"rdma\\u001b[31m\", \"fallback_reason\": null,"
    "    \"front_end\": \"lmcache\", \"pid\": null}]}";

static json_t *doc_of(const char *text)
{
    json_error_t err;
    json_t *doc = json_loads(text, 0, &err);
    if (!doc)
        fail_msg("bad test JSON: %s", err.text);
    return doc;
}

/* Runs print_status() on doc with stdout sent to a file; returns what it printed (static). */
static const char *status_text(json_t *doc)
{
    static char out[8192];
    struct cli x = {.socket_opt = NULL};
    FILE *f = tmpfile();
    assert_non_null(f);
    snprintf(x.path, sizeof(x.path), "/tmp/test.sock");
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(f), STDOUT_FILENO) >= 0);
    print_status(&x, doc);
    fflush(stdout);
    assert_true(dup2(saved, STDOUT_FILENO) >= 0);
    close(saved);
    rewind(f);
    size_t n = fread(out, 1, sizeof(out) - 1, f);
    out[n] = '\0';
    fclose(f);
    return out;
}

/* The line of text that contains s, copied into line; fails if there is none. */
static void line_with(const char *text, const char *s, char *line, size_t size)
{
    const char *p = strstr(text, s);
    if (!p)
        fail_msg("no line with '%s' in:\n%s", s, text);
    const char *a = p;
    while (a > text && a[-1] != '\n')
        a--;
    const char *b = strchr(p, '\n');
    snprintf(line, size, "%.*s", (int)(b ? b - a : (long)strlen(a)), a);
}

static void test_counts(void **state)
{
    (void)state;
    char buf[COUNTS];
    json_t *doc = doc_of(doc_text);

    /* shm and inline always, then each other transport as the daemon names it (escaped). */
    assert_string_equal(transport_counts(json_object_get(doc, "instances"), buf, sizeof(buf)),
                        "1 shm, 1 inline, 1 pickle, 1 rdma\\x1b[31m");
    /* kvpool's connections less this command's own, then every other front end's clients. */
    assert_string_equal(client_counts(doc, true, buf, sizeof(buf)),
                        "0 connected besides this command (max 256); lmcache 2; x\\x1b[2Jfe 1");
    assert_string_equal(client_counts(doc, false, buf, sizeof(buf)), "0; lmcache 2; x\\x1b[2Jfe 1");
    /* A small buffer is cut, never overrun. */
    char small[12];
    client_counts(doc, true, small, sizeof(small));
    assert_int_equal(strlen(small), sizeof(small) - 1);
    json_decref(doc);

    /* No instance at all: the two transports every daemon has, at 0. */
    doc = doc_of("{\"instances\": [], \"clients\": {\"connected\": 0, \"list\": []}}");
    assert_string_equal(transport_counts(json_object_get(doc, "instances"), buf, sizeof(buf)),
                        "0 shm, 0 inline");
    assert_string_equal(client_counts(doc, false, buf, sizeof(buf)), "0");
    json_decref(doc);

    /* More transports than the tally keeps: the rest are "other", every instance counted. */
    char text[4096];
    size_t len = (size_t)snprintf(text, sizeof(text), "{\"instances\": [");
    for (int i = 0; i < 12; i++)
        len += (size_t)snprintf(text + len, sizeof(text) - len, "%s{\"transport\": \"t%d\"}",
                                i ? ", " : "", i);
    snprintf(text + len, sizeof(text) - len, "]}");
    doc = doc_of(text);
    transport_counts(json_object_get(doc, "instances"), buf, sizeof(buf));
    assert_non_null(strstr(buf, "0 shm, 0 inline, 1 t0, "));
    assert_non_null(strstr(buf, ", 6 other"));
    json_decref(doc);
}

/* A degraded daemon's reasons, a line each; nothing for a daemon doing its whole job. */
static void test_health_lines(void **state)
{
    (void)state;
    json_t *doc = doc_of("{\"health\": {\"status\": \"healthy\", \"degraded\": true,"
                         " \"reasons\": [\"SHM disabled: /dev/shm has 64.0 MiB free\","
                         " \"l2 down: \\u001b[2J\"]}}");
    const char *out = status_text(doc);
    char line[512];
    line_with(out, "Health:", line, sizeof(line));
    assert_string_equal(line, "Health:     degraded: SHM disabled: /dev/shm has 64.0 MiB free");
    line_with(out, "l2 down", line, sizeof(line));
    assert_string_equal(line, "            l2 down: \\x1b[2J");
    json_decref(doc);
    doc = doc_of("{\"health\": {\"status\": \"healthy\", \"degraded\": false,"
                 " \"reasons\": []}}");
    assert_null(strstr(status_text(doc), "Health:"));
    json_decref(doc);
}

/* The LMCache line: where it is served, requests, then only the refusals that happened, then
 * unknown pings; "off"; and a daemon that does not say where. */
static void test_lmcache_line(void **state)
{
    (void)state;
    char buf[COUNTS];
    json_t *c = doc_of("{\"counters\": {\"lmcache_requests\": 0}}");
    assert_null(lmcache_line(c, buf, sizeof(buf)));
    json_decref(c);
    c = doc_of("{\"lmcache\": null, \"counters\": {\"lmcache_requests\": 0}}");
    assert_string_equal(lmcache_line(c, buf, sizeof(buf)), "off");
    json_decref(c);
    c = doc_of("{\"lmcache\": {\"address\": \"tcp://127.0.0.1:5555\", \"instances\": 2},"
               " \"counters\": {\"lmcache_requests\": 1523, \"lmcache_replies_refused\": 12,"
               " \"lmcache_connections_refused\": 3, \"lmcache_instances_refused\": 0,"
               " \"lmcache_unknown_pings\": 2}}");
    assert_string_equal(lmcache_line(c, buf, sizeof(buf)),
                        "tcp://127.0.0.1:5555, 2 instances; 1523 requests; refused: 12 prepares "
                        "(unread replies), 3 connections; 2 pings of unknown instances (told to "
                        "register again)");
    json_decref(c);
    c = doc_of("{\"counters\": {\"lmcache_requests\": 7}}");
    assert_string_equal(lmcache_line(c, buf, sizeof(buf)), "7 requests");
    /* A small buffer is cut, never overrun. */
    char small[5];
    lmcache_line(c, small, sizeof(small));
    assert_int_equal(strlen(small), sizeof(small) - 1);
    json_decref(c);
}

static void test_status_table(void **state)
{
    (void)state;
    char line[512];
    json_t *doc = doc_of(doc_text);
    const char *out = status_text(doc);

    line_with(out, "Clients:", line, sizeof(line));
    assert_string_equal(line, "Clients:    0 connected besides this command (max 256); lmcache 2; "
                              "x\\x1b[2Jfe 1");
    line_with(out, "Instances:", line, sizeof(line));
    assert_string_equal(line, "Instances:  4 (1 shm, 1 inline, 1 pickle, 1 rdma\\x1b[31m)");
    line_with(out, "TRANSPORT", line, sizeof(line));
    assert_non_null(strstr(line, "FRONT END  TRANSPORT"));
    line_with(out, "native-shm", line, sizeof(line));
    assert_non_null(strstr(line, " kvpool "));
    assert_true(strcmp(line + strlen(line) - 4, " shm") == 0);
    line_with(out, "lmcache-1", line, sizeof(line));
    assert_non_null(strstr(line, " lmcache "));
    assert_non_null(strstr(line, " pickle (no segment)"));
    line_with(out, "lmcache-2", line, sizeof(line));
    assert_non_null(strstr(line, " rdma\\x1b[31m"));
    assert_null(strchr(out, '\x1b'));
    json_decref(doc);

    /* An older daemon names no front end: "-", and its clients are kvpool's. */
    doc = doc_of("{\"pool\": {}, \"clients\": {\"connected\": 2, \"max\": 8, \"list\": [{\"id\": "
                 "1}]}, \"instances\": [{\"instance_id\": \"old\", \"transport\": \"inline\"}]}");
    out = status_text(doc);
    line_with(out, "Clients:", line, sizeof(line));
    assert_string_equal(line, "Clients:    1 connected besides this command (max 8)");
    line_with(out, "  old  ", line, sizeof(line));
    assert_non_null(strstr(line, "-          inline")); /* FRONT END, as wide as its title */
    json_decref(doc);
}

/* "Totals:": bytes stored and retrieved over every transport, not only shm and inline. */
static void test_totals_by_transport(void **state)
{
    (void)state;
    char line[512];
    json_t *doc = doc_of("{\"pool\": {}, \"counters\": {\"store_bytes_shm\": 1024,"
                         " \"store_bytes_inline\": 1024, \"store_bytes_pickle\": 4096,"
                         " \"store_bytes_envelope\": 2048, \"retrieve_bytes_shm\": 0,"
                         " \"retrieve_bytes_inline\": 512, \"retrieve_bytes_pickle\": 512,"
                         " \"retrieve_bytes_envelope\": 1024, \"evictions\": 3}}");
    const char *out = status_text(doc);
    line_with(out, "Totals:", line, sizeof(line));
    assert_non_null(strstr(line, "Totals:     8.00 KiB stored, 2.00 KiB retrieved, 3 evictions"));
    json_decref(doc);

    /* An older daemon's counters have shm and inline only. */
    doc = doc_of("{\"pool\": {}, \"counters\": {\"store_bytes_shm\": 1024,"
                 " \"store_bytes_inline\": 1024, \"retrieve_bytes_shm\": 1024,"
                 " \"retrieve_bytes_inline\": 0, \"evictions\": 0}}");
    out = status_text(doc);
    line_with(out, "Totals:", line, sizeof(line));
    assert_non_null(strstr(line, "Totals:     2.00 KiB stored, 1.00 KiB retrieved, 0 evictions"));
    json_decref(doc);
}

/* "Warm restart:" in `kvpool status` and `watch`, from "warm_restart" and the gauge and counter
 * of the verification. */
static void test_warm_line(void **state)
{
    (void)state;
    char buf[L2_LINE], line[512];
    json_t *doc = doc_of(
        "{\"pool\": {}, \"warm_restart\": {\"enabled\": true, \"kind\": \"adopted\","
        " \"planned\": false, \"previous_pid\": 4863, \"reason\": null,"
        " \"adopted_chunks\": 512, \"adopted_bytes\": 1073741824, \"dropped_chunks\": 3,"
        " \"dropped\": {\"bad_seal\": 2, \"out_of_range\": 1, \"overlap\": 0},"
        " \"duration_ms\": 12}, \"gauges\": {\"warm_restart_unverified_chunks\": 500},"
        " \"counters\": {\"warm_restart_corrupt_chunks\": 1,"
        " \"warm_restart_verified_chunks\": 11}}");
    assert_true(warm_line(doc, buf, sizeof(buf)));
    assert_string_equal(buf, "adopted 512 chunks (1.00 GiB) of pid 4863 after a crash in 12 ms, 3 "
                             "dropped; 500 to verify, 1 corrupt");
    line_with(status_text(doc), "Warm restart:", line, sizeof(line));
    assert_string_equal(line, "Warm restart: adopted 512 chunks (1.00 GiB) of pid 4863 after a "
                              "crash in 12 ms, 3 dropped; 500 to verify, 1 corrupt");
    json_object_set_new(jobj(doc, "warm_restart"), "planned", json_true());
    assert_true(warm_line(doc, buf, sizeof(buf)));
    assert_non_null(strstr(buf, " of pid 4863 after a planned restart in 12 ms, "));
    /* A small buffer is cut, never overrun. */
    char small[9];
    assert_true(warm_line(doc, small, sizeof(small)));
    assert_int_equal(strlen(small), sizeof(small) - 1);
    json_decref(doc);

    /* Refused: a cold start, and why (the daemon's words, terminal controls made visible). */
    doc = doc_of("{\"warm_restart\": {\"enabled\": true, \"kind\": \"cold\", \"planned\": false,"
                 " \"previous_pid\": 77, \"reason\": \"another kvpoold (pid 77) still uses "
                 "it\\u001b[2J\", \"adopted_chunks\": 0}}");
    assert_true(warm_line(doc, buf, sizeof(buf)));
    assert_string_equal(buf, "on, cold start (another kvpoold (pid 77) still uses it\\x1b[2J)");
    json_decref(doc);
    /* Nothing was left to adopt. */
    doc = doc_of("{\"warm_restart\": {\"enabled\": true, \"kind\": \"cold\", \"reason\": null}}");
    assert_true(warm_line(doc, buf, sizeof(buf)));
    assert_string_equal(buf, "on, cold start (no pool was left to adopt)");
    json_decref(doc);
    doc = doc_of("{\"pool\": {}, \"warm_restart\": {\"enabled\": false, \"kind\": \"cold\"}}");
    assert_true(warm_line(doc, buf, sizeof(buf)));
    assert_string_equal(buf, "off");
    line_with(status_text(doc), "Warm restart:", line, sizeof(line));
    assert_string_equal(line, "Warm restart: off");
    json_decref(doc);
    /* A pool refused, and none kept for a successor either (its index's name was taken). */
    doc = doc_of("{\"warm_restart\": {\"enabled\": false, \"kind\": \"cold\","
                 " \"reason\": \"index belongs to uid 999\"}}");
    assert_true(warm_line(doc, buf, sizeof(buf)));
    assert_string_equal(buf, "off for this run, cold start (index belongs to uid 999)");
    json_decref(doc);
    /* An older daemon says nothing about it: neither does the command. */
    doc = doc_of("{\"pool\": {}}");
    assert_false(warm_line(doc, buf, sizeof(buf)));
    assert_null(strstr(status_text(doc), "Warm restart"));
    json_decref(doc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts),
        cmocka_unit_test(test_status_table),
        cmocka_unit_test(test_lmcache_line),
        cmocka_unit_test(test_health_lines),
        cmocka_unit_test(test_totals_by_transport),
        cmocka_unit_test(test_warm_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
