/*
 * kvpool_cli.c - the `kvpool` command line: kvpoold's state at a glance, its metrics, a live
 * view, and emptying the cache.
 *
 *   kvpool [--socket PATH] [--timeout MS] COMMAND [OPTIONS]
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
 * The readable views are made from the status JSON, whose field names are an interface
 * (docs/HTTP.md): a field this program does not know is ignored and one it misses shows as
 * "-", so another daemon version still gets a view. Worker-supplied strings (instance ids,
 * model names, reasons) have their control characters replaced before they reach a terminal.
 *
 * One function per command, found in a table that also makes the help. The whole command line,
 * each command's options included, is checked before the daemon is contacted, so a typo is
 * never a connection attempt. The socket path is resolved here the same way the library does
 * (option, $KVPOOL_SOCKET, kvp_default_socket_path()) only so that messages name the socket
 * that was tried. Results go to stdout, diagnostics and questions to stderr.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "kvpool.h"

#define EXIT_DAEMON 1  /* the daemon refused the request, or it failed once connected */
#define EXIT_CONNECT 2 /* the daemon cannot be reached */
#define EXIT_USAGE 64  /* a bad command line: sysexits.h's EX_USAGE */
#define MAX_STATS 128
#define DEFAULT_TIMEOUT_MS 30000u
#define CELL 300 /* bytes of one table cell: a name (127), or a transport and its reason (255) */

/* Options a command may accept (struct command.opts). */
enum { O_JSON = 1, O_ONCE = 2, O_INTERVAL = 4, O_YES = 8 };

/* What a command's options said. */
struct cmd_opts {
    bool json, once, yes, help;
    double interval; /* seconds */
};

/* What every command works with: the socket it talks to, and the client once connected. */
struct cli {
    const char *socket_opt; /* --socket, or NULL */
    kvp_opts opts;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* set by connect_daemon() */
    kvp_client *client;
};

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

/* The socket the library will use, for messages. Resolved here and passed explicitly, so the
 * path printed is guaranteed to be the path tried. Returns 0 or a negative error. */
static int resolve_socket(const char *opt, char *buf, size_t size)
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

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Prints why the daemon could not be reached, naming the socket, with the library's message
 * when it has one. Returns EXIT_CONNECT. */
static int unreachable(const char *path, int rc)
{
    /* With NULL this is why kvp_client_open() failed. */
    const char *msg = kvp_last_error(NULL);

    if (msg[0])
        fprintf(stderr, "kvpool: cannot reach kvpoold at %s: %s (%s)\n", path, kvp_strerror(rc),
                msg);
    else
        fprintf(stderr, "kvpool: cannot reach kvpoold at %s: %s\n", path, kvp_strerror(rc));
    return EXIT_CONNECT;
}

/* Resolves the socket and connects (HELLO included). Returns 0, or EXIT_CONNECT after saying
 * why. Opening proves the daemon is alive and speaks our major protocol version. */
static int connect_daemon(struct cli *x)
{
    int rc = resolve_socket(x->socket_opt, x->path, sizeof(x->path));

    if (rc < 0) {
        fprintf(stderr, "kvpool: cannot reach kvpoold: socket path %s: %s\n",
                x->path[0] ? x->path : "(default)", kvp_strerror(rc));
        return EXIT_CONNECT;
    }
    x->opts.socket_path = x->path;
    rc = kvp_client_open(&x->opts, &x->client);
    return rc < 0 ? unreachable(x->path, rc) : 0;
}

/* A request that failed once connected, with the daemon's message (or the library's). Returns
 * EXIT_DAEMON. */
static int failed(const struct cli *x, const char *what, int rc)
{
    const char *msg = kvp_last_error(x->client);

    fprintf(stderr, "kvpool: %s failed: %s%s%s%s\n", what, kvp_strerror(rc), msg[0] ? " (" : "",
            msg, msg[0] ? ")" : "");
    return EXIT_DAEMON;
}

/* ---- reading the status JSON ---- */

/*
 * The daemon's status, parsed. Returns the document (the caller releases it with json_decref)
 * or NULL with *code set after a message. With quiet, a failed request prints nothing (watch
 * shows it in its frame).
 */
