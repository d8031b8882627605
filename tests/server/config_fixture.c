/*
 * config_fixture.c - one captured kvp_config_parse() call and a clean environment, for the
 * configuration tests (see config_fixture.h).
 */
#include "config_fixture.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_assert.h"

static const char *const env_vars[] = {
    "KVPOOL_SOCKET",
    "KVPOOL_SOCKET_MODE",
    "KVPOOL_L1_SIZE",
    "KVPOOL_CHUNK_SIZE",
    "KVPOOL_SHM_NAME",
    "KVPOOL_LOG_LEVEL",
    "KVPOOL_MAX_CLIENTS",
    "KVPOOL_RESERVE_TIMEOUT",
    "KVPOOL_IO_TIMEOUT",
    "KVPOOL_SHM_BACKEND",
    "KVPOOL_SHM_MODE",
    "KVPOOL_ALLOW_UID",
    "KVPOOL_ALLOW_GID",
    "KVPOOL_LOG_FORMAT",
    "KVPOOL_CONFIG",
    "XDG_RUNTIME_DIR",
    "KVPOOL_LMCACHE",
    "KVPOOL_LMCACHE_REAP_TIMEOUT",
    "KVPOOL_LMCACHE_REGISTRATION_GRACE",
};

int clean_env(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(env_vars) / sizeof(env_vars[0]); i++)
        unsetenv(env_vars[i]);
    return 0;
}

void run_free(struct run *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

void parse_args(struct run *r, const char *const *args)
{
    char *argv[32];
    int argc = 0;
    size_t out_len = 0, err_len = 0;

    argv[argc++] = (char *)"kvpoold";
    for (; *args; args++) {
        assert_true(argc < 31);
        argv[argc++] = (char *)*args;
    }
    argv[argc] = NULL;

    FILE *out = open_memstream(&r->out, &out_len);
    FILE *err = open_memstream(&r->err, &err_len);
    assert_non_null(out);
    assert_non_null(err);
    kvp_config_defaults(&r->cfg);
    r->rc = kvp_config_parse(&r->cfg, argc, argv, out, err);
    fclose(out);
    fclose(err);
}

void expect_ok(const struct run *r)
{
    if (r->rc != 0)
        fail_msg("kvp_config_parse = %d, expected 0; stderr: %s", r->rc, r->err);
    assert_string_equal(r->err, "");
    assert_string_equal(r->out, "");
}

void expect_einval_all(const struct run *r, const char *const *fragments)
{
    assert_rc(r->rc, -EINVAL);
    assert_string_equal(r->out, "");
    for (; *fragments; fragments++)
        if (!strstr(r->err, *fragments))
            fail_msg("error text \"%s\" does not contain \"%s\"", r->err, *fragments);
}
