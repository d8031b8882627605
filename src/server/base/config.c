/*
 * config.c - option parsing for kvpoold.
 *
 * Every option has a default, a long command-line form, a KVPOOL_<NAME> environment variable
 * and a key of the same name in the --config file; the command line wins over the environment,
 * which wins over the file, which wins over the defaults. The option table below is the single
 * source for getopt, the environment, the file's keys and --help, so they cannot drift apart.
 * Values are validated here, once (apply()), with a message that names the option and where the
 * value came from (command line, variable, FILE:LINE).
 *
 * "The command line wins" holds for errors too: the command line is scanned first for the
 * options it sets (and its --config), and a value of a lower layer (file, environment) whose
 * option a higher one sets is not applied at all, so a bad value there is only noted, never
 * fatal. A bad value nothing overrides is. Errors in the file's structure (an unknown key, a
 * line without '=') are always fatal: they are not values that anything overrides.
 */
#include "base/config.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/config_file.h"
#include "common/shm_name.h"
#include "common/socket_path.h"
#include "http/http.h"
#include "l2/l2_url.h"

#define MIN_L1 (1ull << 20)
#define MAX_L1 (1ull << 50) /* 1 PiB: far beyond any host, and rounding cannot overflow */
#define MAX_CHUNK_TOKENS (1u << 20)

enum opt_id {
    OPT_SOCKET = 1,
    OPT_SOCKET_MODE,
    OPT_L1_SIZE,
    OPT_CHUNK_SIZE,
    OPT_SHM_NAME,
    OPT_LOG_LEVEL,
    OPT_MAX_CLIENTS,
    OPT_RESERVE_TIMEOUT,
    OPT_IO_TIMEOUT,
    OPT_HTTP,
    OPT_SHM_BACKEND,
    OPT_SHM_MODE,
    OPT_ALLOW_UID,
    OPT_ALLOW_GID,
    OPT_CONFIG,
    OPT_LOG_FORMAT,
    OPT_L2,
    OPT_L2_PASSWORD_FILE,
    OPT_L2_TTL,
    OPT_L2_CONNECTIONS,
    OPT_L2_QUEUE,
    OPT_L2_TIMEOUT,
    OPT_FOLLOW_CPU,
    OPT_HELP,
    OPT_VERSION,
};

struct opt_desc {
    const char *name;
    const char *env; /* NULL: command line only */
    const char *arg;
    const char *help;
    int id;
};

