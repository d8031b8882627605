/*
 * log.c - formatting of log lines.
 *
 * Each line is formatted into a local buffer and written with a single write(2) (writev(2) for
 * json) so that lines from concurrent connection threads never interleave. Logging never fails
 * loudly: a log line that cannot be built or written is dropped. Text lines never allocate.
 *
 * Text lines are escaped as a whole, after formatting (kvp_log_escape()): the one place every
 * message passes, so no call site can forget it and no argument (a worker's instance id, model
 * name or fallback reason) can end a line, forge one, or reach a terminal as an escape sequence.
 *
 * json lines (--log-format json) are encoded by jansson, which allocates: every string is
 * escaped as JSON requires, and bytes that are not UTF-8 (a client's name, say) become U+FFFD,
 * so that every line parses. The message is the text line's, without time and level.
 *
 * Rate limiting (log_warn_rl and friends): every call site owns a static struct kvp_log_rl, so
 * a flood of one kind of message (one per malformed connection, say) cannot push the others out
 * of the log, and the first lines of a burst, the informative ones, always get through. The
 * report of a site's count quotes the first line it dropped (formatted once, when it is dropped,
 * into the site's sample), so that it says what happened, not which format string. Each
 * site's counters are guarded by its own mutex; the list of sites with a pending count is a
 * singly linked list guarded by list_lock. Lock order: list_lock, then a site's lock. A site is
 * added to the list once, the first time it drops a line, and never removed (sites are static).
 */
#include "base/log.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"

/* Room for one message; a longer one is cut (text and json alike). */
#define LINE_MAX_BYTES 2048

_Atomic(enum kvp_log_level) kvp_log_threshold = KVP_LOG_INFO;
/* Read once per line: a line is written whole in one format or the other. */
static _Atomic(enum kvp_log_format) log_format = KVP_LOG_TEXT;

static const char *const level_names[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};
static const char *const json_level_names[] = {"debug", "info", "warn", "error"};

int kvp_log_parse_level(const char *s, enum kvp_log_level *out)
{
    for (int i = 0; i < 4; i++) {
        if (strcmp(s, json_level_names[i]) == 0) {
            *out = (enum kvp_log_level)i;
            return 0;
        }
    }
    return -EINVAL;
}

int kvp_log_parse_format(const char *s, enum kvp_log_format *out)
{
    if (strcmp(s, "text") == 0)
        *out = KVP_LOG_TEXT;
    else if (strcmp(s, "json") == 0)
        *out = KVP_LOG_JSON;
    else
        return -EINVAL;
    return 0;
}

void kvp_log_set_level(enum kvp_log_level level)
{
    atomic_store_explicit(&kvp_log_threshold, level, memory_order_relaxed);
}

void kvp_log_set_format(enum kvp_log_format format)
{
    static bool seeded; /* only the first call, before any thread, writes it */

    /* jansson seeds its hash function on first use; do it here, before any thread exists, for
     * text too: a reload may switch to json while threads run. */
    if (!seeded) {
        json_object_seed(0);
        seeded = true;
    }
    atomic_store_explicit(&log_format, format, memory_order_relaxed);
}

/* Length of the well-formed UTF-8 sequence at p (n bytes left), 0 if it is not one. The
 * bounds are RFC 3629's: no overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t utf8_len(const unsigned char *p, size_t n)
{
    unsigned char lo = 0x80, hi = 0xbf;
    size_t len;

    if (p[0] < 0x80)
        return 1;
    if (p[0] >= 0xc2 && p[0] <= 0xdf) {
        len = 2;
    } else if (p[0] >= 0xe0 && p[0] <= 0xef) {
        len = 3;
        lo = p[0] == 0xe0 ? 0xa0 : 0x80;
        hi = p[0] == 0xed ? 0x9f : 0xbf;
    } else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
        len = 4;
        lo = p[0] == 0xf0 ? 0x90 : 0x80;
        hi = p[0] == 0xf4 ? 0x8f : 0xbf;
    } else {
        return 0;
    }
    if (n < len || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (p[i] < 0x80 || p[i] > 0xbf)
            return 0;
    return len;
}

/* The code point of the well-formed UTF-8 sequence of len bytes at p. */
static uint32_t utf8_code(const unsigned char *p, size_t len)
{
    static const unsigned char lead_mask[] = {0, 0x7f, 0x1f, 0x0f, 0x07};
    uint32_t c = p[0] & lead_mask[len];
    for (size_t i = 1; i < len; i++)
        c = (c << 6) | (p[i] & 0x3f);
    return c;
}

