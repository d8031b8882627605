/*
 * server.c - start-up, the accept loop, the expiry thread and shutdown.
 *
 * Start-up order (each step logs what it decided). Everything that can be wrong with the
 * configuration or the socket path is found before the pool, which may take minutes to
 * reserve, is touched:
 *   1. the socket's owner lock: flock(LOCK_EX|LOCK_NB) on <socket>.lock (0600, created if
 *      needed, never unlinked: unlinking a lock file races with the next daemon opening it).
 *      Held until exit, it makes one daemon at a time the owner of the socket path; a second
 *      one exits at once naming the owner's pid, which the lock file holds. A missing socket
 *      directory is found here; the default one (socket_path.c) is created 0700 first, and
 *      refused if another user owns it or it is writable by group or others.
 *   2. the socket path: a file that is not a socket is refused; a socket that answers belongs
 *      to a daemon that does not take the lock and is refused; a dead one is replaced. The new
 *      socket is bound (not yet listening: a client gets ECONNREFUSED until step 6, never a
 *      hang) with --socket-mode (umask is tightened around bind so it is never more open than
 *      that, even briefly), and its inode is recorded;
 *   2b. the HTTP endpoint (http.c, --http): bound, and answering in a thread of its own (503
 *      "starting" from /api/healthcheck until the end of step 6), so that a port in use fails
 *      the start-up at once and a probe can watch a long reservation;
 *   3. crash leftovers: segments of dead daemons in /dev/shm are removed (segment.c), so the
 *      gate counts the space they held;
 *   4. the transport decision (transport.c): capacity gate (shm_gate.c) on the segment size
 *      (header page + pool), then the shared segment (segment.c), or private memory when the
 *      gate or the reservation said no; a segment held by a live daemon is fatal. Only the
 *      first KVP_RESERVE_FIRST bytes of the pool are reserved here, so start-up takes the same
 *      time for any pool size;
 *   5. store and registry over that memory (the store hands out reserved pages only);
 *   6. listen, the expiry thread, the thread that reserves the rest of the pool (warmup.c; it
 *      logs its progress and stops early on SIGINT/SIGTERM/SIGHUP), the "ready" line and
 *      READY=1 to a service manager (notify.c).
 * A failure logs exactly one ERROR line saying what is wrong, and kvp_server_start() returns.
 *
 * Threads: the main thread accepts and checks credentials; each connection has a detached thread
 * and joins the connection list (session.c, which owns a connection's whole life); connections
 * that are not served are answered by the refusals thread (refusals.c); one expiry
 * thread cancels overdue reservations and reports rate-limited log counts once a second, and
 * notices a segment that shrank under the daemon (seg_guard.c, segment_lost()); one
 * warm-up thread reserves the rest of the pool after start-up (warmup.c). The
 * threads are created with the stop signals blocked, so only the main thread handles them.
 * Shutdown: the signal handler writes to a self-pipe; the main thread stops accepting, shuts
 * every connection's socket down (their threads see EOF, release their holds and exit), waits
 * for them, then frees the store, unlinks the segment, and unlinks the socket file only if it
 * is still the one this daemon bound (same device and inode): a path taken over by another
 * daemon is left alone. The lock goes last.
 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "base/listen_addr.h"
#include "base/log.h"
#include "base/notify.h"
#include "common/errors.h"
#include "common/msg.h"
#include "common/socket_path.h"
#include "core/owner.h"
#include "core/seg_guard.h"
#include "core/shm_gate.h"
#include "core/stats.h"
#include "core/transport.h"
#include "core/warmup.h"
#include "http/http.h"
#include "kvp/listener.h"
#include "kvp/refusals.h"
#include "l2/l2.h"
#include "lmc/listener.h"

/* The directory part of path, for messages. */
static void dir_of(const char *path, char *dir, size_t size)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, size, ".");
    else if (slash == path)
        snprintf(dir, size, "/");
    else
        snprintf(dir, size, "%.*s", (int)(slash - path), path);
}

