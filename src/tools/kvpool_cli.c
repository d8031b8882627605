/*
 * kvpool_cli.c - command-line client of kvpoold: liveness check and statistics.
 *
 *   kvpool [--socket PATH] [--timeout MS] ping | stats
 *
 * Design. A thin shell over libkvpool: it resolves the socket path the same way the library
 * does (option, then $KVPOOL_SOCKET, then kvp_default_socket_path()) only so that its messages
 * can name the socket it talked to. Exit codes: 0 success, 1 the daemon could not be reached or
 * failed the request, 2 bad usage. Results go to stdout, diagnostics to stderr.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <time.h>

#include "kvpool.h"

#define EXIT_USAGE 2
#define MAX_STATS 128
#define DEFAULT_TIMEOUT_MS 30000u

/* Help goes to stdout for --help (exit 0) and to stderr for usage errors (exit 2). The default
 * socket shown is the one this invocation would use. */
static void usage(FILE *f)
{
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];

    if (kvp_default_socket_path(path, sizeof(path)) < 0)
        snprintf(path, sizeof(path), "(too long)");
    fprintf(f,
            "Usage: kvpool [OPTIONS] COMMAND\n"
            "\n"
            "Talks to the kvpool KV-cache daemon (kvpoold).\n"
            "\n"
            "Commands:\n"
            "  ping              check that the daemon answers; prints the round-trip time\n"
            "  stats             print the daemon's statistics, one \"name value\" per line\n"
            "\n"
            "Options:\n"
            "  -s, --socket PATH  daemon socket (default: $KVPOOL_SOCKET if set, else\n"
            "                     $XDG_RUNTIME_DIR/kvpool/kvpool.sock, else\n"
            "                     /tmp/kvpool-<uid>/kvpool.sock; here: %s)\n"
            "  -t, --timeout MS   per-request timeout in milliseconds (default: %u)\n"
            "  -h, --help         show this help and exit\n"
            "      --version      show the version and exit\n"
            "\n"
            "Exit status: 0 success, 1 daemon unreachable or request failed, 2 usage error.\n",
            getenv("KVPOOL_SOCKET") && getenv("KVPOOL_SOCKET")[0] ? getenv("KVPOOL_SOCKET") : path,
            DEFAULT_TIMEOUT_MS);
}

/* Parses a timeout in milliseconds: 1..UINT32_MAX, digits only. strtoull alone would accept
 * "-5" (wrapping it) and leading blanks, so the first character is checked by hand. 0 is
 * refused because the library would read it as "use the default". */
static int parse_timeout(const char *s, uint32_t *out)
{
    char *end;

    if (!s[0] || s[0] < '0' || s[0] > '9')
        return -EINVAL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v == 0 || v > UINT32_MAX)
        return -EINVAL;
    *out = (uint32_t)v;
    return 0;
}

/* The socket the library will use, for messages. Resolved here and passed explicitly, so the
 * path printed is guaranteed to be the path tried. */
static int resolve_socket(const char *opt, char *buf, size_t size)
{
    const char *env = getenv("KVPOOL_SOCKET");
    const char *p = opt ? opt : (env && env[0] ? env : NULL);

    if (!p)
        return kvp_default_socket_path(buf, size);
    if (strlen(p) >= size)
        return -ENAMETOOLONG;
    snprintf(buf, size, "%s", p);
    return 0;
}

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Prints why the daemon could not be reached, with its message when it sent one. */
static int unreachable(const char *path, kvp_client *c, int rc)
{
    /* With c == NULL this is why kvp_client_open() failed. */
    const char *msg = kvp_last_error(c);

    if (msg[0])
        fprintf(stderr, "kvpool: cannot reach kvpoold at %s: %s (%s)\n", path, kvp_strerror(rc),
                msg);
    else
        fprintf(stderr, "kvpool: cannot reach kvpoold at %s: %s\n", path, kvp_strerror(rc));
    return EXIT_FAILURE;
}

