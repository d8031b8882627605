/*
 * http.c - the daemon's HTTP endpoint (see http.h), on libmicrohttpd.
 *
 * Design. Operators' tools (Prometheus, a browser, curl, a container's liveness probe) read the
 * daemon over HTTP; workers never do. So the endpoint is read-only, and nothing it does can slow
 * the data path: every answer is rendered from a snapshot (snapshot.c) whose locks are held only
 * to copy, and the text is formatted with no lock held. It has its own thread, so a slow or
 * malicious HTTP client can at worst delay other HTTP clients, never a worker; and the limits
 * below keep it from delaying them for long, so that a liveness probe is answered at once even
 * while hundreds of idle or trickling connections are open.
 *
 * Life cycle. kvp_server_start() calls kvp_http_start() before the pool is reserved (server.c,
 * step 2b): a port that cannot be bound is a start-up error within a second, not after minutes
 * of reservation, and during the reservation /api/healthcheck already answers 503 "starting".
 * The socket is bound here (so the ERROR line can name the cause) and handed to libmicrohttpd.
 * From the release store of s->serving on, the answers read the store and the registry; the
 * endpoint is stopped in kvp_server_destroy() after the connections have closed (so that a probe
 * sees 503 "stopping" meanwhile) and before the store and the registry are freed.
 *
 * Limits (every input an HTTP client controls): KVP_HTTP_MAX_CONNECTIONS connections at once
 * (an idle one costs a descriptor and a few KiB, so there is room for a crowd), and
 * KVP_HTTP_REQUEST_TIMEOUT_S seconds for a request's line and headers to arrive, counted from
 * the connection's start or the end of its previous answer, however often bytes come: a client
 * that trickles its headers a byte at a time (slowloris), or opens connections and sends
 * nothing, holds its slot for that long at most. libmicrohttpd's inactivity timeout
 * (KVP_HTTP_TIMEOUT_S) covers the rest (a client that stops reading its answer).
 * KVP_HTTP_MEMORY_LIMIT bytes for a request's line and headers (more is answered 431 or 414 by
 * libmicrohttpd), strict HTTP/1.1 parsing, GET and HEAD only (anything else 405, an unknown path
 * 404, both with a JSON body). A request body is never read.
 *
 * The request deadline is enforced here, because libmicrohttpd 0.9 only knows inactivity: the
 * endpoint's thread runs libmicrohttpd itself (external polling with epoll: MHD_run_wait() at
 * most KVP_HTTP_TICK_MS at a time), follows every connection through its notifications, and
 * shuts down the socket of one whose request is late; libmicrohttpd then closes it. Everything
 * here runs on that one thread, so the connection list needs no lock.
 *
 * Security headers: no caching, no MIME sniffing; the page gets a Content-Security-Policy that
 * allows nothing but its own inline style and script, identified by their SHA-256 (computed
 * here from the embedded page, so editing the page needs no second edit), and fetches from its
 * own origin.
 *
 * Threads: the endpoint's thread (http_main()) runs libmicrohttpd, every request handler and
 * every notification; it is created with the stop signals blocked, like every other thread of
 * the daemon. The fuzz driver runs the same daemon without it, by kvp_http_run() (http.h).
 */
#include "http/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <microhttpd.h>
#include <sodium.h>

#include "base/log.h"
#include "common/errors.h"
#include "core/daemon.h"
#include "core/stats.h"
#include "http/status_page.h"
#include "report/metrics.h"
#include "report/status_json.h"

#define KVP_HTTP_TICK_MS 100 /* the longest the thread waits in libmicrohttpd */

/* One open connection, from libmicrohttpd's STARTED notification to its CLOSED one. */
struct http_conn {
    struct http_conn *prev, *next;
    int fd;
    uint64_t deadline_ms; /* its request must be in by then; 0 while it is being answered */
};

struct kvp_http {
    struct MHD_Daemon *mhd;
    struct kvp_server *srv;
    uint16_t port;
    char url[80]; /* http://ADDR:PORT/ as actually bound */
    char csp[512];
    struct http_conn conns; /* sentinel of the open connections (the thread's own) */
    uint32_t nconns;
    pthread_t thread;
    bool threaded;
    atomic_bool stop;
};