static json_t *get_status(struct cli *x, bool quiet, int *code)
{
    char *text = NULL;
    json_error_t err;

    int rc = kvp_get_status(x->client, &text);
    if (rc < 0) {
        *code = quiet ? EXIT_DAEMON : failed(x, "status", rc);
        return NULL;
    }
    json_t *doc = json_loads(text, 0, &err);
    kvp_free(text);
    if (!json_is_object(doc)) {
        fprintf(stderr, "kvpool: the daemon's status is not a JSON object%s%s\n", doc ? "" : ": ",
                doc ? "" : err.text);
        json_decref(doc);
        *code = EXIT_DAEMON;
        return NULL;
    }
    return doc;
}

/* Member key of o when it is an object, else NULL (o may be NULL). */
static json_t *jobj(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_object(v) ? v : NULL;
}

/* Member key of o as a non-negative integer: true and *v, or false when absent or not one. */
static bool jget(json_t *o, const char *key, uint64_t *v)
{
    json_t *j = json_object_get(o, key);
    if (!json_is_integer(j) || json_integer_value(j) < 0)
        return false;
    *v = (uint64_t)json_integer_value(j);
    return true;
}

/* Member key of o as an integer, 0 when it is not one. */
static uint64_t jnum(json_t *o, const char *key)
{
    uint64_t v = 0;
    return jget(o, key, &v) ? v : 0;
}

/* Member key of o as a string, def when it is not one. */
static const char *jstr(json_t *o, const char *key, const char *def)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : def;
}

/* Copies a string for a terminal: control characters (a worker chose it) become '?'. */
static void safe_copy(char *out, size_t size, const char *s)
{
    size_t i = 0;
    for (; s[i] && i + 1 < size; i++)
        out[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
    out[i] = '\0';
}

/* ---- human units ---- */

/* 1536 -> "1.50 KiB": binary units, three significant digits. */
static const char *human_bytes(double v, char *buf, size_t size)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;

    while (v >= 1024 && u < 6) {
        v /= 1024;
        u++;
    }
    int prec = u == 0 ? 0 : v < 10 ? 2 : v < 100 ? 1 : 0;
    snprintf(buf, size, "%.*f %s", prec, v, unit[u]);
    return buf;
}

/* 7384 -> "2h 03m": the two largest units. */
static const char *human_duration(uint64_t s, char *buf, size_t size)
{
    if (s < 60)
        snprintf(buf, size, "%" PRIu64 "s", s);
    else if (s < 3600)
        snprintf(buf, size, "%" PRIu64 "m %02" PRIu64 "s", s / 60, s % 60);
    else if (s < 86400)
        snprintf(buf, size, "%" PRIu64 "h %02" PRIu64 "m", s / 3600, s % 3600 / 60);
    else
        snprintf(buf, size, "%" PRIu64 "d %02" PRIu64 "h", s / 86400, s % 86400 / 3600);
    return buf;
}

/* part of whole as "12.5%", or "-" when whole is 0. */
static const char *percent(uint64_t part, uint64_t whole, char *buf, size_t size)
{
    if (whole == 0)
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.1f%%", 100.0 * (double)part / (double)whole);
    return buf;
}

/* ---- views of the status ---- */

/* "kvpoold 1.0.0 at PATH: serving, pid 4863, up 2h 03m" */
static void print_headline(const struct cli *x, json_t *doc)
{
    char up[32] = "-";
    uint64_t v;

    if (jget(doc, "uptime_s", &v))
        human_duration(v, up, sizeof(up));
    printf("kvpoold %s at %s: %s, pid %" PRIu64 ", up %s\n", jstr(doc, "version", "-"), x->path,
           jstr(doc, "state", "-"), jnum(doc, "pid"), up);
}

/*
 * "3.00 MiB of 4.00 MiB used (75.0%), 48 objects (2 pinned, 1 reserved)", and while the daemon
 * still reserves the pool in the background ", 256 MiB of 4.00 GiB reserved so far".
 */
static void print_pool(json_t *pool)
{
    char used[32], cap[32], pct[16], res[32];
    uint64_t u = jnum(pool, "used_bytes"), c = jnum(pool, "capacity_bytes");

    printf("%s of %s used (%s), %" PRIu64 " objects (%" PRIu64 " pinned, %" PRIu64 " reserved)",
           human_bytes((double)u, used, sizeof(used)), human_bytes((double)c, cap, sizeof(cap)),
           percent(u, c, pct, sizeof(pct)), jnum(pool, "objects"), jnum(pool, "pinned_objects"),
           jnum(pool, "reserved_objects"));
    if (json_is_true(json_object_get(pool, "warming")))
        printf(", %s of %s reserved so far",
               human_bytes((double)jnum(pool, "reserved_bytes"), res, sizeof(res)), cap);
}

