/*
 * config.c - option parsing for kvpoold.
 *
 * Every option has a default, a long command-line form, a KVPOOL_<NAME> environment variable
 * and a key of the same name in the --config file; the command line wins over the environment,
 * which wins over the file, which wins over the defaults. The option table below (opts[], one
 * row per option: name, variable, metavar, help, how its value is parsed and where it is stored,
 * whether SIGHUP applies it) is the single source for getopt, the environment, the file's keys,
 * --help and the reload, so they cannot drift apart. Values are validated here, once
 * (set_value(), driven by the row's kind: size, number with bounds, octal bits, on/off, a name of
 * an enum, a string with a maximum length, or a custom parser), with a message that names the
 * option and where the value came from (command line, variable, FILE:LINE).
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
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/config_file.h"
#include "base/l2_url.h"
#include "base/listen_addr.h"
#include "common/shm_name.h"
#include "common/socket_path.h"

#define MIN_L1 (1ull << 20)
#define MAX_L1 (1ull << 50) /* 1 PiB: far beyond any host, and rounding cannot overflow */
#define MAX_CHUNK_TOKENS (1u << 20)

/* How a row's value is parsed, stored and shown. */
enum opt_kind {
    KIND_NONE,   /* --config, --help, --version: the parser itself handles them */
    KIND_STRING, /* char[size]: min..size-1 bytes */
    KIND_U32,    /* uint32_t, decimal, min..max */
    KIND_OCTAL,  /* uint32_t, octal permission bits, min..max */
    KIND_SIZE,   /* uint64_t, kvp_parse_size(), min..max, rounded up to a multiple of round */
    KIND_BOOL,   /* bool, "on" or "off" */
    KIND_ENUM,   /* an enum (an int): value i is names[i] */
    KIND_CUSTOM, /* parse() and show() */
};

struct opt_desc {
    const char *name; /* long option, file key */
    const char *env;  /* NULL: command line only */
    const char *arg;  /* metavar in --help; NULL: takes no value */
    const char *help;
    enum opt_kind kind;
    size_t offset, size;   /* the field in struct kvp_config */
    size_t offset2, size2; /* KIND_CUSTOM: a second field it sets (size2 0: none) */
    uint64_t min, max, round;
    const char *const *names; /* KIND_ENUM, NULL-terminated */
    /* KIND_CUSTOM: parses val into cfg; 0, or -EINVAL with why set when it has more to say
     * than want. show() writes the value as a user would write it. */
    int (*parse)(struct kvp_config *cfg, const char *val, char *why, size_t why_size);
    void (*show)(const struct kvp_config *cfg, char *out, size_t size);
    const char *want; /* what a valid value looks like, for errors */
    bool reload;      /* SIGHUP applies a new value to the running daemon */
    bool secret;      /* never shown: neither in a note nor in a change (it may hold a password) */
};

#define FIELD(f) \
    .offset = offsetof(struct kvp_config, f), .size = sizeof(((struct kvp_config *)0)->f)
#define STRING(f, lo) .kind = KIND_STRING, FIELD(f), .min = (lo)
#define U32(f, lo, hi) .kind = KIND_U32, FIELD(f), .min = (lo), .max = (hi)
#define OCTAL(f, hi) .kind = KIND_OCTAL, FIELD(f), .max = (hi)
#define SIZE(f, lo, hi, r) .kind = KIND_SIZE, FIELD(f), .min = (lo), .max = (hi), .round = (r)
#define BOOL(f) .kind = KIND_BOOL, FIELD(f)
#define ENUM(f, n) .kind = KIND_ENUM, FIELD(f), .names = (n)
#define FIELD2(f) \
    .offset2 = offsetof(struct kvp_config, f), .size2 = sizeof(((struct kvp_config *)0)->f)
#define CUSTOM(p, s) .kind = KIND_CUSTOM, .parse = (p), .show = (s)

static const char *const log_levels[] = {"debug", "info", "warn", "error", NULL};
static const char *const log_formats[] = {"text", "json", NULL};
static const char *const shm_backends[] = {"posix", "memfd", "none", NULL};

_Static_assert(sizeof(enum kvp_log_level) == sizeof(int) &&
                   sizeof(enum kvp_log_format) == sizeof(int) &&
                   sizeof(enum kvp_shm_backend) == sizeof(int),
               "KIND_ENUM fields are stored as an int");
_Static_assert(KVP_LOG_DEBUG == 0 && KVP_LOG_ERROR == 3 && KVP_LOG_TEXT == 0 && KVP_LOG_JSON == 1 &&
                   KVP_SHM_POSIX == 0 && KVP_SHM_MEMFD == 1 && KVP_SHM_NONE == 2,
               "an enum's names are in the order of its values");

static int parse_shm_name(struct kvp_config *cfg, const char *val, char *why, size_t why_size);
static void show_shm_name(const struct kvp_config *cfg, char *out, size_t size);
static int parse_shm_mode(struct kvp_config *cfg, const char *val, char *why, size_t why_size);
static void show_shm_mode(const struct kvp_config *cfg, char *out, size_t size);
static int parse_allow_uid(struct kvp_config *cfg, const char *val, char *why, size_t why_size);
static void show_allow_uid(const struct kvp_config *cfg, char *out, size_t size);
static int parse_allow_gid(struct kvp_config *cfg, const char *val, char *why, size_t why_size);
static void show_allow_gid(const struct kvp_config *cfg, char *out, size_t size);
static int parse_http(struct kvp_config *cfg, const char *val, char *why, size_t why_size);
static void show_http(const struct kvp_config *cfg, char *out, size_t size);
static int parse_l2(struct kvp_config *cfg, const char *val, char *why, size_t why_size);
static void show_l2(const struct kvp_config *cfg, char *out, size_t size);
static int parse_lmcache(struct kvp_config *cfg, const char *val, char *why, size_t why_size);
static void show_lmcache(const struct kvp_config *cfg, char *out, size_t size);

