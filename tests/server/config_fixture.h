/*
 * config_fixture.h - what the configuration tests (test_config.c, test_config_file.c) share:
 * one kvp_config_parse() call over fresh defaults with what it prints captured, and an
 * environment without the daemon's variables.
 *
 * kvp_config_parse() writes help and errors to the FILE*s it is given; parse() captures them with
 * open_memstream(), so a case checks the text itself.
 */
#ifndef KVP_TEST_CONFIG_FIXTURE_H
#define KVP_TEST_CONFIG_FIXTURE_H

#include "base/config.h"

/* Output of one kvp_config_parse() call. */
struct run {
    int rc;
    struct kvp_config cfg;
    char *out; /* what went to out, NUL-terminated */
    char *err;
};

/*
 * parse(r, "--option", "value", ..., NULL) and expect_einval(r, "fragment", ..., NULL) take
 * NULL-terminated lists; the macros pass them as arrays, since a NULL passed through "..." is
 * not portably a null pointer.
 */
#define parse(r, ...) parse_args(r, (const char *const[]){__VA_ARGS__})
#define expect_einval(r, ...) expect_einval_all(r, (const char *const[]){__VA_ARGS__})

/* cmocka setup and teardown: unsets every KVPOOL_* variable the daemon reads, KVPOOL_CONFIG
 * and XDG_RUNTIME_DIR, so the machine running the tests cannot change the outcome. Returns 0. */
int clean_env(void **state);

/* Parses the NULL-terminated argument list (argv[0] is added) over fresh defaults into *r. The
 * caller frees with run_free(). */
void parse_args(struct run *r, const char *const *args);

void run_free(struct run *r);

/* The call succeeded and printed nothing. */
void expect_ok(const struct run *r);

/* The call failed with -EINVAL, printed nothing to out, and the error text contains every
 * fragment of the NULL-terminated list. */
void expect_einval_all(const struct run *r, const char *const *fragments);

#endif /* KVP_TEST_CONFIG_FIXTURE_H */