/* Columns of the instance tables. */
enum col { C_ID, C_MODEL, C_RANK, C_DTYPE, C_CHUNK, C_PID, C_STORED, C_RETRIEVED, C_TRANSPORT };
static const char *const col_title[] = {"ID",  "MODEL",  "RANK",      "DTYPE",    "CHUNK",
                                        "PID", "STORED", "RETRIEVED", "TRANSPORT"};

/* The text of one cell. The transport comes with the fallback reason when it is inline. */
static void cell(json_t *inst, enum col col, char *buf, size_t size)
{
    char tmp[CELL];
    uint64_t v;

    switch (col) {
    case C_ID:
        safe_copy(buf, size, jstr(inst, "instance_id", "-"));
        break;
    case C_MODEL:
        safe_copy(buf, size, jstr(inst, "model_name", "-"));
        break;
    case C_RANK:
        snprintf(buf, size, "%" PRIu64 "/%" PRIu64, jnum(inst, "worker_rank"),
                 jnum(inst, "world_size"));
        break;
    case C_DTYPE:
        safe_copy(buf, size, jstr(inst, "dtype", "-"));
        break;
    case C_CHUNK:
        human_bytes((double)jnum(inst, "chunk_bytes"), buf, size);
        break;
    case C_PID:
        if (jget(inst, "pid", &v))
            snprintf(buf, size, "%" PRIu64, v);
        else
            snprintf(buf, size, "-");
        break;
    case C_STORED:
        human_bytes((double)jnum(inst, "stored_bytes"), buf, size);
        break;
    case C_RETRIEVED:
        human_bytes((double)jnum(inst, "retrieved_bytes"), buf, size);
        break;
    case C_TRANSPORT:
        safe_copy(tmp, sizeof(tmp), jstr(inst, "fallback_reason", ""));
        if (tmp[0])
            snprintf(buf, size, "%.8s (%.255s)", jstr(inst, "transport", "-"), tmp);
        else
            snprintf(buf, size, "%s", jstr(inst, "transport", "-"));
        break;
    }
}

/* A table of the instances with the given columns, each as wide as its widest cell. */
static void print_instance_table(json_t *list, const enum col *cols, size_t ncols,
                                 const char *indent)
{
    int width[C_TRANSPORT + 1] = {0};
    char buf[CELL];
    size_t i;
    json_t *inst;

    for (size_t k = 0; k < ncols; k++)
        width[cols[k]] = (int)strlen(col_title[cols[k]]);
    json_array_foreach(list, i, inst)
    {
        for (size_t k = 0; k < ncols; k++) {
            cell(inst, cols[k], buf, sizeof(buf));
            if ((int)strlen(buf) > width[cols[k]])
                width[cols[k]] = (int)strlen(buf);
        }
    }
    /* The last column is not padded: no trailing blanks. */
    fputs(indent, stdout);
    for (size_t k = 0; k < ncols; k++) {
        if (k + 1 < ncols)
            printf("%-*s  ", width[cols[k]], col_title[cols[k]]);
        else
            printf("%s\n", col_title[cols[k]]);
    }
    json_array_foreach(list, i, inst)
    {
        fputs(indent, stdout);
        for (size_t k = 0; k < ncols; k++) {
            cell(inst, cols[k], buf, sizeof(buf));
            if (k + 1 < ncols)
                printf("%-*s  ", width[cols[k]], buf);
            else
                printf("%s\n", buf);
        }
    }
}

/* Counts the instances of a list by transport. */
static void count_transports(json_t *list, size_t *shm, size_t *inl)
{
    size_t i;
    json_t *inst;

    *shm = *inl = 0;
    json_array_foreach(list, i, inst)
    {
        if (strcmp(jstr(inst, "transport", ""), "shm") == 0)
            (*shm)++;
        else
            (*inl)++;
    }
}

