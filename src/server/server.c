/*
 * server.c - the daemon's life cycle: every part opened, started and stopped in order, the main
 * loop (signals, reloads, kvpool's accepts) and the configuration reload. The parts do their
 * own work: the front ends (kvp/listener.h, lmc/listener.h, http/http.h), the core's memory
 * (transport.c, segment.c, store.c, registry.c), the housekeeping thread (expiry.c), the warm-up
 * (warmup.c) and the L2 tier (l2.h).
 *
 * Start-up order (each step logs what it decided). Everything that can be wrong with the
 * configuration, the socket path or an address is found before the pool, which may take
 * minutes to reserve, is touched:
 *   1. open the front ends: kvpool's (the socket's owner lock, then its socket bound but not
 *      listening: a client gets ECONNREFUSED until step 5, never a hang), the descriptor budget
 *      of all of them, the HTTP endpoint (bound, and answering 503 "starting" from
 *      /api/healthcheck until the end of step 5, so that a probe can watch a long reservation),
 *      LMCache's (--lmcache, bound);
 *   2. warm restart (warm_restart.c): the pool a dead kvpoold left on this socket is adopted
 *      (its segment locked and kept, nothing of it read), or set aside with one WARN line; then
 *      crash leftovers: segments of dead daemons in /dev/shm are removed (segment.c; the
 *      adopted one is locked, so never), and indexes whose pool is gone, so the gate counts
 *      the space they held;
 *   3. the transport decision (transport.c): the adopted segment as it is, else the capacity
 *      gate (shm_gate.c) on the segment size (header page + pool, and the warm-restart index),
 *      then the shared segment (segment.c), or private memory when the gate or the reservation
 *      said no; a segment held by a live daemon is fatal. Only the first KVP_RESERVE_FIRST
 *      bytes of the pool are reserved here, so start-up takes the same time for any pool size;
 *   4. the core over that memory: store (with an adopted pool, its index scanned into it and
 *      the INFO line that says what was adopted; with a new one, a fresh index beside it), L2
 *      tier, registry (shared by the front ends that register instances);
 *   5. start the front ends and the threads: kvpool's listens, the housekeeping thread
 *      (expiry.c), LMCache's serves, the thread that reserves the rest of the pool (warmup.c; it
 *      logs its progress and stops early on SIGINT/SIGTERM/SIGHUP), then the "ready" line and
 *      READY=1 to a service manager (notify.c).
 * A failure logs exactly one ERROR line saying what is wrong, and kvp_server_start() returns.
 *
 * Threads: the main thread runs the loop: the self-pipe (stop and reload requests from the
 * signal handlers) and kvpool's listening socket (its accepts are quick: refusals are answered
 * off this thread). Every other thread is a part's own, created with the stop signals blocked,
 * so only the main thread handles them.
 *
 * Shutdown, in the reverse order: no new clients on kvpool's socket (closed, its file unlinked
 * if still ours); every client of every front end told to go (KVP_OWNER_DROP, owner.h: kvpool's
 * connections are shut down, their threads release their holds and exit), and kvpool's waited
 * for; LMCache's front end closed; the warm-up and housekeeping threads; the HTTP endpoint
 * (503 "stopping" until then); the L2 tier; registry, store and segment. A planned restart
 * (SIGUSR2) leaves the segment and its index for the next kvpoold (warm_restart.c); a plain
 * stop removes both. kvpool's socket lock goes last.
 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/listen_addr.h"
#include "base/log.h"
#include "base/notify.h"
#include "common/errors.h"
#include "core/expiry.h"
#include "core/owner.h"
#include "core/seg_guard.h"
#include "core/shm_gate.h"
#include "core/transport.h"
#include "core/warmup.h"
#include "http/http.h"
#include "kvp/latency.h"
#include "kvp/listener.h"
#include "l2/l2.h"
#include "lmc/latency.h"
#include "lmc/listener.h"

/* Descriptors the daemon needs besides one per client: lock, socket, pipe, segment, logs... */
#define KVP_FD_RESERVE 64

/*
 * --max-clients is only a promise if the descriptor limit allows it (and the HTTP endpoint's
 * KVP_HTTP_MAX_CONNECTIONS when it is on, and the LMCache front end's --lmcache-max-connections
 * with LMC_FD_SLACK for the connections it is closing): raise the soft limit as far as needed
 * (up to the hard limit) and refuse to start when even the hard limit is too low. Each front end
 * then stays within its own part, so that none can take the others' descriptors.
 */
