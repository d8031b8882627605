/*
 * l2_url.h - where the L2 tier lives: the --l2 URL, its credentials and the masked form that
 * logs and reports show.
 *
 * Accepted forms (docs: README "Sharing across hosts"):
 *
 *   redis://[user:password@]HOST[:PORT][/DB]        TCP, PORT 6379 by default, DB 0
 *   unix://[user:password@]/PATH[?db=N]             a Unix socket
 *   redis-cluster://[user:password@]HOST:PORT[,HOST:PORT...]   seed nodes of a Redis Cluster
 *
 * HOST is a name, an IPv4 address or a bracketed IPv6 address. User and password may be
 * percent-encoded. A password never leaves this module unmasked except towards the backend's
 * AUTH command: kvp_l2_url_masked() is what everything else prints.
 */
#ifndef KVP_L2_URL_H
#define KVP_L2_URL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVP_L2_MAX_URL 2048
#define KVP_L2_MAX_SEEDS 16
#define KVP_L2_MAX_HOST 255
#define KVP_L2_MAX_USER 128
#define KVP_L2_MAX_PASSWORD 512
#define KVP_L2_MAX_DB 65535
/* The largest password file read: a password is far shorter. */
#define KVP_L2_MAX_PASSWORD_FILE 4096

enum kvp_l2_scheme {
    KVP_L2_REDIS,         /* one node over TCP */
    KVP_L2_REDIS_UNIX,    /* one node over a Unix socket */
    KVP_L2_REDIS_CLUSTER, /* a Redis Cluster, found from its seed nodes */
};

struct kvp_l2_endpoint {
    char host[KVP_L2_MAX_HOST + 1];
    uint16_t port;
};

/* A parsed --l2 URL. */
struct kvp_l2_target {
    enum kvp_l2_scheme scheme;
    struct kvp_l2_endpoint nodes[KVP_L2_MAX_SEEDS]; /* REDIS: nodes[0]; CLUSTER: the seeds */
    uint32_t nnodes;
    char path[108];                         /* REDIS_UNIX: the socket path */
    uint32_t db;                            /* SELECT after connecting (not for a cluster) */
    char user[KVP_L2_MAX_USER + 1];         /* "" for the default user */
    char password[KVP_L2_MAX_PASSWORD + 1]; /* "" for none */
};

/*
 * Parses url into *t. Returns 0, or -EINVAL with why (why_size bytes, NUL-terminated) saying
 * what is wrong; why never contains the password.
 */
int kvp_l2_url_parse(const char *url, struct kvp_l2_target *t, char *why, size_t why_size);

/* Writes the URL of t with the password replaced by "***" (and no password at all when none
 * is set): the only form of a target that logs, errors and reports show. */
void kvp_l2_url_masked(const struct kvp_l2_target *t, char *out, size_t size);

/*
 * Reads a password file: the whole file, at most KVP_L2_MAX_PASSWORD_FILE bytes, one trailing
 * newline (LF or CRLF) removed; it must then be non-empty, at most KVP_L2_MAX_PASSWORD bytes,
 * without NUL or line breaks. *loose is set when group or others may read the file (the caller
 * warns). Returns 0, or a negative errno with why.
 */
int kvp_l2_password_file_read(const char *path, char *out, size_t size, bool *loose, char *why,
                              size_t why_size);

#endif /* KVP_L2_URL_H */