static const struct opt_desc opts[] = {
    {"config", "KVPOOL_CONFIG", "FILE",
     "Read options from FILE: one 'name = value' per line, the names of the long options\n"
     "here (l1-size = 4GiB); '#' starts a comment; a value may be quoted (shm-name = \"\").\n"
     "The command line wins over the environment, which wins over the file. Default: none",
     OPT_CONFIG},
    {"socket", "KVPOOL_SOCKET", "PATH",
     "Unix socket to listen on.\n"
     "Default: $XDG_RUNTIME_DIR/kvpool/kvpool.sock, else /tmp/kvpool-<uid>/kvpool.sock\n"
     "(a private directory, created 0700; refused if another user owns it or it is\n"
     "writable by group or others)",
     OPT_SOCKET},
    {"socket-mode", "KVPOOL_SOCKET_MODE", "MODE",
     "Permission bits of the socket file, octal. Default: 0600 (owner only)", OPT_SOCKET_MODE},
    {"l1-size", "KVPOOL_L1_SIZE", "SIZE",
     "L1 pool size: bytes, or with a unit (KiB, MiB, GiB, TiB). Default: 1GiB", OPT_L1_SIZE},
    {"chunk-size", "KVPOOL_CHUNK_SIZE", "TOKENS", "Tokens per KV chunk. Default: 256",
     OPT_CHUNK_SIZE},
    {"shm-name", "KVPOOL_SHM_NAME", "NAME",
     "POSIX shared-memory segment of the pool; '/' stripped, prefix kvpool_l1_pool_ added.\n"
     "\"\" disables shared memory (inline transport only). Default: kvpool_l1_pool_<pid>_<random>",
     OPT_SHM_NAME},
    {"shm-backend", "KVPOOL_SHM_BACKEND", "BACKEND",
     "posix: a named segment under /dev/shm, mapped by name (default).\n"
     "memfd: an anonymous segment handed to each worker over the socket; not limited by\n"
     "the size of /dev/shm and never left behind, even after SIGKILL. none: inline only.",
     OPT_SHM_BACKEND},
    {"shm-mode", "KVPOOL_SHM_MODE", "MODE",
     "Permission bits of a posix segment, octal: 0600 (default, owner only) or 0660 to let\n"
     "workers of the daemon's group map it (they can then read and write every chunk).",
     OPT_SHM_MODE},
    {"allow-uid", "KVPOOL_ALLOW_UID", "UIDS",
     "Comma-separated user ids that may connect besides the daemon's own. Default: none",
     OPT_ALLOW_UID},
    {"allow-gid", "KVPOOL_ALLOW_GID", "GIDS",
     "Comma-separated group ids whose members' processes may connect. Default: none",
     OPT_ALLOW_GID},
    {"log-level", "KVPOOL_LOG_LEVEL", "LEVEL", "debug, info, warn or error. Default: info",
     OPT_LOG_LEVEL},
    {"log-format", "KVPOOL_LOG_FORMAT", "FORMAT",
     "text: one line per event (default). json: one JSON object per line with ts, level,\n"
     "msg, pid and the event's fields, for log shippers.",
     OPT_LOG_FORMAT},
    {"max-clients", "KVPOOL_MAX_CLIENTS", "N",
     "Maximum simultaneous connections (1..4096). Default: 256", OPT_MAX_CLIENTS},
    {"reserve-timeout", "KVPOOL_RESERVE_TIMEOUT", "SECONDS",
     "Cancel store reservations not committed within this time. Default: 600", OPT_RESERVE_TIMEOUT},
    {"io-timeout", "KVPOOL_IO_TIMEOUT", "MS",
     "Drop a client that stalls in the middle of a frame for this long. Default: 30000",
     OPT_IO_TIMEOUT},
    {"follow-cpu", "KVPOOL_FOLLOW_CPU", "on|off",
     "Run each connection's thread on the CPU its worker sent the request from, so that\n"
     "a request and its reply never wake an idle CPU (docs/PERFORMANCE.md). off: leave\n"
     "the threads to the scheduler. Default: on",
     OPT_FOLLOW_CPU},
    {"http", "KVPOOL_HTTP", "ADDR:PORT",
     "Serve the status page, /api/healthcheck, /api/status and /metrics over HTTP there\n"
     "(read-only, unauthenticated: see docs/SECURITY.md before using a non-loopback\n"
     "address). ADDR is an IPv4 address, localhost or [IPv6]; a bare PORT means\n"
     "127.0.0.1:PORT; port 0 picks a free one (logged). off: no HTTP. Default: " KVP_HTTP_DEFAULT,
     OPT_HTTP},
    {"l2", "KVPOOL_L2", "URL",
     "A second tier on Redis, shared by every daemon that names it (README: Sharing\n"
     "across hosts): redis://[user:password@]HOST:PORT[/DB], unix:///PATH[?db=N] or\n"
     "redis-cluster://HOST:PORT[,HOST:PORT...] (seed nodes). Credentials are never\n"
     "logged. Set maxmemory-policy allkeys-lru on the Redis side. Default: off",
     OPT_L2},
    {"l2-password-file", "KVPOOL_L2_PASSWORD_FILE", "FILE",
     "Read the L2 password from FILE (one line, read once at start-up; a warning if\n"
     "group or others can read it). It replaces a password in the URL. Default: none",
     OPT_L2_PASSWORD_FILE},
    {"l2-ttl", "KVPOOL_L2_TTL", "SECONDS",
     "Expire chunks in L2 after this many seconds; 0: never (Redis' maxmemory policy\n"
     "evicts them). Default: 0",
     OPT_L2_TTL},
    {"l2-connections", "KVPOOL_L2_CONNECTIONS", "N",
     "Background threads copying to and loading from L2, each with its own connection,\n"
     "and as many connections for workers' lookups and retrieves (1..64). Default: 2",
     OPT_L2_CONNECTIONS},
    {"l2-queue", "KVPOOL_L2_QUEUE", "SIZE",
     "Bytes of chunks waiting for a copy to L2; when full, the oldest are dropped\n"
     "(counted), never a worker slowed. Default: 256MiB",
     OPT_L2_QUEUE},
    {"l2-timeout", "KVPOOL_L2_TIMEOUT", "MS",
     "Bound of every L2 connect, command and wait for a load (10..600000). Default: 1000",
     OPT_L2_TIMEOUT},
    {"help", NULL, NULL, "Show this help and exit", OPT_HELP},
    {"version", NULL, NULL, "Show the version and exit", OPT_VERSION},
};

