/*
 * main.c - kvpoold entry point: configuration, signals, server life cycle.
 *
 * SIGINT and SIGTERM ask the server to stop (an atomic store and a write to its self-pipe, both
 * async-signal-safe); the main thread then tears everything down in order and exits 0, leaving
 * neither the shared segment nor the socket file behind. A stop during start-up (a long pool
 * reservation) ends the start-up early, also with status 0.
 *
 * SIGUSR2 stops the daemon like SIGTERM for a planned restart (an upgrade, a new binary): the
 * pool's segment and its warm-restart index stay in /dev/shm, marked as left on purpose, and the
 * next kvpoold started with the same configuration adopts them (core/warm_restart.h) and serves
 * their chunks at once. Exit status 0. With --warm-restart off (or no named segment) there is
 * nothing to leave, and SIGUSR2 is a plain stop, which a WARN line says.
 *
 * SIGHUP reloads the configuration, as PostgreSQL and nginx do: the handler only flags it and
 * wakes the main loop (server.c), which returns here; the main thread parses the same layers again
 * (the
 * --config file, the KVPOOL_* environment, the command line, which still win over the file),
 * applies the options the option table marks reloadable (kvp_server_reconfigure() logs each
 * change, and each change that needs a restart) and serves on. A file with an error is reported
 * and changes nothing. The daemon never stops for SIGHUP: an operator who sends it out of habit
 * keeps the cache. A SIGHUP during start-up is handled once the daemon serves.
 *
 * SIGPIPE is ignored (a process-wide disposition, so in every thread): a worker that
 * disappears mid-reply is an EPIPE on its own connection, not the daemon's death.
 *
 * Exit status: 0 after a stop, 1 when start-up or serving failed (the failing step logged one
 * ERROR line saying why), 2 for a usage error (printed by the option parser), including an error
 * in the --config file.
 *
 * Under a service manager (systemd Type=notify, notify.c): READY=1 once the daemon serves
 * (server.c, with the "ready" line), RELOADING=1 then READY=1 around a reload, STOPPING=1 as
 * soon as a stop begins.
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

static void on_stop_signal(int sig)
{
    (void)sig;
    kvp_server_stop(&server);
}

static void on_restart_signal(int sig)
{
    (void)sig;
    kvp_server_stop_planned(&server);
}

static void on_reload_signal(int sig)
{
    (void)sig;
    kvp_server_request_reload(&server);
}

/* SIGHUP: the configuration again, from the same layers; cur is the configuration in effect. */
static void reload(struct kvp_config *cur, int argc, char **argv)
{
    struct kvp_config next;

    kvp_notify_reloading();
    log_info("SIGHUP: reading the configuration again");
    kvp_config_defaults(&next);
    /* Messages go to the log (err NULL); there is no --help to print. */
    if (kvp_config_parse(&next, argc, argv, stderr, NULL) != 0)
        log_error("Configuration not reloaded: it has an error (above); nothing changed");
    else
        kvp_server_reconfigure(&server, cur, &next);
    explicit_bzero(&next, sizeof(next)); /* it may hold an L2 password */
    kvp_notify_reloaded("Serving; configuration reloaded");
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
    kvp_log_set_level(cfg.log_level);
    kvp_log_set_format(cfg.log_format);

    if (kvp_server_init(&server, &cfg) != 0)
        return EXIT_FAILURE;
    struct sigaction stop = {.sa_handler = on_stop_signal};
    sigemptyset(&stop.sa_mask);
    sigaction(SIGINT, &stop, NULL);
    sigaction(SIGTERM, &stop, NULL);
    struct sigaction restart = {.sa_handler = on_restart_signal};
    sigemptyset(&restart.sa_mask);
    sigaction(SIGUSR2, &restart, NULL);
    struct sigaction hup = {.sa_handler = on_reload_signal};
    sigemptyset(&hup.sa_mask);
    sigaction(SIGHUP, &hup, NULL);

    rc = kvp_server_start(&server);
    if (rc == -ECANCELED) {
        kvp_notify_stopping();
        log_info("kvpoold stopped during start-up");
        kvp_server_destroy(&server);
        return EXIT_SUCCESS;
    }
    if (rc) {
        /* A pool adopted before the step that failed stays for the next attempt: nothing of it
         * has been served, and the next kvpoold adopts it again. */
        if (server.warm.adopted)
            atomic_store(&server.planned_restart, true);
        kvp_server_destroy(&server);
        return EXIT_FAILURE;
    }
    while ((rc = kvp_server_run(&server)) == KVP_SERVER_RELOAD)
        reload(&cfg, argc, argv);
    kvp_notify_stopping();
    if (atomic_load(&server.planned_restart) && server.warm.has_index)
        log_info("kvpoold stopping for a restart (SIGUSR2): the pool stays for the next kvpoold");
    else if (atomic_load(&server.planned_restart))
        log_info("kvpoold stopping for a restart (SIGUSR2); without warm restart the pool goes "
                 "with it");
    else
        log_info("kvpoold stopping");
    kvp_server_destroy(&server);
    /* The lock file stays (kvp/listener.c): removing it would let two daemons that opened it
     * at different moments both think they own the socket. */
    char lock[sizeof(cfg.socket_path) + 8];
    snprintf(lock, sizeof(lock), "%s.lock", cfg.socket_path);
    explicit_bzero(&cfg, sizeof(cfg));
    if (rc)
        return EXIT_FAILURE;
    log_info("%s stays: the next kvpoold on this socket locks it again", lock);
    log_info("kvpoold stopped");
    return EXIT_SUCCESS;
}