/* Code points that move or hide text on a terminal or in a viewer without being C0: the C1
 * controls (U+009B is a CSI, as ESC [ is), the line and paragraph separators and the
 * bidirectional overrides and isolates. */
static bool invisible_code(uint32_t c)
{
    return (c >= 0x80 && c <= 0x9f) || c == 0x2028 || c == 0x2029 || (c >= 0x202a && c <= 0x202e) ||
           (c >= 0x2066 && c <= 0x2069);
}

size_t kvp_log_escape(char *out, size_t size, const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    char esc[8];
    size_t n = 0;

    for (size_t i = 0; i < len;) {
        size_t k = utf8_len(p + i, len - i), e;
        const char *piece = esc;
        if (k == 0) {
            e = (size_t)snprintf(esc, sizeof(esc), "\\x%02x", p[i]);
            k = 1;
        } else if (k > 1) {
            uint32_t c = utf8_code(p + i, k);
            if (invisible_code(c)) {
                e = (size_t)snprintf(esc, sizeof(esc), "\\u%04x", (unsigned)c);
            } else {
                piece = s + i;
                e = k;
            }
        } else if (p[i] == '\n') {
            piece = "\\n";
            e = 2;
        } else if (p[i] == '\r') {
            piece = "\\r";
            e = 2;
        } else if (p[i] == '\t') {
            piece = "\\t";
            e = 2;
        } else if (p[i] == '\\') {
            piece = "\\\\";
            e = 2;
        } else if (p[i] < 0x20 || p[i] == 0x7f) {
            e = (size_t)snprintf(esc, sizeof(esc), "\\x%02x", p[i]);
        } else {
            piece = s + i;
            e = 1;
        }
        if (n + e >= size)
            break; /* cut before a piece, never inside an escape or a character */
        memcpy(out + n, piece, e);
        n += e;
        i += k;
    }
    if (size)
        out[n] = '\0';
    return n;
}

/* A JSON string of s[0, len): as it is when it is UTF-8, else with U+FFFD for each bad byte. */
static json_t *json_text(const char *s, size_t len)
{
    json_t *j = json_stringn(s, len);
    if (j)
        return j;
    char *fixed = malloc(len * 3 + 1);
    if (!fixed)
        return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        size_t k = utf8_len((const unsigned char *)s + i, len - i);
        if (k) {
            memcpy(fixed + n, s + i, k);
            n += k;
            i += k;
        } else {
            memcpy(fixed + n, "\xef\xbf\xbd", 3);
            n += 3;
            i++;
        }
    }
    j = json_stringn(fixed, n);
    free(fixed);
    return j;
}

/* One json line without its newline: ts, level, msg, pid, then the fields. The caller frees it;
 * NULL when it cannot be built. */
static char *json_line(enum kvp_log_level level, const char *ts, const char *msg, size_t msg_len,
                       const struct kvp_log_field *fields, size_t nfields)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    int bad = json_object_set_new(o, "ts", json_string(ts));
    bad |= json_object_set_new(o, "level", json_string(json_level_names[level]));
    bad |= json_object_set_new(o, "msg", json_text(msg, msg_len));
    bad |= json_object_set_new(o, "pid", json_integer((json_int_t)getpid()));
    for (size_t i = 0; i < nfields; i++) {
        const struct kvp_log_field *f = &fields[i];
        bad |= json_object_set_new(o, f->key,
                                   f->str ? json_text(f->str, strlen(f->str))
                                          : json_integer((json_int_t)f->num));
    }
    char *text = bad ? NULL : json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return text;
}

