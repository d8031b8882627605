/*
 * test_config_file.c - kvpoold's configuration file (--config, KVPOOL_CONFIG; config_file.c and
 * its use in config.c): the syntax (comments, quotes, blanks), errors with their line numbers,
 * limits, unreadable files, and the precedence of the layers: command line > environment >
 * file > defaults, also for errors (a bad value that a higher layer overrides is only noted).
 *
 * Every case writes its file into a fresh temporary directory and parses through
 * config_fixture.c, which captures what kvp_config_parse() prints; the environment starts
 * without any KVPOOL_* variable.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/config.h"
#include "base/config_file.h"
#include "common/kvp_assert.h"
#include "config_fixture.h"

static char dir[64];

static int setup(void **state)
{
    clean_env(state);
    snprintf(dir, sizeof(dir), "/tmp/kvpt-conf-XXXXXX");
    assert_non_null(mkdtemp(dir));
    return 0;
}

static int teardown(void **state)
{
    char cmd[128];
    (void)state;
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    clean_env(state);
    return system(cmd) == 0 ? 0 : -1;
}

/* Writes len bytes of text into dir/name; returns the path (static storage, per name). */
static const char *write_file_n(const char *name, const char *text, size_t len)
{
    static char paths[4][128];
    static int next;
    char *path = paths[next++ % 4];
    snprintf(path, 128, "%s/%s", dir, name);
    FILE *f = fopen(path, "we");
    assert_non_null(f);
    assert_rc(fwrite(text, 1, len, f), len);
    assert_rc(fclose(f), 0);
    return path;
}

static const char *write_file(const char *name, const char *text)
{
    return write_file_n(name, text, strlen(text));
}

/* expect_einval(), and the error text is exactly one line. */
#define expect_error_line(r, ...)                                              \
    do {                                                                       \
        expect_einval(r, __VA_ARGS__);                                         \
        const char *nl_ = strchr((r)->err, '\n');                              \
        if (!nl_ || nl_[1] != '\0')                                            \
            fail_msg("expected one line of error text, got \"%s\"", (r)->err); \
    } while (0)

/* "PATH:LINE", for messages. */
static const char *at(const char *path, unsigned line)
{
    static char buf[160];
    snprintf(buf, sizeof(buf), "%s:%u", path, line);
    return buf;
}

/* ---- syntax ---- */

static void test_comments_quotes_blanks(void **state)
{
    (void)state;
    struct run r;
    const char *path = write_file("kvpoold.conf", "# kvpoold configuration\n"
                                                  "\n"
                                                  "   # an indented comment\n"
                                                  "l1-size = 256MiB\n"
                                                  "\tchunk-size=64   \n"
                                                  "log-level   =   debug # trailing comment\n"
                                                  "socket = \"/tmp/a #b.sock\"  # quoted '#'\n"
                                                  "shm-name = ''\n"
                                                  "max-clients = 8\r\n"
                                                  "   \t  \n"
                                                  "io-timeout = \"500\"");
    parse(&r, "--config", path, NULL);
    expect_ok(&r);
    assert_int_equal(r.cfg.l1_size, 256ull << 20);
    assert_int_equal(r.cfg.chunk_tokens, 64);
    assert_int_equal(r.cfg.log_level, KVP_LOG_DEBUG);
    assert_string_equal(r.cfg.socket_path, "/tmp/a #b.sock");
    assert_false(r.cfg.shm_enabled);
    assert_int_equal(r.cfg.max_clients, 8);
    assert_int_equal(r.cfg.io_timeout_ms, 500); /* the last line has no newline */
    run_free(&r);

    /* shm-name = "" disables shared memory, like --shm-name "". A '#' right after a
     * character is part of the value. */
    path = write_file("b.conf", "shm-name = \"\"\n"
                                "socket = /tmp/x#y.sock\n"
                                "chunk-size = 32\n");
    parse(&r, "--config", path, NULL);
    expect_ok(&r);
    assert_false(r.cfg.shm_enabled);
    assert_string_equal(r.cfg.shm_name, "");
    assert_string_equal(r.cfg.socket_path, "/tmp/x#y.sock");
    assert_int_equal(r.cfg.chunk_tokens, 32);
    run_free(&r);

    /* An empty file, or one of comments only: the defaults. */
    path = write_file("empty.conf", "");
    parse(&r, "--config", path, NULL);
    expect_ok(&r);
    assert_int_equal(r.cfg.l1_size, 1ull << 30);
    run_free(&r);
}