/*
 * One row per option, in --help's order. A new option is one row here (and its field in
 * struct kvp_config); the command line, KVPOOL_*, the file's keys, --help and SIGHUP all follow.
 */
static const struct opt_desc opts[] = {
    {.name = "config",
     .env = "KVPOOL_CONFIG",
     .arg = "FILE",
     .kind = KIND_NONE,
     .help =
         "Read options from FILE: one 'name = value' per line, the names of the long options\n"
         "here (l1-size = 4GiB); '#' starts a comment; a value may be quoted (shm-name = \"\").\n"
         "The command line wins over the environment, which wins over the file. SIGHUP reads\n"
         "it again and applies the options marked 'SIGHUP: applied'. Default: none"},
    {.name = "socket",
     .env = "KVPOOL_SOCKET",
     .arg = "PATH",
     STRING(socket_path, 1),
     .want = "a path of 1..107 bytes",
     .help = "Unix socket to listen on.\n"
             "Default: $XDG_RUNTIME_DIR/kvpool/kvpool.sock, else /tmp/kvpool-<uid>/kvpool.sock\n"
             "(a private directory, created 0700; refused if another user owns it or it is\n"
             "writable by group or others)"},
    {.name = "socket-mode",
     .env = "KVPOOL_SOCKET_MODE",
     .arg = "MODE",
     OCTAL(socket_mode, 0777),
     .want = "octal permission bits such as 0600 or 0660",
     .help = "Permission bits of the socket file, octal. Default: 0600 (owner only)"},
    {.name = "l1-size",
     .env = "KVPOOL_L1_SIZE",
     .arg = "SIZE",
     SIZE(l1_size, MIN_L1, MAX_L1, 4096),
     .want = "a size from 1MiB to 1PiB, such as 1GiB, 512MiB or 67108864",
     .help = "L1 pool size: bytes, or with a unit (KiB, MiB, GiB, TiB). Default: 1GiB"},
    {.name = "chunk-size",
     .env = "KVPOOL_CHUNK_SIZE",
     .arg = "TOKENS",
     U32(chunk_tokens, 1, MAX_CHUNK_TOKENS),
     .want = "a token count from 1 to 1048576",
     .help = "Tokens per KV chunk. Default: 256"},
    {.name = "shm-name",
     .env = "KVPOOL_SHM_NAME",
     .arg = "NAME",
     CUSTOM(parse_shm_name, show_shm_name),
     FIELD(shm_name),
     FIELD2(shm_enabled),
     .want = "a name without '/' of at most 127 bytes with the prefix, or \"\"",
     .help =
         "POSIX shared-memory segment of the pool; '/' stripped, prefix kvpool_l1_pool_ added.\n"
         "\"\" disables shared memory (inline transport only). Not with --shm-backend memfd,\n"
         "which has no name. Default: kvpool_l1_pool_<pid>_<random>"},
    {.name = "shm-backend",
     .env = "KVPOOL_SHM_BACKEND",
     .arg = "BACKEND",
     ENUM(shm_backend, shm_backends),
     .want = "posix, memfd or none",
     .help = "posix: a named segment under /dev/shm, mapped by name (default).\n"
             "memfd: an anonymous segment handed to each worker over the socket; not limited by\n"
             "the size of /dev/shm and never left behind, even after SIGKILL. none: inline only."},
    {.name = "shm-mode",
     .env = "KVPOOL_SHM_MODE",
     .arg = "MODE",
     CUSTOM(parse_shm_mode, show_shm_mode),
     FIELD(shm_mode),
     .want = "octal bits with owner read/write and nothing for others, such as 0600 or 0660",
     .help =
         "Permission bits of a posix segment, octal: 0600 (default, owner only) or 0660 to let\n"
         "workers of the daemon's group map it (they can then read and write every chunk)."},
    {.name = "warm-restart",
     .env = "KVPOOL_WARM_RESTART",
     .arg = "on|off",
     BOOL(warm_restart),
     .want = "on or off",
     .help = "Adopt the pool a previous kvpoold on the same socket left in /dev/shm (killed, or\n"
             "stopped with SIGUSR2 for a restart) and serve its chunks at once, each checked\n"
             "against its checksum when first read; a pool of other settings, another user or a\n"
             "live daemon is set aside (WARN). Keeps an index of 1/64 of the pool beside it.\n"
             "posix segments only. off: start empty, remove a dead daemon's pool. Default: on"},
    {.name = "allow-uid",
     .env = "KVPOOL_ALLOW_UID",
     .arg = "UIDS",
     CUSTOM(parse_allow_uid, show_allow_uid),
     FIELD(allow_uids),
     FIELD2(n_allow_uids),
     .reload = true,
     .want = "up to 32 comma-separated numeric user ids",
     .help = "Comma-separated user ids that may connect besides the daemon's own (checked when\n"
             "a connection is accepted; on an ipc:// --lmcache socket too, as set at start-up).\n"
             "Default: none"},
    {.name = "allow-gid",
     .env = "KVPOOL_ALLOW_GID",
     .arg = "GIDS",
     CUSTOM(parse_allow_gid, show_allow_gid),
     FIELD(allow_gids),
     FIELD2(n_allow_gids),
     .reload = true,
     .want = "up to 32 comma-separated numeric group ids",
     .help = "Comma-separated group ids whose members' processes may connect (checked when a\n"
             "connection is accepted; on an ipc:// --lmcache socket too, as set at start-up).\n"
             "Default: none"},
    {.name = "log-level",
     .env = "KVPOOL_LOG_LEVEL",
     .arg = "LEVEL",
     ENUM(log_level, log_levels),
     .reload = true,
     .want = "debug, info, warn or error",
     .help = "debug, info, warn or error. Default: info"},
    {.name = "log-format",
     .env = "KVPOOL_LOG_FORMAT",
     .arg = "FORMAT",
     ENUM(log_format, log_formats),
     .reload = true,
     .want = "text or json",
     .help = "text: one line per event (default). json: one JSON object per line with ts, level,\n"
             "msg, pid and the event's fields, for log shippers."},
    {.name = "max-clients",
     .env = "KVPOOL_MAX_CLIENTS",
     .arg = "N",
     U32(max_clients, 1, 4096),
     .want = "a number from 1 to 4096",
     .help = "Maximum simultaneous connections (1..4096). Default: 256"},
    {.name = "max-instances-per-client",
     .env = "KVPOOL_MAX_INSTANCES_PER_CLIENT",
     .arg = "N",
     U32(max_instances_per_client, 1, 1024),
     .want = "a number from 1 to 1024",
     .help = "Instances one client (connection) may have registered at once (1..1024), so that\n"
             "no client can take the whole table of 1024. Default: 64"},
    {.name = "reserve-timeout",
     .env = "KVPOOL_RESERVE_TIMEOUT",
     .arg = "SECONDS",
     U32(reserve_timeout_s, 1, 86400),
     .reload = true,
     .want = "seconds from 1 to 86400",
     .help = "Cancel store reservations not committed within this time. Default: 600"},
    {.name = "io-timeout",
     .env = "KVPOOL_IO_TIMEOUT",
     .arg = "MS",
     U32(io_timeout_ms, 10, 3600000),
     .reload = true,
     .want = "milliseconds from 10 to 3600000",
     .help = "Drop a client that stalls in the middle of a frame for this long (set when a\n"
             "connection opens). Default: 30000"},
    {.name = "follow-cpu",
     .env = "KVPOOL_FOLLOW_CPU",
     .arg = "on|off",
     BOOL(follow_cpu),
     .reload = true,
     .want = "on or off",
     .help = "Run each connection's thread on the CPU its worker sent the request from, so that\n"
             "a request and its reply never wake an idle CPU (docs/PERFORMANCE.md). off: leave\n"
             "the threads to the scheduler. Default: on"},
    {.name = "http",
     .env = "KVPOOL_HTTP",
     .arg = "ADDR:PORT",
     CUSTOM(parse_http, show_http),
     FIELD(http),
     .want = "ADDR:PORT (127.0.0.1:9190, [::1]:9190, localhost:0), a port, or off",
     .help = "Serve the status page, /api/healthcheck, /api/status and /metrics over HTTP there\n"
             "(read-only, unauthenticated: see docs/SECURITY.md before using a non-loopback\n"
             "address). ADDR is an IPv4 address, localhost or [IPv6]; a bare PORT means\n"
             "127.0.0.1:PORT; port 0 picks a free one (logged). off: no HTTP. "
             "Default: " KVP_HTTP_DEFAULT},
    {.name = "l2",
     .env = "KVPOOL_L2",
     .arg = "URL",
     CUSTOM(parse_l2, show_l2),
     FIELD(l2_url),
     .secret = true,
     .help = "A second tier on Redis, shared by every daemon that names it (README: Sharing\n"
             "across hosts): redis://[user:password@]HOST:PORT[/DB], unix:///PATH[?db=N] or\n"
             "redis-cluster://HOST:PORT[,HOST:PORT...] (seed nodes). Credentials are never\n"
             "logged. Set maxmemory-policy allkeys-lru on the Redis side. Default: off"},
    {.name = "l2-password-file",
     .env = "KVPOOL_L2_PASSWORD_FILE",
     .arg = "FILE",
     STRING(l2_password_file, 0),
     .want = "a path of at most 1023 bytes",
     .help = "Read the L2 password from FILE (one line, read once at start-up; a warning if\n"
             "group or others can read it). It replaces a password in the URL. Default: none"},
    {.name = "l2-ttl",
     .env = "KVPOOL_L2_TTL",
     .arg = "SECONDS",
     U32(l2_ttl_s, 0, 315360000),
     .reload = true,
     .want = "seconds from 0 (no expiry) to 315360000",
     .help = "Expire chunks in L2 after this many seconds; 0: never (Redis' maxmemory policy\n"
             "evicts them). Default: 0"},
    {.name = "l2-connections",
     .env = "KVPOOL_L2_CONNECTIONS",
     .arg = "N",
     U32(l2_connections, 1, 64),
     .want = "a number from 1 to 64",
     .help = "Background threads copying to and loading from L2, each with its own connection,\n"
             "and as many connections for workers' lookups and retrieves (1..64). Default: 2"},
    {.name = "l2-queue",
     .env = "KVPOOL_L2_QUEUE",
     .arg = "SIZE",
     SIZE(l2_queue_bytes, 1, UINT64_MAX, 1),
     .want = "a size such as 256MiB or 1GiB",
     .help = "Bytes of chunks waiting for a copy to L2; when full, the oldest are dropped\n"
             "(counted), never a worker slowed. Default: 256MiB"},
    {.name = "l2-timeout",
     .env = "KVPOOL_L2_TIMEOUT",
     .arg = "MS",
     U32(l2_timeout_ms, 10, 600000),
     .reload = true,
     .want = "milliseconds from 10 to 600000",
     .help = "Bound of every L2 connect, command and wait for a load (10..600000); a new value\n"
             "holds for connections made and waits begun after it. Default: 1000"},
    {.name = "lmcache",
     .env = "KVPOOL_LMCACHE",
     .arg = "ADDR",
     CUSTOM(parse_lmcache, show_lmcache),
     FIELD(lmcache),
     .want = "tcp://HOST:PORT (tcp://127.0.0.1:5555), ipc:///PATH, or off",
     .help = "Also serve LMCache's multiprocess protocol there, as a drop-in for `lmcache server`\n"
             "(vLLM's LMCacheMPConnector, SGLang; README: Using kvpool with vLLM, SGLang and\n"
             "LMCache): tcp://HOST:PORT (LMCache's default is tcp://127.0.0.1:5555; the protocol\n"
             "has no authentication, see docs/SECURITY.md) or ipc:///PATH. off: not served.\n"
             "Default: off"},
    {.name = "lmcache-reap-timeout",
     .env = "KVPOOL_LMCACHE_REAP_TIMEOUT",
     .arg = "SECONDS",
     U32(lmcache_reap_s, 0, 86400),
     .want = "seconds from 0 (never) to 86400",
     .help = "An LMCache worker that pinged and then stays silent this long is unregistered and\n"
             "everything it held is released (LMCache's --worker-reap-timeout-seconds); 0: never.\n"
             "Default: 120"},
    {.name = "lmcache-registration-grace",
     .env = "KVPOOL_LMCACHE_REGISTRATION_GRACE",
     .arg = "SECONDS",
     U32(lmcache_grace_s, 1, 604800),
     .want = "seconds from 1 to 604800",
     .help = "The same for an LMCache worker that registered but never pinged (at least the\n"
             "reap timeout; LMCache's --worker-registration-grace-seconds). Default: 3600"},
    {.name = "lmcache-clear",
     .env = "KVPOOL_LMCACHE_CLEAR",
     .arg = "on|off",
     BOOL(lmcache_clear),
     .want = "on or off",
     .help = "Whether LMCache's clear request empties the cache, as in `lmcache server`. off:\n"
             "any peer of the front end could otherwise drop every cached chunk; a clear is then\n"
             "answered as usual, changes nothing, and is logged and counted. Default: on"},
    {.name = "lmcache-max-connections",
     .env = "KVPOOL_LMCACHE_MAX_CONNECTIONS",
     .arg = "N",
     U32(lmcache_max_conns, 1, 65536),
     .want = "a number from 1 to 65536",
     .help = "LMCache connections open at once (1..65536); more are closed at the handshake,\n"
             "logged and counted. Counted into the descriptor limit kvpoold raises at start-up.\n"
             "Default: 128"},
    {.name = "lmcache-reply-memory",
     .env = "KVPOOL_LMCACHE_REPLY_MEMORY",
     .arg = "SIZE",
     SIZE(lmcache_reply_mem, 1ull << 20, 1ull << 50, 1),
     .want = "a size from 1MiB to 1PiB, such as 256MiB",
     .help = "Memory for LMCache replies that their clients have not read yet, all clients\n"
             "together; one client may fill a quarter of it. Beyond that its prepares are\n"
             "answered negatively (a miss), logged and counted, until it reads. Default: a\n"
             "quarter of --l1-size, at least 64MiB"},
    {.name = "lmcache-max-message",
     .env = "KVPOOL_LMCACHE_MAX_MESSAGE",
     .arg = "SIZE",
     SIZE(lmcache_max_msg, 1ull << 20, 1ull << 50, 1),
     .want = "a size from 1MiB to 1PiB, such as 256MiB",
     .help = "Largest LMCache message accepted (a pickle commit carries a whole store): a larger\n"
             "one closes its connection. Half-received messages take at most\n"
             "--lmcache-max-connections times this. Default: the largest store the pool holds"},
    {.name = "help", .kind = KIND_NONE, .help = "Show this help and exit"},
    {.name = "version", .kind = KIND_NONE, .help = "Show the version and exit"},
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
        .max_instances_per_client = 64,
        .reserve_timeout_s = 600,
        .io_timeout_ms = 30000,
        .http = KVP_HTTP_DEFAULT,
        .shm_backend = KVP_SHM_POSIX,
        .shm_mode = 0600,
        .warm_restart = true,
        .l2_connections = 2,
        .l2_queue_bytes = 256ull << 20,
        .l2_timeout_ms = 1000,
        .follow_cpu = true,
        .lmcache_reap_s = 120,
        .lmcache_grace_s = 3600,
        .lmcache_clear = true,
        .lmcache_max_conns = 128,
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

/* ---- the options that are more than a number or a string ---- */

static int parse_shm_name(struct kvp_config *cfg, const char *val, char *why, size_t why_size)
{
    (void)why;
    (void)why_size;
    if (val[0] == '\0') {
        cfg->shm_enabled = false;
        cfg->shm_name[0] = '\0';
        return 0;
    }
    cfg->shm_enabled = true;
    cfg->shm_name_given = true;
    return kvp_shm_name_normalize(val, cfg->shm_name, sizeof(cfg->shm_name)) ? -EINVAL : 0;
}

/* The default name is drawn anew by every kvp_config_defaults(): shown as what it stands for, so
 * that a reload does not see a change where the operator made none. */
static void show_shm_name(const struct kvp_config *cfg, char *out, size_t size)
{
    if (cfg->shm_enabled && !cfg->shm_name_given)
        snprintf(out, size, "%s", "kvpool_l1_pool_<pid>_<random> (default)");
    else
        snprintf(out, size, "%s", cfg->shm_enabled ? cfg->shm_name : "\"\"");
}

static int parse_shm_mode(struct kvp_config *cfg, const char *val, char *why, size_t why_size)
{
    (void)why;
    (void)why_size;
    uint32_t mode;
    if (parse_u32(val, 0, 0777, 8, &mode) || (mode & 0600) != 0600 || (mode & 0007))
        return -EINVAL;
    cfg->shm_mode = mode;
    return 0;
}

static void show_shm_mode(const struct kvp_config *cfg, char *out, size_t size)
{
    snprintf(out, size, "0%03o", (unsigned)cfg->shm_mode);
}

/* A comma-separated list of numeric ids, at most KVP_MAX_ALLOW. */
static int parse_id_list(const char *s, uint32_t *ids, uint32_t *n)
{
    uint32_t tmp[KVP_MAX_ALLOW], count = 0;
    char buf[512], *save = NULL;
    if (strlen(s) >= sizeof(buf))
        return -EINVAL;
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (count == KVP_MAX_ALLOW || parse_u32(tok, 0, UINT32_MAX - 1, 10, &tmp[count]))
            return -EINVAL;
        count++;
    }
    if (!count)
        return -EINVAL;
    memcpy(ids, tmp, sizeof(tmp[0]) * count);
    *n = count;
    return 0;
}