/* http://ADDR:PORT/ for the log and the status. */
static void format_url(const struct sockaddr_storage *ss, uint16_t port, char *out, size_t size)
{
    char a[INET6_ADDRSTRLEN] = "?";
    if (ss->ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)ss)->sin6_addr, a, sizeof(a));
        snprintf(out, size, "http://[%s]:%u/", a, (unsigned)port);
    } else {
        inet_ntop(AF_INET, &((const struct sockaddr_in *)ss)->sin_addr, a, sizeof(a));
        snprintf(out, size, "http://%s:%u/", a, (unsigned)port);
    }
}

/* Binds and listens. Returns the socket, or a negative errno after the start-up ERROR line. */
static int bind_listen(const struct kvp_listen_addr *l, const char *spec, uint16_t *port)
{
    int fd = socket(l->addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), err;
    if (fd < 0) {
        err = errno;
        log_error("Cannot start: cannot create the HTTP socket for --http %s: %s", spec,
                  kvp_strerror(-err));
        return -err;
    }
    int one = 1;
    /* A restart must not wait for the previous daemon's connections in TIME_WAIT. */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (l->addr.ss_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    if (bind(fd, (const struct sockaddr *)&l->addr, l->addrlen) != 0) {
        err = errno;
        close(fd);
        if (err == EADDRINUSE)
            log_error("Cannot start: the HTTP address %s is already in use (by another kvpoold or "
                      "another service); choose another with --http ADDR:PORT, or --http off",
                      spec);
        else if (err == EACCES)
            log_error("Cannot start: no permission to bind the HTTP address %s (ports below 1024 "
                      "need privileges); choose another with --http ADDR:PORT",
                      spec);
        else if (err == EADDRNOTAVAIL)
            log_error("Cannot start: the HTTP address %s is not an address of this host (--http)",
                      spec);
        else
            log_error("Cannot start: cannot bind the HTTP address %s: %s", spec,
                      kvp_strerror(-err));
        return -err;
    }
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (listen(fd, 64) != 0 || getsockname(fd, (struct sockaddr *)&ss, &len) != 0) {
        err = errno;
        close(fd);
        log_error("Cannot start: cannot listen on the HTTP address %s: %s", spec,
                  kvp_strerror(-err));
        return -err;
    }
    *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                           : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

/* ---- the page's Content-Security-Policy ---- */

/* 'sha256-<base64>' of the text between the first open tag and the next close tag. */
static int inline_hash(const char *open, const char *close, char *out, size_t size)
{
    const char *page = (const char *)kvp_status_page;
    size_t len = kvp_status_page_len;
    const char *a = memmem(page, len, open, strlen(open));
    if (!a)
        return -EINVAL;
    a += strlen(open);
    const char *b = memmem(a, len - (size_t)(a - page), close, strlen(close));
    if (!b)
        return -EINVAL;
    unsigned char h[crypto_hash_sha256_BYTES];
    char b64[sodium_base64_ENCODED_LEN(crypto_hash_sha256_BYTES, sodium_base64_VARIANT_ORIGINAL)];
    crypto_hash_sha256(h, (const unsigned char *)a, (unsigned long long)(b - a));
    sodium_bin2base64(b64, sizeof(b64), h, sizeof(h), sodium_base64_VARIANT_ORIGINAL);
    snprintf(out, size, "'sha256-%s'", b64);
    return 0;
}

static int make_csp(char *out, size_t size)
{
    char script[64], style[64];
    if (inline_hash("<script>", "</script>", script, sizeof(script)) ||
        inline_hash("<style>", "</style>", style, sizeof(style)))
        return -EINVAL;
    snprintf(out, size,
             "default-src 'none'; script-src %s; style-src %s; connect-src 'self'; "
             "img-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
             script, style);
    return 0;
}

/* ---- answers ---- */

#define TYPE_JSON "application/json"

/*
 * Queues one response. mode says who owns body: MHD_RESPMEM_MUST_FREE hands a malloc'd body
 * over (freed here if the response cannot be made), MHD_RESPMEM_PERSISTENT is static text.
 */
static enum MHD_Result reply(struct kvp_http *h, struct MHD_Connection *conn, unsigned status,
                             const char *type, const char *body, size_t len,
                             enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE)
            free((void *)body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    if (strncmp(type, "text/html", 9) == 0) {
        MHD_add_response_header(r, "Content-Security-Policy", h->csp);
        MHD_add_response_header(r, "X-Frame-Options", "DENY");
        MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    }
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    if (status >= 400)
        KVP_COUNT(http_errors, 1);
    enum MHD_Result rc = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result reply_static(struct kvp_http *h, struct MHD_Connection *conn,
                                    unsigned status, const char *type, const char *text)
{
    return reply(h, conn, status, type, text, strlen(text), MHD_RESPMEM_PERSISTENT);
}

/* json_dumps() leaves no final newline; curl users like one. Returns the text's length. */
static size_t add_newline(char **text)
{
    size_t len = strlen(*text);
    char *t = realloc(*text, len + 2);
    if (t) {
        *text = t;
        t[len++] = '\n';
        t[len] = '\0';
    }
    return len;
}

/* Serving: the store and the registry exist until kvp_http_stop(). */
static bool serving(const struct kvp_http *h)
{
    return atomic_load_explicit(&h->srv->serving, memory_order_acquire);
}

static enum MHD_Result serve_health(struct kvp_http *h, struct MHD_Connection *conn)
{
    if (atomic_load(&h->srv->stopping))
        return reply_static(h, conn, MHD_HTTP_SERVICE_UNAVAILABLE, TYPE_JSON,
                            "{\"status\": \"unhealthy\", \"reason\": \"stopping\"}\n");
    if (!serving(h))
        return reply_static(h, conn, MHD_HTTP_SERVICE_UNAVAILABLE, TYPE_JSON,
                            "{\"status\": \"unhealthy\", \"reason\": \"starting: the pool is "
                            "being reserved\"}\n");
    /* Still healthy (200) when L2 is not up: the daemon serves from L1, and a liveness probe
     * must not restart it; the body says what is degraded. */
    char *text = kvp_status_health_degraded(h->srv);
    if (text) {
        size_t len = add_newline(&text);
        return reply(h, conn, MHD_HTTP_OK, TYPE_JSON, text, len, MHD_RESPMEM_MUST_FREE);
    }
    return reply_static(h, conn, MHD_HTTP_OK, TYPE_JSON, "{\"status\": \"healthy\"}\n");
}

static enum MHD_Result serve_status(struct kvp_http *h, struct MHD_Connection *conn)
{
    unsigned status = serving(h) ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE;
    char *text = kvp_status_json(h->srv);
    if (!text)
        return reply_static(h, conn, MHD_HTTP_INTERNAL_SERVER_ERROR, TYPE_JSON,
                            "{\"error\": \"out of memory\"}\n");
    size_t len = add_newline(&text);
    return reply(h, conn, status, TYPE_JSON, text, len, MHD_RESPMEM_MUST_FREE);
}

static enum MHD_Result serve_metrics(struct kvp_http *h, struct MHD_Connection *conn)
{
    size_t len = 0;
    if (!serving(h))
        return reply_static(h, conn, MHD_HTTP_SERVICE_UNAVAILABLE, "text/plain; charset=utf-8",
                            "kvpoold is starting: the pool is being reserved\n");
    char *text = kvp_metrics_text(h->srv, &len);
    if (!text)
        return reply_static(h, conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain; charset=utf-8",
                            "out of memory\n");
    return reply(h, conn, MHD_HTTP_OK, KVP_METRICS_CONTENT_TYPE, text, len, MHD_RESPMEM_MUST_FREE);
}

/* ---- connections and their request deadline ---- */

static struct http_conn *conn_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* A new connection must send its request within KVP_HTTP_REQUEST_TIMEOUT_S; a closed one is
 * forgotten. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct kvp_http *h = cls;
    struct http_conn *c = *socket_context;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        c = malloc(sizeof(*c));
        /* Without an entry (out of memory) the connection has only the inactivity timeout. */
        if (!c || !ci) {
            free(c);
            return;
        }
        c->fd = ci->connect_fd;
        c->deadline_ms = kvp_mono_ms() + KVP_HTTP_REQUEST_TIMEOUT_S * 1000;
        c->next = h->conns.next;
        c->prev = &h->conns;
        h->conns.next->prev = c;
        h->conns.next = c;
        h->nconns++;
        *socket_context = c;
    } else if (c) {
        c->prev->next = c->next;
        c->next->prev = c->prev;
        h->nconns--;
        free(c);
        *socket_context = NULL;
    }
}

/* An answer was sent (or given up): the next request on the connection, if any, gets a new
 * deadline. */
static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct http_conn *c = conn_of(conn);
    (void)cls;
    (void)req_cls;
    (void)toe;
    if (c)
        c->deadline_ms = kvp_mono_ms() + KVP_HTTP_REQUEST_TIMEOUT_S * 1000;
}