static void test_every_option_is_a_key(void **state)
{
    (void)state;
    struct run r;
    const char *path = write_file("all.conf", "socket = /tmp/all.sock\n"
                                              "socket-mode = 0660\n"
                                              "l1-size = 2GiB\n"
                                              "chunk-size = 128\n"
                                              "shm-name = /pool\n"
                                              "shm-backend = posix\n"
                                              "shm-mode = 0660\n"
                                              "allow-uid = 1000,1001\n"
                                              "allow-gid = 100\n"
                                              "log-level = warn\n"
                                              "log-format = json\n"
                                              "max-clients = 16\n"
                                              "reserve-timeout = 30\n"
                                              "io-timeout = 1000\n");
    parse(&r, "--config", path, NULL);
    expect_ok(&r);
    assert_string_equal(r.cfg.socket_path, "/tmp/all.sock");
    assert_int_equal(r.cfg.socket_mode, 0660);
    assert_int_equal(r.cfg.l1_size, 2ull << 30);
    assert_int_equal(r.cfg.chunk_tokens, 128);
    assert_string_equal(r.cfg.shm_name, "kvpool_l1_pool_pool");
    assert_int_equal(r.cfg.shm_backend, KVP_SHM_POSIX);
    assert_int_equal(r.cfg.shm_mode, 0660);
    assert_int_equal(r.cfg.n_allow_uids, 2);
    assert_int_equal(r.cfg.allow_uids[1], 1001);
    assert_int_equal(r.cfg.n_allow_gids, 1);
    assert_int_equal(r.cfg.log_level, KVP_LOG_WARN);
    assert_int_equal(r.cfg.log_format, KVP_LOG_JSON);
    assert_int_equal(r.cfg.max_clients, 16);
    assert_int_equal(r.cfg.reserve_timeout_s, 30);
    assert_int_equal(r.cfg.io_timeout_ms, 1000);
    run_free(&r);
}

/*
 * A key given twice: which value was meant is anybody's guess, so neither wins silently; the
 * error names both lines. Even when the command line overrides the key.
 */
static void test_duplicate_key(void **state)
{
    (void)state;
    struct run r;
    const char *path = write_file("dup.conf", "chunk-size = 16\n"
                                              "l1-size = 64MiB\n"
                                              "# a comment\n"
                                              "chunk-size = 32\n");
    parse(&r, "--config", path, NULL);
    expect_error_line(&r, at(path, 4), "chunk-size is set twice, at line 1 and at line 4", NULL);
    run_free(&r);

    parse(&r, "--config", path, "--chunk-size", "64", NULL);
    expect_error_line(&r, "chunk-size is set twice, at line 1 and at line 4", NULL);
    run_free(&r);
}

/* A file saved with a UTF-8 byte order mark (some editors add one) reads like one without. */
static void test_byte_order_mark(void **state)
{
    (void)state;
    struct run r;
    const char *path = write_file("bom.conf", "\xef\xbb\xbfl1-size = 64MiB\nchunk-size = 32\n");
    parse(&r, "--config", path, NULL);
    expect_ok(&r);
    assert_int_equal(r.cfg.l1_size, 64ull << 20);
    assert_int_equal(r.cfg.chunk_tokens, 32);
    run_free(&r);

    /* Only at the very start: elsewhere it is part of a key, and unknown. */
    path = write_file("bom2.conf", "l1-size = 64MiB\n\xef\xbb\xbf"
                                   "chunk-size = 32\n");
    parse(&r, "--config", path, NULL);
    expect_error_line(&r, at(path, 2), "unknown key", NULL);
    run_free(&r);
}