/* The readable summary of `kvpool status`. */
static void print_status(const struct cli *x, json_t *doc)
{
    json_t *pool = jobj(doc, "pool"), *shm = jobj(doc, "shm"), *clients = jobj(doc, "clients");
    json_t *counters = jobj(doc, "counters");
    json_t *list = json_object_get(doc, "instances");
    char a[32], b[32], c[32], reason[CELL];

    print_headline(x, doc);
    if (!pool) {
        /* A daemon still starting has no pool yet: say why, and nothing more. */
        safe_copy(reason, sizeof(reason), jstr(doc, "reason", "-"));
        printf("  %s\n", reason);
        return;
    }
    printf("Pool:       ");
    print_pool(pool);
    printf("\nChunk size: %" PRIu64 " tokens\n", jnum(doc, "chunk_tokens"));
    if (shm && json_is_true(json_object_get(shm, "enabled"))) {
        const char *backend = jstr(shm, "backend", "-");
        if (strcmp(backend, "memfd") == 0)
            printf("SHM:        enabled, memfd segment of %s (passed to workers over the socket)\n",
                   human_bytes((double)jnum(shm, "segment_size"), a, sizeof(a)));
        else
            printf("SHM:        enabled, %s segment /dev/shm/%s of %s\n", backend,
                   jstr(shm, "name", "-"),
                   human_bytes((double)jnum(shm, "segment_size"), a, sizeof(a)));
    } else {
        safe_copy(reason, sizeof(reason), jstr(shm, "disabled_reason", "-"));
        printf("SHM:        disabled: %s (every worker uses the inline transport)\n", reason);
    }
    if (clients)
        printf("Clients:    %" PRIu64 " connected (max %" PRIu64 ")\n", jnum(clients, "connected"),
               jnum(clients, "max"));
    if (counters) {
        uint64_t stored = jnum(counters, "store_bytes_shm") + jnum(counters, "store_bytes_inline");
        uint64_t got = jnum(counters, "retrieve_bytes_shm") +
                       jnum(counters, "retrieve_bytes_inline");
        printf("Totals:     %s stored, %s retrieved, %" PRIu64 " evictions, lookup hit ratio %s\n",
               human_bytes((double)stored, a, sizeof(a)), human_bytes((double)got, b, sizeof(b)),
               jnum(counters, "evictions"),
               percent(jnum(counters, "lookup_hit_chunks"), jnum(counters, "lookup_chunks"), c,
                       sizeof(c)));
    }
    if (!json_is_array(list))
        return;
    size_t nshm, ninl;
    count_transports(list, &nshm, &ninl);
    printf("Instances:  %zu (%zu shm, %zu inline)\n", json_array_size(list), nshm, ninl);
    if (json_array_size(list) > 0) {
        static const enum col cols[] = {C_ID, C_MODEL, C_RANK, C_PID, C_TRANSPORT};
        print_instance_table(list, cols, sizeof(cols) / sizeof(cols[0]), "  ");
    }
}

/* ---- the commands ---- */

/* The time reported is one PING round trip on an open connection, not connect + HELLO. */
static int cmd_ping(struct cli *x, const struct cmd_opts *o)
{
    (void)o;
    int rc = connect_daemon(x);
    if (rc)
        return rc;
    int64_t t0 = now_us();
    rc = kvp_ping(x->client);
    int64_t dt = now_us() - t0;
    if (rc < 0)
        return failed(x, "ping", rc);
    printf("kvpoold at %s: ok (%" PRId64 " us)\n", x->path, dt);
    return EXIT_SUCCESS;
}

/* Prints "name value" lines, a format that shells (awk, grep) and scrapers read easily. */
static int cmd_stats(struct cli *x, const struct cmd_opts *o)
{
    kvp_stat st[MAX_STATS];

    (void)o;
    int rc = connect_daemon(x);
    if (rc)
        return rc;
    int n = kvp_stats(x->client, st, MAX_STATS);
    if (n < 0)
        return failed(x, "stats", n);
    for (int i = 0; i < n && i < MAX_STATS; i++)
        printf("%s %" PRIu64 "\n", st[i].name, st[i].value);
    return EXIT_SUCCESS;
}

/* --json prints the daemon's document as it came, for jq and scripts. */
static int cmd_status(struct cli *x, const struct cmd_opts *o)
{
    int code = connect_daemon(x);
    if (code)
        return code;
    if (o->json) {
        char *text = NULL;
        int n = kvp_get_status(x->client, &text);
        if (n < 0)
            return failed(x, "status", n);
        fputs(text, stdout);
        if (n == 0 || text[n - 1] != '\n')
            putchar('\n');
        kvp_free(text);
        return EXIT_SUCCESS;
    }
    json_t *doc = get_status(x, false, &code);
    if (!doc)
        return code;
    print_status(x, doc);
    json_decref(doc);
    return EXIT_SUCCESS;
}

