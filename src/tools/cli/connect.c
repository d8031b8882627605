/*
 * connect.c - reaching kvpoold, and the one-line messages when it cannot be reached or a
 * request fails once connected.
 *
 * Design. The socket path is resolved here the same way the library does (--socket,
 * $KVPOOL_SOCKET, kvp_default_socket_path()) and passed to the library explicitly, only so that
 * every message names the socket that was really tried. Opening a client proves that the
 * daemon is alive and speaks our major protocol version (HELLO). Messages go to stderr, one
 * line each; the exit code says which kind of failure it was (cli.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int cli_resolve_socket(const char *opt, char *buf, size_t size)
{
    const char *env = getenv("KVPOOL_SOCKET");
    const char *p = opt ? opt : (env && env[0] ? env : NULL);

    if (!p) {
        int rc = kvp_default_socket_path(buf, size); /* the length on success */
        return rc < 0 ? rc : 0;
    }
    if (strlen(p) >= size) {
        snprintf(buf, size, "%.*s...", (int)size - 4, p);
        return -ENAMETOOLONG;
    }
    snprintf(buf, size, "%s", p);
    return 0;
}

const char *cli_connect_reason(const char *path, int rc, const char *msg)
{
    if (!msg || !msg[0])
        return kvp_strerror(rc);
    /* "cannot connect to PATH: No such file or directory", "refusing PATH: the process
     * listening there runs as uid 0...": the caller names the socket already, so what follows
     * "PATH: " is the reason. */
    const char *p = strstr(msg, path);
    size_t n = strlen(path);
    if (p && n && !memchr(msg, ':', (size_t)(p - msg)) && p[n] == ':' && p[n + 1] == ' ' &&
        p[n + 2])
        return p + n + 2;
    return msg;
}

/* Prints why the daemon could not be reached: the socket once, and the reason once. Returns
 * EXIT_CONNECT. */
static int unreachable(const char *path, int rc)
{
    /* With NULL this is why kvp_client_open() failed. */
    const char *msg = kvp_last_error(NULL);

    fprintf(stderr, "kvpool: cannot reach kvpoold at %s: ", path);
    term_puts(stderr, cli_connect_reason(path, rc, msg));
    fputc('\n', stderr);
    return EXIT_CONNECT;
}

int cli_connect(struct cli *x)
{
    int rc = cli_resolve_socket(x->socket_opt, x->path, sizeof(x->path));

    if (rc < 0) {
        fprintf(stderr, "kvpool: cannot reach kvpoold: socket path %s: %s\n",
                x->path[0] ? x->path : "(default)", kvp_strerror(rc));
        return EXIT_CONNECT;
    }
    x->opts.socket_path = x->path;
    rc = kvp_client_open(&x->opts, &x->client);
    return rc < 0 ? unreachable(x->path, rc) : 0;
}

int cli_failed(const struct cli *x, const char *what, int rc)
{
    const char *msg = kvp_last_error(x->client);

    /* The daemon's message may quote what a worker chose (an instance id, a model name). */
    fprintf(stderr, "kvpool: %s failed: %s", what, kvp_strerror(rc));
    if (msg[0]) {
        fputs(" (", stderr);
        term_puts(stderr, msg);
        fputc(')', stderr);
    }
    fputc('\n', stderr);
    return EXIT_DAEMON;
}

json_t *cli_get_status(struct cli *x, bool quiet, int *code)
{
    char *text = NULL;
    json_error_t err;

    int rc = kvp_get_status(x->client, &text);
    if (rc < 0) {
        *code = quiet ? EXIT_DAEMON : cli_failed(x, "status", rc);
        return NULL;
    }
    json_t *doc = json_loads(text, 0, &err);
    kvp_free(text);
    if (!json_is_object(doc)) {
        fprintf(stderr, "kvpool: the daemon's status is not a JSON object%s", doc ? "" : ": ");
        term_puts(stderr, doc ? "" : err.text);
        fputc('\n', stderr);
        json_decref(doc);
        *code = EXIT_DAEMON;
        return NULL;
    }
    return doc;
}