/* --shm-name names a POSIX segment; memfd has none: saying both is refused, from any layers. */
static void test_shm_name_with_memfd(void **state)
{
    (void)state;
    struct run r;

    parse(&r, "--shm-backend", "memfd", "--shm-name", "pool", NULL);
    expect_error_line(&r, "shm-name (from command line)", "shm-backend memfd (from command line)",
                      NULL);
    run_free(&r);

    const char *path = write_file("memfd.conf", "shm-name = pool\n");
    parse(&r, "--config", path, "--shm-backend", "memfd", NULL);
    expect_error_line(&r, "shm-name (from", at(path, 1), "memfd (from command line)", NULL);
    run_free(&r);

    setenv("KVPOOL_SHM_NAME", "", 1);
    parse(&r, "--shm-backend", "memfd", NULL);
    expect_error_line(&r, "shm-name (from KVPOOL_SHM_NAME)", NULL);
    run_free(&r);
    unsetenv("KVPOOL_SHM_NAME");

    /* A named segment with no segment at all is the same contradiction; "" with none is not. */
    parse(&r, "--shm-backend", "none", "--shm-name", "pool", NULL);
    expect_error_line(&r, "shm-backend none", NULL);
    run_free(&r);
    parse(&r, "--shm-backend", "none", "--shm-name", "", NULL);
    expect_ok(&r);
    run_free(&r);

    /* Either alone is fine. */
    parse(&r, "--shm-backend", "memfd", NULL);
    expect_ok(&r);
    assert_int_equal(r.cfg.shm_backend, KVP_SHM_MEMFD);
    run_free(&r);
}

/*
 * With --log-format json, the option parser's messages are json log lines too (a log shipper
 * parses every line): from the moment the format is known, i.e. at once when the command line
 * or the environment says json, and from its line on when only the file does.
 */
static void test_errors_as_json(void **state)
{
    (void)state;
    struct run r;
    const char *path = write_file("j.conf", "l1-size = 64MiB\nchunk-size = lots\n");

    parse(&r, "--log-format", "json", "--config", path, NULL);
    expect_error_line(&r, "{\"ts\":\"", "\"level\":\"error\"",
                      "\"msg\":\"invalid chunk-size 'lots' (from ", ":2): expected a token count",
                      "\"pid\":", NULL);
    assert_null(strstr(r.err, "kvpoold: "));
    run_free(&r);

    /* The file's own syntax errors, and its format line before them. */
    path = write_file("j2.conf", "log-format = json\nl1-size 64MiB\n");
    parse(&r, "--config", path, NULL);
    expect_error_line(&r, "\"level\":\"error\"", ":2: expected 'key = value'", NULL);
    run_free(&r);

    /* From the environment; a note is a warning. */
    setenv("KVPOOL_LOG_FORMAT", "json", 1);
    setenv("KVPOOL_CHUNK_SIZE", "lots", 1);
    parse(&r, "--chunk-size", "16", NULL);
    assert_rc(r.rc, 0);
    assert_non_null(strstr(r.err, "\"level\":\"warn\""));
    assert_non_null(strstr(r.err, "ignoring invalid KVPOOL_CHUNK_SIZE 'lots'"));
    run_free(&r);
    unsetenv("KVPOOL_CHUNK_SIZE");

    parse(&r, "--bogus", NULL);
    expect_error_line(&r, "\"msg\":\"unknown or incomplete option '--bogus'\\nTry", NULL);
    run_free(&r);

    /* The command line's text wins over the environment's json. */
    parse(&r, "--log-format", "text", "--bogus", NULL);
    expect_einval(&r, "kvpoold: unknown or incomplete option '--bogus'", NULL);
    run_free(&r);
    unsetenv("KVPOOL_LOG_FORMAT");
}

static void test_unknown_key_names_line(void **state)
{
    (void)state;
    struct run r;
    const char *path = write_file("k.conf", "# comment\n"
                                            "l1-size = 64MiB\n"
                                            "l1_size = 64MiB\n");
    parse(&r, "--config", path, NULL);
    expect_error_line(&r, at(path, 3), "unknown key 'l1_size'", "kvpoold --help", NULL);
    run_free(&r);

    /* Keys are case-sensitive, like the options. */
    path = write_file("k2.conf", "L1-SIZE = 64MiB\n");
    parse(&r, "--config", path, NULL);
    expect_error_line(&r, at(path, 1), "unknown key 'L1-SIZE'", NULL);
    run_free(&r);

    /* Options without a value are not keys. */
    path = write_file("k3.conf", "\nhelp = yes\n");
    parse(&r, "--config", path, NULL);
    expect_error_line(&r, at(path, 2), "'help' cannot be set in a configuration file", NULL);
    run_free(&r);
}