static void show_id_list(const uint32_t *ids, uint32_t n, char *out, size_t size)
{
    size_t len = 0;
    out[0] = '\0';
    if (!n)
        snprintf(out, size, "none");
    for (uint32_t i = 0; i < n && len < size; i++)
        len += (size_t)snprintf(out + len, size - len, "%s%" PRIu32, i ? "," : "", ids[i]);
}

static int parse_allow_uid(struct kvp_config *cfg, const char *val, char *why, size_t why_size)
{
    (void)why;
    (void)why_size;
    return parse_id_list(val, cfg->allow_uids, &cfg->n_allow_uids);
}

static void show_allow_uid(const struct kvp_config *cfg, char *out, size_t size)
{
    show_id_list(cfg->allow_uids, cfg->n_allow_uids, out, size);
}

static int parse_allow_gid(struct kvp_config *cfg, const char *val, char *why, size_t why_size)
{
    (void)why;
    (void)why_size;
    return parse_id_list(val, cfg->allow_gids, &cfg->n_allow_gids);
}

static void show_allow_gid(const struct kvp_config *cfg, char *out, size_t size)
{
    show_id_list(cfg->allow_gids, cfg->n_allow_gids, out, size);
}

static int parse_http(struct kvp_config *cfg, const char *val, char *why, size_t why_size)
{
    (void)why;
    (void)why_size;
    if (strlen(val) >= sizeof(cfg->http) || kvp_listen_addr_parse(val, NULL))
        return -EINVAL;
    snprintf(cfg->http, sizeof(cfg->http), "%s", val);
    return 0;
}

