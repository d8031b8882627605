/*
 * listen_addr.h - the ADDR:PORT values of listening options (--http): parsed here, once, for
 * both the option parser (config.c, which validates) and the endpoint that binds it (http.c).
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

#endif /* KVP_LISTEN_ADDR_H */
