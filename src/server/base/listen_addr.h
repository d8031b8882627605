/*
 * listen_addr.h - the addresses of listening options: ADDR:PORT (--http) and ZeroMQ endpoints
 * (--lmcache), parsed here, once, for both the option parser (config.c, which validates) and
 * the front end that binds them (http.c, lmc/listener.c).
 */
#ifndef KVP_LISTEN_ADDR_H
#define KVP_LISTEN_ADDR_H

#include <stdbool.h>
#include <sys/socket.h>

/* --http when neither the command line nor KVPOOL_HTTP says otherwise. */
#define KVP_HTTP_DEFAULT "127.0.0.1:9190"

/* A parsed ADDR:PORT value. */
struct kvp_listen_addr {
    bool off;
    struct sockaddr_storage addr; /* unless off */
    socklen_t addrlen;
    bool loopback; /* 127.0.0.0/8 or ::1 */
};

/*
 * Parses a listening address: "off"; "ADDR:PORT" where ADDR is an IPv4 address, "localhost"
 * (127.0.0.1) or an IPv6 address in brackets ("[::1]:9190"); or a bare PORT, which means
 * 127.0.0.1:PORT. PORT is 0 to 65535; 0 lets the kernel pick one. Returns 0 or -EINVAL. out
 * may be NULL (validation only).
 */
int kvp_listen_addr_parse(const char *spec, struct kvp_listen_addr *out);

/* A parsed --lmcache address (ZeroMQ's endpoint syntax, the forms LMCache's clients use). */
struct kvp_lmc_addr {
    bool ipc;       /* ipc:///PATH, else tcp://HOST:PORT */
    char path[108]; /* ipc: the socket file (an absolute path that fits sun_path) */
    char host[64];  /* tcp: an IPv4 address, localhost, *, or [IPv6] */
    char url[300];  /* what ZeroMQ binds: the address, with localhost as 127.0.0.1 */
    unsigned port;  /* tcp: 1..65535 */
    bool loopback;  /* tcp: 127.0.0.0/8, localhost or [::1]: served without a warning */
};

/*
 * Parses "tcp://HOST:PORT" or "ipc:///PATH" (out may be NULL: validation only). Returns 0 or
 * -EINVAL.
 */
int kvp_lmc_addr_parse(const char *spec, struct kvp_lmc_addr *out);

/* Whether spec is a tcp:// address whose host is a name other than localhost (refused by
 * kvp_lmc_addr_parse(): ZeroMQ would take it for an interface); out gets its port. */
bool kvp_lmc_addr_named_host(const char *spec, struct kvp_lmc_addr *out);

#endif /* KVP_LISTEN_ADDR_H */