#define NOPTS (sizeof(opts) / sizeof(opts[0]))

void kvp_config_defaults(struct kvp_config *cfg)
{
    *cfg = (struct kvp_config){
        .socket_mode = 0600,
        .l1_size = 1ull << 30,
        .chunk_tokens = 256,
        .shm_enabled = true,
        .log_level = KVP_LOG_INFO,
        .log_format = KVP_LOG_TEXT,
        .max_clients = 256,
        .reserve_timeout_s = 600,
        .io_timeout_ms = 30000,
        .http = KVP_HTTP_DEFAULT,
        .shm_backend = KVP_SHM_POSIX,
        .shm_mode = 0600,
        .l2_connections = 2,
        .l2_queue_bytes = 256ull << 20,
        .l2_timeout_ms = 1000,
        .follow_cpu = true,
    };
    /* The clients' rule. A path too long for a socket stays "" and is reported at bind. */
    kvp_socket_path_default(cfg->socket_path, sizeof(cfg->socket_path));
    /* Random: another local user cannot plant a file of that name (docs/SECURITY.md). On the
     * impossible failure the name stays "", and the segment's creation draws one again. */
    kvp_shm_name_random((long)getpid(), cfg->shm_name, sizeof(cfg->shm_name));
}

int kvp_parse_size(const char *s, uint64_t *out)
{
    static const struct {
        const char *unit;
        unsigned shift;
    } units[] = {
        {"", 0},     {"b", 0},  {"k", 10},   {"kib", 10}, {"m", 20},
        {"mib", 20}, {"g", 30}, {"gib", 30}, {"t", 40},   {"tib", 40},
    };
    char *end;

    if (!s || s[0] < '0' || s[0] > '9')
        return -EINVAL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || v == 0)
        return -EINVAL;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcasecmp(end, units[i].unit) == 0) {
            if (v > (UINT64_MAX >> units[i].shift))
                return -EINVAL;
            *out = (uint64_t)v << units[i].shift;
            return 0;
        }
    }
    return -EINVAL;
}

static int parse_u32(const char *s, uint32_t min, uint32_t max, int base, uint32_t *out);

/* A comma-separated list of numeric ids, at most KVP_MAX_ALLOW. */
static int parse_id_list(const char *s, uint32_t *ids, uint32_t *n)
{
    char buf[512], *save = NULL;
    if (strlen(s) >= sizeof(buf))
        return -EINVAL;
    snprintf(buf, sizeof(buf), "%s", s);
    *n = 0;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*n == KVP_MAX_ALLOW || parse_u32(tok, 0, UINT32_MAX - 1, 10, &ids[*n]))
            return -EINVAL;
        (*n)++;
    }
    return *n ? 0 : -EINVAL;
}

static int parse_u32(const char *s, uint32_t min, uint32_t max, int base, uint32_t *out)
{
    char *end;
    if (!s || !*s || *s == '-')
        return -EINVAL;
    errno = 0;
    unsigned long v = strtoul(s, &end, base);
    if (errno || *end || v < min || v > max)
        return -EINVAL;
    *out = (uint32_t)v;
    return 0;
}

