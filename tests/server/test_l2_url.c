/*
 * test_l2_url.c - the --l2 URL parser, its masked form and the password file
 * (src/server/base/l2_url.h).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/l2_url.h"
#include "common/kvp_assert.h"

static void parse_ok(const char *url, struct kvp_l2_target *t)
{
    char why[256] = "";
    int rc = kvp_l2_url_parse(url, t, why, sizeof(why));
    if (rc != 0)
        fail_msg("kvp_l2_url_parse(%s) = %d (%s), expected 0", url, rc, why);
}

/* Refused, with a reason that never shows the password "s3cret". */
static void parse_bad(const char *url, const char *why_contains)
{
    struct kvp_l2_target t;
    char why[256] = "";
    int rc = kvp_l2_url_parse(url, &t, why, sizeof(why));
    if (rc != -EINVAL)
        fail_msg("kvp_l2_url_parse(%s) = %d, expected -EINVAL", url, rc);
    if (!strstr(why, why_contains))
        fail_msg("kvp_l2_url_parse(%s): reason '%s' lacks '%s'", url, why, why_contains);
    assert_null(strstr(why, "s3cret"));
    assert_string_equal(t.password, "");
}

static void test_redis_tcp(void **state)
{
    (void)state;
    struct kvp_l2_target t;
    parse_ok("redis://127.0.0.1:6380", &t);
    assert_int_equal(t.scheme, KVP_L2_REDIS);
    assert_int_equal(t.nnodes, 1);
    assert_string_equal(t.nodes[0].host, "127.0.0.1");
    assert_int_equal(t.nodes[0].port, 6380);
    assert_int_equal(t.db, 0);
    assert_string_equal(t.user, "");
    assert_string_equal(t.password, "");

    parse_ok("redis://cache.example:7000/3", &t);
    assert_string_equal(t.nodes[0].host, "cache.example");
    assert_int_equal(t.db, 3);

    parse_ok("redis://redis-host", &t);
    assert_int_equal(t.nodes[0].port, 6379);

    parse_ok("redis://[::1]:6379/0", &t);
    assert_string_equal(t.nodes[0].host, "::1");
    assert_int_equal(t.nodes[0].port, 6379);
}

static void test_credentials(void **state)
{
    (void)state;
    struct kvp_l2_target t;
    parse_ok("redis://kv:s3cret@10.0.0.2:6379/1", &t);
    assert_string_equal(t.user, "kv");
    assert_string_equal(t.password, "s3cret");
    assert_int_equal(t.db, 1);

    parse_ok("redis://:p%40ss%3Aw@h:1", &t);
    assert_string_equal(t.user, "");
    assert_string_equal(t.password, "p@ss:w");

    /* An unencoded '@' in the password: the last '@' ends the credentials. */
    parse_ok("redis://u:a@b@h:2", &t);
    assert_string_equal(t.password, "a@b");
    assert_string_equal(t.nodes[0].host, "h");

    parse_ok("redis://justuser@h:2", &t);
    assert_string_equal(t.user, "justuser");
    assert_string_equal(t.password, "");
}

static void test_unix(void **state)
{
    (void)state;
    struct kvp_l2_target t;
    parse_ok("unix:///run/redis/redis.sock", &t);
    assert_int_equal(t.scheme, KVP_L2_REDIS_UNIX);
    assert_string_equal(t.path, "/run/redis/redis.sock");
    assert_int_equal(t.db, 0);

    parse_ok("unix:///tmp/r.sock?db=7", &t);
    assert_string_equal(t.path, "/tmp/r.sock");
    assert_int_equal(t.db, 7);

    parse_ok("unix://:s3cret@/tmp/r.sock", &t);
    assert_string_equal(t.password, "s3cret");
    assert_string_equal(t.path, "/tmp/r.sock");
}

static void test_cluster(void **state)
{
    (void)state;
    struct kvp_l2_target t;
    parse_ok("redis-cluster://127.0.0.1:7000,127.0.0.1:7001,[::1]:7002", &t);
    assert_int_equal(t.scheme, KVP_L2_REDIS_CLUSTER);
    assert_int_equal(t.nnodes, 3);
    assert_int_equal(t.nodes[1].port, 7001);
    assert_string_equal(t.nodes[2].host, "::1");

    parse_ok("redis-cluster://u:s3cret@a:1", &t);
    assert_int_equal(t.nnodes, 1);
    assert_string_equal(t.password, "s3cret");

    char url[512] = "redis-cluster://";
    for (int i = 0; i < KVP_L2_MAX_SEEDS + 1; i++)
        snprintf(url + strlen(url), sizeof(url) - strlen(url), "%sh%d:%d", i ? "," : "", i,
                 7000 + i);
    parse_bad(url, "seed nodes");
}

