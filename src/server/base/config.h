/*
 * config.h - the daemon's configuration: defaults, --config file, KVPOOL_* environment, command
 * line.
 */
#ifndef KVP_CONFIG_H
#define KVP_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/log.h"

#define KVP_MAX_ALLOW 32

enum kvp_shm_backend {
    KVP_SHM_POSIX, /* named segment under /dev/shm (default) */
    KVP_SHM_MEMFD, /* anonymous memfd passed to workers over the socket */
    KVP_SHM_NONE,  /* no shared memory: inline transport only */
};

struct kvp_config {
    char socket_path[108];
    uint32_t socket_mode; /* permission bits of the socket file */
    uint64_t l1_size;     /* pool bytes, multiple of 4096 */
    uint32_t chunk_tokens;
    bool shm_enabled;    /* false: --shm-name "" (--shm-backend none is shm_backend) */
    char shm_name[128];  /* normalised, without '/'; by default a random one (shm_name.h) */
    bool shm_name_given; /* shm_name came from the operator (--shm-name, its variable or file) */
    enum kvp_log_level log_level;
    enum kvp_log_format log_format;
    uint32_t max_clients;
    uint32_t max_instances_per_client; /* registered at once by one client (owner) */
    uint32_t reserve_timeout_s;
    uint32_t io_timeout_ms; /* bound on receiving the rest of a started frame */
    bool follow_cpu;        /* --follow-cpu: connection threads run on their worker's CPU */
    char http[64];          /* --http: "ADDR:PORT" of the HTTP endpoint, or "off" */
    enum kvp_shm_backend shm_backend;
    uint32_t shm_mode; /* permission bits of a POSIX segment */
    bool warm_restart; /* --warm-restart: adopt a dead daemon's pool (core/warm_restart.h) */
    uint32_t allow_uids[KVP_MAX_ALLOW];
    uint32_t n_allow_uids;
    uint32_t allow_gids[KVP_MAX_ALLOW];
    uint32_t n_allow_gids;
    char l2_url[2049];           /* --l2: "" when the L2 tier is off (holds credentials) */
    char l2_password_file[1024]; /* --l2-password-file, "" for none */
    uint32_t l2_ttl_s;           /* expiry of L2 values, 0 for none */
    uint32_t l2_connections;     /* background threads, and foreground connections */
    uint64_t l2_queue_bytes;     /* bound of the write-behind backlog */
    uint32_t l2_timeout_ms;      /* bound of every L2 network operation and wait */
    char lmcache[256];           /* --lmcache: tcp://HOST:PORT or ipc:///PATH, "" when off */
    uint32_t lmcache_reap_s;     /* silence that ends a pinged LMCache instance, 0: never */
    uint32_t lmcache_grace_s;    /* the same for an instance that never pinged */
    bool lmcache_clear;          /* --lmcache-clear: LMCache's clear empties the cache */
    uint32_t lmcache_max_conns;  /* LMCache connections open at once */
    uint64_t lmcache_reply_mem;  /* bytes of LMCache replies not yet sent; 0: from the pool */
    uint64_t lmcache_max_msg;    /* largest LMCache message accepted; 0: the pool's largest */
};

/* Fills the defaults (socket path per kvp_default_socket_path rule, shm name with our pid). */
void kvp_config_defaults(struct kvp_config *cfg);

/*
 * Applies the configuration file (--config, else $KVPOOL_CONFIG), then the KVPOOL_* environment
 * variables, then the command line. Returns 0 to run, 1 when --help or --version was printed to
 * out (exit 0), or -EINVAL after printing an error to err (a file error names FILE:LINE). Notes
 * about ignored values (a bad value that a higher layer overrides) also go to err. Messages are
 * "kvpoold: ..." lines, or json log lines once --log-format json is known to be asked for; with
 * err NULL (a reload, the logger set up) they are log lines of the running logger.
 */
int kvp_config_parse(struct kvp_config *cfg, int argc, char **argv, FILE *out, FILE *err);

/*
 * Called by kvp_config_compare() for each option whose value differs: its name, whether SIGHUP
 * applies it (else it needs a restart), and both values as a user would write them (a secret
 * one as "(not shown)").
 */
typedef void (*kvp_config_change_fn)(void *arg, const char *name, bool reloadable, const char *was,
                                     const char *now);

/* Compares two configurations option by option, calling fn (may be NULL) for each difference.
 * Returns the number of options that differ. */
int kvp_config_compare(const struct kvp_config *cur, const struct kvp_config *next,
                       kvp_config_change_fn fn, void *arg);

/* Copies into cur the values of next's options that SIGHUP applies (the option table's
 * reloadable ones); the others stay as they are. */
void kvp_config_take_reloadable(struct kvp_config *cur, const struct kvp_config *next);

/* 1 if SIGHUP applies option name, 0 if it needs a restart, -ENOENT for no such option. */
int kvp_config_is_reloadable(const char *name);

/*
 * Parses a size: a decimal number with an optional unit B, K/KiB, M/MiB, G/GiB, T/TiB (powers
 * of 1024), case-insensitive. Returns 0 or -EINVAL (garbage, zero, overflow).
 */
int kvp_parse_size(const char *s, uint64_t *out);

#endif /* KVP_CONFIG_H */