/* Writes one json line to stderr. Dropped if it cannot be built. */
static void write_json(enum kvp_log_level level, const char *ts, const char *msg, size_t msg_len,
                       const struct kvp_log_field *fields, size_t nfields)
{
    char *text = json_line(level, ts, msg, msg_len, fields, nfields);
    if (!text)
        return;
    struct iovec iov[2] = {{.iov_base = text, .iov_len = strlen(text)},
                           {.iov_base = (void *)"\n", .iov_len = 1}};
    int saved = errno;
    ssize_t w = writev(STDERR_FILENO, iov, 2);
    (void)w;
    errno = saved;
    free(text);
}

/* The time stamp of a line: ISO 8601 in UTC with milliseconds. Returns its length. */
static size_t stamp(char *buf, size_t size)
{
    struct timespec ts;
    struct tm tm;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(buf, size, "%Y-%m-%dT%H:%M:%S", &tm);
    n += (size_t)snprintf(buf + n, size - n, ".%03ldZ", ts.tv_nsec / 1000000);
    return n;
}

void kvp_log_json_to(FILE *out, enum kvp_log_level level, const char *msg)
{
    char ts[64];
    stamp(ts, sizeof(ts));
    char *text = json_line(level, ts, msg, strlen(msg), NULL, 0);
    if (text)
        fprintf(out, "%s\n", text);
    free(text);
}

__attribute__((format(printf, 4, 0))) static void vlog(enum kvp_log_level level,
                                                       const struct kvp_log_field *fields,
                                                       size_t nfields, const char *fmt, va_list ap)
{
    char line[LINE_MAX_BYTES];
    size_t n = stamp(line, sizeof(line));

    if (atomic_load_explicit(&log_format, memory_order_relaxed) == KVP_LOG_JSON) {
        char msg[LINE_MAX_BYTES];
        int m = vsnprintf(msg, sizeof(msg), fmt, ap);
        if (m >= 0)
            write_json(level, line, msg, (size_t)m < sizeof(msg) ? (size_t)m : sizeof(msg) - 1,
                       fields, nfields);
        return;
    }

    n += (size_t)snprintf(line + n, sizeof(line) - n, " %s ", level_names[level]);
    char msg[LINE_MAX_BYTES];
    int m = vsnprintf(msg, sizeof(msg), fmt, ap);
    if (m < 0)
        return;
    size_t len = (size_t)m < sizeof(msg) ? (size_t)m : sizeof(msg) - 1;
    n += kvp_log_escape(line + n, sizeof(line) - n - 1, msg, len);
    line[n++] = '\n';

    int saved = errno;
    ssize_t w = write(STDERR_FILENO, line, n);
    (void)w;
    errno = saved;
}

void kvp_log_write(enum kvp_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(level, NULL, 0, fmt, ap);
    va_end(ap);
}

void kvp_log_write_fields(enum kvp_log_level level, const struct kvp_log_field *fields, size_t n,
                          const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(level, fields, n, fmt, ap);
    va_end(ap);
}

static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kvp_log_rl *pending_sites;

/* The count of a site's dropped lines, with the first of them when it is known. */
static void report(enum kvp_log_level level, const char *what, uint32_t n, const char *sample)
{
    const struct kvp_log_field f[] = {KVP_LOG_NUM("suppressed", n), KVP_LOG_STR("kind", what)};
    if (sample[0])
        kvp_log_write_fields(level, f, 2,
                             "suppressed %" PRIu32 " similar message%s, the first: "
                             "\"%s\"",
                             n, n == 1 ? "" : "s", sample);
    else
        kvp_log_write_fields(level, f, 2, "suppressed %" PRIu32 " similar message%s (%s)", n,
                             n == 1 ? "" : "s", what);
}

/* Whether the site's window has ended by now_ms. A clock read before the site's lock can be
 * older than a window another thread started since: still inside it. */