static int check_fd_limit(const struct kvp_config *cfg)
{
    struct rlimit rl;
    struct kvp_listen_addr l;
    bool http = kvp_listen_addr_parse(cfg->http, &l) == 0 && !l.off;
    bool lmc = cfg->lmcache[0] != '\0';
    const char *with = http && lmc ? " (with the HTTP and LMCache connections)"
                       : http      ? " (with the HTTP endpoint's connections)"
                       : lmc       ? " (with the LMCache connections)"
                                   : "";
    rlim_t need = (rlim_t)cfg->max_clients + KVP_FD_RESERVE +
                  (http ? KVP_HTTP_MAX_CONNECTIONS : 0) +
                  (lmc ? (rlim_t)cfg->lmcache_max_conns + LMC_FD_SLACK : 0);
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need)
        return 0;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) {
        log_error("Refusing to start: --max-clients %" PRIu32 " needs %llu file descriptors%s, "
                  "but the limit is %llu (ulimit -n); lower --max-clients or raise the limit",
                  cfg->max_clients, (unsigned long long)need, with,
                  (unsigned long long)rl.rlim_max);
        return -EMFILE;
    }
    rl.rlim_cur = need;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        int err = errno;
        log_error("Refusing to start: --max-clients %" PRIu32 " needs %llu file descriptors%s, "
                  "and the limit cannot be raised: %s",
                  cfg->max_clients, (unsigned long long)need, with, kvp_strerror(-err));
        return -err;
    }
    log_debug("Raised the file descriptor limit to %llu for --max-clients %" PRIu32,
              (unsigned long long)need, cfg->max_clients);
    return 0;
}

/*
 * The one INFO line an operator reads first: pool size, SHM state and why, socket, chunk size.
 * The same text is the service manager's STATUS= with READY=1: the socket listens by now.
 */
static void log_startup(const struct kvp_server *s)
{
    const struct kvp_config *cfg = &s->cfg;
    char shm[sizeof(s->seg.name) + sizeof(s->shm_reason) + 32], line[sizeof(shm) + 256];
    const char *shm_name = "";

    if (s->seg.memfd) {
        snprintf(shm, sizeof(shm), "SHM enabled (memfd)");
        shm_name = "memfd";
    } else if (s->seg.shared) {
        snprintf(shm, sizeof(shm), "SHM enabled (shm_name=%s)", s->seg.name);
        shm_name = s->seg.name;
    } else {
        snprintf(shm, sizeof(shm), "%s", s->shm_reason);
    }
    char warming[96] = "";
    if (s->warmup_started) {
        /* The first step reserves a whole number of steps of the segment, header included: of
         * a 256 MiB pool, all but 4096 bytes. Say what the background really has left. */
        uint64_t now = kvp_segment_pool_bytes(s->reserved_at_start);
        snprintf(warming, sizeof(warming),
                 " (%" PRIu64 " reserved, %" PRIu64 " more in the background)", now,
                 cfg->l1_size - now);
    }
    snprintf(line, sizeof(line),
             "kvpoold %s ready: pool %" PRIu64 " bytes%s, %s, socket %s, chunk size %" PRIu32
             " tokens",
             KVP_DAEMON_VERSION, cfg->l1_size, warming, shm, cfg->socket_path, cfg->chunk_tokens);
    const struct kvp_log_field f[] = {
        KVP_LOG_STR("version", KVP_DAEMON_VERSION),
        KVP_LOG_NUM("pool_bytes", cfg->l1_size),
        KVP_LOG_STR("transport", s->seg.shared ? "shm" : "inline"),
        KVP_LOG_STR("shm_name", shm_name),
        KVP_LOG_STR("shm_reason", s->shm_reason),
        KVP_LOG_STR("socket", cfg->socket_path),
        KVP_LOG_NUM("chunk_tokens", cfg->chunk_tokens),
    };
    kvp_log_fields(KVP_LOG_INFO, f, "%s", line);
    kvp_notify_ready(line);
}

