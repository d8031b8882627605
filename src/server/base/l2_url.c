/*
 * l2_url.c - parsing of the --l2 URL and of the password file (see l2_url.h for the forms).
 *
 * The parser is strict: every part has a limit, anything it does not understand is an error
 * that names the part, and a password is never copied into a message. It runs at option
 * parsing (so a bad URL stops the daemon with status 2 before anything starts) and again when
 * the tier starts. No allocation, no global state: any thread may call it.
 */
#include "base/l2_url.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/why.h"

/* The value of one hex digit, -1 for anything else. */
static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Percent-decodes src[0..len) into out (size bytes). Returns 0, or -EINVAL for a bad escape, a
 * NUL byte or a result that does not fit. */
static int pct_decode(const char *src, size_t len, char *out, size_t size)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        int c = (unsigned char)src[i];
        if (c == '%') {
            if (i + 2 >= len)
                return -EINVAL;
            int hi = hexval(src[i + 1]), lo = hexval(src[i + 2]);
            if (hi < 0 || lo < 0)
                return -EINVAL;
            c = hi * 16 + lo;
            i += 2;
        }
        if (c == 0 || o + 1 >= size)
            return -EINVAL;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    return 0;
}

/* A decimal number in [min, max] spanning exactly s[0..len). */
static int parse_num(const char *s, size_t len, unsigned long min, unsigned long max,
                     unsigned long *out)
{
    unsigned long v = 0;
    if (len == 0 || len > 10)
        return -EINVAL;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -EINVAL;
        v = v * 10 + (unsigned long)(s[i] - '0');
    }
    if (v < min || v > max)
        return -EINVAL;
    *out = v;
    return 0;
}

/* "user:password", ":password" or "user", percent-encoded, from s[0..len). */
static int parse_userinfo(const char *s, size_t len, struct kvp_l2_target *t, char *why,
                          size_t why_size)
{
    const char *colon = memchr(s, ':', len);
    size_t ulen = colon ? (size_t)(colon - s) : len;
    if (pct_decode(s, ulen, t->user, sizeof(t->user)))
        return kvp_why(why, why_size, -EINVAL,
                       "bad user name (at most %d bytes, valid %%XX escapes)", KVP_L2_MAX_USER);
    if (colon && pct_decode(colon + 1, len - ulen - 1, t->password, sizeof(t->password)))
        return kvp_why(why, why_size, -EINVAL,
                       "bad password (at most %d bytes, valid %%XX escapes)", KVP_L2_MAX_PASSWORD);
    return 0;
}