/* Applies one option value. Returns 0, or -EINVAL after printing what is wrong. */
static int apply(struct kvp_config *cfg, int id, const char *val, const char *src, FILE *err)
{
    int rc = 0;
    const char *want = "";

    switch (id) {
    case OPT_SOCKET:
        if (!val[0] || strlen(val) >= sizeof(cfg->socket_path)) {
            rc = -EINVAL;
            want = "a path of 1..107 bytes";
        } else {
            snprintf(cfg->socket_path, sizeof(cfg->socket_path), "%s", val);
        }
        break;
    case OPT_SOCKET_MODE:
        rc = parse_u32(val, 0, 0777, 8, &cfg->socket_mode);
        want = "octal permission bits such as 0600 or 0660";
        break;
    case OPT_L1_SIZE: {
        uint64_t v;
        rc = kvp_parse_size(val, &v);
        if (!rc && (v < MIN_L1 || v > MAX_L1))
            rc = -EINVAL;
        if (!rc)
            cfg->l1_size = (v + 4095) & ~(uint64_t)4095;
        want = "a size from 1MiB to 1PiB, such as 1GiB, 512MiB or 67108864";
        break;
    }
    case OPT_CHUNK_SIZE:
        rc = parse_u32(val, 1, MAX_CHUNK_TOKENS, 10, &cfg->chunk_tokens);
        want = "a token count from 1 to 1048576";
        break;
    case OPT_SHM_NAME:
        if (val[0] == '\0') {
            cfg->shm_enabled = false;
            cfg->shm_name[0] = '\0';
        } else {
            cfg->shm_enabled = true;
            cfg->shm_name_given = true;
            rc = kvp_shm_name_normalize(val, cfg->shm_name, sizeof(cfg->shm_name));
            want = "a name without '/' of at most 127 bytes with the prefix, or \"\"";
        }
        break;
    case OPT_SHM_BACKEND:
        if (strcmp(val, "posix") == 0)
            cfg->shm_backend = KVP_SHM_POSIX;
        else if (strcmp(val, "memfd") == 0)
            cfg->shm_backend = KVP_SHM_MEMFD;
        else if (strcmp(val, "none") == 0)
            cfg->shm_backend = KVP_SHM_NONE;
        else
            rc = -EINVAL;
        want = "posix, memfd or none";
        break;
    case OPT_SHM_MODE:
        rc = parse_u32(val, 0, 0777, 8, &cfg->shm_mode);
        if (!rc && ((cfg->shm_mode & 0600) != 0600 || (cfg->shm_mode & 0007)))
            rc = -EINVAL;
        want = "octal bits with owner read/write and nothing for others, such as 0600 or 0660";
        break;
    case OPT_ALLOW_UID:
        rc = parse_id_list(val, cfg->allow_uids, &cfg->n_allow_uids);
        want = "up to 32 comma-separated numeric user ids";
        break;
    case OPT_ALLOW_GID:
        rc = parse_id_list(val, cfg->allow_gids, &cfg->n_allow_gids);
        want = "up to 32 comma-separated numeric group ids";
        break;
    case OPT_LOG_LEVEL:
        rc = kvp_log_parse_level(val, &cfg->log_level);
        want = "debug, info, warn or error";
        break;
    case OPT_LOG_FORMAT:
        rc = kvp_log_parse_format(val, &cfg->log_format);
        want = "text or json";
        break;
    case OPT_MAX_CLIENTS:
        rc = parse_u32(val, 1, 4096, 10, &cfg->max_clients);
        want = "a number from 1 to 4096";
        break;
    case OPT_RESERVE_TIMEOUT:
        rc = parse_u32(val, 1, 86400, 10, &cfg->reserve_timeout_s);
        want = "seconds from 1 to 86400";
        break;
    case OPT_IO_TIMEOUT:
        rc = parse_u32(val, 10, 3600000, 10, &cfg->io_timeout_ms);
        want = "milliseconds from 10 to 3600000";
        break;
    case OPT_FOLLOW_CPU:
        if (strcmp(val, "on") == 0)
            cfg->follow_cpu = true;
        else if (strcmp(val, "off") == 0)
            cfg->follow_cpu = false;
        else
            rc = -EINVAL;
        want = "on or off";
        break;
    case OPT_HTTP:
        if (strlen(val) >= sizeof(cfg->http) || kvp_http_parse_listen(val, NULL))
            rc = -EINVAL;
        else
            snprintf(cfg->http, sizeof(cfg->http), "%s", val);
        want = "ADDR:PORT (127.0.0.1:9190, [::1]:9190, localhost:0), a port, or off";
        break;
    case OPT_L2: {
        struct kvp_l2_target t;
        char why[256];
        bool off = val[0] == '\0' || strcmp(val, "off") == 0;
        /* The URL may hold a password: the message names the problem, never the value. */
        rc = off ? 0 : kvp_l2_url_parse(val, &t, why, sizeof(why));
        explicit_bzero(&t, sizeof(t));
        if (rc) {
            if (err)
                fprintf(err, "kvpoold: invalid l2 URL (from %s): %s\n", src, why);
            return -EINVAL;
        }
        snprintf(cfg->l2_url, sizeof(cfg->l2_url), "%s", off ? "" : val);
        break;
    }
    case OPT_L2_PASSWORD_FILE:
        if (strlen(val) >= sizeof(cfg->l2_password_file))
            rc = -EINVAL;
        else
            snprintf(cfg->l2_password_file, sizeof(cfg->l2_password_file), "%s", val);
        want = "a path of at most 1023 bytes";
        break;
    case OPT_L2_TTL:
        rc = parse_u32(val, 0, 315360000, 10, &cfg->l2_ttl_s);
        want = "seconds from 0 (no expiry) to 315360000";
        break;
    case OPT_L2_CONNECTIONS:
        rc = parse_u32(val, 1, 64, 10, &cfg->l2_connections);
        want = "a number from 1 to 64";
        break;
    case OPT_L2_QUEUE:
        rc = kvp_parse_size(val, &cfg->l2_queue_bytes);
        want = "a size such as 256MiB or 1GiB";
        break;
    case OPT_L2_TIMEOUT:
        rc = parse_u32(val, 10, 600000, 10, &cfg->l2_timeout_ms);
        want = "milliseconds from 10 to 600000";
        break;
    default:
        rc = -EINVAL;
    }
    if (rc) {
        const char *name = "?";
        for (size_t i = 0; i < NOPTS; i++)
            if (opts[i].id == id)
                name = opts[i].name;
        if (err)
            fprintf(err, "kvpoold: invalid %s '%s' (from %s): expected %s\n", name, val, src, want);
        return -EINVAL;
    }
    return 0;
}

