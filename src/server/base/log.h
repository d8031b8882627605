/*
 * log.h - the daemon's leveled logger. One line per message on stderr, in one of two formats:
 *   text (default):  2026-12-02T12:00:00.123Z INFO  message
 *   json (--log-format json, for log shippers): one object per line,
 *     {"ts":"2026-12-02T12:00:00.123Z","level":"info","msg":"message","pid":4863,...}
 *     with the fields the call site passes (kvp_log_fields) after pid.
 * The level is checked before the arguments are formatted.
 *
 * A text line is always one line of printable text, whatever a message carries (a worker
 * chooses its instance id, model name and fallback reason): the formatted message as a whole is
 * escaped (kvp_log_escape()), so no value can end the line, forge another one or send a
 * terminal escape sequence. json lines are escaped by the JSON encoder.
 *
 * Rate-limited variants (log_warn_rl, log_error_rl) are for messages a client can cause once per
 * connection or per request: each call site passes at most KVP_LOG_RL_BURST lines per
 * KVP_LOG_RL_WINDOW_MS, then counts what it drops and reports the count in one line with the
 * first message it dropped,
 *   WARN  suppressed 45 similar messages, the first: "Connection 12 (pid 4242): malformed ..."
 * either before its next admitted line or from kvp_log_rl_flush() (the daemon calls it once a
 * second and at shutdown), whichever comes first.
 */
#ifndef KVP_LOG_H
#define KVP_LOG_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum kvp_log_level { KVP_LOG_DEBUG, KVP_LOG_INFO, KVP_LOG_WARN, KVP_LOG_ERROR };

enum kvp_log_format { KVP_LOG_TEXT, KVP_LOG_JSON };

/* The lowest level written. Any thread may read it; kvp_log_set_level() (SIGHUP) changes it. */
extern _Atomic(enum kvp_log_level) kvp_log_threshold;

/* Sets the threshold, from any thread: the next call of every thread sees it. */
void kvp_log_set_level(enum kvp_log_level level);

/* The threshold as a call site checks it (a relaxed load: a level is used on its own). */
#define KVP_LOG_ON(level) \
    ((level) >= atomic_load_explicit(&kvp_log_threshold, memory_order_relaxed))

/* Parses "debug", "info", "warn" or "error". Returns 0 or -EINVAL. */
int kvp_log_parse_level(const char *s, enum kvp_log_level *out);

/* Parses "text" or "json". Returns 0 or -EINVAL. */
int kvp_log_parse_format(const char *s, enum kvp_log_format *out);

/*
 * Writes s[0, len) to out (size bytes, NUL-terminated) as a text log line shows it: printable
 * ASCII and well-formed UTF-8 as they are; backslash, newline, carriage return and tab as \\,
 * \n, \r and \t; other C0 controls, DEL and bytes that are not UTF-8 as \xNN; C1 controls,
 * the line and paragraph separators and the bidirectional controls as \uNNNN. Cut before the
 * first character or escape that does not fit. Returns the bytes written, without the NUL.
 */
size_t kvp_log_escape(char *out, size_t size, const char *s, size_t len);

/* Writes msg to out as one json log line (ts, level, msg, pid), whatever the selected format:
 * for the option parser's messages once --log-format json is known (config.c). */
void kvp_log_json_to(FILE *out, enum kvp_log_level level, const char *msg);

/* Selects the output format, text until then. The first call must come before the daemon
 * starts threads (it seeds jansson's hash function); later ones (SIGHUP) from any thread. */
void kvp_log_set_format(enum kvp_log_format format);

/*
 * A structured field of one log line: in json output "key": value after "pid", in text output
 * nothing (the message already says it). str != NULL makes it a string, else num a number.
 */
struct kvp_log_field {
    const char *key;
    const char *str;
    int64_t num;
};

#define KVP_LOG_STR(k, v) ((struct kvp_log_field){.key = (k), .str = (v)})
#define KVP_LOG_NUM(k, v) ((struct kvp_log_field){.key = (k), .num = (int64_t)(v)})