/* HOST[:PORT] from s[0..len); a bracketed IPv6 address keeps its brackets out of host. */
static int parse_hostport(const char *s, size_t len, bool port_required, struct kvp_l2_endpoint *e,
                          char *why, size_t why_size)
{
    const char *host = s, *port = NULL;
    size_t hlen;

    if (len && s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (!close)
            return kvp_why(why, why_size, -EINVAL, "unterminated '[' in host '%.*s'", (int)len, s);
        host = s + 1;
        hlen = (size_t)(close - host);
        size_t rest = len - (size_t)(close + 1 - s);
        if (rest && close[1] != ':')
            return kvp_why(why, why_size, -EINVAL, "unexpected text after ']' in '%.*s'", (int)len,
                           s);
        if (rest)
            port = close + 2;
    } else {
        const char *colon = memchr(s, ':', len);
        hlen = colon ? (size_t)(colon - s) : len;
        if (colon)
            port = colon + 1;
    }
    if (hlen == 0 || hlen > KVP_L2_MAX_HOST)
        return kvp_why(why, why_size, -EINVAL, "host of '%.*s' must have 1..%d bytes", (int)len, s,
                       KVP_L2_MAX_HOST);
    for (size_t i = 0; i < hlen; i++) {
        char c = host[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '-' || c == '_' || c == ':';
        if (!ok)
            return kvp_why(why, why_size, -EINVAL, "bad character in host '%.*s'", (int)hlen, host);
    }
    memcpy(e->host, host, hlen);
    e->host[hlen] = '\0';
    unsigned long p = 6379;
    if (!port && port_required)
        return kvp_why(why, why_size, -EINVAL, "node '%.*s' needs a port (HOST:PORT)", (int)len, s);
    if (port && parse_num(port, len - (size_t)(port - s), 1, 65535, &p))
        return kvp_why(why, why_size, -EINVAL, "bad port in '%.*s' (1..65535)", (int)len, s);
    e->port = (uint16_t)p;
    return 0;
}

/* Splits "[userinfo@]rest" of an authority s[0..len): the last '@' ends the userinfo, since a
 * password may contain '@' only percent-encoded but users do not always encode it. */
static int split_userinfo(const char *s, size_t len, struct kvp_l2_target *t, size_t *skip,
                          char *why, size_t why_size)
{
    const char *at = NULL;
    for (size_t i = 0; i < len; i++)
        if (s[i] == '@')
            at = s + i;
    *skip = 0;
    if (!at)
        return 0;
    *skip = (size_t)(at - s) + 1;
    return parse_userinfo(s, (size_t)(at - s), t, why, why_size);
}

/*
 * redis://[userinfo@]HOST[:PORT][/DB]: s is what follows the scheme. The authority ends at the
 * first '/', '?' or '#'; a trailing "/" alone means database 0. Query strings and fragments are
 * refused rather than ignored: an option kvpool would silently drop is worse than an error.
 */
static int parse_redis(const char *s, struct kvp_l2_target *t, char *why, size_t why_size)
{
    size_t len = strcspn(s, "/?#"), skip;
    int rc = split_userinfo(s, len, t, &skip, why, why_size);
    if (rc)
        return rc;
    rc = parse_hostport(s + skip, len - skip, false, &t->nodes[0], why, why_size);
    if (rc)
        return rc;
    t->nnodes = 1;
    const char *rest = s + len;
    if (*rest == '/' && rest[1]) {
        unsigned long db;
        if (parse_num(rest + 1, strlen(rest + 1), 0, KVP_L2_MAX_DB, &db))
            return kvp_why(why, why_size, -EINVAL, "bad database '%s' (a number from 0 to %d)",
                           rest + 1, KVP_L2_MAX_DB);
        t->db = (uint32_t)db;
    } else if (*rest && strcmp(rest, "/") != 0) {
        return kvp_why(why, why_size, -EINVAL,
                       "unexpected '%s' after the host (only /DB may follow)", rest);
    }
    return 0;
}

/*
 * unix://[userinfo@]/PATH[?db=N]: the path is absolute and must fit a sockaddr_un; the only
 * query is the database, since a path has no room for "/DB".
 */
static int parse_unix(const char *s, struct kvp_l2_target *t, char *why, size_t why_size)
{
    /* unix:///path: the authority is empty, or holds only credentials ("user:pw@"). */
    size_t len = strcspn(s, "/"), skip;
    int rc = split_userinfo(s, len, t, &skip, why, why_size);
    if (rc)
        return rc;
    if (skip != len)
        return kvp_why(why, why_size, -EINVAL, "a unix URL names no host: unix:///PATH");
    const char *path = s + len, *q = strchr(path, '?');
    size_t plen = q ? (size_t)(q - path) : strlen(path);
    if (plen < 2 || path[0] != '/')
        return kvp_why(why, why_size, -EINVAL,
                       "a unix URL needs an absolute socket path: unix:///PATH");
    if (plen >= sizeof(t->path))
        return kvp_why(why, why_size, -EINVAL, "socket path longer than %zu bytes",
                       sizeof(t->path) - 1);
    memcpy(t->path, path, plen);
    t->path[plen] = '\0';
    if (q) {
        unsigned long db;
        if (strncmp(q, "?db=", 4) != 0 || parse_num(q + 4, strlen(q + 4), 0, KVP_L2_MAX_DB, &db))
            return kvp_why(why, why_size, -EINVAL, "bad query '%s' (only ?db=N, N from 0 to %d)", q,
                           KVP_L2_MAX_DB);
        t->db = (uint32_t)db;
    }
    return 0;
}

/*
 * redis-cluster://[userinfo@]HOST:PORT[,HOST:PORT...]: seed nodes, each with its port (there is
 * no usual port for a cluster node). One reachable seed is enough: the others are found from
 * CLUSTER SLOTS, so the list is only a set of ways in.
 */
static int parse_cluster(const char *s, struct kvp_l2_target *t, char *why, size_t why_size)
{
    size_t len = strcspn(s, "/?#"), skip;
    int rc = split_userinfo(s, len, t, &skip, why, why_size);
    if (rc)
        return rc;
    if (s[len] && strcmp(s + len, "/") != 0 && strcmp(s + len, "/0") != 0)
        return kvp_why(why, why_size, -EINVAL, "a cluster has only database 0; unexpected '%s'",
                       s + len);
    for (const char *p = s + skip; p < s + len;) {
        const char *comma = memchr(p, ',', (size_t)(s + len - p));
        size_t n = comma ? (size_t)(comma - p) : (size_t)(s + len - p);
        if (t->nnodes == KVP_L2_MAX_SEEDS)
            return kvp_why(why, why_size, -EINVAL, "more than %d seed nodes", KVP_L2_MAX_SEEDS);
        rc = parse_hostport(p, n, true, &t->nodes[t->nnodes], why, why_size);
        if (rc)
            return rc;
        t->nnodes++;
        p += n + (comma ? 1 : 0);
        if (comma && p == s + len)
            return kvp_why(why, why_size, -EINVAL, "empty seed node after ','");
    }
    if (t->nnodes == 0)
        return kvp_why(why, why_size, -EINVAL,
                       "a cluster URL needs at least one seed node HOST:PORT");
    return 0;
}

/* Dispatches on the scheme; whatever fails leaves a zeroed target (no password behind). */
int kvp_l2_url_parse(const char *url, struct kvp_l2_target *t, char *why, size_t why_size)
{
    static const struct {
        const char *prefix;
        enum kvp_l2_scheme scheme;
        int (*parse)(const char *, struct kvp_l2_target *, char *, size_t);
    } schemes[] = {
        {"redis://", KVP_L2_REDIS, parse_redis},
        {"unix://", KVP_L2_REDIS_UNIX, parse_unix},
        {"redis-cluster://", KVP_L2_REDIS_CLUSTER, parse_cluster},
    };

    *t = (struct kvp_l2_target){0};
    if (!url || strlen(url) > KVP_L2_MAX_URL)
        return kvp_why(why, why_size, -EINVAL, "URL longer than %d bytes", KVP_L2_MAX_URL);
    for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++) {
        size_t n = strlen(schemes[i].prefix);
        if (strncmp(url, schemes[i].prefix, n) != 0)
            continue;
        t->scheme = schemes[i].scheme;
        int rc = schemes[i].parse(url + n, t, why, why_size);
        if (rc)
            *t = (struct kvp_l2_target){0}; /* no half-parsed password left behind */
        return rc;
    }
    return kvp_why(why, why_size, -EINVAL,
                   "unknown scheme (expected redis://HOST:PORT[/DB], unix:///PATH[?db=N] or "
                   "redis-cluster://HOST:PORT[,HOST:PORT...])");
}

