/*
 * listener.c - kvpool's own front end on its Unix socket: the socket's owner lock, the bound
 * socket, accepting connections under the peer-credential policy, and the front end's start and
 * stop. The connections themselves are the set's (sessions.c); the ones that are not served are
 * answered by the refusals thread (refusals.c).
 *
 * Opening (before the pool is reserved, so that every mistake fails fast):
 *   1. the socket's owner lock: flock(LOCK_EX|LOCK_NB) on <socket>.lock (0600, created if
 *      needed, never unlinked: unlinking a lock file races with the next daemon opening it).
 *      Held until kvp_listener_close(), it makes one daemon at a time the owner of the socket
 *      path; a second one exits at once naming the owner's pid, which the lock file holds. A
 *      missing socket directory is found here; the default one (socket_path.c) is created 0700
 *      first, and refused if another user owns it or it is writable by group or others.
 *   2. the socket path: a file that is not a socket is refused; a socket that answers belongs
 *      to a daemon that does not take the lock and is refused; a dead one is replaced. The new
 *      socket is bound (not yet listening: a client gets ECONNREFUSED until kvp_listener_start(),
 *      never a hang) with --socket-mode (umask is tightened around bind so it is never more open
 *      than that, even briefly), and its inode is recorded.
 * Starting: the refusals thread, the set of connections, listen().
 * Stopping: the listening socket is closed and its file unlinked only if it is still the one
 * this daemon bound (same device and inode): a path taken over by another daemon is left alone.
 * The connections end through their owners (KVP_OWNER_DROP, sent by the server), and
 * kvp_listener_drain() waits for them. The lock goes last (kvp_listener_close()).
 *
 * Accepting runs on the daemon's main thread, polled beside its self-pipe (server.c), rather
 * than in a thread of its own: an accept never waits for a peer (refusals are answered off this
 * thread), and the peer policy, which SIGHUP changes, is then read and written by that one
 * thread, without a lock.
 *
 * Threads: a listener is used by the main thread only; its set of connections and the refusals
 * thread have their own locks.
 */
#include "kvp/listener.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/log.h"
#include "common/errors.h"
#include "common/socket_path.h"
#include "core/daemon.h"
#include "core/stats.h"
#include "kvp/refusals.h"
#include "kvp/sessions.h"

struct kvp_listener {
    struct kvp_server *srv;
    int lock_fd;       /* <socket>.lock, flocked for the listener's lifetime */
    int listen_fd;     /* bound at open, listening from start, -1 once stopped */
    bool socket_bound; /* the socket file at cfg.socket_path is ours ... */
    dev_t socket_dev;  /* ... as long as it is this inode */
    ino_t socket_ino;
    /* The peer policy: --allow-uid and --allow-gid, as the last reload set them. */
    uint32_t allow_uids[KVP_MAX_ALLOW], n_allow_uids;
    uint32_t allow_gids[KVP_MAX_ALLOW], n_allow_gids;
    struct kvp_refusals *refusals; /* answers connections that are not served (refusals.c) */
    struct kvp_sessions *sessions; /* the connections served (sessions.c) */
};

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

/* The owner lock of the socket path. Returns 0 or a negative errno after logging. */
static int take_socket_lock(struct kvp_listener *l)
{
    const struct kvp_config *cfg = &l->srv->cfg;
    const char *path = cfg->socket_path;
    char lock[sizeof(cfg->socket_path) + 8], dir[sizeof(cfg->socket_path)];
    struct stat st;

    snprintf(lock, sizeof(lock), "%s.lock", path);
    dir_of(path, dir, sizeof(dir));
    /* The default path lives in a private directory that we create; one that somebody else
     * made (or opened up) may hold a planted socket: refuse it (docs/SECURITY.md). */
    char def[sizeof(cfg->socket_path)];
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
    l->lock_fd = fd;
    return 0;
}

/*
 * Binds the socket, without listening. A dead socket file is replaced, anything else
 * at the path is refused. Records the inode so that shutdown removes only our own file.
 */