void kvp_log_write(enum kvp_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* kvp_log_write() with n structured fields (may be 0). */
void kvp_log_write_fields(enum kvp_log_level level, const struct kvp_log_field *fields, size_t n,
                          const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#define kvp_log(level, ...)                      \
    do {                                         \
        if (KVP_LOG_ON(level))                   \
            kvp_log_write((level), __VA_ARGS__); \
    } while (0)

/* kvp_log() with an array of struct kvp_log_field (its element count is taken here). */
#define kvp_log_fields(level, fields, ...)                                                \
    do {                                                                                  \
        if (KVP_LOG_ON(level))                                                            \
            kvp_log_write_fields((level), (fields), sizeof(fields) / sizeof((fields)[0]), \
                                 __VA_ARGS__);                                            \
    } while (0)

#define log_debug(...) kvp_log(KVP_LOG_DEBUG, __VA_ARGS__)
#define log_info(...) kvp_log(KVP_LOG_INFO, __VA_ARGS__)
#define log_warn(...) kvp_log(KVP_LOG_WARN, __VA_ARGS__)
#define log_error(...) kvp_log(KVP_LOG_ERROR, __VA_ARGS__)

/* ---- rate limiting ---- */

#define KVP_LOG_RL_BURST 5        /* lines a call site may log per window */
#define KVP_LOG_RL_WINDOW_MS 1000 /* length of a window */
#define KVP_LOG_RL_SAMPLE 256     /* bytes kept of the first dropped message */

/* The state of one call site. Static, zero-initialised but for the mutex; guarded by lock. */
struct kvp_log_rl {
    pthread_mutex_t lock;
    uint64_t window_start_ms;       /* start of the current window */
    uint32_t passed;                /* lines admitted in the current window */
    uint32_t suppressed;            /* lines dropped since the last report */
    bool started;                   /* window_start_ms is valid */
    bool listed;                    /* on the flush list (guarded by the list lock in log.c) */
    enum kvp_log_level level;       /* of the call site, for its report */
    const char *what;               /* the call site's format string: the report's "kind" field */
    struct kvp_log_rl *next;        /* flush list */
    char sample[KVP_LOG_RL_SAMPLE]; /* the first message dropped since the last report, or "" */
};

#define KVP_LOG_RL_INIT(lvl, fmt)                                        \
    {                                                                    \
        .lock = PTHREAD_MUTEX_INITIALIZER, .level = (lvl), .what = (fmt) \
    }

/*
 * Decides whether the call site may log a line at time now_ms. Returns true to log. Before an
 * admitted line, a count of lines dropped in earlier windows is reported (one line). A dropped
 * line puts the site on the flush list so that its count is reported even if it never logs
 * again. It sees no message, so a report of what it alone dropped names the site's format
 * string instead of quoting one ("suppressed 3 similar messages (accept failed)"). Thread-safe.
 */
bool kvp_log_rl_admit(struct kvp_log_rl *rl, uint64_t now_ms);

/*
 * The rate-limited log call (log_warn_rl() and friends): kvp_log_rl_admit(), then the line when
 * admitted; a dropped line is formatted only when it is the first one dropped since the last
 * report, into the site's sample, which the report quotes. Thread-safe.
 */
void kvp_log_rl_write(struct kvp_log_rl *rl, enum kvp_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Reports the count of every site whose window has ended and that dropped lines. Returns the
 * number of report lines written. Thread-safe. */
int kvp_log_rl_flush(uint64_t now_ms);

/* Reports every pending count now, whatever the windows (shutdown). */
int kvp_log_rl_flush_all(void);

/* The format string of a call: names the call site's kind of message. */
#define KVP_LOG_FIRST_(a, ...) a
#define KVP_LOG_FIRST(...) KVP_LOG_FIRST_(__VA_ARGS__, 0)

#define kvp_log_rl(level, ...)                                                               \
    do {                                                                                     \
        static struct kvp_log_rl kvp_rl_site_ = KVP_LOG_RL_INIT((level),                     \
                                                                KVP_LOG_FIRST(__VA_ARGS__)); \
        if (KVP_LOG_ON(level))                                                               \
            kvp_log_rl_write(&kvp_rl_site_, (level), __VA_ARGS__);                           \
    } while (0)

#define log_info_rl(...) kvp_log_rl(KVP_LOG_INFO, __VA_ARGS__)
#define log_warn_rl(...) kvp_log_rl(KVP_LOG_WARN, __VA_ARGS__)
#define log_error_rl(...) kvp_log_rl(KVP_LOG_ERROR, __VA_ARGS__)

#endif /* KVP_LOG_H */