/* The pid the owner wrote into the lock file, 0 while it has not (yet). */
static long lock_owner_pid(int fd)
{
    char buf[32];
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    return strtol(buf, NULL, 10);
}

/* Step 1: the owner lock of the socket path. Returns 0 or a negative errno after logging. */
static int take_socket_lock(struct kvp_server *s)
{
    const char *path = s->cfg.socket_path;
    char lock[sizeof(s->cfg.socket_path) + 8], dir[sizeof(s->cfg.socket_path)];
    struct stat st;

    snprintf(lock, sizeof(lock), "%s.lock", path);
    dir_of(path, dir, sizeof(dir));
    /* The default path lives in a private directory that we create; one that somebody else
     * made (or opened up) may hold a planted socket: refuse it (docs/SECURITY.md). */
    char def[sizeof(s->cfg.socket_path)];
    if (kvp_socket_path_default(def, sizeof(def)) > 0 && strcmp(def, path) == 0) {
        char why[512];
        int rc = kvp_socket_dir_prepare(dir, geteuid(), why, sizeof(why));
        if (rc < 0) {
            log_error("%s: %s", rc == -EPERM ? "Refusing to start" : "Cannot start", why);
            return rc;
        }
    }
    int fd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        int err = errno;
        if (err == ENOENT)
            log_error("Cannot start: the socket directory %s does not exist (--socket %s)", dir,
                      path);
        else if (err == ENOTDIR)
            log_error("Cannot start: the socket directory %s is not a directory (--socket %s)", dir,
                      path);
        else if (err == EACCES)
            log_error("Cannot start: no permission to create %s in the socket directory %s", lock,
                      dir);
        else if (err == ELOOP)
            log_error("Refusing to start: the lock file %s is a symbolic link", lock);
        else
            log_error("Cannot start: cannot create the lock file %s: %s", lock, kvp_strerror(-err));
        return -err;
    }
    /* A lock file of another user could be held forever by that user: not ours to trust. */
    if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || !S_ISREG(st.st_mode)) {
        log_error("Refusing to start: the lock file %s is not a regular file of uid %d", lock,
                  (int)geteuid());
        close(fd);
        return -EPERM;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        long pid = 0;
        if (err == EWOULDBLOCK) {
            /* The owner writes its pid right after locking: give it a moment. */
            for (int i = 0; i < 50 && (pid = lock_owner_pid(fd)) <= 0; i++)
                usleep(2000);
            if (pid > 0)
                log_error("Refusing to start: another kvpoold (pid %ld) owns socket %s", pid, path);
            else
                log_error("Refusing to start: another kvpoold owns socket %s (it holds %s)", path,
                          lock);
        } else {
            log_error("Cannot start: cannot lock %s: %s", lock, kvp_strerror(-err));
        }
        close(fd);
        return -err;
    }
    char buf[32];
    int n = snprintf(buf, sizeof(buf), "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, buf, (size_t)n, 0) != n)
        log_warn("Cannot write our pid into %s: %s", lock, kvp_strerror(-errno));
    s->lock_fd = fd;
    return 0;
}

/* True if something accepts connections on path: a daemon that does not take the lock. */
static bool socket_answers(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    int rc = connect(fd, (struct sockaddr *)&addr, sizeof(addr));
    close(fd);
    return rc == 0;
}

/*
 * Step 2: binds the socket, without listening. A dead socket file is replaced, anything else
 * at the path is refused. Records the inode so that shutdown removes only our own file.
 */
