/*
 * admin.c - the commands that are one request each: `ping`, `stats`, `metrics`, `clear` and
 * `version`.
 *
 * Design. Each connects (connect.c), makes its library call and prints the answer to stdout;
 * a failure is one line on stderr and an exit code (cli.h). `clear` is the one command that
 * changes the daemon's state, so it asks first on a terminal and, without one, insists on
 * --yes (checked in main.c before anything is contacted).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli.h"

#define MAX_STATS 128

/* The time reported is one PING round trip on an open connection, not connect + HELLO. */
int cmd_ping(struct cli *x, const struct cmd_opts *o)
{
    (void)o;
    int rc = cli_connect(x);
    if (rc)
        return rc;
    int64_t t0 = now_us();
    rc = kvp_ping(x->client);
    int64_t dt = now_us() - t0;
    if (rc < 0)
        return cli_failed(x, "ping", rc);
    printf("kvpoold at %s: ok (%" PRId64 " us)\n", x->path, dt);
    return EXIT_SUCCESS;
}

/* Prints "name value" lines, a format that shells (awk, grep) and scrapers read easily. */
int cmd_stats(struct cli *x, const struct cmd_opts *o)
{
    kvp_stat st[MAX_STATS];

    (void)o;
    int rc = cli_connect(x);
    if (rc)
        return rc;
    int n = kvp_stats(x->client, st, MAX_STATS);
    if (n < 0)
        return cli_failed(x, "stats", n);
    for (int i = 0; i < n && i < MAX_STATS; i++) {
        term_puts(stdout, st[i].name);
        printf(" %" PRIu64 "\n", st[i].value);
    }
    return EXIT_SUCCESS;
}

int cmd_metrics(struct cli *x, const struct cmd_opts *o)
{
    char *text = NULL;

    (void)o;
    int code = cli_connect(x);
    if (code)
        return code;
    int n = kvp_get_metrics(x->client, &text);
    if (n < 0)
        return cli_failed(x, "metrics", n);
    term_write(stdout, text, (size_t)n, TERM_LINES);
    if (n > 0 && text[n - 1] != '\n')
        putchar('\n');
    kvp_free(text);
    return EXIT_SUCCESS;
}
/* Reads a yes from the terminal. */
static bool confirmed(void)
{
    char line[64];
    if (!fgets(line, sizeof(line), stdin))
        return false;
    line[strcspn(line, "\r\n")] = '\0';
    return strcasecmp(line, "y") == 0 || strcasecmp(line, "yes") == 0;
}

/*
 * The question is asked on a terminal only; without one, --yes is the only way, and its absence
 * is a usage error found before the daemon is contacted. The count in the question is what the
 * status says now: stores and retrieves going on may change it before the answer.
 */
int cmd_clear(struct cli *x, const struct cmd_opts *o)
{
    int code;

    if (!o->yes && !isatty(STDIN_FILENO)) {
        fprintf(stderr, "kvpool: clear drops every cached chunk and needs a confirmation: run it "
                        "on a terminal, or pass --yes\n");
        return EXIT_USAGE;
    }
    code = cli_connect(x);
    if (code)
        return code;
    if (!o->yes) {
        json_t *doc = cli_get_status(x, false, &code);
        if (!doc)
            return code;
        json_t *pool = jobj(doc, "pool");
        uint64_t committed = jnum(pool, "objects"), pinned = jnum(pool, "pinned_objects");
        json_decref(doc);
        uint64_t n = committed > pinned ? committed - pinned : 0;
        if (n == 0) {
            printf("Nothing to drop: no committed object is unpinned.\n");
            return EXIT_SUCCESS;
        }
        fprintf(stderr, "Drop %" PRIu64 " committed objects? [y/N] ", n);
        fflush(stderr);
        if (!confirmed()) {
            printf("Nothing dropped.\n");
            return EXIT_SUCCESS;
        }
    }
    int n = kvp_clear(x->client);
    if (n < 0)
        return cli_failed(x, "clear", n);
    printf("Dropped %d committed objects.\n", n);
    return EXIT_SUCCESS;
}

/* The daemon's version comes from its status; an unreachable daemon is reported, not fatal. */
int cmd_version(struct cli *x, const struct cmd_opts *o)
{
    uint32_t v = kvp_version();
    char *text = NULL;
    json_error_t err;

    (void)o;
    printf("kvpool %s\n", KVP_VERSION_STRING);
    printf("libkvpool %u.%u.%u\n", v >> 16, (v >> 8) & 0xff, v & 0xff);
    fflush(stdout);
    int rc = cli_resolve_socket(x->socket_opt, x->path, sizeof(x->path));
    if (rc == 0) {
        x->opts.socket_path = x->path;
        rc = kvp_client_open(&x->opts, &x->client);
    }
    if (rc < 0) {
        const char *msg = kvp_last_error(NULL);
        printf("kvpoold: not reachable at %s (", x->path);
        term_puts(stdout, cli_connect_reason(x->path, rc, msg));
        printf(")\n");
        return EXIT_SUCCESS;
    }
    rc = kvp_get_status(x->client, &text);
    if (rc < 0) {
        printf("kvpoold: unknown version at %s (", x->path);
        term_puts(stdout, kvp_last_error(x->client));
        printf(")\n");
        return EXIT_SUCCESS;
    }
    json_t *doc = json_loads(text, 0, &err);
    kvp_free(text);
    printf("kvpoold ");
    term_puts(stdout, jstr(doc, "version", "-"));
    printf(" at %s\n", x->path);
    json_decref(doc);
    return EXIT_SUCCESS;
}