static void test_bad_value_names_line(void **state)
{
    (void)state;
    struct run r;
    const char *path = write_file("v.conf", "l1-size = 64MiB\n"
                                            "\n"
                                            "chunk-size = lots\n");
    parse(&r, "--config", path, NULL);
    expect_error_line(&r, "invalid chunk-size 'lots'", at(path, 3), "expected a token count", NULL);
    run_free(&r);

    path = write_file("v2.conf", "log-format = xml\n");
    parse(&r, "--config", path, NULL);
    expect_error_line(&r, "invalid log-format 'xml'", at(path, 1), "text or json", NULL);
    run_free(&r);

    /* A value of blanks is empty: not a valid size. */
    path = write_file("v3.conf", "l1-size =   \n");
    parse(&r, "--config", path, NULL);
    expect_error_line(&r, "invalid l1-size ''", at(path, 1), NULL);
    run_free(&r);
}

static void test_syntax_errors_name_line(void **state)
{
    (void)state;
    struct run r;
    static const struct {
        const char *text;
        unsigned line;
        const char *what;
    } cases[] = {
        {"l1-size = 64MiB\nchunk-size 64\n", 2, "expected 'key = value', found 'chunk-size 64'"},
        {"\n\n = 64\n", 3, "no key before '='"},
        {"socket = \"/tmp/a.sock\n", 1, "the quoted value of socket has no closing \""},
        {"socket = '/tmp/a.sock\"\n", 1, "the quoted value of socket has no closing '"},
        {"shm-name = \"\" x\n", 1, "unexpected 'x' after the quoted value of shm-name"},
        {"# a file cannot name another\nconfig = /etc/other.conf\n", 2,
         "'config' cannot be set in a configuration file"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *path = write_file("s.conf", cases[i].text);
        parse(&r, "--config", path, NULL);
        expect_error_line(&r, at(path, cases[i].line), cases[i].what, NULL);
        run_free(&r);
    }
}

/* ---- reading ---- */

static void test_unreadable_file(void **state)
{
    (void)state;
    struct run r;
    char path[128];

    snprintf(path, sizeof(path), "%s/missing.conf", dir);
    parse(&r, "--config", path, NULL);
    expect_error_line(&r, "cannot read configuration file", path, "No such file or directory",
                      NULL);
    run_free(&r);

    parse(&r, "--config", dir, NULL);
    expect_error_line(&r, "cannot read configuration file", dir, "directory", NULL);
    run_free(&r);

    /* A mode that the reader lacks (root reads anything: only checked for others). */
    const char *locked = write_file("locked.conf", "chunk-size = 64\n");
    assert_rc(chmod(locked, 0), 0);
    if (geteuid() != 0) {
        parse(&r, "--config", locked, NULL);
        expect_error_line(&r, "cannot read configuration file", locked, "Permission denied", NULL);
        run_free(&r);
    }
}

static void test_line_and_file_limits(void **state)
{
    (void)state;
    struct run r;
    static char text[KVP_CONF_MAX_SIZE + 2];

    /* A comment line of exactly the limit is fine; one byte more is not. */
    memset(text, 'x', sizeof(text));
    memcpy(text, "chunk-size = 64\n#", 17);
    text[16 + KVP_CONF_MAX_LINE] = '\n';
    memcpy(text + 17 + KVP_CONF_MAX_LINE, "l1-size = 64MiB\n", 16);
    const char *path = write_file_n("long.conf", text, 17 + KVP_CONF_MAX_LINE + 16);
    parse(&r, "--config", path, NULL);
    expect_ok(&r);
    assert_int_equal(r.cfg.chunk_tokens, 64);
    assert_int_equal(r.cfg.l1_size, 64ull << 20);
    run_free(&r);

    memset(text, 'x', sizeof(text));
    memcpy(text, "chunk-size = 64\n#", 17);
    text[17 + KVP_CONF_MAX_LINE] = '\n';
    path = write_file_n("toolong.conf", text, 18 + KVP_CONF_MAX_LINE);
    parse(&r, "--config", path, NULL);
    expect_error_line(&r, at(path, 2), "line of 4097 bytes, more than the limit of 4096", NULL);
    run_free(&r);

    /* The whole file: exactly the limit is read, one byte more is refused. */
    memset(text, '\n', sizeof(text));
    memcpy(text, "chunk-size = 48\n", 16);
    path = write_file_n("big.conf", text, KVP_CONF_MAX_SIZE);
    parse(&r, "--config", path, NULL);
    expect_ok(&r);
    assert_int_equal(r.cfg.chunk_tokens, 48);
    run_free(&r);

    path = write_file_n("huge.conf", text, KVP_CONF_MAX_SIZE + 1);
    parse(&r, "--config", path, NULL);
    expect_error_line(&r, "cannot read configuration file", path, "1048577 bytes",
                      "more than the limit of 1048576", NULL);
    run_free(&r);

    /* A binary file is not a configuration file. */
    path = write_file_n("nul.conf", "chunk-size = 64\nl1-size\0 = 1\n", 29);
    parse(&r, "--config", path, NULL);
    expect_error_line(&r, at(path, 2), "NUL byte", NULL);
    run_free(&r);
}

/* A pipe (--config /dev/stdin, a process substitution): read to its end, limits the same. */
static void test_pipe(void **state)
{
    (void)state;
    struct run r;
    static char text[20000];
    int p[2];
    char path[64];

    /* More than the first read's 4096 bytes, less than a pipe's buffer. */
    memset(text, '#', sizeof(text));
    for (size_t i = 79; i < sizeof(text); i += 80)
        text[i] = '\n';
    memcpy(text + sizeof(text) - 16, "\nchunk-size = 8\n", 16);
    assert_rc(pipe(p), 0);
    assert_rc(write(p[1], text, sizeof(text)), sizeof(text));
    close(p[1]);
    snprintf(path, sizeof(path), "/proc/self/fd/%d", p[0]);
    parse(&r, "--config", path, NULL);
    close(p[0]);
    expect_ok(&r);
    assert_int_equal(r.cfg.chunk_tokens, 8);
    run_free(&r);
}

/* ---- precedence: command line > environment > file > defaults ---- */

static void test_precedence(void **state)
{
    (void)state;
    struct run r;
    const char *path = write_file("p.conf", "l1-size = 256MiB\n"
                                            "chunk-size = 64\n"
                                            "log-level = debug\n");

    parse(&r, "--config", path, NULL);
    expect_ok(&r);
    assert_int_equal(r.cfg.l1_size, 256ull << 20);
    assert_int_equal(r.cfg.chunk_tokens, 64);
    assert_int_equal(r.cfg.log_level, KVP_LOG_DEBUG);
    assert_int_equal(r.cfg.max_clients, 256); /* the default where nobody says otherwise */
    run_free(&r);

    /* The environment wins over the file, option by option. */
    setenv("KVPOOL_CHUNK_SIZE", "128", 1);
    parse(&r, "--config", path, NULL);
    expect_ok(&r);
    assert_int_equal(r.cfg.chunk_tokens, 128);
    assert_int_equal(r.cfg.l1_size, 256ull << 20);
    run_free(&r);

    /* The command line wins over both, wherever --config stands on it. */
    parse(&r, "--chunk-size", "32", "--config", path, "--log-level=warn", NULL);
    expect_ok(&r);
    assert_int_equal(r.cfg.chunk_tokens, 32);
    assert_int_equal(r.cfg.log_level, KVP_LOG_WARN);
    assert_int_equal(r.cfg.l1_size, 256ull << 20);
    run_free(&r);
}

static void test_config_from_environment(void **state)
{
    (void)state;
    struct run r;
    const char *env_file = write_file("env.conf", "chunk-size = 64\n");
    const char *cli_file = write_file("cli.conf", "l1-size = 128MiB\n");

    setenv("KVPOOL_CONFIG", env_file, 1);
    parse(&r, NULL);
    expect_ok(&r);
    assert_int_equal(r.cfg.chunk_tokens, 64);
    run_free(&r);

    /* --config replaces KVPOOL_CONFIG: that file is not read at all, even a missing one. */
    parse(&r, "--config", cli_file, NULL);
    expect_ok(&r);
    assert_int_equal(r.cfg.chunk_tokens, 256);
    assert_int_equal(r.cfg.l1_size, 128ull << 20);
    run_free(&r);

    setenv("KVPOOL_CONFIG", "/nonexistent/kvpoold.conf", 1);
    parse(&r, "--config", cli_file, NULL);
    expect_ok(&r);
    run_free(&r);

    /* ... and --config "" means no file. */
    parse(&r, "--config", "", NULL);
    expect_ok(&r);
    assert_int_equal(r.cfg.l1_size, 1ull << 30);
    run_free(&r);

    /* A missing file named by the variable is an error like any other. */
    parse(&r, NULL);
    expect_error_line(&r, "cannot read configuration file /nonexistent/kvpoold.conf", NULL);
    run_free(&r);
}

/* A bad file value that the environment or the command line overrides is noted, not fatal. */
static void test_overridden_bad_value_is_noted(void **state)
{
    (void)state;
    struct run r;
    const char *path = write_file("bad.conf", "l1-size = 1KiB\n"
                                              "chunk-size = lots\n");

    setenv("KVPOOL_CHUNK_SIZE", "128", 1);
    parse(&r, "--config", path, "--l1-size", "64MiB", NULL);
    if (r.rc != 0)
        fail_msg("kvp_config_parse = %d, expected 0; stderr: %s", r.rc, r.err);
    assert_int_equal(r.cfg.l1_size, 64ull << 20);
    assert_int_equal(r.cfg.chunk_tokens, 128);
    char want[256];
    snprintf(want, sizeof(want),
             "kvpoold: ignoring invalid l1-size '1KiB' at %s: --l1-size on the command line "
             "overrides it\n",
             at(path, 1));
    assert_non_null(strstr(r.err, want));
    snprintf(want, sizeof(want),
             "kvpoold: ignoring invalid chunk-size 'lots' at %s: KVPOOL_CHUNK_SIZE overrides it\n",
             at(path, 2));
    assert_non_null(strstr(r.err, want));
    run_free(&r);

    /* Not overridden: fatal, with the file's line. */
    parse(&r, "--config", path, "--chunk-size", "8", NULL);
    expect_error_line(&r, "invalid l1-size '1KiB'", at(path, 1), NULL);
    run_free(&r);

    /* A bad variable over a good file value is fatal too: the environment is not overridden. */
    path = write_file("good.conf", "chunk-size = 64\n");
    setenv("KVPOOL_CHUNK_SIZE", "lots", 1);
    parse(&r, "--config", path, NULL);
    expect_error_line(&r, "invalid chunk-size 'lots'", "KVPOOL_CHUNK_SIZE", NULL);
    run_free(&r);

    /* Structure errors are never overridden: they are not values. */
    path = write_file("typo.conf", "chunk-size 64\n");
    parse(&r, "--config", path, "--chunk-size", "8", NULL);
    expect_error_line(&r, at(path, 1), "expected 'key = value'", NULL);
    run_free(&r);
}

/* --help and --version never read the file: they work next to a broken one. */
static void test_help_ignores_file(void **state)
{
    (void)state;
    struct run r;
    const char *path = write_file("broken.conf", "garbage\n");

    parse(&r, "--config", path, "--help", NULL);
    assert_rc(r.rc, 1);
    assert_string_equal(r.err, "");
    static const char *const want[] = {"--config FILE", "KVPOOL_CONFIG", "--log-format FORMAT",
                                       "KVPOOL_LOG_FORMAT", "Precedence:"};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        if (!strstr(r.out, want[i]))
            fail_msg("--help output lacks %s:\n%s", want[i], r.out);
    run_free(&r);

    setenv("KVPOOL_CONFIG", path, 1);
    parse(&r, "--version", NULL);
    assert_rc(r.rc, 1);
    assert_string_equal(r.err, "");
    run_free(&r);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_comments_quotes_blanks),
        T(test_every_option_is_a_key),
        T(test_duplicate_key),
        T(test_byte_order_mark),
        T(test_shm_name_with_memfd),
        T(test_errors_as_json),
        T(test_unknown_key_names_line),
        T(test_bad_value_names_line),
        T(test_syntax_errors_name_line),
        T(test_unreadable_file),
        T(test_line_and_file_limits),
        T(test_pipe),
        T(test_precedence),
        T(test_config_from_environment),
        T(test_overridden_bad_value_is_noted),
        T(test_help_ignores_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