static int bind_socket(struct kvp_server *s)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    const char *path = s->cfg.socket_path;
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);

    struct stat st;
    int fd, err;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            log_error("Refusing to start: %s exists and is not a socket (remove it or choose "
                      "another --socket)",
                      path);
            return -EEXIST;
        }
        if (socket_answers(path)) {
            log_error("Refusing to start: another kvpoold is listening on %s", path);
            return -EADDRINUSE;
        }
        log_debug("Replacing the dead socket file %s", path);
        unlink(path);
    } else if (errno != ENOENT) {
        err = errno;
        log_error("Cannot start: cannot inspect %s: %s", path, kvp_strerror(-err));
        return -err;
    }

    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        err = errno;
        log_error("Cannot start: cannot create a Unix socket: %s", kvp_strerror(-err));
        return -err;
    }
    mode_t old = umask(0777 & ~s->cfg.socket_mode);
    int rc = bind(fd, (struct sockaddr *)&addr, sizeof(addr));
    err = errno;
    umask(old);
    if (rc != 0) {
        close(fd);
        log_error("Cannot start: cannot bind %s: %s", path, kvp_strerror(-err));
        return -err;
    }
    s->listen_fd = fd;
    if (stat(path, &st) != 0) {
        err = errno;
        log_error("Cannot start: cannot inspect the socket %s just bound: %s", path,
                  kvp_strerror(-err));
        return -err;
    }
    s->socket_dev = st.st_dev;
    s->socket_ino = st.st_ino;
    s->socket_bound = true;
    if (chmod(path, s->cfg.socket_mode) != 0) {
        err = errno;
        log_error("Cannot start: cannot set mode %o on %s: %s", s->cfg.socket_mode, path,
                  kvp_strerror(-err));
        return -err;
    }
    return 0;
}

/* At exit: unlinks the socket file only if it is still the one we bound. */
static void unlink_own_socket(struct kvp_server *s)
{
    struct stat st;
    const char *path = s->cfg.socket_path;
    if (lstat(path, &st) != 0)
        return;
    if (!S_ISSOCK(st.st_mode) || st.st_dev != s->socket_dev || st.st_ino != s->socket_ino) {
        log_info("Leaving %s alone: it is no longer the socket this kvpoold bound", path);
        return;
    }
    unlink(path);
}

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
 * The segment shrank under the daemon and the guard replaced it with private memory
 * (seg_guard.h): said once, at ERROR; the instances on shm are moved to inline and their
 * connections closed, so that their libraries reconnect and register again, inline (a
 * reservation written through a mapping the daemon no longer shares could only be refused); the
 * chunks, whose bytes are lost, are dropped (the pinned ones a second later, by the caller,
 * once the transfers that pinned them have ended).
 */
static void segment_lost(struct kvp_server *s, int64_t size_now)
{
    static uint64_t owners[KVP_MAX_INSTANCES];
    struct kvp_clear_result r;
    uint32_t nowners = 0;

    uint32_t moved = kvp_registry_stop_shm(&s->registry, kvp_seg_guard_reason(), owners,
                                           KVP_MAX_INSTANCES, &nowners);
    kvp_sessions_drop(s, owners, nowners);
    kvp_store_clear(&s->store, &r);
    log_error("The shared segment /dev/shm/%s shrank to %lld of %" PRIu64 " bytes under kvpoold "
              "(another process truncated it). kvpoold no longer uses shared memory: its pool is "
              "private memory now, the %" PRIu64 " chunks it held are dropped (%" PRIu64
              " pinned ones once released), and every worker is served inline (%" PRIu32
              " instance(s) on shm had their connection closed, to register again)",
              s->seg.name, (long long)size_now, s->seg.size, r.dropped, r.pinned, moved);
}

/* Once a second: cancel reservations older than --reserve-timeout, notice a segment that
 * shrank. Woken early at shutdown. */