/* Shuts down the sockets of connections whose request is late: libmicrohttpd sees the end of
 * the stream and closes them. */
static void reap_late(struct kvp_http *h)
{
    uint64_t now = kvp_mono_ms();
    for (struct http_conn *c = h->conns.next; c != &h->conns; c = c->next) {
        if (c->deadline_ms && now >= c->deadline_ms) {
            shutdown(c->fd, SHUT_RDWR);
            c->deadline_ms = 0;
        }
    }
}

/*
 * Every request, called once its headers are in: answered at once, so a body (which no
 * endpoint takes) is never read; libmicrohttpd then closes the connection.
 */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **req_cls)
{
    struct kvp_http *h = cls;
    struct http_conn *c = conn_of(conn);
    (void)version;
    (void)upload_data;
    (void)upload_data_size;
    (void)req_cls;

    /* The request is in: while it is answered, only the inactivity timeout applies. */
    if (c)
        c->deadline_ms = 0;
    KVP_COUNT(http_requests, 1);
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return reply_static(h, conn, MHD_HTTP_METHOD_NOT_ALLOWED, TYPE_JSON,
                            "{\"error\": \"method not allowed: kvpoold answers GET and HEAD\"}\n");
    if (strcmp(url, "/") == 0 || strcmp(url, "/index.html") == 0)
        return reply(h, conn, MHD_HTTP_OK, "text/html; charset=utf-8",
                     (const char *)kvp_status_page, kvp_status_page_len, MHD_RESPMEM_PERSISTENT);
    /* /healthcheck: where LMCache's tooling probes `lmcache server`. */
    if (strcmp(url, "/api/healthcheck") == 0 || strcmp(url, "/healthcheck") == 0)
        return serve_health(h, conn);
    if (strcmp(url, "/api/status") == 0)
        return serve_status(h, conn);
    if (strcmp(url, "/metrics") == 0)
        return serve_metrics(h, conn);
    return reply_static(h, conn, MHD_HTTP_NOT_FOUND, TYPE_JSON,
                        "{\"error\": \"not found: kvpoold serves /, /api/healthcheck "
                        "(also /healthcheck), /api/status and /metrics\"}\n");
}

