/*
 * test_l2_line.c - the L2 line of `kvpool status` and `kvpool watch` (src/tools/cli/status.c)
 * for each shape of the status JSON's "l2": off (null), the "up" boolean of daemons without a
 * "state", a "state" and "reason" when the daemon gives them, an unknown state, a reason with
 * terminal controls, and no "l2" at all (an older daemon: no line).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"

/* l2_line() of the status document text; "(none)" when it returns false. */
static const char *line_of(const char *text)
{
    static char buf[L2_LINE];
    json_error_t err;
    json_t *doc = json_loads(text, 0, &err);
    if (!doc)
        fail_msg("bad test JSON: %s: %s", err.text, text);
    if (!l2_line(doc, buf, sizeof(buf)))
        snprintf(buf, sizeof(buf), "(none)");
    json_decref(doc);
    return buf;
}

static void test_shapes(void **state)
{
    (void)state;
    static const struct {
        const char *json, *line;
    } cases[] = {
        {"{\"l2\": null}", "off"},
        {"{\"pool\": {}}", "(none)"},
        {"{\"l2\": {\"url\": \"redis://10.0.0.5:6379\", \"up\": true, \"backlog_chunks\": 3, "
         "\"backlog_bytes\": 24576}}",
         "redis://10.0.0.5:6379 up (backlog 3 chunks, 24.0 KiB)"},
        {"{\"l2\": {\"url\": \"unix:///run/redis.sock\", \"up\": false, \"backlog_chunks\": 0, "
         "\"backlog_bytes\": 0}}",
         "unix:///run/redis.sock down (backlog 0 chunks, 0 B)"},
        {"{\"l2\": {\"url\": \"redis://h:6379\", \"up\": false, \"state\": \"down\", "
         "\"reason\": \"Connection refused\", \"backlog_chunks\": 7, \"backlog_bytes\": 7168}}",
         "redis://h:6379 down: Connection refused (backlog 7 chunks, 7.00 KiB)"},
        {"{\"l2\": {\"url\": \"redis://:***@h:6379\", \"up\": false, \"state\": \"auth_failed\", "
         "\"reason\": \"WRONGPASS invalid username-password pair\"}}",
         "redis://:***@h:6379 authentication failed: WRONGPASS invalid username-password pair "
         "(backlog 0 chunks, 0 B)"},
        {"{\"l2\": {\"url\": \"redis://h:6379\", \"up\": true, \"state\": \"up\", \"reason\": "
         "null, \"backlog_chunks\": 1, \"backlog_bytes\": 1024}}",
         "redis://h:6379 up (backlog 1 chunks, 1.00 KiB)"},
        /* A state this program does not know is shown as it is. */
        {"{\"l2\": {\"url\": \"redis://h:6379\", \"up\": false, \"state\": \"resharding\"}}",
         "redis://h:6379 resharding (backlog 0 chunks, 0 B)"},
        /* The reason and the URL may quote what a server said: escaped like any string. */
        {"{\"l2\": {\"url\": \"redis://h\\u001b[2J:6379\", \"up\": false, \"state\": \"down\", "
         "\"reason\": \"ERR \\u009b31m\"}}",
         "redis://h\\x1b[2J:6379 down: ERR \\u009b31m (backlog 0 chunks, 0 B)"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *got = line_of(cases[i].json);
        if (strcmp(got, cases[i].line) != 0)
            fail_msg("case %zu: '%s', expected '%s'", i, got, cases[i].line);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