static void show_http(const struct kvp_config *cfg, char *out, size_t size)
{
    snprintf(out, size, "%s", cfg->http);
}

static int parse_lmcache(struct kvp_config *cfg, const char *val, char *why, size_t why_size)
{
    struct kvp_lmc_addr a;
    if (strcmp(val, "off") == 0 || val[0] == '\0') {
        cfg->lmcache[0] = '\0';
        return 0;
    }
    if (strlen(val) >= sizeof(cfg->lmcache))
        return -EINVAL;
    if (kvp_lmc_addr_parse(val, &a)) {
        if (kvp_lmc_addr_named_host(val, &a))
            snprintf(why, why_size,
                     "ZeroMQ listens on an address, not a host name: write tcp://127.0.0.1:%u "
                     "(this host only; localhost means the same), tcp://0.0.0.0:%u (every "
                     "interface) or tcp://ADDRESS:%u",
                     a.port, a.port, a.port);
        return -EINVAL;
    }
    snprintf(cfg->lmcache, sizeof(cfg->lmcache), "%s", val);
    return 0;
}

static void show_lmcache(const struct kvp_config *cfg, char *out, size_t size)
{
    snprintf(out, size, "%s", cfg->lmcache[0] ? cfg->lmcache : "off");
}

static int parse_l2(struct kvp_config *cfg, const char *val, char *why, size_t why_size)
{
    struct kvp_l2_target t;
    bool off = val[0] == '\0' || strcmp(val, "off") == 0;
    /* The URL may hold a password: the message names the problem, never the value. */
    int rc = off ? 0 : kvp_l2_url_parse(val, &t, why, why_size);
    explicit_bzero(&t, sizeof(t));
    if (rc)
        return -EINVAL;
    snprintf(cfg->l2_url, sizeof(cfg->l2_url), "%s", off ? "" : val);
    return 0;
}