static void *expiry_main(void *arg)
{
    struct kvp_server *s = arg;
    kvp_thread_name("kvp-expiry");
    /* The chunks pinned when the segment was lost are still there, reserved before lost_ms;
     * the ones stored since, in private memory, are sound. */
    bool clear_again = false;
    uint64_t lost_ms = 0;

    pthread_mutex_lock(&s->expiry_lock);
    while (!atomic_load(&s->stopping)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&s->expiry_cv, &s->expiry_lock, &ts);
        if (atomic_load(&s->stopping))
            break;
        pthread_mutex_unlock(&s->expiry_lock);
        kvp_log_rl_flush(kvp_mono_ms());
        int64_t size_now;
        kvp_seg_guard_check();
        if (clear_again) {
            struct kvp_clear_result r;
            kvp_store_clear_older(&s->store, lost_ms, &r);
            clear_again = false;
            log_debug("Dropped %" PRIu64 " more chunks of the lost segment", r.dropped);
        }
        if (kvp_seg_guard_take_report(&size_now)) {
            lost_ms = kvp_mono_ms();
            segment_lost(s, size_now);
            clear_again = true;
        }
        /* SIGHUP may change it: every round reads it anew. */
        uint32_t timeout_s = atomic_load_explicit(&s->reserve_timeout_s, memory_order_relaxed);
        uint32_t n = kvp_store_expire(&s->store, kvp_mono_ms(), (uint64_t)timeout_s * 1000);
        if (n) {
            KVP_COUNT(reservations_expired, n);
            log_warn("Cancelled %" PRIu32 " reserved chunk(s) not committed within %" PRIu32 " s",
                     n, timeout_s);
        }
        pthread_mutex_lock(&s->expiry_lock);
    }
    pthread_mutex_unlock(&s->expiry_lock);
    return NULL;
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
    s->listen_fd = -1;
    s->lock_fd = -1;
    s->wake_fds[0] = s->wake_fds[1] = -1;
    s->started_mono_ms = kvp_mono_ms();
    s->started_wall_ms = kvp_wall_ms();
    kvp_owners_init(&s->owners);
    atomic_init(&s->reserve_timeout_s, cfg->reserve_timeout_s);
    atomic_init(&s->io_timeout_ms, cfg->io_timeout_ms);
    atomic_init(&s->follow_cpu, cfg->follow_cpu);
    pthread_mutex_init(&s->conns_lock, NULL);
    pthread_cond_init(&s->conns_cv, NULL);
    pthread_mutex_init(&s->expiry_lock, NULL);
    pthread_cond_init(&s->expiry_cv, NULL);
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

    int rc = take_socket_lock(s);
    if (rc)
        return rc;
    rc = bind_socket(s);
    if (rc)
        return rc;
    rc = check_fd_limit(cfg);
    if (rc)
        return rc;
    rc = kvp_http_start(s);
    if (rc)
        return rc;
    /* The LMCache front end's address too is taken before the pool is reserved. */
    if (cfg->lmcache[0] && (rc = lmc_listener_open(s, &s->lmc)))
        return rc;
    if (atomic_load(&s->stopping))
        return -ECANCELED;

    kvp_segment_sweep(KVP_SHM_DIR, cfg->shm_enabled ? cfg->shm_name : NULL, KVP_SWEEP_MIN_AGE_S);
    kvp_segment_set_reserve_control(progress_interval(), &s->stopping);
    rc = kvp_transport_setup(&s->cfg, &s->seg, s->shm_reason, sizeof(s->shm_reason), &s->gate);
    if (rc)
        return rc;
    /* The memfd backend is sealed against shrinking; private memory has no file. */
    rc = s->seg.shared && !s->seg.memfd ? kvp_seg_guard_arm(s->seg.base, s->seg.size, s->seg.fd)
                                        : 0;
    if (rc)
        log_warn("Cannot install the SIGBUS handler that survives a truncated segment: %s",
                 kvp_strerror(rc));
    rc = kvp_store_init(&s->store, KVP_SEG_HEADER, cfg->l1_size,
                        kvp_segment_pool_bytes(s->seg.reserved));
    if (rc) {
        log_error("Cannot start: cannot allocate the pool index: %s", kvp_strerror(rc));
        return rc;
    }
    s->store_ready = true;
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

    rc = kvp_refusals_start(&s->refusals);
    if (rc) {
        log_error("Cannot start: cannot create the thread that answers refused connections: %s",
                  kvp_strerror(rc));
        return rc;
    }
    if (listen(s->listen_fd, 128) != 0) {
        int err = errno;
        log_error("Cannot start: cannot listen on %s: %s", cfg->socket_path, kvp_strerror(-err));
        return -err;
    }
    rc = kvp_thread_create(&s->expiry_thread, NULL, expiry_main, s);
    if (rc) {
        log_error("Cannot start: cannot create the expiry thread: %s", kvp_strerror(-rc));
        return -rc;
    }
    s->expiry_started = true;
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
    atomic_store_explicit(&s->io_timeout_ms, cur->io_timeout_ms, memory_order_relaxed);
    atomic_store_explicit(&s->follow_cpu, cur->follow_cpu, memory_order_relaxed);
    kvp_l2_set_limits(s->l2, cur->l2_ttl_s, cur->l2_timeout_ms);
    /* Read by the accept loop only, which is this thread. */
    memcpy(s->cfg.allow_uids, cur->allow_uids, sizeof(s->cfg.allow_uids));
    s->cfg.n_allow_uids = cur->n_allow_uids;
    memcpy(s->cfg.allow_gids, cur->allow_gids, sizeof(s->cfg.allow_gids));
    s->cfg.n_allow_gids = cur->n_allow_gids;

    if (!changed)
        log_info("Reloaded the configuration: nothing changed");
    else
        log_info("Reloaded the configuration: %d change(s) applied, %d waiting for a restart",
                 changed - pending, pending);
}