/* A value as a note about an ignored one may show it: a --l2 URL may hold a password. */
static const char *shown(int id, const char *val)
{
    return id == OPT_L2 ? "(an L2 URL, not shown)" : val;
}

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: kvpoold [OPTION]...\n"
            "KV-cache daemon for LLM inference workers: an L1 memory pool shared with workers\n"
            "through POSIX shared memory, with an inline socket transport as fallback.\n\n");
    for (size_t i = 0; i < NOPTS; i++) {
        fprintf(out, "  --%s%s%s\n", opts[i].name, opts[i].arg ? " " : "",
                opts[i].arg ? opts[i].arg : "");
        /* Each line of the help text is indented under its option. */
        for (const char *line = opts[i].help; *line;) {
            const char *nl = strchr(line, '\n');
            int len = nl ? (int)(nl - line) : (int)strlen(line);
            fprintf(out, "      %.*s\n", len, line);
            line += len + (nl ? 1 : 0);
        }
        if (opts[i].env)
            fprintf(out, "      Environment: %s\n", opts[i].env);
        fputc('\n', out);
    }
    fprintf(out, "Precedence: the command line, then the environment, then the --config file,\n"
                 "then the defaults.\n"
                 "Signals: SIGINT, SIGTERM and SIGHUP stop the daemon cleanly and remove the\n"
                 "segment and the socket file.\n");
}

/* What the file reader's callback needs to know. */
struct file_layer {
    struct kvp_config *cfg;
    const bool *on_command_line; /* by option id */
    const char *path;
    FILE *err;
};