/* Never the URL itself: it may hold a password. */
static void show_l2(const struct kvp_config *cfg, char *out, size_t size)
{
    snprintf(out, size, "%s", cfg->l2_url[0] ? "(a URL, not shown)" : "off");
}

/* ---- one row's value ---- */

/*
 * A size written with a decimal unit (16GB, 512M, 2tb): "expected ... (did you mean 16GiB?
 * sizes are binary: KiB, MiB, GiB, TiB)" in why; nothing when val is not of that form.
 */
static void binary_unit_hint(const char *val, const char *want, char *why, size_t why_size)
{
    static const char *const units[][2] = {
        {"K", "KiB"}, {"M", "MiB"}, {"G", "GiB"}, {"T", "TiB"}, {"P", "PiB"}};
    char *end;
    errno = 0;
    unsigned long long n = strtoull(val, &end, 10);
    if (errno || end == val || val[0] == '-')
        return;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcasecmp(end, units[i][0]) != 0 &&
            (strncasecmp(end, units[i][0], 1) != 0 || strcasecmp(end + 1, "B") != 0))
            continue;
        snprintf(why, why_size,
                 "expected %s (did you mean %lluGiB? sizes are binary: KiB, MiB, GiB, TiB)", want,
                 n);
        /* The suggestion keeps the user's number and letter. */
        char *gib = strstr(why, "GiB?");
        if (gib)
            memcpy(gib, units[i][1], 3);
        return;
    }
}

