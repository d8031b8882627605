/*
 * test_log_injection.c - what a worker chooses (its instance id, its model name) reaches the
 * daemon's text log as one escaped line: a newline cannot forge a line with a timestamp and a
 * level of its choice, and no terminal escape sequence reaches the log raw.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"

/* What a hostile worker would like the operator to read. */
#define FORGED "1999-01-01T00:00:00.000Z ERROR forged"

/* True if some line of the log begins with s. */
static bool line_starts_with(const struct kvpt_daemon *d, const char *s)
{
    FILE *f = fopen(d->log, "re");
    char line[4096];
    bool found = false;
    assert_non_null(f);
    while (!found && fgets(line, sizeof(line), f))
        found = strncmp(line, s, strlen(s)) == 0;
    fclose(f);
    return found;
}

/* True if the log holds byte c anywhere. */
static bool log_has_byte(const struct kvpt_daemon *d, int c)
{
    FILE *f = fopen(d->log, "re");
    int ch;
    assert_non_null(f);
    while ((ch = fgetc(f)) != EOF && ch != c)
        ;
    fclose(f);
    return ch == c;
}

static void test_hostile_names(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "16MiB", "--chunk-size", "16", NULL};
    kvpt_daemon_start(&d, args);

    /* An instance id with a forged line and a colour escape: logged when it registers. */
    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts o = kvpt_layout("w0\n" FORGED " id\x1b[2J", KVP_TRANSPORT_AUTO);
    kvp_instance *inst = NULL;
    assert_int_equal(kvp_register(c, &o, &inst), 0);

    /* The same id with another model name, which the refusal names: a C1 CSI, a forged line. */
    kvp_client *c2 = kvpt_connect(&d);
    kvp_register_opts o2 = o;
    o2.model_name = "m\xc2\x9b"
                    "2J\r\n" FORGED " model";
    kvp_instance *inst2 = NULL;
    assert_int_not_equal(kvp_register(c2, &o2, &inst2), 0);

    assert_true(kvpt_log_wait(&d, "Instance w0\\n" FORGED " id\\x1b[2J non-GPU context", 5000));
    assert_true(kvpt_log_wait(&d, "'m\\u009b2J\\r\\n" FORGED " model'", 5000));
    assert_false(line_starts_with(&d, FORGED));
    assert_false(log_has_byte(&d, 0x1b));
    assert_false(log_has_byte(&d, '\r'));
    /* Every line of the log is the daemon's own: it starts with a timestamp. */
    FILE *f = fopen(d.log, "re");
    char line[4096];
    assert_non_null(f);
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, "20", 2) != 0 || line[10] != 'T')
            fail_msg("a line that is not the daemon's: %s", line);
    fclose(f);

    kvp_client_close(c2);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostile_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