static void test_refused(void **state)
{
    (void)state;
    parse_bad("http://h:1", "unknown scheme");
    parse_bad("redis://", "host");
    parse_bad("redis://h:0", "port");
    parse_bad("redis://h:65536", "port");
    parse_bad("redis://h:12x", "port");
    parse_bad("redis://u:s3cret@h:1/x", "database");
    parse_bad("redis://u:s3cret@h:1/99999", "database");
    parse_bad("redis://h:1?x=1", "unexpected");
    parse_bad("redis://h o:1", "bad character");
    parse_bad("redis://[::1:1", "unterminated");
    parse_bad("redis://u:s3cret%zz@h:1", "password");
    parse_bad("redis://u:s3cret%0@h:1", "password");
    parse_bad("redis://u:s3cret%00@h:1", "password");
    parse_bad("unix://", "absolute");
    parse_bad("unix://relative.sock", "no host");
    parse_bad("unix:///tmp/x?db=a", "query");
    parse_bad("unix:///tmp/x?dbx=1", "query");
    parse_bad("redis-cluster://", "seed node");
    parse_bad("redis-cluster://h", "port");
    parse_bad("redis-cluster://h:1,", "empty seed");
    parse_bad("redis-cluster://u:s3cret@h:1/2", "database 0");

    char long_path[200] = "unix:///";
    memset(long_path + 8, 'p', 150);
    long_path[158] = '\0';
    parse_bad(long_path, "longer");
}

static void test_masked(void **state)
{
    (void)state;
    struct kvp_l2_target t;
    char out[512];

    parse_ok("redis://kv:s3cret@10.0.0.2:6379/1", &t);
    kvp_l2_url_masked(&t, out, sizeof(out));
    assert_string_equal(out, "redis://kv:***@10.0.0.2:6379/1");

    parse_ok("redis://h", &t);
    kvp_l2_url_masked(&t, out, sizeof(out));
    assert_string_equal(out, "redis://h:6379");

    parse_ok("unix://:s3cret@/tmp/r.sock?db=2", &t);
    kvp_l2_url_masked(&t, out, sizeof(out));
    assert_string_equal(out, "unix://:***@/tmp/r.sock?db=2");

    parse_ok("redis-cluster://a:1,[::1]:2", &t);
    kvp_l2_url_masked(&t, out, sizeof(out));
    assert_string_equal(out, "redis-cluster://a:1,[::1]:2");
}

static void write_file(const char *path, const char *data, size_t len, mode_t mode)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
    assert_int_equal(chmod(path, mode), 0);
}

static void test_password_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvpt-l2pw-XXXXXX", path[64], pw[KVP_L2_MAX_PASSWORD + 1], why[256];
    bool loose;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/pw", dir);

    write_file(path, "s3cret\n", 7, 0600);
    assert_rc(kvp_l2_password_file_read(path, pw, sizeof(pw), &loose, why, sizeof(why)), 0);
    assert_string_equal(pw, "s3cret");
    assert_false(loose);

    write_file(path, "s3cret\r\n", 8, 0644);
    assert_rc(kvp_l2_password_file_read(path, pw, sizeof(pw), &loose, why, sizeof(why)), 0);
    assert_string_equal(pw, "s3cret");
    assert_true(loose);

    write_file(path, "\n", 1, 0600);
    assert_rc(kvp_l2_password_file_read(path, pw, sizeof(pw), &loose, why, sizeof(why)), -EINVAL);
    write_file(path, "two\nlines\n", 10, 0600);
    assert_rc(kvp_l2_password_file_read(path, pw, sizeof(pw), &loose, why, sizeof(why)), -EINVAL);
    assert_null(strstr(why, "lines"));

    char big[KVP_L2_MAX_PASSWORD_FILE + 10];
    memset(big, 'x', sizeof(big));
    write_file(path, big, sizeof(big), 0600);
    assert_rc(kvp_l2_password_file_read(path, pw, sizeof(pw), &loose, why, sizeof(why)), -EFBIG);

    unlink(path);
    assert_rc(kvp_l2_password_file_read(path, pw, sizeof(pw), &loose, why, sizeof(why)), -ENOENT);
    assert_rc(kvp_l2_password_file_read(dir, pw, sizeof(pw), &loose, why, sizeof(why)), -EINVAL);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_redis_tcp),     cmocka_unit_test(test_credentials),
        cmocka_unit_test(test_unix),          cmocka_unit_test(test_cluster),
        cmocka_unit_test(test_refused),       cmocka_unit_test(test_masked),
        cmocka_unit_test(test_password_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