/*
 * Parses val as row o's value into cfg. Returns 0, or -EINVAL with why set to what is wrong:
 * what a valid value looks like, or the custom parser's own reason.
 */
static int set_value(struct kvp_config *cfg, const struct opt_desc *o, const char *val, char *why,
                     size_t why_size)
{
    char *field = (char *)cfg + o->offset;
    uint64_t v64;
    uint32_t v32;
    int rc = -EINVAL;

    why[0] = '\0';
    switch (o->kind) {
    case KIND_STRING:
        if (strlen(val) >= o->min && strlen(val) < o->size) {
            snprintf(field, o->size, "%s", val);
            rc = 0;
        }
        break;
    case KIND_U32:
    case KIND_OCTAL:
        if (!parse_u32(val, (uint32_t)o->min, (uint32_t)o->max, o->kind == KIND_OCTAL ? 8 : 10,
                       &v32)) {
            memcpy(field, &v32, sizeof(v32));
            rc = 0;
        }
        break;
    case KIND_SIZE:
        if (!kvp_parse_size(val, &v64) && v64 >= o->min && v64 <= o->max) {
            v64 = (v64 + o->round - 1) / o->round * o->round;
            memcpy(field, &v64, sizeof(v64));
            rc = 0;
        } else {
            binary_unit_hint(val, o->want, why, why_size);
        }
        break;
    case KIND_BOOL:
        if (strcmp(val, "on") == 0 || strcmp(val, "off") == 0) {
            bool b = strcmp(val, "on") == 0;
            memcpy(field, &b, sizeof(b));
            rc = 0;
        }
        break;
    case KIND_ENUM:
        for (int i = 0; o->names[i]; i++) {
            if (strcmp(val, o->names[i]) == 0) {
                memcpy(field, &i, sizeof(i));
                rc = 0;
            }
        }
        break;
    case KIND_CUSTOM:
        rc = o->parse(cfg, val, why, why_size);
        break;
    case KIND_NONE:
        break;
    }
    if (rc && !why[0])
        snprintf(why, why_size, "expected %s", o->want);
    return rc;
}

/* Row o's value in cfg as a user would write it ("" for KIND_NONE). */
static void show_value(const struct kvp_config *cfg, const struct opt_desc *o, char *out,
                       size_t size)
{
    const char *field = (const char *)cfg + o->offset;
    uint64_t v64;
    uint32_t v32;
    bool b;
    int i;

    out[0] = '\0';
    switch (o->kind) {
    case KIND_STRING:
        snprintf(out, size, "%s", field);
        break;
    case KIND_U32:
        memcpy(&v32, field, sizeof(v32));
        snprintf(out, size, "%" PRIu32, v32);
        break;
    case KIND_OCTAL:
        memcpy(&v32, field, sizeof(v32));
        snprintf(out, size, "0%03o", (unsigned)v32);
        break;
    case KIND_SIZE:
        memcpy(&v64, field, sizeof(v64));
        snprintf(out, size, "%" PRIu64, v64);
        break;
    case KIND_BOOL:
        memcpy(&b, field, sizeof(b));
        snprintf(out, size, "%s", b ? "on" : "off");
        break;
    case KIND_ENUM:
        memcpy(&i, field, sizeof(i));
        snprintf(out, size, "%s", o->names[i]);
        break;
    case KIND_CUSTOM:
        o->show(cfg, out, size);
        break;
    case KIND_NONE:
        break;
    }
}

/* A value as a note may show it: a secret one (a --l2 URL may hold a password) is not. */
static const char *shown(const struct opt_desc *o, const char *val)
{
    return o->secret ? "(not shown)" : val;
}

/* ---- the parse: layers, messages ---- */

/* Where the value in effect of an option came from. */
enum layer { FROM_DEFAULT, FROM_FILE, FROM_ENV, FROM_COMMAND_LINE };

/* One kvp_config_parse() call. */
struct parse {
    struct kvp_config *cfg;
    bool on_command_line[NOPTS]; /* by row */
    enum layer from[NOPTS];      /* by row: the layer of the value applied */
    unsigned file_line[NOPTS];   /* by row: the file's line that set it, 0 if none */
    const char *path;            /* of the file being read */
    int json;                    /* --log-format json asked for: 1, 0, or -1 (not known yet) */
    FILE *err;
};

/* True when the messages are to be json log lines: the command line's --log-format, else
 * KVPOOL_LOG_FORMAT, else the file's as far as it has been read. */
static bool json_asked(const struct parse *p)
{
    return p->json >= 0 ? p->json == 1 : p->cfg->log_format == KVP_LOG_JSON;
}

/* Prints "kvpoold: <message>" to the parse's error stream, or the message as a json log line
 * of that level when json was asked for. */
