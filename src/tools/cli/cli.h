/*
 * cli.h - what the files of the `kvpool` command line share: the exit codes, the state of one
 * run (struct cli), a command's parsed options, and the functions one file offers the others.
 *
 *   main.c     the command table, the command line (global and command options), the help
 *   connect.c  reaching the daemon and saying why it could not be reached or a request failed
 *   fields.c   reading the status JSON's fields, and numbers in human units
 *   term.c     terminal-safe output of every string the daemon supplies
 *   status.c   `status` and `instances`: the views of the status JSON
 *   watch.c    `watch`: rates between two readings, redrawn every interval
 *   admin.c    `ping`, `stats`, `metrics`, `clear`, `version`
 */
#ifndef KVP_CLI_H
#define KVP_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/un.h>

#include <jansson.h>

#include "common/units.h"
#include "kvpool.h"

#define EXIT_DAEMON 1  /* the daemon refused the request, or it failed once connected */
#define EXIT_CONNECT 2 /* the daemon cannot be reached */
#define EXIT_USAGE 64  /* a bad command line: sysexits.h's EX_USAGE */
#define DEFAULT_TIMEOUT_MS 30000u

/* What a command's options said. */
struct cmd_opts {
    bool json, once, yes, help;
    double interval; /* seconds */
};

/* What every command works with: the socket it talks to, and the client once connected. */
struct cli {
    const char *socket_opt; /* --socket, or NULL */
    kvp_opts opts;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* set by cli_connect() */
    kvp_client *client;
};

/* ---- connect.c ---- */

/* The socket the library will use ($KVPOOL_SOCKET, --socket or the default), into buf, so that
 * messages name the socket that was tried. Returns 0 or a negative error. */
int cli_resolve_socket(const char *opt, char *buf, size_t size);

/* Resolves the socket and connects (HELLO included). Returns 0, or EXIT_CONNECT after one line
 * on stderr naming the socket and the reason. */
int cli_connect(struct cli *x);

/* Why connecting to path failed with rc, as one phrase that does not repeat the path (callers
 * name it): the library's message msg past its own mention of the path, or kvp_strerror(rc)
 * when there is no message. */
const char *cli_connect_reason(const char *path, int rc, const char *msg);

/* One line on stderr about a request that failed once connected, with the daemon's (or the
 * library's) message. Returns EXIT_DAEMON. */
int cli_failed(const struct cli *x, const char *what, int rc);

/* The daemon's status, parsed. Returns the document (the caller releases it with json_decref)
 * or NULL with *code set after a message; with quiet, a failed request prints nothing. */
json_t *cli_get_status(struct cli *x, bool quiet, int *code);

/* ---- fields.c ---- */

json_t *jobj(json_t *o, const char *key);                       /* member object, or NULL */
bool jget(json_t *o, const char *key, uint64_t *v);             /* member non-negative integer */
uint64_t jnum(json_t *o, const char *key);                      /* member integer, or 0 */
const char *jstr(json_t *o, const char *key, const char *def);  /* member string, or def */
const char *human_duration(uint64_t s, char *buf, size_t size); /* 7384 -> "2h 03m" */
const char *percent(uint64_t part, uint64_t whole, char *buf, size_t size); /* "12.5%" */
int64_t now_us(void); /* monotonic microseconds */

/* ---- term.c ---- */

/* How term.c treats line breaks and tabs: one line (escaped like any control), lines of text
 * (kept), or a JSON document (kept; every escape in JSON's \u00NN form, so that the document
 * means what it meant). */
enum term_mode { TERM_LINE, TERM_LINES, TERM_JSON };

/* term_safe() turns each byte of a string into at most this many bytes. */
#define TERM_ESCAPED_MAX(n) ((n)*4 + 1)

/* Copies s into buf (size bytes, NUL-terminated) with every terminal control made visible:
 * C0 controls and DEL as \xNN, C1 controls (U+0080..U+009F) and the Unicode characters that
 * reorder text as \uNNNN, bytes that are not UTF-8 as \xNN (term.c). An escape is never cut in
 * half; a copy that does not fit ends with "...". Returns buf. */
const char *term_safe(char *buf, size_t size, const char *s);

/* Writes len bytes of s to f with the same escapes, in the given mode. */
void term_write(FILE *f, const char *s, size_t len, enum term_mode mode);

/* Writes the string s to f escaped as one line. */
void term_puts(FILE *f, const char *s);

/* ---- status.c ---- */

/* "kvpoold 1.0.0 at PATH: serving, pid 4863, up 2h 03m" */
void print_headline(const struct cli *x, json_t *doc);
/* "3.00 MiB of 4.00 MiB used (75.0%), 48 objects (2 pinned, 1 reserved)" */
void print_pool(json_t *pool);
/* Bytes of the text l2_line() makes: a URL and a reason, escaped, and a few words. */
#define L2_LINE (2 * TERM_ESCAPED_MAX(255) + 128)
/* The L2 tier's line after its label into buf: "redis://host:6379 up (backlog 3 chunks, 24.0
 * KiB)", "... down: <reason> (...)", or "off". Returns false when the status has no "l2". */
bool l2_line(json_t *doc, char *buf, size_t size);
/* How the daemon started, after "Warm restart: " into buf (L2_LINE bytes are enough): "adopted N
 * chunks (X) of pid P after a crash in T ms, D dropped; U to verify, C corrupt", "on, cold start
 * (<reason>)", "off" or "off for this run, cold start (<reason>)". Returns false when the status
 * has no "warm_restart". */
bool warm_line(json_t *doc, char *buf, size_t size);
/* "Health:     degraded: <reason>", a line per reason, when the daemon says it is degraded. */
void print_health(json_t *doc);
/* The summary of `kvpool status`. */
void print_status(const struct cli *x, json_t *doc);
/* Bytes of the texts transport_counts() and client_counts() make. */
#define COUNTS 512
/* "1 shm, 1 inline, 2 pickle": the instances of a list by transport (shm and inline always, then
 * every other transport the daemon names, as it names it). Returns buf. */
const char *transport_counts(json_t *list, char *buf, size_t size);
/* "3 connected (max 256); lmcache 2" (with_max) or "3; lmcache 2": kvpool's connections, then
 * the clients of every other front end. Returns buf. */
const char *client_counts(json_t *doc, bool with_max, char *buf, size_t size);
/* "tcp://127.0.0.1:5555, 2 instances; 1523 requests; refused: 12 prepares (unread replies), 3
 * connections", or "off": the LMCache front end from the status document; NULL when the daemon
 * does not say and its counters show nothing. */
const char *lmcache_line(json_t *doc, char *buf, size_t size);

int cmd_status(struct cli *x, const struct cmd_opts *o);
int cmd_instances(struct cli *x, const struct cmd_opts *o);

/* ---- watch.c ---- */

int cmd_watch(struct cli *x, const struct cmd_opts *o);

/* ---- admin.c ---- */

int cmd_ping(struct cli *x, const struct cmd_opts *o);
int cmd_stats(struct cli *x, const struct cmd_opts *o);
int cmd_metrics(struct cli *x, const struct cmd_opts *o);
int cmd_clear(struct cli *x, const struct cmd_opts *o);
int cmd_version(struct cli *x, const struct cmd_opts *o);

#endif /* KVP_CLI_H */
