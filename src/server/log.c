/*
 * log.c - formatting of log lines.
 *
 * Each line is formatted into a local buffer and written with a single write(2) so that lines
 * from concurrent connection threads never interleave. Logging never allocates and never fails
 * loudly: a log line that cannot be written is dropped.
 *
 * Rate limiting (log_warn_rl and friends): every call site owns a static struct kvp_log_rl, so
 * a flood of one kind of message (one per malformed connection, say) cannot push the others out
 * of the log, and the first lines of a burst, the informative ones, always get through. Each
 * site's counters are guarded by its own mutex; the list of sites with a pending count is a
 * singly linked list guarded by list_lock. Lock order: list_lock, then a site's lock. A site is
 * added to the list once, the first time it drops a line, and never removed (sites are static).
 */
#include "log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum kvp_log_level kvp_log_threshold = KVP_LOG_INFO;

static const char *const level_names[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};

int kvp_log_parse_level(const char *s, enum kvp_log_level *out)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = (enum kvp_log_level)i;
            return 0;
        }
    }
    return -EINVAL;
}

void kvp_log_write(enum kvp_log_level level, const char *fmt, ...)
{
    char line[2048];
    struct timespec ts;
    struct tm tm;
    va_list ap;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
    n += (size_t)snprintf(line + n, sizeof(line) - n, ".%03ldZ %s ", ts.tv_nsec / 1000000,
                          level_names[level]);

    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        return;
    n += (size_t)m < sizeof(line) - n - 1 ? (size_t)m : sizeof(line) - n - 2;
    line[n++] = '\n';

    int saved = errno;
    ssize_t w = write(STDERR_FILENO, line, n);
    (void)w;
    errno = saved;
}

uint64_t kvp_log_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kvp_log_rl *pending_sites;

static void report(enum kvp_log_level level, const char *what, uint32_t n)
{
    kvp_log_write(level, "suppressed %" PRIu32 " similar message%s: \"%s\"", n, n == 1 ? "" : "s",
                  what);
}

bool kvp_log_rl_admit(struct kvp_log_rl *rl, uint64_t now_ms)
{
    uint32_t dropped = 0;
    bool admit, list = false;

    pthread_mutex_lock(&rl->lock);
    if (!rl->started || now_ms - rl->window_start_ms >= KVP_LOG_RL_WINDOW_MS) {
        rl->started = true;
        rl->window_start_ms = now_ms;
        rl->passed = 0;
        dropped = rl->suppressed;
        rl->suppressed = 0;
    }
    admit = rl->passed < KVP_LOG_RL_BURST;
    if (admit) {
        rl->passed++;
    } else {
        rl->suppressed++;
        list = rl->suppressed == 1;
    }
    pthread_mutex_unlock(&rl->lock);

    if (dropped)
        report(rl->level, rl->what, dropped);
    if (list) {
        pthread_mutex_lock(&list_lock);
        if (!rl->listed) {
            rl->listed = true;
            rl->next = pending_sites;
            pending_sites = rl;
        }
        pthread_mutex_unlock(&list_lock);
    }
    return admit;
}

/* Reports the sites whose window ended before now_ms (all of them when all is set). */
static int flush(uint64_t now_ms, bool all)
{
    int lines = 0;

    pthread_mutex_lock(&list_lock);
    for (struct kvp_log_rl *rl = pending_sites; rl; rl = rl->next) {
        uint32_t dropped = 0;
        pthread_mutex_lock(&rl->lock);
        if (rl->suppressed && (all || now_ms - rl->window_start_ms >= KVP_LOG_RL_WINDOW_MS)) {
            dropped = rl->suppressed;
            rl->suppressed = 0;
        }
        pthread_mutex_unlock(&rl->lock);
        if (dropped) {
            report(rl->level, rl->what, dropped);
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