int kvp_server_init(struct kvp_server *s, const struct kvp_config *cfg)
{
    memset(s, 0, sizeof(*s));
    s->cfg = *cfg;
    s->seg = (struct kvp_segment)KVP_SEGMENT_INIT;
    s->wake_fds[0] = s->wake_fds[1] = -1;
    s->started_mono_ms = kvp_mono_ms();
    s->started_wall_ms = kvp_wall_ms();
    kvp_warm_init(&s->warm, cfg);
    atomic_init(&s->planned_restart, false);
    kvp_owners_init(&s->owners);
    atomic_init(&s->reserve_timeout_s, cfg->reserve_timeout_s);
    /* Each front end's request-latency family, for the reports (core/stats.h). */
    (void)kvp_request_latency_register();
    (void)lmc_latency_register();
    if (pipe2(s->wake_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
        int err = errno;
        log_error("Cannot start: cannot create the wake-up pipe: %s", kvp_strerror(-err));
        return -err;
    }
    return 0;
}

/* The reservation's progress interval: KVPOOL_PROGRESS_INTERVAL_MS, for tests. */
static uint32_t progress_interval(void)
{
    const char *v = getenv("KVPOOL_PROGRESS_INTERVAL_MS");
    char *end;
    if (!v || !*v)
        return KVP_RESERVE_PROGRESS_MS;
    unsigned long ms = strtoul(v, &end, 10);
    return *end || ms > 3600000 ? KVP_RESERVE_PROGRESS_MS : (uint32_t)ms;
}

int kvp_server_start(struct kvp_server *s)
{
    const struct kvp_config *cfg = &s->cfg;

    /* 1. The front ends' addresses, before the pool is reserved. */
    int rc = kvp_listener_open(s, &s->kvp);
    if (rc)
        return rc;
    rc = check_fd_limit(cfg);
    if (rc)
        return rc;
    rc = kvp_http_start(s);
    if (rc)
        return rc;
    if (cfg->lmcache[0] && (rc = lmc_listener_open(s, &s->lmc)))
        return rc;
    if (atomic_load(&s->stopping))
        return -ECANCELED;

    /* 2. and 3. The pool's memory: a dead predecessor's, or the leftovers reaped first. */
    kvp_segment_set_reserve_control(progress_interval(), &s->stopping);
    (void)kvp_warm_find(&s->warm, cfg, &s->seg);
    kvp_segment_sweep(KVP_SHM_DIR, cfg->shm_enabled ? cfg->shm_name : NULL, KVP_SWEEP_MIN_AGE_S);
    (void)kvp_warm_sweep(&s->warm, KVP_SHM_DIR, KVP_SWEEP_MIN_AGE_S);
    rc = kvp_transport_setup(&s->cfg, &s->seg, s->shm_reason, sizeof(s->shm_reason), &s->gate);
    if (rc)
        return rc;
    /* The memfd backend is sealed against shrinking; private memory has no file. */
    rc = s->seg.shared && !s->seg.memfd ? kvp_seg_guard_arm(s->seg.base, s->seg.size, s->seg.fd)
                                        : 0;
    if (rc)
        log_warn("Cannot install the SIGBUS handler that survives a truncated segment: %s",
                 kvp_strerror(rc));

    /* 4. The core. */
    rc = kvp_store_init(&s->store, KVP_SEG_HEADER, cfg->l1_size,
                        kvp_segment_pool_bytes(s->seg.reserved));
    if (rc) {
        log_error("Cannot start: cannot allocate the pool index: %s", kvp_strerror(rc));
        return rc;
    }
    s->store_ready = true;
    /* The adopted pool's chunks into the store, or a fresh index for a new pool. */
    kvp_warm_attach(&s->warm, &s->seg, &s->store);
    /* Its threads connect by themselves: an unreachable L2 never delays the start-up. */
    rc = kvp_l2_start(cfg, &s->store, s->seg.base, &s->l2);
    if (rc)
        return rc;
    struct kvp_offer offer = {
        .shm_enabled = s->seg.shared,
        .memfd = s->seg.memfd,
        .shm_name = s->seg.name,
        .shm_reason = s->shm_reason,
        .pool_size = cfg->l1_size,
        .chunk_tokens = cfg->chunk_tokens,
    };
    kvp_registry_init(&s->registry, &offer);
    /* kvpool's own front end, and LMCache's when it is on. */
    kvp_registry_share(&s->registry, cfg->lmcache[0] ? 2 : 1);
    s->registry_ready = true;

    /* 5. Serving. */
    rc = kvp_listener_start(s->kvp);
    if (rc)
        return rc;
    rc = kvp_expiry_start(s);
    if (rc) {
        log_error("Cannot start: cannot create the expiry thread: %s", kvp_strerror(rc));
        return rc;
    }
    if (s->lmc && (rc = lmc_listener_start(s->lmc)))
        return rc;
    (void)kvp_warmup_start(s);
    if (atomic_load(&s->stopping))
        return -ECANCELED;
    /* Publishes everything above to the reporting threads (snapshot.c, http.c). */
    atomic_store_explicit(&s->serving, true, memory_order_release);
    log_startup(s);
    return 0;
}

/* Called from the signal handler: only an atomic store and a write(2). */
void kvp_server_stop(struct kvp_server *s)
{
    atomic_store(&s->stopping, true);
    if (s->wake_fds[1] >= 0) {
        ssize_t w = write(s->wake_fds[1], "x", 1);
        (void)w;
    }
}

/* Called from the signal handler, like kvp_server_stop(). */
void kvp_server_stop_planned(struct kvp_server *s)
{
    atomic_store(&s->planned_restart, true);
    kvp_server_stop(s);
}

/* Called from the signal handler, like kvp_server_stop(). */
void kvp_server_request_reload(struct kvp_server *s)
{
    atomic_store(&s->reload_requested, true);
    if (s->wake_fds[1] >= 0) {
        ssize_t w = write(s->wake_fds[1], "r", 1);
        (void)w;
    }
}

/* One change a reload found: applied, or waiting for a restart. */
static void log_change(void *arg, const char *name, bool reloadable, const char *was,
                       const char *now)
{
    int *pending = arg;
    if (reloadable) {
        log_info("Reload: %s changed from %s to %s", name, was, now);
        return;
    }
    log_warn("Reload: %s changed from %s to %s in the configuration; it takes effect at the "
             "next start (still %s)",
             name, was, now, was);
    (*pending)++;
}

void kvp_server_reconfigure(struct kvp_server *s, struct kvp_config *cur,
                            const struct kvp_config *next)
{
    int pending = 0;
    int changed = kvp_config_compare(cur, next, log_change, &pending);
    kvp_config_take_reloadable(cur, next);

    /* Every reloadable option of config.c's table, to where the running daemon reads it. */
    kvp_log_set_level(cur->log_level);
    kvp_log_set_format(cur->log_format);
    atomic_store_explicit(&s->reserve_timeout_s, cur->reserve_timeout_s, memory_order_relaxed);
    kvp_l2_set_limits(s->l2, cur->l2_ttl_s, cur->l2_timeout_ms);
    /* The peer policy, io-timeout and follow-cpu; its accepts run on this thread. */
    kvp_listener_reconfigure(s->kvp, cur);

    if (!changed)
        log_info("Reloaded the configuration: nothing changed");
    else
        log_info("Reloaded the configuration: %d change(s) applied, %d waiting for a restart",
                 changed - pending, pending);
}

/* Empties the self-pipe (non-blocking): its bytes only wake the loop, the flags say why. */
static void drain_wake_pipe(struct kvp_server *s)
{
    char buf[64];
    while (read(s->wake_fds[0], buf, sizeof(buf)) > 0)
        ;
}

/* The main loop: returns when the self-pipe says stop, or reload. */
int kvp_server_run(struct kvp_server *s)
{
    struct pollfd p[2] = {{.fd = kvp_listener_fd(s->kvp), .events = POLLIN},
                          {.fd = s->wake_fds[0], .events = POLLIN}};

    while (!atomic_load(&s->stopping)) {
        int n = poll(p, 2, -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            log_error("poll: %s", kvp_strerror(-errno));
            return -errno;
        }
        if (p[1].revents) {
            if (atomic_load(&s->stopping))
                break;
            drain_wake_pipe(s);
            if (atomic_exchange(&s->reload_requested, false))
                return KVP_SERVER_RELOAD;
        }
        if (p[0].revents & POLLIN)
            kvp_listener_accept(s->kvp);
    }
    return 0;
}

/* Order matters: no new clients, then no live ones, then the memory they pointed into. */
void kvp_server_destroy(struct kvp_server *s)
{
    atomic_store(&s->stopping, true);
    /* A planned restart: the reservations its clients are dropped with keep their marks, so
     * that the next kvpoold holds back the pages their workers may still be writing. */
    if (atomic_load(&s->planned_restart) && s->store_ready)
        kvp_store_keep_marks(&s->store);
    kvp_listener_stop(s->kvp);
    /* Every client of every front end: each front end ends its own (owner.h). */
    kvp_owners_notify(&s->owners, KVP_OWNER_DROP, NULL, 0);
    kvp_listener_drain(s->kvp);
    /* The LMCache instances' holds go before the store does. */
    lmc_listener_close(s->lmc);
    s->lmc = NULL;
    kvp_warmup_join(s);
    kvp_expiry_stop(s);
    /* Until here a health probe saw 503 "stopping"; its answers read the store and registry. */
    kvp_http_stop(s);
    /* Nobody calls into the tier any more (connections, reports); its threads use the store. */
    kvp_l2_stop(s->l2);
    s->l2 = NULL;
    if (s->registry_ready)
        kvp_registry_destroy(&s->registry);
    /* Nothing writes the store any more: its index is left complete for the next kvpoold
     * (SIGUSR2), or removed before the segment is. */
    bool leave = kvp_warm_stop(&s->warm, &s->seg, s->store_ready ? &s->store : NULL,
                               atomic_load(&s->planned_restart));
    if (s->store_ready)
        kvp_store_destroy(&s->store);
    kvp_seg_guard_disarm();
    if (leave)
        kvp_segment_leave(&s->seg);
    else
        kvp_segment_destroy(&s->seg);
    kvp_warm_close(&s->warm);
    kvp_log_rl_flush_all();
    /* Last: until here a new daemon on this socket would find our files in use. */
    kvp_listener_close(s->kvp);
    s->kvp = NULL;
    for (int i = 0; i < 2; i++)
        if (s->wake_fds[i] >= 0)
            close(s->wake_fds[i]);
    kvp_owners_destroy(&s->owners);
}
