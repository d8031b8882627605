/*
 * http_client.c - a small raw-socket HTTP/1.1 client for tests (see http_client.h).
 */
#include "http_client.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int kvpt_http_connect(uint16_t port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        int err = errno;
        close(fd);
        return -err;
    }
    return fd;
}

/* Splits what was read into status, headers and body. */
static void parse(char *buf, size_t n, struct kvpt_http_reply *r)
{
    char *end = NULL;
    for (size_t i = 0; i + 3 < n && !end; i++)
        if (memcmp(buf + i, "\r\n\r\n", 4) == 0)
            end = buf + i;
    size_t hlen = end ? (size_t)(end - buf) : n;
    snprintf(r->headers, sizeof(r->headers), "%.*s", (int)hlen, buf);
    if (strncmp(r->headers, "HTTP/1.", 7) == 0)
        r->status = atoi(r->headers + 9);
    size_t off = end ? hlen + 4 : n;
    r->body_len = n - off;
    r->body = malloc(r->body_len + 1);
    if (r->body) {
        memcpy(r->body, buf + off, r->body_len);
        r->body[r->body_len] = '\0';
    }
}

int kvpt_http_raw(uint16_t port, const void *req, size_t len, int timeout_ms,
                  struct kvpt_http_reply *r)
{
    memset(r, 0, sizeof(*r));
    int fd = kvpt_http_connect(port);
    if (fd < 0)
        return fd;
    /* The server may answer (and close) before it has read everything: not an error here. */
    const char *p = req;
    for (size_t off = 0; off < len;) {
        ssize_t w = send(fd, p + off, len - off, MSG_NOSIGNAL);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    int rc = 0;
    for (;;) {
        uint64_t now = now_ms();
        if (now >= deadline) {
            rc = -ETIMEDOUT;
            break;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, (int)(deadline - now)) <= 0)
            continue;
        if (n + 1 >= cap) {
            char *b = realloc(buf, cap * 2);
            if (!b) {
                rc = -ENOMEM;
                break;
            }
            buf = b;
            cap *= 2;
        }
        ssize_t k = recv(fd, buf + n, cap - n - 1, 0);
        if (k > 0) {
            n += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno != ECONNRESET)
            rc = -errno;
        break; /* EOF, or a reset after the reply */
    }
    close(fd);
    if (rc == 0 && n == 0)
        rc = -ECONNRESET;
    if (rc == 0 || (rc == -ETIMEDOUT && n > 0))
        parse(buf, n, r);
    free(buf);
    return rc == -ETIMEDOUT && n > 0 ? 0 : rc;
}

int kvpt_http_request(uint16_t port, const char *method, const char *path,
                      struct kvpt_http_reply *r)
{
    char req[1024];
    int n = snprintf(req, sizeof(req),
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%u\r\nUser-Agent: kvpool-test\r\n"
                     "Connection: close\r\n\r\n",
                     method, path, (unsigned)port);
    return kvpt_http_raw(port, req, (size_t)n, 10000, r);
}

const char *kvpt_http_header(const struct kvpt_http_reply *r, const char *name, char *out,
                             size_t size)
{
    size_t n = strlen(name);
    for (const char *line = strstr(r->headers, "\r\n"); line; line = strstr(line, "\r\n")) {
        line += 2;
        if (strncasecmp(line, name, n) == 0 && line[n] == ':') {
            const char *v = line + n + 1;
            while (*v == ' ')
                v++;
            size_t len = strcspn(v, "\r\n");
            snprintf(out, size, "%.*s", (int)len, v);
            return out;
        }
    }
    return NULL;
}

void kvpt_http_free(struct kvpt_http_reply *r)
{
    free(r->body);
    r->body = NULL;
}

uint16_t kvpt_http_port_in_log(const char *path, int timeout_ms)
{
    static const char mark[] = "HTTP endpoint on http://";
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    do {
        FILE *f = fopen(path, "re");
        char line[1024];
        while (f && fgets(line, sizeof(line), f)) {
            const char *p = strstr(line, mark);
            if (!p)
                continue;
            p += strlen(mark);
            const char *end = strchr(p, '/');
            const char *colon = end ? memrchr(p, ':', (size_t)(end - p)) : NULL;
            if (colon) {
                fclose(f);
                return (uint16_t)atoi(colon + 1);
            }
        }
        if (f)
            fclose(f);
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    } while (now_ms() < deadline);
    return 0;
}

json_t *kvpt_http_json(uint16_t port, const char *path, int *status)
{
    struct kvpt_http_reply r;
    *status = 0;
    if (kvpt_http_request(port, "GET", path, &r) != 0)
        return NULL;
    *status = r.status;
    json_t *v = r.body ? json_loads(r.body, 0, NULL) : NULL;
    kvpt_http_free(&r);
    return v;
}

double kvpt_metric(const char *text, const char *series, int *found)
{
    size_t n = strlen(series);
    *found = 0;
    for (const char *p = text; p && *p;) {
        if (strncmp(p, series, n) == 0 && p[n] == ' ') {
            *found = 1;
            return strtod(p + n + 1, NULL);
        }
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return 0;
}
