/*
 * http_client.h - a small HTTP/1.1 client for the tests of the daemon's HTTP endpoint (unit tests
 * in tests/server, integration tests in tests/integration). Raw sockets on purpose: the tests
 * also send what no real client would (malformed lines, huge headers, a request cut short), and
 * they read exactly what the daemon wrote. Every wait is bounded.
 */
#ifndef KVPT_HTTP_CLIENT_H
#define KVPT_HTTP_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct kvpt_http_reply {
    int status;         /* the status line's code; 0 if no status line came */
    char headers[4096]; /* the status line and the headers, NUL-terminated (truncated) */
    char *body;         /* malloc'd, NUL-terminated; NULL before a reply */
    size_t body_len;
};

/*
 * Sends len bytes of req to 127.0.0.1:port, then reads until the server closes the connection
 * or timeout_ms pass. Returns 0 with *r filled (free with kvpt_http_free()), -ECONNRESET when
 * the server closed without a byte of reply, -ETIMEDOUT when it neither answered nor closed, or
 * another negative errno (connect failed...).
 */
int kvpt_http_raw(uint16_t port, const void *req, size_t len, int timeout_ms,
                  struct kvpt_http_reply *r);

/* METHOD path HTTP/1.1 with Host and "Connection: close", 10 s timeout. Returns what
 * kvpt_http_raw() returns. */
int kvpt_http_request(uint16_t port, const char *method, const char *path,
                      struct kvpt_http_reply *r);

/* The value of header name (case-insensitive) copied into out, or NULL if absent. */
const char *kvpt_http_header(const struct kvpt_http_reply *r, const char *name, char *out,
                             size_t size);

void kvpt_http_free(struct kvpt_http_reply *r);

/* Opens a TCP connection to 127.0.0.1:port. Returns the descriptor or a negative errno. */
int kvpt_http_connect(uint16_t port);

/*
 * The port of the daemon's "HTTP endpoint on http://ADDR:PORT/" line in the log file at path,
 * waiting up to timeout_ms for it to appear. 0 if it does not.
 */
uint16_t kvpt_http_port_in_log(const char *path, int timeout_ms);

/* GET path, parsed as JSON (jansson; the caller json_decref()s it). *status gets the HTTP
 * status. NULL when the request fails or the body is not JSON. */
json_t *kvpt_http_json(uint16_t port, const char *path, int *status);

/*
 * The value of one sample of a Prometheus text exposition: the line that starts with series
 * (the metric name and its labels exactly as written, e.g.
 * kvpool_instances{front_end="kvpool",transport="shm"}) followed by a space. Sets *found; returns 0
 * when absent.
 */
double kvpt_metric(const char *text, const char *series, int *found);

#endif /* KVPT_HTTP_CLIENT_H */