__attribute__((format(printf, 3, 4))) static void say(const struct parse *p,
                                                      enum kvp_log_level level, const char *fmt,
                                                      ...)
{
    char msg[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (!p->err)
        kvp_log_write(level, "%s", msg); /* a reload: the logger is set up */
    else if (json_asked(p))
        kvp_log_json_to(p->err, level, msg);
    else
        fprintf(p->err, "kvpoold: %s\n", msg);
}

/* Where row i's value came from, for a message: "command line", the variable, or FILE:LINE. */
static const char *source(const struct parse *p, size_t i, char *buf, size_t size)
{
    switch (p->from[i]) {
    case FROM_COMMAND_LINE:
        return "command line";
    case FROM_ENV:
        return opts[i].env;
    case FROM_FILE:
        snprintf(buf, size, "%s:%u", p->path, p->file_line[i]);
        return buf;
    case FROM_DEFAULT:
        break;
    }
    return "the default";
}

/* Applies row o's value from src (command line, variable, FILE:LINE). Returns 0 or -EINVAL
 * after saying what is wrong. */
static int apply(struct parse *p, const struct opt_desc *o, const char *val, const char *src,
                 enum layer from)
{
    char why[256];
    if (!set_value(p->cfg, o, val, why, sizeof(why))) {
        p->from[o - opts] = from;
        return 0;
    }
    if (o->secret)
        say(p, KVP_LOG_ERROR, "invalid %s %s (from %s): %s", o->name, o->arg, src, why);
    else
        say(p, KVP_LOG_ERROR, "invalid %s '%s' (from %s): %s", o->name, val, src, why);
    return -EINVAL;
}

/* True if val would be a valid value of row o (a value a higher layer overrides). */
static bool valid(const struct parse *p, const struct opt_desc *o, const char *val)
{
    struct kvp_config scratch = *p->cfg;
    char why[256];
    bool ok = set_value(&scratch, o, val, why, sizeof(why)) == 0;
    explicit_bzero(&scratch, sizeof(scratch));
    return ok;
}

static const struct opt_desc *find(const char *name)
{
    for (size_t i = 0; i < NOPTS; i++)
        if (strcmp(opts[i].name, name) == 0)
            return &opts[i];
    return NULL;
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
        if (opts[i].kind != KIND_NONE)
            fprintf(out, "      SIGHUP: %s\n",
                    opts[i].reload ? "applied to the running daemon" : "needs a restart");
        fputc('\n', out);
    }
    fprintf(out, "Precedence: the command line, then the environment, then the --config file,\n"
                 "then the defaults.\n"
                 "Signals: SIGINT and SIGTERM stop the daemon cleanly and remove the segment and\n"
                 "the socket file. SIGHUP reads the configuration again (the file, the\n"
                 "environment, the command line) and applies the options marked 'SIGHUP:\n"
                 "applied'; the others take effect at the next start. The daemon keeps serving.\n");
}

/* One entry of the --config file: a key of the option table, applied unless overridden. */
static int file_entry(void *arg, const char *key, const char *value, unsigned line)
{
    struct parse *p = arg;
    const struct opt_desc *o = find(key);
    char src[4200];

    snprintf(src, sizeof(src), "%s:%u", p->path, line);
    if (!o) {
        say(p, KVP_LOG_ERROR,
            "%s: unknown key '%s' (the keys are the long option names of 'kvpoold --help')", src,
            key);
        return -EINVAL;
    }
    if (o->kind == KIND_NONE) {
        say(p, KVP_LOG_ERROR, "%s: '%s' cannot be set in a configuration file", src, key);
        return -EINVAL;
    }
    /* Which of two values was meant is anybody's guess: neither wins silently. */
    size_t i = (size_t)(o - opts);
    if (p->file_line[i]) {
        say(p, KVP_LOG_ERROR, "%s:%u: %s is set twice, at line %u and at line %u", p->path, line,
            key, p->file_line[i], line);
        return -EINVAL;
    }
    p->file_line[i] = line;
    /* Overridden by a higher layer: the value is never used, so a bad one is only noted. */
    if (p->on_command_line[i] || (o->env && getenv(o->env))) {
        if (!valid(p, o, value)) {
            if (p->on_command_line[i])
                say(p, KVP_LOG_WARN,
                    "ignoring invalid %s '%s' at %s: --%s on the command line overrides it", key,
                    shown(o, value), src, key);
            else
                say(p, KVP_LOG_WARN, "ignoring invalid %s '%s' at %s: %s overrides it", key,
                    shown(o, value), src, o->env);
        }
        return 0;
    }
    return apply(p, o, value, src, FROM_FILE);
}

/*
 * Reads the file through config_file.c, whose own messages (syntax, limits, a file that cannot
 * be read) are collected and said like the others, so that they too are json lines when json
 * was asked for. Returns 0 or -EINVAL.
 */
static int read_file(struct parse *p)
{
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) {
        say(p, KVP_LOG_ERROR, "cannot read configuration file %s: out of memory", p->path);
        return -EINVAL;
    }
    int rc = kvp_conf_file_read(p->path, file_entry, p, mem);
    fclose(mem);
    for (char *line = text, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        const char *prefix = "kvpoold: ";
        say(p, KVP_LOG_ERROR, "%s",
            strncmp(line, prefix, strlen(prefix)) == 0 ? line + strlen(prefix) : line);
    }
    free(text);
    return rc ? -EINVAL : 0;
}

/* Options that contradict each other, whichever layers set them. Returns 0 or -EINVAL. */
static int check_together(const struct parse *p)
{
    const struct opt_desc *name = find("shm-name"), *backend = find("shm-backend");
    size_t n = (size_t)(name - opts), b = (size_t)(backend - opts);
    const struct kvp_config *cfg = p->cfg;
    char s1[4200], s2[4200];

    /* Two wishes about the segment: which one was meant is not ours to guess. */
    if (p->from[n] != FROM_DEFAULT && (cfg->shm_backend == KVP_SHM_MEMFD ||
                                       (cfg->shm_backend == KVP_SHM_NONE && cfg->shm_enabled))) {
        say(p, KVP_LOG_ERROR,
            "shm-name (from %s) names a POSIX segment, but shm-backend %s (from %s) has no "
            "named segment: set only one of them",
            source(p, n, s1, sizeof(s1)), cfg->shm_backend == KVP_SHM_MEMFD ? "memfd" : "none",
            source(p, b, s2, sizeof(s2)));
        return -EINVAL;
    }
    if (cfg->lmcache_reap_s && cfg->lmcache_grace_s < cfg->lmcache_reap_s) {
        say(p, KVP_LOG_ERROR,
            "lmcache-registration-grace (%u s) must be at least lmcache-reap-timeout (%u s)",
            cfg->lmcache_grace_s, cfg->lmcache_reap_s);
        return -EINVAL;
    }
    return 0;
}

