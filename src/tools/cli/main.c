/*
 * main.c - the `kvpool` command line: kvpoold's state at a glance, its metrics, a live view,
 * and emptying the cache.
 *
 *   kvpool [--socket PATH] [--timeout MS] COMMAND [OPTIONS]   (global options may follow the
 *                                                             command too)
 *
 *   status [--json]                  pool, SHM decision, one line per instance and transport
 *   instances                        a table of the registered instances
 *   metrics                          the Prometheus text of the daemon's metrics
 *   watch [--once] [--interval S]    rates, hit ratio and usage on one screen, every second
 *   clear [--yes]                    drop the committed chunks nobody pins (asks first)
 *   stats                            every statistic, one "name value" per line
 *   ping                             the round-trip time of one request
 *   version                          the versions of kvpool, libkvpool and kvpoold
 *
 * Exit status: 0 success; 1 the daemon answered with an error, or a request failed once
 * connected; 2 the daemon cannot be reached (the message names the socket); 64 (EX_USAGE) a bad
 * command line, including `clear` without --yes where nobody can answer its question.
 *
 * Design. A thin shell over libkvpool. Everything goes over the daemon's socket (STATUS,
 * METRICS, CLEAR, STATS and PING in docs/PROTOCOL.md), so it works with the HTTP endpoint off.
 * This file holds the command table (which also makes the help) and the command line; each
 * command lives with its concern (cli.h lists the files). The whole command line, each
 * command's options included, is checked before the daemon is contacted, so a typo is never a
 * connection attempt. Results go to stdout, diagnostics and questions to stderr.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Options a command may accept (struct command.opts). */
enum { O_JSON = 1, O_ONCE = 2, O_INTERVAL = 4, O_YES = 8 };

struct command {
    const char *name;
    const char *args; /* its options, for the help */
    const char *help;
    unsigned opts; /* O_* it accepts */
    int (*run)(struct cli *x, const struct cmd_opts *o);
};

static void usage(FILE *f);

