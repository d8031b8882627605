/*
 * test_term.c - the command line's terminal-safe output (src/tools/cli/term.c): which
 * characters are escaped and how, that well-formed text passes unchanged, and that a copy that
 * does not fit is cut between escapes, never inside one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"

/* term_safe() of s into a buffer of size bytes. */
static const char *safe(const char *s, size_t size)
{
    static char buf[4096];
    assert_true(size <= sizeof(buf));
    return term_safe(buf, size, s);
}

/* term_write() of s in mode, as a string. */
static char *written(const char *s, size_t len, enum term_mode mode)
{
    static char out[4096];
    out[0] = '\0';
    FILE *f = fmemopen(out, sizeof(out), "w");
    assert_non_null(f);
    term_write(f, s, len, mode);
    fclose(f);
    return out;
}

static void test_controls_are_escaped(void **state)
{
    (void)state;
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"plain-id_0", "plain-id_0"},
        {"a\x1b[2Jb", "a\\x1b[2Jb"},      /* ESC, clear screen */
        {"bell\x07", "bell\\x07"},        /* C0 */
        {"del\x7f", "del\\x7f"},          /* DEL */
        {"nl\ntab\t", "nl\\x0atab\\x09"}, /* one line: no break survives */
        {"csi\xc2\x9b"
         "31m",
         "csi\\u009b31m"}, /* U+009B CSI, UTF-8 */
        {"osc\xc2\x9d"
         "0;x",
         "osc\\u009d0;x"},                          /* U+009D OSC, UTF-8 */
        {"c1\xc2\x80\xc2\x9f", "c1\\u0080\\u009f"}, /* both ends of C1 */
        {"raw\x9b"
         "31m",
         "raw\\x9b31m"},                     /* a raw 0x9b is not UTF-8 */
        {"bidi\xe2\x80\xae", "bidi\\u202e"}, /* RIGHT-TO-LEFT OVERRIDE */
        {"iso\xe2\x81\xa6", "iso\\u2066"},   /* LEFT-TO-RIGHT ISOLATE */
        {"ls\xe2\x80\xa8", "ls\\u2028"},     /* LINE SEPARATOR */
        {"caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x99\x82", "caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x99\x82"},
        {"nbsp\xc2\xa0", "nbsp\xc2\xa0"},          /* U+00A0 is printable */
        {"over\xc0\x9b", "over\\xc0\\x9b"},        /* overlong encodings are not UTF-8 */
        {"sur\xed\xa0\x80", "sur\\xed\\xa0\\x80"}, /* nor are surrogates */
        {"cut\xe2\x80", "cut\\xe2\\x80"},          /* a sequence cut short */
        {"", ""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *got = safe(cases[i].in, 4096);
        if (strcmp(got, cases[i].out) != 0)
            fail_msg("case %zu: '%s', expected '%s'", i, got, cases[i].out);
        assert_string_equal(written(cases[i].in, strlen(cases[i].in), TERM_LINE), cases[i].out);
    }
}

/* Multi-line text keeps its line breaks and tabs, nothing else. */
static void test_lines(void **state)
{
    (void)state;
    const char *in = "# HELP x\nx{a=\"\x1b\"}\t1\n";
    assert_string_equal(written(in, strlen(in), TERM_LINES), "# HELP x\nx{a=\"\\x1b\"}\t1\n");
}

/* In a JSON document the escapes are JSON's: the document still parses to the same text. */
static void test_json(void **state)
{
    (void)state;
    const char *in = "{\n  \"id\": \"a\xc2\x9b"
                     "b\\u001b\"\n}\n";
    assert_string_equal(written(in, strlen(in), TERM_JSON),
                        "{\n  \"id\": \"a\\u009bb\\u001b\"\n}\n");
    json_t *doc = json_loads(written(in, strlen(in), TERM_JSON), 0, NULL);
    assert_non_null(doc);
    assert_string_equal(json_string_value(json_object_get(doc, "id")), "a\xc2\x9b"
                                                                       "b\x1b");
    json_decref(doc);
    /* A raw byte that is not UTF-8 reads as Latin-1, and the result is valid JSON. */
    assert_string_equal(written("\"\x9b\"", 3, TERM_JSON), "\"\\u009b\"");
}

/* A copy that does not fit ends with "..." after the last whole escape. */
static void test_truncation(void **state)
{
    (void)state;
    assert_string_equal(safe("abcdef", 7), "abcdef");
    assert_string_equal(safe("abcdefg", 7), "abc...");
    assert_string_equal(safe("\x1b\x1b\x1b", 13), "\\x1b\\x1b\\x1b");
    assert_string_equal(safe("\x1b\x1b\x1b", 12), "\\x1b\\x1b...");
    assert_string_equal(safe("\x1b\x1b\x1b", 11), "\\x1b...");
    assert_string_equal(safe("ab\xe6\x97\xa5xyz", 8), "ab...");
    assert_string_equal(safe("ab\xe6\x97\xa5", 6), "ab\xe6\x97\xa5");
    assert_string_equal(safe("abc", 1), "");
    /* The bound the views size their buffers with holds for the worst input. */
    char worst[256], big[TERM_ESCAPED_MAX(255)];
    memset(worst, 0x9b, 255);
    worst[255] = '\0';
    assert_int_equal(strlen(term_safe(big, sizeof(big), worst)), 4 * 255);
    for (int i = 0; i < 255; i += 2)
        memcpy(worst + i, i + 1 < 255 ? "\xc2\x9b" : "\x1b", i + 1 < 255 ? 2 : 1);
    assert_null(strstr(term_safe(big, sizeof(big), worst), "..."));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_controls_are_escaped),
        cmocka_unit_test(test_lines),
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_truncation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
