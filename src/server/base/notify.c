/*
 * notify.c - readiness and status messages to the service manager (see notify.h).
 *
 * The protocol is systemd's: one datagram of "KEY=value" lines to the AF_UNIX socket named by
 * $NOTIFY_SOCKET, sent by libsystemd's sd_notify(). The daemon sends
 *   - during a long start-up, with each progress line: STATUS= (the same text) and
 *     EXTEND_TIMEOUT_USEC=, so that a slow start-up is not killed by TimeoutStartSec=;
 *   - once it serves (after the "ready" log line, the socket listening): READY=1, STATUS= (the
 *     ready line) and MAINPID=;
 *   - while the rest of the pool is reserved in the background (warmup.c): STATUS= with each
 *     progress line, and once more when it ends;
 *   - when it stops: STOPPING=1.
 * $NOTIFY_SOCKET is left in the environment (unset_environment 0): later messages need it, and
 * the daemon starts no children that could inherit it.
 *
 * A STATUS= value must be one line: control characters in it (a socket path may hold any byte
 * but '/' and NUL) become spaces.
 *
 * Threads: the main thread (start-up and shutdown) and the warm-up thread (STATUS= only);
 * sd_notify() keeps no state between calls.
 */
#include "base/notify.h"

#include <stdio.h>
#include <stdlib.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "common/errors.h"

#define STATUS_MAX 1024

bool kvp_notify_enabled(void)
{
    const char *e = getenv("NOTIFY_SOCKET");
    return e && e[0];
}

/* Sends msg; a failure is logged once, not per message. */
static void send_msg(const char *msg)
{
    static bool warned;
    if (!kvp_notify_enabled())
        return;
    int rc = sd_notify(0, msg);
    if (rc < 0 && !warned) {
        warned = true;
        log_warn("Cannot notify the service manager at NOTIFY_SOCKET=%s: %s",
                 getenv("NOTIFY_SOCKET"), kvp_strerror(rc));
    }
}

/* status as one line, cut to fit. */
static void one_line(const char *status, char *out, size_t size)
{
    size_t i = 0;
    for (; status[i] && i + 1 < size; i++)
        out[i] = (unsigned char)status[i] < 0x20 || status[i] == 0x7f ? ' ' : status[i];
    out[i] = '\0';
}

void kvp_notify_ready(const char *status)
{
    char line[STATUS_MAX], msg[STATUS_MAX + 64];
    if (!kvp_notify_enabled())
        return;
    one_line(status, line, sizeof(line));
    snprintf(msg, sizeof(msg), "READY=1\nSTATUS=%s\nMAINPID=%ld", line, (long)getpid());
    send_msg(msg);
}

void kvp_notify_progress(const char *status)
{
    char line[STATUS_MAX], msg[STATUS_MAX + 64];
    if (!kvp_notify_enabled())
        return;
    one_line(status, line, sizeof(line));
    snprintf(msg, sizeof(msg), "STATUS=%s\nEXTEND_TIMEOUT_USEC=%llu", line,
             (unsigned long long)KVP_NOTIFY_EXTEND_USEC);
    send_msg(msg);
}

void kvp_notify_status(const char *status)
{
    char line[STATUS_MAX], msg[STATUS_MAX + 16];
    if (!kvp_notify_enabled())
        return;
    one_line(status, line, sizeof(line));
    snprintf(msg, sizeof(msg), "STATUS=%s", line);
    send_msg(msg);
}

void kvp_notify_reloading(void)
{
    struct timespec ts;
    char msg[96];
    if (!kvp_notify_enabled())
        return;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    snprintf(msg, sizeof(msg),
             "RELOADING=1\nSTATUS=Reloading the configuration\nMONOTONIC_USEC=%llu",
             (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000);
    send_msg(msg);
}

void kvp_notify_reloaded(const char *status)
{
    char line[STATUS_MAX], msg[STATUS_MAX + 32];
    if (!kvp_notify_enabled())
        return;
    one_line(status, line, sizeof(line));
    snprintf(msg, sizeof(msg), "READY=1\nSTATUS=%s", line);
    send_msg(msg);
}

void kvp_notify_stopping(void)
{
    send_msg("STOPPING=1\nSTATUS=Stopping");
}
