/*
 * listen_addr.c - parsing of ADDR:PORT values (see listen_addr.h).
 *
 * Anything but loopback needs an explicit address: binding elsewhere is a choice the operator
 * writes out. No name is resolved (only "localhost", which is 127.0.0.1), so parsing never
 * blocks and the option parser can validate a value without side effects. Pure functions, any
 * thread.
 */
#include "base/listen_addr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_port(const char *s, uint16_t *port)
{
    size_t n = strlen(s);
    if (n == 0 || n > 5 || strspn(s, "0123456789") != n)
        return -EINVAL;
    unsigned long v = strtoul(s, NULL, 10);
    if (v > 65535)
        return -EINVAL;
    *port = (uint16_t)v;
    return 0;
}

int kvp_listen_addr_parse(const char *spec, struct kvp_listen_addr *out)
{
    struct kvp_listen_addr l;
    char host[64] = "127.0.0.1";
    const char *port_s = spec;
    uint16_t port;

    memset(&l, 0, sizeof(l));
    if (strcmp(spec, "off") == 0) {
        l.off = true;
        goto done;
    }
    const char *colon = strrchr(spec, ':');
    if (colon) {
        size_t hl = (size_t)(colon - spec);
        if (hl == 0 || hl >= sizeof(host))
            return -EINVAL;
        memcpy(host, spec, hl);
        host[hl] = '\0';
        port_s = colon + 1;
    }
    if (parse_port(port_s, &port))
        return -EINVAL;
    if (host[0] == '[') {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&l.addr;
        size_t n = strlen(host);
        if (n < 3 || host[n - 1] != ']')
            return -EINVAL;
        host[n - 1] = '\0';
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons(port);
        if (inet_pton(AF_INET6, host + 1, &a6->sin6_addr) != 1)
            return -EINVAL;
        l.addrlen = sizeof(*a6);
        l.loopback = IN6_IS_ADDR_LOOPBACK(&a6->sin6_addr);
    } else {
        struct sockaddr_in *a4 = (struct sockaddr_in *)&l.addr;
        if (strcmp(host, "localhost") == 0)
            snprintf(host, sizeof(host), "127.0.0.1");
        a4->sin_family = AF_INET;
        a4->sin_port = htons(port);
        if (inet_pton(AF_INET, host, &a4->sin_addr) != 1)
            return -EINVAL;
        l.addrlen = sizeof(*a4);
        l.loopback = (ntohl(a4->sin_addr.s_addr) >> 24) == 127;
    }
done:
    if (out)
        *out = l;
    return 0;
}