/* Paths are matched as sent: none of ours needs an escape, so "%2F" or "%00" never decodes
 * into another path (or into a NUL that would end one early). */
static size_t keep_escapes(void *cls, struct MHD_Connection *conn, char *s)
{
    (void)cls;
    (void)conn;
    return strlen(s);
}

/* libmicrohttpd's own complaints (mostly about malformed requests): debug, rate-limited. */
__attribute__((format(printf, 2, 0))) static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char buf[256];
    (void)cls;
    vsnprintf(buf, sizeof(buf), fmt, ap);
    buf[strcspn(buf, "\n")] = '\0';
    kvp_log_rl(KVP_LOG_DEBUG, "HTTP: %s", buf);
}

/* ---- life cycle ---- */

/* A new endpoint for s, with its page's policy; NULL after the ERROR line. */
static struct kvp_http *http_new(struct kvp_server *s)
{
    struct kvp_http *h = calloc(1, sizeof(*h));
    if (!h) {
        log_error("Cannot start: out of memory for the HTTP endpoint");
        return NULL;
    }
    h->srv = s;
    h->conns.prev = h->conns.next = &h->conns;
    if (sodium_init() < 0 || make_csp(h->csp, sizeof(h->csp))) {
        log_error("Cannot start: the embedded status page has no style or script element to "
                  "hash for its Content-Security-Policy");
        free(h);
        return NULL;
    }
    return h;
}

/* libmicrohttpd on listen socket fd (-1: none, connections come from kvp_http_add_connection),
 * polled by the caller: every option that bounds a client is here, for both uses. */