static bool window_over(const struct kvp_log_rl *rl, uint64_t now_ms)
{
    return kvp_ms_since(now_ms, rl->window_start_ms) >= KVP_LOG_RL_WINDOW_MS;
}

/*
 * Under rl->lock: counts one line at now_ms. Returns true to log it. *dropped is the count to
 * report now (a window ended), its sample moved to sample; *first tells that this line is the
 * first one dropped since the last report.
 */
static bool do_admit(struct kvp_log_rl *rl, uint64_t now_ms, uint32_t *dropped, char *sample,
                     bool *first)
{
    *dropped = 0;
    *first = false;
    sample[0] = '\0';
    if (!rl->started || window_over(rl, now_ms)) {
        rl->started = true;
        rl->window_start_ms = now_ms;
        rl->passed = 0;
        *dropped = rl->suppressed;
        rl->suppressed = 0;
        memcpy(sample, rl->sample, sizeof(rl->sample));
        rl->sample[0] = '\0';
    }
    if (rl->passed < KVP_LOG_RL_BURST) {
        rl->passed++;
        return true;
    }
    *first = rl->suppressed++ == 0;
    return false;
}

/* After a call: reports what a window's end released, and lists a site that began dropping. */
static void after_admit(struct kvp_log_rl *rl, uint32_t dropped, const char *sample, bool first)
{
    if (dropped)
        report(rl->level, rl->what, dropped, sample);
    if (first) {
        pthread_mutex_lock(&list_lock);
        if (!rl->listed) {
            rl->listed = true;
            rl->next = pending_sites;
            pending_sites = rl;
        }
        pthread_mutex_unlock(&list_lock);
    }
}

bool kvp_log_rl_admit(struct kvp_log_rl *rl, uint64_t now_ms)
{
    char sample[KVP_LOG_RL_SAMPLE];
    uint32_t dropped;
    bool first;

    pthread_mutex_lock(&rl->lock);
    bool admit = do_admit(rl, now_ms, &dropped, sample, &first);
    pthread_mutex_unlock(&rl->lock);
    after_admit(rl, dropped, sample, first);
    return admit;
}

void kvp_log_rl_write(struct kvp_log_rl *rl, enum kvp_log_level level, const char *fmt, ...)
{
    char sample[KVP_LOG_RL_SAMPLE];
    uint32_t dropped;
    bool first;
    va_list ap;

    va_start(ap, fmt);
    pthread_mutex_lock(&rl->lock);
    bool admit = do_admit(rl, kvp_mono_ms(), &dropped, sample, &first);
    /* Only the first dropped line is formatted: a flood costs a count, not a vsnprintf each. */
    if (first)
        vsnprintf(rl->sample, sizeof(rl->sample), fmt, ap);
    pthread_mutex_unlock(&rl->lock);
    after_admit(rl, dropped, sample, first);
    if (admit)
        vlog(level, NULL, 0, fmt, ap);
    va_end(ap);
}

/* Reports the sites whose window ended before now_ms (all of them when all is set). */
static int flush(uint64_t now_ms, bool all)
{
    int lines = 0;

    pthread_mutex_lock(&list_lock);
    for (struct kvp_log_rl *rl = pending_sites; rl; rl = rl->next) {
        char sample[KVP_LOG_RL_SAMPLE];
        uint32_t dropped = 0;
        pthread_mutex_lock(&rl->lock);
        if (rl->suppressed && (all || window_over(rl, now_ms))) {
            dropped = rl->suppressed;
            rl->suppressed = 0;
            memcpy(sample, rl->sample, sizeof(sample));
            rl->sample[0] = '\0';
        }
        pthread_mutex_unlock(&rl->lock);
        if (dropped) {
            report(rl->level, rl->what, dropped, sample);
            lines++;
        }
    }
    pthread_mutex_unlock(&list_lock);
    return lines;
}

int kvp_log_rl_flush(uint64_t now_ms)
{
    return flush(now_ms, false);
}

int kvp_log_rl_flush_all(void)
{
    return flush(0, true);
}