static int bind_socket(struct kvp_listener *l)
{
    const struct kvp_config *cfg = &l->srv->cfg;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    const char *path = cfg->socket_path;
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
        if (kvp_socket_answers(path)) {
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
    mode_t old = umask(0777 & ~cfg->socket_mode);
    int rc = bind(fd, (struct sockaddr *)&addr, sizeof(addr));
    err = errno;
    umask(old);
    if (rc != 0) {
        close(fd);
        log_error("Cannot start: cannot bind %s: %s", path, kvp_strerror(-err));
        return -err;
    }
    l->listen_fd = fd;
    if (stat(path, &st) != 0) {
        err = errno;
        log_error("Cannot start: cannot inspect the socket %s just bound: %s", path,
                  kvp_strerror(-err));
        return -err;
    }
    l->socket_dev = st.st_dev;
    l->socket_ino = st.st_ino;
    l->socket_bound = true;
    if (chmod(path, cfg->socket_mode) != 0) {
        err = errno;
        log_error("Cannot start: cannot set mode %o on %s: %s", cfg->socket_mode, path,
                  kvp_strerror(-err));
        return -err;
    }
    return 0;
}

/* At stop: unlinks the socket file only if it is still the one we bound. */
static void unlink_own_socket(struct kvp_listener *l)
{
    struct stat st;
    const char *path = l->srv->cfg.socket_path;
    if (lstat(path, &st) != 0)
        return;
    if (!S_ISSOCK(st.st_mode) || st.st_dev != l->socket_dev || st.st_ino != l->socket_ino) {
        log_info("Leaving %s alone: it is no longer the socket this kvpoold bound", path);
        return;
    }
    unlink(path);
}

/* The peer-credential policy: the daemon's own uid, --allow-uid, or a member of --allow-gid. */
static bool peer_allowed(const struct kvp_listener *l, const struct ucred *cr)
{
    if ((uid_t)cr->uid == geteuid())
        return true;
    for (uint32_t i = 0; i < l->n_allow_uids; i++)
        if ((uint32_t)cr->uid == l->allow_uids[i])
            return true;
    if (l->n_allow_gids == 0)
        return false;
    /* The peer's primary gid from SO_PEERCRED, then its supplementary groups from /proc. */
    for (uint32_t i = 0; i < l->n_allow_gids; i++)
        if ((uint32_t)cr->gid == l->allow_gids[i])
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
            for (uint32_t i = 0; i < l->n_allow_gids; i++)
                ok |= g == l->allow_gids[i];
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
void kvp_listener_accept(struct kvp_listener *l)
{
    int fd = accept4(l->listen_fd, NULL, NULL, SOCK_CLOEXEC);
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
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) != 0 || !peer_allowed(l, &cr)) {
        char msg[128];
        KVP_COUNT(connections_rejected, 1);
        snprintf(msg, sizeof(msg), "uid %d is not allowed to use this kvpoold (see --allow-uid)",
                 (int)cr.uid);
        log_warn_rl("Refusing a connection from pid %d uid %d gid %d: not allowed by "
                    "--allow-uid/--allow-gid",
                    (int)cr.pid, (int)cr.uid, (int)cr.gid);
        kvp_refusals_add(l->refusals, fd, -EACCES, msg);
        return;
    }
    int rc = kvp_session_spawn(l->sessions, fd);
    if (rc == -EUSERS) {
        KVP_COUNT(connections_rejected, 1);
        log_warn_rl("Refusing a connection: %" PRIu32 " clients connected (--max-clients)",
                    l->srv->cfg.max_clients);
        kvp_refusals_add(l->refusals, fd, -EUSERS, "too many clients connected (--max-clients)");
        return;
    }
    if (rc < 0) {
        char msg[160];
        KVP_COUNT(connections_rejected, 1);
        log_error_rl("Cannot serve a new connection: %s", kvp_strerror(rc));
        snprintf(msg, sizeof(msg), "kvpoold cannot serve a new connection now: %s%s",
                 kvp_strerror(rc), rc == -EAGAIN ? " (no thread for it)" : "");
        kvp_refusals_add(l->refusals, fd, rc, msg);
        return;
    }
    KVP_COUNT(connections_accepted, 1);
}

/* The policy of cfg, for the connections accepted from now on. */
static void set_policy(struct kvp_listener *l, const struct kvp_config *cfg)
{
    memcpy(l->allow_uids, cfg->allow_uids, sizeof(l->allow_uids));
    l->n_allow_uids = cfg->n_allow_uids;
    memcpy(l->allow_gids, cfg->allow_gids, sizeof(l->allow_gids));
    l->n_allow_gids = cfg->n_allow_gids;
}

int kvp_listener_open(struct kvp_server *s, struct kvp_listener **out)
{
    *out = NULL;
    struct kvp_listener *l = calloc(1, sizeof(*l));
    if (!l) {
        log_error("Cannot start: out of memory");
        return -ENOMEM;
    }
    l->srv = s;
    l->lock_fd = -1;
    l->listen_fd = -1;
    set_policy(l, &s->cfg);
    int rc = take_socket_lock(l);
    if (rc == 0)
        rc = bind_socket(l);
    if (rc) {
        kvp_listener_close(l);
        return rc;
    }
    *out = l;
    return 0;
}

int kvp_listener_start(struct kvp_listener *l)
{
    const char *path = l->srv->cfg.socket_path;
    int rc = kvp_refusals_start(&l->refusals);
    if (rc) {
        log_error("Cannot start: cannot create the thread that answers refused connections: %s",
                  kvp_strerror(rc));
        return rc;
    }
    rc = kvp_sessions_new(l->srv, l->refusals, &l->sessions);
    if (rc) {
        log_error("Cannot start: cannot allocate the list of connections: %s", kvp_strerror(rc));
        return rc;
    }
    if (listen(l->listen_fd, 128) != 0) {
        int err = errno;
        log_error("Cannot start: cannot listen on %s: %s", path, kvp_strerror(-err));
        return -err;
    }
    return 0;
}

int kvp_listener_fd(const struct kvp_listener *l)
{
    return l && l->sessions ? l->listen_fd : -1;
}

void kvp_listener_reconfigure(struct kvp_listener *l, const struct kvp_config *cfg)
{
    set_policy(l, cfg);
    if (l->sessions)
        kvp_sessions_configure(l->sessions, cfg->io_timeout_ms, cfg->follow_cpu);
}

struct kvp_sessions *kvp_listener_sessions(struct kvp_listener *l)
{
    return l ? l->sessions : NULL;
}

void kvp_listener_stop(struct kvp_listener *l)
{
    if (!l)
        return;
    if (l->listen_fd >= 0) {
        close(l->listen_fd);
        l->listen_fd = -1;
    }
    if (l->socket_bound)
        unlink_own_socket(l);
    l->socket_bound = false;
}

void kvp_listener_drain(struct kvp_listener *l)
{
    if (!l)
        return;
    kvp_sessions_wait(l->sessions);
    /* After the connections: one that cannot get its buffers hands its socket over. */
    kvp_refusals_stop(l->refusals);
    l->refusals = NULL;
}

void kvp_listener_close(struct kvp_listener *l)
{
    if (!l)
        return;
    kvp_listener_stop(l);
    kvp_listener_drain(l);
    kvp_sessions_free(l->sessions);
    if (l->lock_fd >= 0)
        close(l->lock_fd);
    free(l);
}