/* One entry of the --config file: a key of the option table, applied unless overridden. */
static int file_entry(void *arg, const char *key, const char *value, unsigned line)
{
    const struct file_layer *f = arg;
    const struct opt_desc *o = NULL;
    char src[4200];

    snprintf(src, sizeof(src), "%s:%u", f->path, line);
    for (size_t i = 0; i < NOPTS && !o; i++)
        if (strcmp(opts[i].name, key) == 0)
            o = &opts[i];
    if (!o) {
        fprintf(f->err,
                "kvpoold: %s: unknown key '%s' (the keys are the long option names of "
                "'kvpoold --help')\n",
                src, key);
        return -EINVAL;
    }
    if (!o->arg || o->id == OPT_CONFIG) {
        fprintf(f->err, "kvpoold: %s: '%s' cannot be set in a configuration file\n", src, key);
        return -EINVAL;
    }
    /* Overridden by a higher layer: the value is never used, so a bad one is only noted. */
    const char *env = o->env ? getenv(o->env) : NULL;
    if (f->on_command_line[o->id] || env) {
        struct kvp_config scratch = *f->cfg;
        if (apply(&scratch, o->id, value, src, NULL)) {
            if (f->on_command_line[o->id])
                fprintf(f->err,
                        "kvpoold: ignoring invalid %s '%s' at %s: --%s on the command line "
                        "overrides it\n",
                        key, shown(o->id, value), src, key);
            else
                fprintf(f->err, "kvpoold: ignoring invalid %s '%s' at %s: %s overrides it\n", key,
                        shown(o->id, value), src, o->env);
        }
        return 0;
    }
    return apply(f->cfg, o->id, value, src, f->err);
}

int kvp_config_parse(struct kvp_config *cfg, int argc, char **argv, FILE *out, FILE *err)
{
    struct option lopts[NOPTS + 1];
    bool on_command_line[OPT_VERSION + 1] = {false};
    const char *config_path = NULL;

    for (size_t i = 0; i < NOPTS; i++)
        lopts[i] = (struct option){opts[i].name, opts[i].arg ? required_argument : no_argument,
                                   NULL, opts[i].id};
    lopts[NOPTS] = (struct option){0};

    /* First pass: which options the command line sets. Its errors are reported below. */
    optind = 0;
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, "h", lopts, NULL)) != -1;) {
        if (c > 0 && c <= OPT_VERSION)
            on_command_line[c] = true;
        if (c == OPT_CONFIG)
            config_path = optarg;
    }
    bool info_only = on_command_line[OPT_HELP] || on_command_line[OPT_VERSION];

    /* The file, the lowest layer: --config, else KVPOOL_CONFIG; "" means none. */
    if (!info_only && !on_command_line[OPT_CONFIG])
        config_path = getenv("KVPOOL_CONFIG");
    if (!info_only && config_path && config_path[0]) {
        struct file_layer f = {cfg, on_command_line, config_path, err};
        if (kvp_conf_file_read(config_path, file_entry, &f, err))
            return -EINVAL;
    }

    for (size_t i = 0; i < NOPTS && !info_only; i++) {
        if (!opts[i].env || opts[i].id == OPT_CONFIG)
            continue;
        const char *v = getenv(opts[i].env);
        if (!v)
            continue;
        if (on_command_line[opts[i].id]) {
            struct kvp_config scratch = *cfg;
            if (apply(&scratch, opts[i].id, v, opts[i].env, NULL))
                fprintf(err,
                        "kvpoold: ignoring invalid %s '%s': --%s on the command line "
                        "overrides it\n",
                        opts[i].env, shown(opts[i].id, v), opts[i].name);
            continue;
        }
        if (apply(cfg, opts[i].id, v, opts[i].env, err))
            return -EINVAL;
    }

    optind = 0;
    opterr = 0;
    for (;;) {
        int c = getopt_long(argc, argv, "h", lopts, NULL);
        if (c == -1)
            break;
        if (c == 'h' || c == OPT_HELP) {
            usage(out);
            return 1;
        }
        if (c == OPT_VERSION) {
            fprintf(out, "kvpoold %s\n", KVP_DAEMON_VERSION);
            return 1;
        }
        if (c == '?' || c == ':') {
            fprintf(err,
                    "kvpoold: unknown or incomplete option '%s'\n"
                    "Try 'kvpoold --help'.\n",
                    argv[optind - 1]);
            return -EINVAL;
        }
        if (c == OPT_CONFIG)
            continue; /* read above */
        if (apply(cfg, c, optarg, "command line", err))
            return -EINVAL;
    }
    if (optind < argc) {
        fprintf(err, "kvpoold: unexpected argument '%s'\nTry 'kvpoold --help'.\n", argv[optind]);
        return -EINVAL;
    }
    if (!cfg->socket_path[0]) {
        fprintf(err, "kvpoold: the default socket path ($XDG_RUNTIME_DIR/kvpool/kvpool.sock) is "
                     "too long for a Unix socket; set --socket\n");
        return -EINVAL;
    }
    return 0;
}