/* One line about a bad command line, with the way to the help. Returns EXIT_USAGE. */
__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt, ...)
{
    va_list ap;

    fputs("kvpool: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs(" (see 'kvpool --help')\n", stderr);
    return EXIT_USAGE;
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

/* Seconds between two frames of `watch`: a decimal number from 0.1 to one day. */
static int parse_interval(const char *s, double *out)
{
    char *end;

    if (!s[0] || ((s[0] < '0' || s[0] > '9') && s[0] != '.'))
        return -EINVAL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < 0.1 || v > 86400)
        return -EINVAL;
    *out = v;
    return 0;
}

static int cmd_help(struct cli *x, const struct cmd_opts *o)
{
    (void)x;
    (void)o;
    usage(stdout);
    return EXIT_SUCCESS;
}

static const struct command commands[] = {
    {"status", "[--json]",
     "pool, SHM state or why it is off, one line per instance with its transport; --json: the "
     "daemon's status JSON as is",
     O_JSON, cmd_status},
    {"instances", "", "a table of the registered instances", 0, cmd_instances},
    {"metrics", "", "the daemon's metrics in the Prometheus text format", 0, cmd_metrics},
    {"watch", "[--once] [-n|--interval S]",
     "rates, hit ratio and pool usage on one screen, refreshed every S seconds (default 1); "
     "--once: one frame, S seconds after the start",
     O_ONCE | O_INTERVAL, cmd_watch},
    {"clear", "[-y|--yes]",
     "drop every committed chunk that no retrieve pins (pinned chunks and stores in progress "
     "stay); asks first, unless --yes",
     O_YES, cmd_clear},
    {"stats", "", "print the daemon's statistics, one \"name value\" per line", 0, cmd_stats},
    {"ping", "", "check that the daemon answers; prints the round-trip time", 0, cmd_ping},
    {"version", "", "the versions of kvpool, libkvpool and (if it answers) kvpoold", 0,
     cmd_version},
    {"help", "", "show this help", 0, cmd_help},
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

/* Prints text indented by indent columns, folded at 100 columns. */
static void print_folded(FILE *f, const char *text, int indent, int col)
{
    while (*text) {
        int room = 100 - col;
        int n = (int)strlen(text);
        if (n > room) {
            n = room;
            while (n > 0 && text[n] != ' ')
                n--;
            if (n == 0)
                n = room;
        }
        fprintf(f, "%.*s\n", n, text);
        text += n;
        while (*text == ' ')
            text++;
        if (*text)
            fprintf(f, "%*s", indent, "");
        col = indent;
    }
}

/* Help goes to stdout for --help (exit 0). The default socket shown is the one this invocation
 * would use. */
static void usage(FILE *f)
{
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];

    if (kvp_default_socket_path(path, sizeof(path)) < 0)
        snprintf(path, sizeof(path), "(too long)");
    fprintf(f, "Usage: kvpool [OPTIONS] COMMAND [COMMAND OPTIONS]\n"
               "\n"
               "Talks to the kvpool KV-cache daemon (kvpoold) over its socket.\n"
               "\n"
               "Commands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++) {
        char synopsis[64];
        snprintf(synopsis, sizeof(synopsis), "%s%s%s", commands[i].name,
                 commands[i].args[0] ? " " : "", commands[i].args);
        fprintf(f, "  %-30s ", synopsis);
        print_folded(f, commands[i].help, 33, 33);
    }
    fprintf(f,
            "\n"
            "Options (before or after the command):\n"
            "  -s, --socket PATH  daemon socket (default: $KVPOOL_SOCKET if set, else\n"
            "                     $XDG_RUNTIME_DIR/kvpool/kvpool.sock, else\n"
            "                     /tmp/kvpool-<uid>/kvpool.sock; here: %s)\n"
            "  -t, --timeout MS   per-request timeout in milliseconds (default: %u)\n"
            "  -h, --help         show this help and exit\n"
            "      --version      show the version and exit\n"
            "\n"
            "Exit status: 0 success; 1 the daemon answered with an error, or a request failed\n"
            "once connected; 2 the daemon cannot be reached (the message names the socket);\n"
            "64 a bad command line (also clear without --yes where nobody can confirm).\n",
            getenv("KVPOOL_SOCKET") && getenv("KVPOOL_SOCKET")[0] ? getenv("KVPOOL_SOCKET") : path,
            DEFAULT_TIMEOUT_MS);
}

/* Reports an option getopt_long refused: '?' (unknown) or ':' (its value is missing). */
static int bad_option(const char *cmd, int opt, char **argv)
{
    const char *arg = argv[optind - 1];

    if (opt == ':')
        return usage_error("%s%soption '%s' needs a value", cmd, cmd[0] ? ": " : "", arg);
    if (optopt && arg[1] != '-')
        return usage_error("%s%sunknown option '-%c'", cmd, cmd[0] ? ": " : "", optopt);
    return usage_error("%s%sunknown option '%s'", cmd, cmd[0] ? ": " : "", arg);
}

/* --socket (-s) or --timeout (-t) with its value, wherever it stands on the command line.
 * Returns 0 or EXIT_USAGE after saying what is wrong. */
static int global_option(struct cli *x, int opt, const char *arg)
{
    if (opt == 's') {
        if (!arg[0])
            return usage_error("--socket needs a path");
        x->socket_opt = arg;
    } else if (parse_timeout(arg, &x->opts.timeout_ms) < 0) {
        return usage_error("invalid timeout '%s': expected milliseconds >= 1", arg);
    }
    return 0;
}

/*
 * Parses a command's options (argv[0] is the command's name) into *o, and the global options
 * given after the command into *x (`kvpool ping --socket X` is `kvpool --socket X ping`; the
 * later one wins). Returns 0, or EXIT_USAGE after one line about what is wrong: an option the
 * command does not take, a bad value, an operand.
 */
static int parse_command(const struct command *cmd, int argc, char **argv, struct cmd_opts *o,
                         struct cli *x)
{
    static const struct option longopts[] = {
        {"json", no_argument, NULL, 'j'},           {"once", no_argument, NULL, '1'},
        {"interval", required_argument, NULL, 'n'}, {"yes", no_argument, NULL, 'y'},
        {"help", no_argument, NULL, 'h'},           {"socket", required_argument, NULL, 's'},
        {"timeout", required_argument, NULL, 't'},  {NULL, 0, NULL, 0},
    };
    int opt, rc;

    *o = (struct cmd_opts){.interval = 1.0};
    optind = 0; /* glibc: start a new scan */
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "+:n:yhs:t:", longopts, NULL)) != -1) {
        unsigned need = opt == 'j'   ? O_JSON
                        : opt == '1' ? O_ONCE
                        : opt == 'n' ? O_INTERVAL
                        : opt == 'y' ? O_YES
                                     : 0;
        if (opt == '?' || opt == ':')
            return bad_option(cmd->name, opt, argv);
        if (opt == 'h') {
            o->help = true;
            continue;
        }
        if (opt == 's' || opt == 't') {
            if ((rc = global_option(x, opt, optarg)) != 0)
                return rc;
            continue;
        }
        if (!(cmd->opts & need))
            return usage_error("%s: unknown option '%s'", cmd->name, argv[optind - 1]);
        switch (opt) {
        case 'j':
            o->json = true;
            break;
        case '1':
            o->once = true;
            break;
        case 'n':
            if (parse_interval(optarg, &o->interval) < 0)
                return usage_error("%s: invalid interval '%s': expected seconds from 0.1 to 86400",
                                   cmd->name, optarg);
            break;
        case 'y':
            o->yes = true;
            break;
        }
    }
    if (optind < argc)
        return usage_error("%s: unexpected argument '%s'", cmd->name, argv[optind]);
    return 0;
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
    struct cli x = {.socket_opt = NULL};
    struct cmd_opts o;
    int opt, rc;

    /* '+': stop at the command; what follows it is the command's (parse_command(), which takes
     * the global options there too). */
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "+:s:t:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 's':
        case 't':
            if ((rc = global_option(&x, opt, optarg)) != 0)
                return rc;
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
            return bad_option("", opt, argv);
        }
    }
    if (optind >= argc)
        return usage_error("missing command");
    const struct command *cmd = NULL;
    for (size_t i = 0; i < NCOMMANDS && !cmd; i++)
        if (strcmp(argv[optind], commands[i].name) == 0)
            cmd = &commands[i];
    if (!cmd)
        return usage_error("unknown command '%s'", argv[optind]);
    rc = parse_command(cmd, argc - optind, argv + optind, &o, &x);
    if (rc)
        return rc;
    if (o.help) {
        usage(stdout);
        return EXIT_SUCCESS;
    }
    rc = cmd->run(&x, &o);
    kvp_client_close(x.client);
    return rc;
}
