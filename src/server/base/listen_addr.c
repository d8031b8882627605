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

static bool is_ipv4(const char *s)
{
    unsigned a, b, c, d;
    char tail;
    return sscanf(s, "%u.%u.%u.%u%c", &a, &b, &c, &d, &tail) == 4 && a < 256 && b < 256 &&
           c < 256 && d < 256;
}

/* The tcp:// address s into a (host and port checked for their characters only). */
static int parse_tcp(const char *s, struct kvp_lmc_addr *a);

int kvp_lmc_addr_parse(const char *s, struct kvp_lmc_addr *out)
{
    struct kvp_lmc_addr a;
    memset(&a, 0, sizeof(a));
    if (strncmp(s, "ipc://", 6) == 0) {
        const char *p = s + 6;
        if (p[0] != '/' || strlen(p) >= sizeof(a.path) || strlen(p) < 2)
            return -EINVAL;
        a.ipc = true;
        snprintf(a.path, sizeof(a.path), "%s", p);
    } else if (strncmp(s, "tcp://", 6) == 0) {
        if (parse_tcp(s, &a))
            return -EINVAL;
        /* ZeroMQ binds addresses and interface names, never host names: localhost is
         * 127.0.0.1, any other name is refused (kvp_lmc_addr_named_host()). */
        bool name = a.host[0] != '[' && !is_ipv4(a.host) && strcmp(a.host, "*") != 0;
        if (name && strcmp(a.host, "localhost") != 0)
            return -EINVAL;
        snprintf(a.url, sizeof(a.url), "tcp://%s:%u", name ? "127.0.0.1" : a.host, a.port);
        a.loopback = name || strcmp(a.host, "[::1]") == 0 ||
                     (is_ipv4(a.host) && strncmp(a.host, "127.", 4) == 0);
    } else {
        return -EINVAL;
    }
    if (a.ipc)
        snprintf(a.url, sizeof(a.url), "ipc://%s", a.path);
    if (out)
        *out = a;
    return 0;
}

bool kvp_lmc_addr_named_host(const char *s, struct kvp_lmc_addr *out)
{
    struct kvp_lmc_addr a;
    memset(&a, 0, sizeof(a));
    if (strncmp(s, "tcp://", 6) != 0 || parse_tcp(s, &a) || a.host[0] == '[' || is_ipv4(a.host) ||
        strcmp(a.host, "*") == 0 || strcmp(a.host, "localhost") == 0)
        return false;
    if (out)
        *out = a;
    return true;
}

static int parse_tcp(const char *s, struct kvp_lmc_addr *out)
{
    struct kvp_lmc_addr a;
    memset(&a, 0, sizeof(a));
    const char *p = s + 6, *colon;
    if (p[0] == '[') {
        const char *close = strchr(p, ']');
        if (!close || close[1] != ':')
            return -EINVAL;
        colon = close + 1;
    } else {
        colon = strrchr(p, ':');
        if (!colon)
            return -EINVAL;
    }
    size_t hlen = (size_t)(colon - p);
    if (hlen == 0 || hlen >= sizeof(a.host))
        return -EINVAL;
    memcpy(a.host, p, hlen);
    a.host[hlen] = '\0';
    if (a.host[0] != '[') {
        for (const char *c = a.host; *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                  (*c >= '0' && *c <= '9') || *c == '.' || *c == '-' || *c == '*'))
                return -EINVAL;
    } else {
        for (const char *c = a.host + 1; *c && *c != ']'; c++)
            if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f') ||
                  (*c >= 'A' && *c <= 'F') || *c == ':' || *c == '.'))
                return -EINVAL;
    }
    char *end;
    errno = 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (errno || *end || colon[1] < '0' || colon[1] > '9' || port < 1 || port > 65535)
        return -EINVAL;
    a.port = (unsigned)port;
    *out = a;
    return 0;
}