static int cmd_instances(struct cli *x, const struct cmd_opts *o)
{
    static const enum col cols[] = {C_ID,  C_MODEL,  C_RANK,      C_DTYPE,    C_CHUNK,
                                    C_PID, C_STORED, C_RETRIEVED, C_TRANSPORT};
    int code = connect_daemon(x);

    (void)o;
    if (code)
        return code;
    json_t *doc = get_status(x, false, &code);
    if (!doc)
        return code;
    json_t *list = json_object_get(doc, "instances");
    if (json_array_size(list) == 0)
        printf("No instance is registered.\n");
    else
        print_instance_table(list, cols, sizeof(cols) / sizeof(cols[0]), "");
    json_decref(doc);
    return EXIT_SUCCESS;
}

static int cmd_metrics(struct cli *x, const struct cmd_opts *o)
{
    char *text = NULL;

    (void)o;
    int code = connect_daemon(x);
    if (code)
        return code;
    int n = kvp_get_metrics(x->client, &text);
    if (n < 0)
        return failed(x, "metrics", n);
    fputs(text, stdout);
    if (n > 0 && text[n - 1] != '\n')
        putchar('\n');
    kvp_free(text);
    return EXIT_SUCCESS;
}

/* Counters `watch` turns into rates, by their names in the status JSON. */
#define WATCH_COUNTERS(XX)     \
    XX(requests)               \
    XX(request_errors)         \
    XX(lookups)                \
    XX(lookup_chunks)          \
    XX(lookup_hit_chunks)      \
    XX(store_chunks_committed) \
    XX(store_bytes_shm)        \
    XX(store_bytes_inline)     \
    XX(retrieve_chunks)        \
    XX(retrieve_bytes_shm)     \
    XX(retrieve_bytes_inline)  \
    XX(evictions)

enum watch_counter {
#define WATCH_ENUM(name) W_##name,
    WATCH_COUNTERS(WATCH_ENUM)
#undef WATCH_ENUM
        W_N
};

static const char *const watch_name[W_N] = {
#define WATCH_NAME(name) #name,
    WATCH_COUNTERS(WATCH_NAME)
#undef WATCH_NAME
};

/* One reading of the counters. */
struct sample {
    bool valid;
    int64_t t_us; /* when the reply came (monotonic) */
    uint64_t pid; /* a new pid means a new daemon: its counters start again */
    uint64_t v[W_N];
    bool have[W_N]; /* the daemon reports it (an older one may not) */
};

static void take_sample(json_t *doc, struct sample *s)
{
    json_t *counters = jobj(doc, "counters");

    s->valid = true;
    s->t_us = now_us();
    s->pid = jnum(doc, "pid");
    for (int i = 0; i < W_N; i++)
        s->have[i] = jget(counters, watch_name[i], &s->v[i]);
}

/* Whether rates can be computed from prev to cur: the same daemon, no counter gone back. */
static bool comparable(const struct sample *prev, const struct sample *cur)
{
    if (!prev->valid || !cur->valid || prev->pid != cur->pid || cur->t_us <= prev->t_us)
        return false;
    for (int i = 0; i < W_N; i++)
        if (prev->have[i] && cur->have[i] && cur->v[i] < prev->v[i])
            return false;
    return true;
}

/* The increase of counter i per second, or -1 when unknown. */
static double rate(const struct sample *prev, const struct sample *cur, int i)
{
    if (!comparable(prev, cur) || !prev->have[i] || !cur->have[i])
        return -1;
    return (double)(cur->v[i] - prev->v[i]) * 1e6 / (double)(cur->t_us - prev->t_us);
}

/* A rate with its unit, "12.5/s" or "12.5 chunks/s", or "-". */
static const char *fmt_rate(double r, const char *unit, char *buf, size_t size)
{
    if (r < 0)
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.1f%s", r, unit);
    return buf;
}

/* A byte rate as "12.3 MiB/s", or "-". */
static const char *fmt_byte_rate(double r, char *buf, size_t size)
{
    char tmp[32];
    if (r < 0)
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%s/s", human_bytes(r, tmp, sizeof(tmp)));
    return buf;
}