/* Appends one endpoint, bracketing IPv6 addresses again. */
static void put_endpoint(char *out, size_t size, const struct kvp_l2_endpoint *e)
{
    size_t len = strlen(out);
    snprintf(out + len, size - len, strchr(e->host, ':') ? "[%s]:%u" : "%s:%u", e->host,
             (unsigned)e->port);
}

/* Rebuilt from the parsed parts rather than edited from the text, so no spelling of the
 * password (percent-encoded, repeated, in an unusual place) can survive the masking. */
void kvp_l2_url_masked(const struct kvp_l2_target *t, char *out, size_t size)
{
    static const char *const prefix[] = {"redis://", "unix://", "redis-cluster://"};
    size_t len;

    snprintf(out, size, "%s%s%s%s", prefix[t->scheme], t->user, t->password[0] ? ":***" : "",
             t->user[0] || t->password[0] ? "@" : "");
    switch (t->scheme) {
    case KVP_L2_REDIS:
        put_endpoint(out, size, &t->nodes[0]);
        len = strlen(out);
        if (t->db)
            snprintf(out + len, size - len, "/%u", (unsigned)t->db);
        break;
    case KVP_L2_REDIS_UNIX:
        len = strlen(out);
        snprintf(out + len, size - len, "%s", t->path);
        len = strlen(out);
        if (t->db)
            snprintf(out + len, size - len, "?db=%u", (unsigned)t->db);
        break;
    case KVP_L2_REDIS_CLUSTER:
        for (uint32_t i = 0; i < t->nnodes; i++) {
            if (i) {
                len = strlen(out);
                snprintf(out + len, size - len, ",");
            }
            put_endpoint(out, size, &t->nodes[i]);
        }
        break;
    }
}

