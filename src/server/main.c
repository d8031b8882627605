/*
 * main.c - kvpoold entry point: configuration, signals, server life cycle.
 *
 * SIGINT and SIGTERM ask the server to stop (async-signal-safe write to its self-pipe); the
 * main thread then tears everything down in order and exits 0, leaving neither the shared
 * segment nor the socket file behind. SIGPIPE is ignored: a worker that disappears mid-reply
 * is an EPIPE on its own connection, not the daemon's death.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "log.h"
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

    kvp_config_defaults(&cfg);
    int rc = kvp_config_parse(&cfg, argc, argv, stdout, stderr);
    if (rc)
        return rc > 0 ? EXIT_SUCCESS : 2;
    kvp_log_threshold = cfg.log_level;

    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* Block signals while threads are created so that only the main thread handles them. */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    rc = kvp_server_start(&server, &cfg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0)
        rc = kvp_server_run(&server);

    log_info("kvpoold stopping");
    kvp_server_destroy(&server);
    if (rc) {
        log_error("kvpoold exited with an error: %s", strerror(-rc));
        return EXIT_FAILURE;
    }
    log_info("kvpoold stopped");
    return EXIT_SUCCESS;
}