/* Peer-credential policy: the daemon's own uid, --allow-uid, or a member of --allow-gid. */
static bool peer_allowed(const struct kvp_config *cfg, const struct ucred *cr)
{
    if ((uid_t)cr->uid == geteuid())
        return true;
    for (uint32_t i = 0; i < cfg->n_allow_uids; i++)
        if ((uint32_t)cr->uid == cfg->allow_uids[i])
            return true;
    if (cfg->n_allow_gids == 0)
        return false;
    /* The peer's primary gid from SO_PEERCRED, then its supplementary groups from /proc. */
    for (uint32_t i = 0; i < cfg->n_allow_gids; i++)
        if ((uint32_t)cr->gid == cfg->allow_gids[i])
            return true;
    char path[64], line[1024];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)cr->pid);
    FILE *f = fopen(path, "re");
    bool ok = false;
    while (f && !ok && fgets(line, sizeof(line), f)) {
        if (strncmp(line, "Groups:", 7) != 0)
            continue;
        char *p = line + 7, *end;
        for (unsigned long g = strtoul(p, &end, 10); end != p; g = strtoul(p, &end, 10)) {
            for (uint32_t i = 0; i < cfg->n_allow_gids; i++)
                ok |= g == cfg->allow_gids[i];
            p = end;
        }
    }
    if (f)
        fclose(f);
    return ok;
}

/*
 * Accepts one connection, checks its peer credentials and the connection limit, and starts its
 * thread. Refusals are answered (with a reason) rather than silently dropped, and never make
 * this loop wait for the refused peer (refusals.c).
 */