int kvp_config_parse(struct kvp_config *cfg, int argc, char **argv, FILE *out, FILE *err)
{
    struct option lopts[NOPTS + 1];
    struct parse p = {.cfg = cfg, .err = err, .json = -1};
    const struct opt_desc *config = find("config"), *help = find("help"),
                          *version = find("version"), *format = find("log-format");
    const char *config_path = NULL, *format_arg = NULL;

    /* getopt_long() returns the row's index + 1 (0 is taken by flag options). */
    for (size_t i = 0; i < NOPTS; i++)
        lopts[i] = (struct option){opts[i].name, opts[i].arg ? required_argument : no_argument,
                                   NULL, (int)i + 1};
    lopts[NOPTS] = (struct option){0};

    /* First pass: which options the command line sets. Its errors are reported below. */
    optind = 0;
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, "h", lopts, NULL)) != -1;) {
        /* 'h' and '?' are not rows of the table. */
        if (c <= 0 || c > (int)NOPTS)
            continue;
        p.on_command_line[c - 1] = true;
        if (&opts[c - 1] == config)
            config_path = optarg;
        if (&opts[c - 1] == format)
            format_arg = optarg;
    }
    bool info_only = p.on_command_line[help - opts] || p.on_command_line[version - opts];

    /* The format of the messages, as soon as it is known: a layer that wins says it. */
    if (!format_arg)
        format_arg = getenv(format->env);
    if (format_arg && (strcmp(format_arg, "json") == 0 || strcmp(format_arg, "text") == 0))
        p.json = strcmp(format_arg, "json") == 0;

    /* The file, the lowest layer: --config, else KVPOOL_CONFIG; "" means none. */
    if (!info_only && !p.on_command_line[config - opts])
        config_path = getenv(config->env);
    if (!info_only && config_path && config_path[0]) {
        p.path = config_path;
        if (read_file(&p))
            return -EINVAL;
    }

    for (size_t i = 0; i < NOPTS && !info_only; i++) {
        const struct opt_desc *o = &opts[i];
        const char *v = o->env && o->kind != KIND_NONE ? getenv(o->env) : NULL;
        if (!v)
            continue;
        if (p.on_command_line[i]) {
            if (!valid(&p, o, v))
                say(&p, KVP_LOG_WARN,
                    "ignoring invalid %s '%s': --%s on the command line overrides it", o->env,
                    shown(o, v), o->name);
            continue;
        }
        if (apply(&p, o, v, o->env, FROM_ENV))
            return -EINVAL;
    }

    optind = 0;
    opterr = 0;
    for (;;) {
        int c = getopt_long(argc, argv, "h", lopts, NULL);
        if (c == -1)
            break;
        const struct opt_desc *o = c > 0 && c <= (int)NOPTS ? &opts[c - 1] : NULL;
        if (c == 'h' || o == help) {
            usage(out);
            return 1;
        }
        if (o == version) {
            fprintf(out, "kvpoold %s\n", KVP_DAEMON_VERSION);
            return 1;
        }
        if (!o) {
            say(&p, KVP_LOG_ERROR, "unknown or incomplete option '%s'\nTry 'kvpoold --help'.",
                argv[optind - 1]);
            return -EINVAL;
        }
        if (o == config)
            continue; /* read above */
        if (apply(&p, o, optarg, "command line", FROM_COMMAND_LINE))
            return -EINVAL;
    }
    if (optind < argc) {
        say(&p, KVP_LOG_ERROR, "unexpected argument '%s'\nTry 'kvpoold --help'.", argv[optind]);
        return -EINVAL;
    }
    if (!cfg->socket_path[0]) {
        say(&p, KVP_LOG_ERROR,
            "the default socket path ($XDG_RUNTIME_DIR/kvpool/kvpool.sock) is too long for a "
            "Unix socket; set --socket");
        return -EINVAL;
    }
    return check_together(&p);
}

/* ---- SIGHUP ---- */

int kvp_config_compare(const struct kvp_config *cur, const struct kvp_config *next,
                       kvp_config_change_fn fn, void *arg)
{
    char was[2200], now[2200];
    int n = 0;

    for (size_t i = 0; i < NOPTS; i++) {
        const struct opt_desc *o = &opts[i];
        if (o->kind == KIND_NONE)
            continue;
        show_value(cur, o, was, sizeof(was));
        show_value(next, o, now, sizeof(now));
        /* A secret's shown form hides changes: compare what it holds. */
        bool differs = o->secret ? memcmp((const char *)cur + o->offset,
                                          (const char *)next + o->offset, o->size) != 0
                                 : strcmp(was, now) != 0;
        if (!differs)
            continue;
        n++;
        if (fn)
            fn(arg, o->name, o->reload, o->secret ? "(not shown)" : was,
               o->secret ? "(not shown)" : now);
    }
    return n;
}

void kvp_config_take_reloadable(struct kvp_config *cur, const struct kvp_config *next)
{
    for (size_t i = 0; i < NOPTS; i++) {
        const struct opt_desc *o = &opts[i];
        if (!o->reload)
            continue;
        memcpy((char *)cur + o->offset, (const char *)next + o->offset, o->size);
        if (o->size2)
            memcpy((char *)cur + o->offset2, (const char *)next + o->offset2, o->size2);
    }
}

int kvp_config_is_reloadable(const char *name)
{
    const struct opt_desc *o = find(name);
    return !o || o->kind == KIND_NONE ? -ENOENT : o->reload;
}
