/*
 * notify.h - telling a service manager (systemd, Type=notify) how start-up and shutdown go,
 * through sd_notify(3). Every call does nothing when $NOTIFY_SOCKET is not set, and never fails:
 * a message that cannot be sent is logged once (WARN) and the daemon goes on.
 */
#ifndef KVP_NOTIFY_H
#define KVP_NOTIFY_H

#include <stdbool.h>

/* Start-up timeout extension sent with each progress message (EXTEND_TIMEOUT_USEC): a long pool
 * reservation sends one at least every KVP_RESERVE_PROGRESS_MS, so it is never killed as hung
 * by TimeoutStartSec=. */
#define KVP_NOTIFY_EXTEND_USEC (60ull * 1000 * 1000)

/* True when a service manager listens ($NOTIFY_SOCKET is set). */
bool kvp_notify_enabled(void);

/* The daemon serves: READY=1, STATUS=<status>, MAINPID=<our pid>. */
void kvp_notify_ready(const char *status);

/* Start-up progress: STATUS=<status> and EXTEND_TIMEOUT_USEC=KVP_NOTIFY_EXTEND_USEC. */
void kvp_notify_progress(const char *status);

/* While serving: STATUS=<status> alone. */
void kvp_notify_status(const char *status);

/* A reload (SIGHUP) has begun: RELOADING=1 with MONOTONIC_USEC=<now>, as systemd asks. */
void kvp_notify_reloading(void);

/* The reload is over, the daemon serves: READY=1, STATUS=<status>. */
void kvp_notify_reloaded(const char *status);

/* Shutdown has begun: STOPPING=1. */
void kvp_notify_stopping(void);

#endif /* KVP_NOTIFY_H */
