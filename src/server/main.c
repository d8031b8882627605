/*
 * main.c - kvpoold entry point: configuration, signals, server life cycle.
 *
 * SIGINT, SIGTERM and SIGHUP (the terminal went away) ask the server to stop (an atomic store
 * and a write to its self-pipe, both async-signal-safe); the main thread then tears everything
 * down in order and exits 0, leaving neither the shared segment nor the socket file behind. A
 * stop during start-up (a long pool reservation) ends the start-up early, also with status 0.
 * SIGPIPE is ignored (a process-wide disposition, so in every thread): a worker that
 * disappears mid-reply is an EPIPE on its own connection, not the daemon's death.
 *
 * Exit status: 0 after a stop, 1 when start-up or serving failed (the failing step logged one
 * ERROR line saying why), 2 for a usage error (printed by the option parser), including an error
 * in the --config file.
 *
 * Under a service manager (systemd Type=notify, notify.c): READY=1 once the daemon serves
 * (server.c, with the "ready" line), STOPPING=1 as soon as a stop begins.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/config.h"
#include "base/log.h"
#include "base/notify.h"
#include "server.h"

static struct kvp_server server;

static void on_signal(int sig)
{
    (void)sig;
    kvp_server_stop(&server);
}

int main(int argc, char **argv)
{
    struct kvp_config cfg;

    /* Before anything can write to a socket. */
    signal(SIGPIPE, SIG_IGN);

    kvp_config_defaults(&cfg);
    int rc = kvp_config_parse(&cfg, argc, argv, stdout, stderr);
    if (rc)
        return rc > 0 ? EXIT_SUCCESS : 2;
    kvp_log_threshold = cfg.log_level;
    kvp_log_set_format(cfg.log_format);

    if (kvp_server_init(&server, &cfg) != 0)
        return EXIT_FAILURE;
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);

    rc = kvp_server_start(&server);
    if (rc == -ECANCELED) {
        kvp_notify_stopping();
        log_info("kvpoold stopped during start-up");
        kvp_server_destroy(&server);
        return EXIT_SUCCESS;
    }
    if (rc) {
        kvp_server_destroy(&server);
        return EXIT_FAILURE;
    }
    rc = kvp_server_run(&server);
    kvp_notify_stopping();
    log_info("kvpoold stopping");
    kvp_server_destroy(&server);
    if (rc)
        return EXIT_FAILURE;
    log_info("kvpoold stopped");
    return EXIT_SUCCESS;
}