/* The sum of two rates, -1 if either is unknown. */
static double sum2(double a, double b)
{
    return a < 0 || b < 0 ? -1 : a + b;
}

/* One frame of `watch`: rates over the last interval, then the pool and the instances now. */
static void print_frame(const struct cli *x, json_t *doc, const struct sample *prev,
                        const struct sample *cur)
{
    char a[32], b[32], c[32], d[48];
    json_t *pool = jobj(doc, "pool"), *gauges = jobj(doc, "gauges");
    time_t now = time(NULL);
    struct tm tm;

    print_headline(x, doc);
    if (localtime_r(&now, &tm))
        strftime(d, sizeof(d), "%Y-%m-%d %H:%M:%S", &tm);
    else
        snprintf(d, sizeof(d), "-");
    printf("%s, rates over the last %.1f s\n\n", d,
           comparable(prev, cur) ? (double)(cur->t_us - prev->t_us) / 1e6 : 0.0);

    printf("Requests    %-14s errors %s\n",
           fmt_rate(rate(prev, cur, W_requests), "/s", a, sizeof(a)),
           fmt_rate(rate(prev, cur, W_request_errors), "/s", b, sizeof(b)));
    /* The hit ratio of the interval: chunks found over chunks asked about. */
    double asked = rate(prev, cur, W_lookup_chunks), hit = rate(prev, cur, W_lookup_hit_chunks);
    if (asked > 0 && hit >= 0)
        snprintf(c, sizeof(c), "%.1f%%", 100.0 * hit / asked);
    else
        snprintf(c, sizeof(c), "- (no lookups)");
    printf("Lookups     %-14s hit ratio %s\n",
           fmt_rate(rate(prev, cur, W_lookups), "/s", a, sizeof(a)), c);
    double shm = rate(prev, cur, W_store_bytes_shm), inl = rate(prev, cur, W_store_bytes_inline);
    printf("Stores      %-14s %-18s (shm %s, inline %s)\n",
           fmt_byte_rate(sum2(shm, inl), a, sizeof(a)),
           fmt_rate(rate(prev, cur, W_store_chunks_committed), " chunks/s", d, sizeof(d)),
           fmt_byte_rate(shm, b, sizeof(b)), fmt_byte_rate(inl, c, sizeof(c)));
    shm = rate(prev, cur, W_retrieve_bytes_shm);
    inl = rate(prev, cur, W_retrieve_bytes_inline);
    printf("Retrieves   %-14s %-18s (shm %s, inline %s)\n",
           fmt_byte_rate(sum2(shm, inl), a, sizeof(a)),
           fmt_rate(rate(prev, cur, W_retrieve_chunks), " chunks/s", d, sizeof(d)),
           fmt_byte_rate(shm, b, sizeof(b)), fmt_byte_rate(inl, c, sizeof(c)));
    printf("Evictions   %s\n\n", fmt_rate(rate(prev, cur, W_evictions), "/s", a, sizeof(a)));

    if (pool) {
        printf("Pool        ");
        print_pool(pool);
        putchar('\n');
    }
    json_t *list = json_object_get(doc, "instances");
    size_t nshm = 0, ninl = 0;
    count_transports(list, &nshm, &ninl);
    printf("Instances   %zu (%zu shm, %zu inline); clients connected: %" PRIu64 "\n",
           json_array_size(list), nshm, ninl, gauges ? jnum(gauges, "connections") : 0);
}

