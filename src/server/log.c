/*
 * log.c - formatting of log lines.
 *
 * Each line is formatted into a local buffer and written with a single write(2) so that lines
 * from concurrent connection threads never interleave. Logging never allocates and never fails
 * loudly: a log line that cannot be written is dropped.
 */
#include "log.h"

#include <errno.h>
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