/* The time reported is one PING round trip on an open connection, not connect + HELLO. */
static int cmd_ping(kvp_client *c, const char *path)
{
    int64_t t0 = now_us();
    int rc = kvp_ping(c);
    int64_t dt = now_us() - t0;

    if (rc < 0)
        return unreachable(path, c, rc);
    printf("kvpoold at %s: ok (%" PRId64 " us)\n", path, dt);
    return EXIT_SUCCESS;
}

/* Prints "name value" lines, a format that shells (awk, grep) and scrapers read easily. */
static int cmd_stats(kvp_client *c)
{
    kvp_stat st[MAX_STATS];
    int n = kvp_stats(c, st, MAX_STATS);

    if (n < 0) {
        const char *msg = kvp_last_error(c);
        fprintf(stderr, "kvpool: stats failed: %s%s%s%s\n", kvp_strerror(n), msg[0] ? " (" : "",
                msg, msg[0] ? ")" : "");
        return EXIT_FAILURE;
    }
    for (int i = 0; i < n && i < MAX_STATS; i++)
        printf("%s %" PRIu64 "\n", st[i].name, st[i].value);
    return EXIT_SUCCESS;
}

int main(int argc, char **argv)
{
    enum { OPT_VERSION = 256 };
    static const struct option longopts[] = {
        {"socket", required_argument, NULL, 's'},
        {"timeout", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        {NULL, 0, NULL, 0},
    };
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    kvp_opts opts = {0};
    const char *socket_opt = NULL;
    kvp_client *c = NULL;
    int opt, rc;

    /* '+': stop at the command, so that nothing after it is taken for a global option. */
    while ((opt = getopt_long(argc, argv, "+s:t:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 's':
            if (!optarg[0]) {
                fprintf(stderr, "kvpool: --socket needs a path\n");
                return EXIT_USAGE;
            }
            socket_opt = optarg;
            break;
        case 't':
            if (parse_timeout(optarg, &opts.timeout_ms) < 0) {
                fprintf(stderr, "kvpool: invalid timeout '%s': expected milliseconds >= 1\n",
                        optarg);
                return EXIT_USAGE;
            }
            break;
        case 'h':
            usage(stdout);
            return EXIT_SUCCESS;
        case OPT_VERSION: {
            uint32_t v = kvp_version();
            printf("kvpool %d.%d.%d (libkvpool %u.%u.%u)\n", KVP_VERSION_MAJOR, KVP_VERSION_MINOR,
                   KVP_VERSION_PATCH, v >> 16, (v >> 8) & 0xff, v & 0xff);
            return EXIT_SUCCESS;
        }
        default:
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "kvpool: missing command\n");
        usage(stderr);
        return EXIT_USAGE;
    }
    /* Validate the whole command line before touching the daemon: a typo must be a usage error
     * (exit 2), never a connection attempt. */
    const char *cmd = argv[optind];
    if (strcmp(cmd, "ping") != 0 && strcmp(cmd, "stats") != 0) {
        fprintf(stderr, "kvpool: unknown command '%s'\n", cmd);
        usage(stderr);
        return EXIT_USAGE;
    }
    if (optind + 1 < argc) {
        fprintf(stderr, "kvpool: unexpected argument '%s' after %s\n", argv[optind + 1], cmd);
        usage(stderr);
        return EXIT_USAGE;
    }

    rc = resolve_socket(socket_opt, path, sizeof(path));
    if (rc < 0) {
        fprintf(stderr, "kvpool: socket path: %s\n", kvp_strerror(rc));
        return EXIT_USAGE;
    }
    opts.socket_path = path;
    /* Opening already proves the daemon is alive and speaks our major version; a failure here is
     * the "cannot reach" case for every command. */
    rc = kvp_client_open(&opts, &c);
    if (rc < 0)
        return unreachable(path, NULL, rc);

    rc = strcmp(cmd, "ping") == 0 ? cmd_ping(c, path) : cmd_stats(c);
    kvp_client_close(c);
    return rc;
}