static void accept_one(struct kvp_server *s)
{
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        if (err != EAGAIN && err != EINTR && err != ECONNABORTED) {
            log_error_rl("accept: %s", kvp_strerror(-err));
            /* EMFILE and friends: back off instead of spinning. */
            usleep(100000);
        }
        return;
    }
    struct ucred cr;
    socklen_t crlen = sizeof(cr);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) != 0 || !peer_allowed(&s->cfg, &cr)) {
        char msg[128];
        KVP_COUNT(connections_rejected, 1);
        snprintf(msg, sizeof(msg), "uid %d is not allowed to use this kvpoold (see --allow-uid)",
                 (int)cr.uid);
        log_warn_rl("Refusing a connection from pid %d uid %d gid %d: not allowed by "
                    "--allow-uid/--allow-gid",
                    (int)cr.pid, (int)cr.uid, (int)cr.gid);
        kvp_refusals_add(s->refusals, fd, -EACCES, msg);
        return;
    }
    int rc = kvp_session_spawn(s, fd);
    if (rc == -EUSERS) {
        KVP_COUNT(connections_rejected, 1);
        log_warn_rl("Refusing a connection: %" PRIu32 " clients connected (--max-clients)",
                    s->cfg.max_clients);
        kvp_refusals_add(s->refusals, fd, -EUSERS, "too many clients connected (--max-clients)");
        return;
    }
    if (rc < 0) {
        char msg[160];
        KVP_COUNT(connections_rejected, 1);
        log_error_rl("Cannot serve a new connection: %s", kvp_strerror(rc));
        snprintf(msg, sizeof(msg), "kvpoold cannot serve a new connection now: %s%s",
                 kvp_strerror(rc), rc == -EAGAIN ? " (no thread for it)" : "");
        kvp_refusals_add(s->refusals, fd, rc, msg);
        return;
    }
    KVP_COUNT(connections_accepted, 1);
}

/* Empties the self-pipe (non-blocking): its bytes only wake the loop, the flags say why. */
static void drain_wake_pipe(struct kvp_server *s)
{
    char buf[64];
    while (read(s->wake_fds[0], buf, sizeof(buf)) > 0)
        ;
}

/* The accept loop: returns when the self-pipe says stop, or reload. */
int kvp_server_run(struct kvp_server *s)
{
    struct pollfd p[2] = {{.fd = s->listen_fd, .events = POLLIN},
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
            accept_one(s);
    }
    return 0;
}

/* Order matters: no new clients, then no live connections, then the memory they pointed into. */
void kvp_server_destroy(struct kvp_server *s)
{
    atomic_store(&s->stopping, true);
    if (s->listen_fd >= 0) {
        close(s->listen_fd);
        s->listen_fd = -1;
    }
    if (s->socket_bound)
        unlink_own_socket(s);

    kvp_sessions_close_all(s);
    /* The LMCache instances' holds go before the store does. */
    lmc_listener_close(s->lmc);
    s->lmc = NULL;
    /* After the connections: one that cannot get its buffers hands its socket over. */
    kvp_refusals_stop(s->refusals);
    s->refusals = NULL;
    kvp_warmup_join(s);

    if (s->expiry_started) {
        pthread_mutex_lock(&s->expiry_lock);
        pthread_cond_signal(&s->expiry_cv);
        pthread_mutex_unlock(&s->expiry_lock);
        pthread_join(s->expiry_thread, NULL);
    }
    /* Until here a health probe saw 503 "stopping"; its answers read the store and registry. */
    kvp_http_stop(s);
    /* Nobody calls into the tier any more (connections, reports); its threads use the store. */
    kvp_l2_stop(s->l2);
    s->l2 = NULL;
    if (s->registry_ready)
        kvp_registry_destroy(&s->registry);
    if (s->store_ready)
        kvp_store_destroy(&s->store);
    kvp_seg_guard_disarm();
    kvp_segment_destroy(&s->seg);
    kvp_log_rl_flush_all();
    /* Last: until here a new daemon on this socket would find our files in use. */
    if (s->lock_fd >= 0)
        close(s->lock_fd);
    s->lock_fd = -1;
    for (int i = 0; i < 2; i++)
        if (s->wake_fds[i] >= 0)
            close(s->wake_fds[i]);
    kvp_owners_destroy(&s->owners);
    pthread_mutex_destroy(&s->conns_lock);
    pthread_cond_destroy(&s->conns_cv);
    pthread_mutex_destroy(&s->expiry_lock);
    pthread_cond_destroy(&s->expiry_cv);
}
