/*
 * test_l2_redis.c - the Redis backend (src/server/l2/l2_redis.c, l2_node.c, l2_redis_read.c)
 * against a server that misbehaves (tests/fake_redis.c): one that drips its answers a byte at
 * a time, one that answers PING with an endless bulk, one that refuses the password.
 *
 *   - every operation, as a whole, ends within the timeout given at open: a dripping server
 *     makes it fail with -ETIMEDOUT, however often a byte comes;
 *   - a reply is bounded (KVP_L2_REPLY_MAX): an endless one fails with -EMSGSIZE once the
 *     bound is reached, and the server cannot make the backend read much more;
 *   - refused credentials are -EACCES with the server's words, whether AUTH is refused or a
 *     command finds that one is needed.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_assert.h"
#include "fake_redis.h"
#include "l2/l2_backend.h"
#include "l2/l2_node.h"

#define TIMEOUT_MS 1000
#define DRIP_MS 400 /* faster than TIMEOUT_MS: no single read ever waits that long */

static struct kvpt_fake_redis fake;

static struct kvp_l2_conn *open_ok(const char *url)
{
    struct kvp_l2_target t;
    struct kvp_l2_conn *c = NULL;
    char why[256] = "";
    assert_rc(kvp_l2_url_parse(url, &t, why, sizeof(why)), 0);
    int rc = kvp_l2_redis_backend.open(&t, TIMEOUT_MS, &c, why, sizeof(why));
    if (rc)
        fail_msg("open(%s) = %d (%s), expected 0", url, rc, why);
    return c;
}

static int open_rc(const char *url, char *why, size_t why_size)
{
    struct kvp_l2_target t;
    struct kvp_l2_conn *c = NULL;
    assert_rc(kvp_l2_url_parse(url, &t, why, why_size), 0);
    int rc = kvp_l2_redis_backend.open(&t, TIMEOUT_MS, &c, why, why_size);
    kvp_l2_redis_backend.close(c);
    return rc;
}

static void start(enum kvpt_fake_mode mode)
{
    fake.drip_ms = DRIP_MS;
    fake.huge_limit = 256u << 20;
    assert_rc(kvpt_fake_redis_start(&fake, mode), 0);
}

/* EXISTS of 12 keys: 48 bytes of answer, 19 s at the drip's pace, each byte within 0.4 s. */
static void test_drip_exists(void **state)
{
    (void)state;
    const char *keys[12];
    uint8_t found[12];
    char why[256] = "";
    for (int i = 0; i < 12; i++)
        keys[i] = "kvpool:key";
    start(KVPT_FAKE_DRIP);
    struct kvp_l2_conn *c = open_ok(fake.url);
    int rc = kvp_l2_redis_backend.exists(c, keys, 12, found, why, sizeof(why));
    assert_rc(rc, -ETIMEDOUT);
    assert_non_null(strstr(why, "timed out"));
    kvp_l2_redis_backend.close(c);
    kvpt_fake_redis_stop(&fake);
}

/* GETRANGE of 4 values: 6 bytes each, straight off the socket (l2_redis_read.c). */
static void test_drip_read(void **state)
{
    (void)state;
    const char *keys[4] = {"a", "b", "c", "d"};
    uint8_t hdr[4][8], data[4][8];
    uint8_t *hp[4] = {hdr[0], hdr[1], hdr[2], hdr[3]},
            *dp[4] = {data[0], data[1], data[2], data[3]};
    uint64_t len[4];
    char why[256] = "";
    start(KVPT_FAKE_DRIP);
    struct kvp_l2_conn *c = open_ok(fake.url);
    int rc = kvp_l2_redis_backend.read(c, keys, 4, hp, 8, dp, 8, len, why, sizeof(why));
    assert_rc(rc, -ETIMEDOUT);
    assert_non_null(strstr(why, "timed out"));
    kvp_l2_redis_backend.close(c);
    kvpt_fake_redis_stop(&fake);
}

/* SET's +OK, then DEL's :1: 2 s and 1.6 s of answer. */
static void test_drip_put_del(void **state)
{
    (void)state;
    uint8_t v[64] = {0};
    struct iovec parts[1] = {{v, sizeof(v)}};
    char why[256] = "";
    start(KVPT_FAKE_DRIP);
    struct kvp_l2_conn *c = open_ok(fake.url);
    assert_rc(kvp_l2_redis_backend.put(c, "k", parts, 1, 0, why, sizeof(why)), -ETIMEDOUT);
    kvp_l2_redis_backend.close(c);
    c = open_ok(fake.url);
    assert_rc(kvp_l2_redis_backend.del(c, "k", why, sizeof(why)), -ETIMEDOUT);
    kvp_l2_redis_backend.close(c);
    kvpt_fake_redis_stop(&fake);
}

/* PING answered with a 1 GiB bulk: refused at the bound, and the backend stops reading. */
static void test_huge_reply(void **state)
{
    (void)state;
    char why[256] = "";
    start(KVPT_FAKE_HUGE);
    assert_rc(open_rc(fake.url, why, sizeof(why)), -EMSGSIZE);
    assert_non_null(strstr(why, "larger than"));
    /* The bound plus what the socket buffers hold: far from the 256 MiB on offer. */
    uint64_t sent = atomic_load(&fake.sent);
    if (sent > 4 * (uint64_t)KVP_L2_REPLY_MAX)
        fail_msg("the server sent %llu bytes of one reply before the backend gave up",
                 (unsigned long long)sent);
    kvpt_fake_redis_stop(&fake);
}

/* A wrong password, and none where one is needed: -EACCES, in the server's words. */
static void test_wrong_password(void **state)
{
    (void)state;
    char why[256] = "", url[256];
    start(KVPT_FAKE_WRONGPASS);
    snprintf(url, sizeof(url), "unix://:s3cret@%s", fake.path);
    assert_rc(open_rc(url, why, sizeof(why)), -EACCES);
    assert_non_null(strstr(why, "WRONGPASS"));
    assert_null(strstr(why, "s3cret"));
    assert_rc(open_rc(fake.url, why, sizeof(why)), -EACCES);
    assert_non_null(strstr(why, "NOAUTH"));
    kvpt_fake_redis_stop(&fake);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drip_exists),    cmocka_unit_test(test_drip_read),
        cmocka_unit_test(test_drip_put_del),   cmocka_unit_test(test_huge_reply),
        cmocka_unit_test(test_wrong_password),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
