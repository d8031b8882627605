/*
 * log.h - the daemon's leveled logger. One line per message on stderr:
 *   2026-12-02T12:00:00.123Z INFO  message
 * The level is checked before the arguments are formatted.
 */
#ifndef KVP_LOG_H
#define KVP_LOG_H

enum kvp_log_level { KVP_LOG_DEBUG, KVP_LOG_INFO, KVP_LOG_WARN, KVP_LOG_ERROR };

extern enum kvp_log_level kvp_log_threshold;

/* Parses "debug", "info", "warn" or "error". Returns 0 or -EINVAL. */
int kvp_log_parse_level(const char *s, enum kvp_log_level *out);

void kvp_log_write(enum kvp_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define kvp_log(level, ...)                      \
    do {                                         \
        if ((level) >= kvp_log_threshold)        \
            kvp_log_write((level), __VA_ARGS__); \
    } while (0)

#define log_debug(...) kvp_log(KVP_LOG_DEBUG, __VA_ARGS__)
#define log_info(...) kvp_log(KVP_LOG_INFO, __VA_ARGS__)
#define log_warn(...) kvp_log(KVP_LOG_WARN, __VA_ARGS__)
#define log_error(...) kvp_log(KVP_LOG_ERROR, __VA_ARGS__)

#endif /* KVP_LOG_H */