/* Sleeps for seconds, through signals that do not end the program. */
static void sleep_s(double seconds)
{
    struct timespec ts = {.tv_sec = (time_t)seconds,
                          .tv_nsec = (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/*
 * A frame needs two readings, an interval apart. --once waits one interval and prints one
 * frame; otherwise a frame follows every interval until interrupted. On a terminal each frame
 * replaces the last (ANSI: cursor home, clear screen); anything else gets the frames one after
 * the other, separated by a blank line, so a log or a pipe keeps them all.
 */
static int cmd_watch(struct cli *x, const struct cmd_opts *o)
{
    struct sample prev = {.valid = false}, cur;
    bool tty = !o->once && isatty(STDOUT_FILENO);
    int code = connect_daemon(x);

    if (code)
        return code;
    json_t *doc = get_status(x, false, &code);
    if (!doc)
        return code;
    take_sample(doc, &prev);
    json_decref(doc);
    for (bool first = true;; first = false) {
        sleep_s(o->interval);
        doc = get_status(x, !o->once, &code);
        if (!doc) {
            if (o->once)
                return code;
            /* Keep watching: the library reconnects at the next call if the daemon restarts. */
            const char *msg = kvp_last_error(x->client);
            printf("%skvpoold at %s: not answering: %s; trying again every %.1f s\n",
                   tty     ? "\033[H\033[2J"
                   : first ? ""
                           : "\n",
                   x->path, msg[0] ? msg : "-", o->interval);
            fflush(stdout);
            prev.valid = false;
            continue;
        }
        take_sample(doc, &cur);
        fputs(tty ? "\033[H\033[2J" : first ? "" : "\n", stdout);
        print_frame(x, doc, &prev, &cur);
        fflush(stdout);
        json_decref(doc);
        if (o->once)
            return EXIT_SUCCESS;
        prev = cur;
    }
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
static int cmd_clear(struct cli *x, const struct cmd_opts *o)
{
    int code;

    if (!o->yes && !isatty(STDIN_FILENO)) {
        fprintf(stderr, "kvpool: clear drops every cached chunk and needs a confirmation: run it "
                        "on a terminal, or pass --yes\n");
        return EXIT_USAGE;
    }
    code = connect_daemon(x);
    if (code)
        return code;
    if (!o->yes) {
        json_t *doc = get_status(x, false, &code);
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
        return failed(x, "clear", n);
    printf("Dropped %d committed objects.\n", n);
    return EXIT_SUCCESS;
}

/* The daemon's version comes from its status; an unreachable daemon is reported, not fatal. */
static int cmd_version(struct cli *x, const struct cmd_opts *o)
{
    uint32_t v = kvp_version();
    char *text = NULL;
    json_error_t err;

    (void)o;
    printf("kvpool %s\n", KVP_VERSION_STRING);
    printf("libkvpool %u.%u.%u\n", v >> 16, (v >> 8) & 0xff, v & 0xff);
    fflush(stdout);
    int rc = resolve_socket(x->socket_opt, x->path, sizeof(x->path));
    if (rc == 0) {
        x->opts.socket_path = x->path;
        rc = kvp_client_open(&x->opts, &x->client);
    }
    if (rc < 0) {
        const char *msg = kvp_last_error(NULL);
        printf("kvpoold: not reachable at %s (%s)\n", x->path, msg[0] ? msg : kvp_strerror(rc));
        return EXIT_SUCCESS;
    }
    rc = kvp_get_status(x->client, &text);
    if (rc < 0) {
        printf("kvpoold: unknown version at %s (%s)\n", x->path, kvp_last_error(x->client));
        return EXIT_SUCCESS;
    }
    json_t *doc = json_loads(text, 0, &err);
    kvp_free(text);
    printf("kvpoold %s at %s\n", jstr(doc, "version", "-"), x->path);
    json_decref(doc);
    return EXIT_SUCCESS;
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
            "Options:\n"
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

/*
 * Parses a command's options (argv[0] is the command's name) into *o. Returns 0, or EXIT_USAGE
 * after one line about what is wrong: an option the command does not take, a bad value, an
 * operand.
 */
static int parse_command(const struct command *cmd, int argc, char **argv, struct cmd_opts *o)
{
    static const struct option longopts[] = {
        {"json", no_argument, NULL, 'j'},           {"once", no_argument, NULL, '1'},
        {"interval", required_argument, NULL, 'n'}, {"yes", no_argument, NULL, 'y'},
        {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0},
    };
    int opt;

    *o = (struct cmd_opts){.interval = 1.0};
    optind = 0; /* glibc: start a new scan */
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "+:n:yh", longopts, NULL)) != -1) {
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

    /* '+': stop at the command, so that nothing after it is taken for a global option. */
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "+:s:t:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 's':
            if (!optarg[0])
                return usage_error("--socket needs a path");
            x.socket_opt = optarg;
            break;
        case 't':
            if (parse_timeout(optarg, &x.opts.timeout_ms) < 0)
                return usage_error("invalid timeout '%s': expected milliseconds >= 1", optarg);
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
    rc = parse_command(cmd, argc - optind, argv + optind, &o);
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