/*
 * Read once, at start-up. The size is checked on the open descriptor before reading and again
 * on what was read (the file may grow in between), and the buffer is wiped before returning.
 * Group- or world-readable files are accepted with a warning by the caller, as ssh does not:
 * refusing would break start-up for a mode that is a hardening issue, not a malfunction.
 */
int kvp_l2_password_file_read(const char *path, char *out, size_t size, bool *loose, char *why,
                              size_t why_size)
{
    char buf[KVP_L2_MAX_PASSWORD_FILE + 1];
    struct stat st;
    int err;

    *loose = false;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        err = errno;
        snprintf(why, why_size, "cannot open the password file %s: %s", path, strerror(err));
        return -err;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        snprintf(why, why_size, "the password file %s is not a regular file", path);
        return -EINVAL;
    }
    if (st.st_size > KVP_L2_MAX_PASSWORD_FILE) {
        close(fd);
        snprintf(why, why_size, "the password file %s is larger than %d bytes", path,
                 KVP_L2_MAX_PASSWORD_FILE);
        return -EFBIG;
    }
    *loose = (st.st_mode & 077) != 0;
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, sizeof(buf) - 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            err = errno;
            close(fd);
            snprintf(why, why_size, "cannot read the password file %s: %s", path, strerror(err));
            return -err;
        }
        if (r == 0 || (n += (size_t)r) == sizeof(buf) - 1)
            break;
    }
    close(fd);
    if (n > KVP_L2_MAX_PASSWORD_FILE) {
        snprintf(why, why_size, "the password file %s is larger than %d bytes", path,
                 KVP_L2_MAX_PASSWORD_FILE);
        return -EFBIG;
    }
    if (n && buf[n - 1] == '\n')
        n--;
    if (n && buf[n - 1] == '\r')
        n--;
    int rc = 0;
    if (n == 0 || n >= size || n > KVP_L2_MAX_PASSWORD || memchr(buf, '\0', n) ||
        memchr(buf, '\n', n) || memchr(buf, '\r', n)) {
        snprintf(why, why_size,
                 "the password file %s must hold one line of 1..%d bytes (the password)", path,
                 KVP_L2_MAX_PASSWORD);
        rc = -EINVAL;
    } else {
        memcpy(out, buf, n);
        out[n] = '\0';
    }
    /* The stack copy held a secret: do not leave it for a later stack frame to print. */
    explicit_bzero(buf, sizeof(buf));
    return rc;
}