static struct MHD_Daemon *mhd_start(struct kvp_http *h, int fd, bool ipv6)
{
    unsigned flags = MHD_USE_EPOLL | MHD_USE_ERROR_LOG;
    if (ipv6)
        flags |= MHD_USE_IPv6;
    if (fd < 0)
        flags |= MHD_USE_NO_LISTEN_SOCKET;
    /* The listening socket, when there is one: libmicrohttpd refuses the option without. */
    struct MHD_OptionItem listen[2] = {{MHD_OPTION_LISTEN_SOCKET, fd, NULL},
                                       {MHD_OPTION_END, 0, NULL}};
    return MHD_start_daemon(flags, 0, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER,
                            mhd_log, h, MHD_OPTION_UNESCAPE_CALLBACK, keep_escapes, h,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_ARRAY,
                            fd >= 0 ? listen : listen + 1, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)KVP_HTTP_MAX_CONNECTIONS, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)KVP_HTTP_TIMEOUT_S, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                            (size_t)KVP_HTTP_MEMORY_LIMIT, MHD_OPTION_STRICT_FOR_CLIENT, 1,
                            MHD_OPTION_END);
}

/* The endpoint's thread: libmicrohttpd's work, then the late requests, until the stop. */
static void *http_main(void *arg)
{
    struct kvp_http *h = arg;
    kvp_thread_name("kvp-http");
    while (!atomic_load_explicit(&h->stop, memory_order_acquire)) {
        MHD_run_wait(h->mhd, KVP_HTTP_TICK_MS);
        reap_late(h);
    }
    return NULL;
}

int kvp_http_start(struct kvp_server *s)
{
    struct kvp_listen_addr l;
    const char *spec = s->cfg.http;

    if (kvp_listen_addr_parse(spec, &l)) {
        log_error("Cannot start: invalid --http '%s'", spec);
        return -EINVAL;
    }
    if (l.off) {
        log_debug("HTTP endpoint disabled (--http off)");
        return 0;
    }
    struct kvp_http *h = http_new(s);
    if (!h)
        return -ENOMEM;
    int fd = bind_listen(&l, spec, &h->port);
    if (fd < 0) {
        free(h);
        return fd;
    }
    format_url(&l.addr, h->port, h->url, sizeof(h->url));
    h->mhd = mhd_start(h, fd, l.addr.ss_family == AF_INET6);
    if (!h->mhd) {
        close(fd);
        log_error("Cannot start: cannot start the HTTP endpoint on %s", h->url);
        free(h);
        return -EIO;
    }
    int rc = kvp_thread_create(&h->thread, NULL, http_main, h);
    if (rc) {
        MHD_stop_daemon(h->mhd);
        log_error("Cannot start: cannot create the HTTP thread: %s", strerror(rc));
        free(h);
        return -rc;
    }
    h->threaded = true;
    s->http = h;
    if (l.loopback)
        log_info("HTTP endpoint on %s (status page; /api/healthcheck, /api/status, /metrics)",
                 h->url);
    else
        log_warn("HTTP endpoint on %s is reachable from other hosts: it is unauthenticated and "
                 "shows instance names, pids and usage to anyone who can connect "
                 "(docs/SECURITY.md)",
                 h->url);
    return 0;
}

int kvp_http_start_unthreaded(struct kvp_server *s)
{
    struct kvp_http *h = http_new(s);
    if (!h)
        return -ENOMEM;
    h->mhd = mhd_start(h, -1, false);
    if (!h->mhd) {
        free(h);
        return -EIO;
    }
    s->http = h;
    return 0;
}

int kvp_http_add_connection(struct kvp_server *s, int fd)
{
    struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(1)};
    peer.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (MHD_add_connection(s->http->mhd, fd, (const struct sockaddr *)&peer, sizeof(peer)) !=
        MHD_YES)
        return -EIO;
    return 0;
}

uint32_t kvp_http_run(struct kvp_server *s)
{
    MHD_run(s->http->mhd);
    reap_late(s->http);
    return s->http->nconns;
}

uint16_t kvp_http_port(const struct kvp_server *s)
{
    return s->http ? s->http->port : 0;
}

void kvp_http_stop(struct kvp_server *s)
{
    struct kvp_http *h = s->http;
    if (!h)
        return;
    if (h->threaded) {
        /* Release: pairs with the acquire of the thread's loop; it ends within a tick. */
        atomic_store_explicit(&h->stop, true, memory_order_release);
        pthread_join(h->thread, NULL);
    }
    /* Closes the listening socket and every connection (each notified as closed). */
    MHD_stop_daemon(h->mhd);
    free(h);
    s->http = NULL;
}
