/*
 * server.c - start-up, the accept loop, the expiry thread and shutdown.
 *
 * Start-up order (each step logs what it decided):
 *   1. capacity gate (shm_gate.c) on the segment size: header page + pool;
 *   2. the shared segment (segment.c), or private memory when the gate or the reservation said
 *      no; a segment held by a live daemon is fatal;
 *   3. store and registry over that memory;
 *   4. the listening socket: a path answered by a live daemon is fatal, a dead socket file is
 *      replaced; the file gets --socket-mode (umask is tightened around bind so it is never
 *      more open than that, even briefly).
 *
 * Threads: the main thread accepts; each connection has a detached thread (conn.c); one expiry
 * thread cancels overdue reservations once a second. Shutdown: the signal handler writes to a
 * self-pipe; the main thread stops accepting, shuts every connection's socket down (their
 * threads see EOF, release their holds and exit), waits for them, then frees the store and
 * unlinks the segment and the socket file.
 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/msg.h"
#include "conn.h"
#include "log.h"
#include "shm_gate.h"
#include "stats.h"

/* Logs a gate verdict. Returns true when the segment may be attempted. */
static bool gate_allows(enum kvp_gate_verdict v, const char *log_line)
{
    if (v == KVP_GATE_SKIPPED)
        log_debug("%s", log_line);
    else if (v != KVP_GATE_OK)
        log_warn("%s", log_line);
    return v == KVP_GATE_OK || v == KVP_GATE_SKIPPED;
}

/*
 * Decides where the pool lives: a shared segment (posix or memfd) when the configuration and
 * the capacity gate allow it and the reservation succeeds, else private memory. Only a segment
 * name held by a live daemon is fatal; every other failure degrades to the inline transport
 * with a logged reason.
 */
static int setup_memory(struct kvp_server *s)
{
    const struct kvp_config *cfg = &s->cfg;
    uint64_t size = KVP_SEG_HEADER + cfg->l1_size;
    char log_line[512], why[200];
    struct kvp_gate_probe probe;
    int rc = 0;

    if (!cfg->shm_enabled || cfg->shm_backend == KVP_SHM_NONE) {
        snprintf(s->shm_reason, sizeof(s->shm_reason), "SHM disabled by configuration");
    } else if (cfg->shm_backend == KVP_SHM_MEMFD) {
        kvp_mem_gate_probe(&probe);
        if (gate_allows(kvp_mem_gate_decide(size, &probe, log_line, sizeof(log_line), s->shm_reason,
                                            sizeof(s->shm_reason)),
                        log_line)) {
            rc = kvp_segment_create_memfd(&s->seg, size, why, sizeof(why));
            if (rc) {
                log_warn("Cannot create the memfd segment (%s). Disabling SHM transport.", why);
                snprintf(s->shm_reason, sizeof(s->shm_reason), "SHM disabled: %s", why);
            }
        }
    } else {
        kvp_shm_gate_probe(KVP_SHM_DIR, &probe);
        if (gate_allows(kvp_shm_gate_decide(size, &probe, log_line, sizeof(log_line), s->shm_reason,
                                            sizeof(s->shm_reason)),
                        log_line)) {
            rc = kvp_segment_create_shared(&s->seg, cfg->shm_name, size, cfg->shm_mode, why,
                                           sizeof(why));
            if (rc == -EBUSY) {
                log_error("Refusing to start: %s", why);
                return rc;
            }
            if (rc) {
                log_warn("Cannot create the shared segment (%s). Disabling SHM transport.", why);
                snprintf(s->shm_reason, sizeof(s->shm_reason), "SHM disabled: %s", why);
            }
        }
    }
    if (!s->seg.shared) {
        rc = kvp_segment_create_private(&s->seg, size);
        if (rc) {
            log_error("Cannot allocate the %" PRIu64 "-byte pool: %s", cfg->l1_size, strerror(-rc));
            return rc;
        }
    }
    return 0;
}

/* A socket path that still answers belongs to a live daemon: never steal it. Checked before
 * the pool is built so that a second daemon fails fast. */
static int check_socket_free(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int err = errno;
        log_error("Cannot create socket: %s", strerror(err));
        return -err;
    }
    int rc = connect(fd, (struct sockaddr *)&addr, sizeof(addr));
    close(fd);
    if (rc == 0) {
        log_error("Refusing to start: another kvpoold is listening on %s", path);
        return -EADDRINUSE;
    }
    return 0;
}

/* Binds and listens; a dead socket file is replaced, anything else at the path is refused. */
static int setup_socket(struct kvp_server *s)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    const char *path = s->cfg.socket_path;
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);

    struct stat st;
    int fd;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            log_error("Refusing to start: %s exists and is not a socket", path);
            return -EEXIST;
        }
        unlink(path);
    }

    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    mode_t old = umask(0777 & ~s->cfg.socket_mode);
    int rc = bind(fd, (struct sockaddr *)&addr, sizeof(addr));
    int err = errno;
    umask(old);
    if (rc != 0) {
        close(fd);
        log_error("Cannot bind %s: %s", path, strerror(err));
        return -err;
    }
    s->socket_bound = true;
    if (chmod(path, s->cfg.socket_mode) != 0 || listen(fd, 128) != 0) {
        err = errno;
        close(fd);
        log_error("Cannot listen on %s: %s", path, strerror(err));
        return -err;
    }
    s->listen_fd = fd;
    return 0;
}

uint64_t kvp_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Once a second: cancel reservations older than --reserve-timeout. Woken early at shutdown. */
static void *expiry_main(void *arg)
{
    struct kvp_server *s = arg;
    uint64_t timeout = (uint64_t)s->cfg.reserve_timeout_s * 1000;

    pthread_mutex_lock(&s->expiry_lock);
    while (!atomic_load(&s->stopping)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&s->expiry_cv, &s->expiry_lock, &ts);
        if (atomic_load(&s->stopping))
            break;
        pthread_mutex_unlock(&s->expiry_lock);
        uint32_t n = kvp_store_expire(&s->store, kvp_mono_ms(), timeout);
        if (n) {
            KVP_COUNT(reservations_expired, n);
            log_warn("Cancelled %" PRIu32 " reserved chunk(s) not committed within %" PRIu32 " s",
                     n, s->cfg.reserve_timeout_s);
        }
        pthread_mutex_lock(&s->expiry_lock);
    }
    pthread_mutex_unlock(&s->expiry_lock);
    return NULL;
}

/* The one INFO line an operator reads first: pool size, SHM state and why, socket, chunk size. */
static void log_startup(const struct kvp_server *s)
{
    const struct kvp_config *cfg = &s->cfg;
    if (s->seg.memfd)
        log_info("kvpoold %s ready: pool %" PRIu64 " bytes, SHM enabled (memfd), socket %s, "
                 "chunk size %" PRIu32 " tokens",
                 KVP_DAEMON_VERSION, cfg->l1_size, cfg->socket_path, cfg->chunk_tokens);
    else if (s->seg.shared)
        log_info("kvpoold %s ready: pool %" PRIu64 " bytes, SHM enabled (shm_name=%s), "
                 "socket %s, chunk size %" PRIu32 " tokens",
                 KVP_DAEMON_VERSION, cfg->l1_size, s->seg.name, cfg->socket_path,
                 cfg->chunk_tokens);
    else
        log_info("kvpoold %s ready: pool %" PRIu64 " bytes, %s, socket %s, "
                 "chunk size %" PRIu32 " tokens",
                 KVP_DAEMON_VERSION, cfg->l1_size, s->shm_reason, cfg->socket_path,
                 cfg->chunk_tokens);
}

int kvp_server_start(struct kvp_server *s, const struct kvp_config *cfg)
{
    memset(s, 0, sizeof(*s));
    s->cfg = *cfg;
    s->seg = (struct kvp_segment)KVP_SEGMENT_INIT;
    s->listen_fd = -1;
    s->wake_fds[0] = s->wake_fds[1] = -1;
    pthread_mutex_init(&s->conns_lock, NULL);
    pthread_cond_init(&s->conns_cv, NULL);
    pthread_mutex_init(&s->expiry_lock, NULL);
    pthread_cond_init(&s->expiry_cv, NULL);

    if (pipe2(s->wake_fds, O_CLOEXEC | O_NONBLOCK) != 0)
        return -errno;
    int rc = check_socket_free(cfg->socket_path);
    if (rc)
        return rc;
    rc = setup_memory(s);
    if (rc)
        return rc;
    rc = kvp_store_init(&s->store, KVP_SEG_HEADER, cfg->l1_size);
    if (rc) {
        log_error("Cannot allocate the pool index: %s", strerror(-rc));
        return rc;
    }
    s->store_ready = true;

    struct kvp_offer offer = {
        .shm_enabled = s->seg.shared,
        .memfd = s->seg.memfd,
        .shm_name = s->seg.name,
        .shm_reason = s->shm_reason,
        .pool_size = cfg->l1_size,
        .chunk_tokens = cfg->chunk_tokens,
    };
    kvp_registry_init(&s->registry, &offer);
    s->registry_ready = true;

    rc = setup_socket(s);
    if (rc)
        return rc;
    rc = pthread_create(&s->expiry_thread, NULL, expiry_main, s);
    if (rc) {
        log_error("Cannot start the expiry thread: %s", strerror(rc));
        return -rc;
    }
    s->expiry_started = true;
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

/* Last step of a connection thread: leave the list and wake a shutdown waiting for it. */
void kvp_server_conn_exit(struct kvp_server *s, struct kvp_conn *c)
{
    pthread_mutex_lock(&s->conns_lock);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->nconns--;
    pthread_cond_broadcast(&s->conns_cv);
    pthread_mutex_unlock(&s->conns_lock);
}

/*
 * Refuses a connection: answers its first request (if it comes within 200 ms) with status and
 * msg, then closes. Runs on the accept thread, so it never waits longer than that.
 */
static void refuse(int fd, int status, const char *msg)
{
    uint8_t raw[KVP_HEADER_SIZE];
    struct kvp_header h;
    struct pollfd p = {.fd = fd, .events = POLLIN};

    if (poll(&p, 1, 200) == 1 && recv(fd, raw, sizeof(raw), MSG_DONTWAIT) == (ssize_t)sizeof(raw) &&
        kvp_header_decode(raw, &h) == 0) {
        struct kvp_wbuf w;
        uint8_t out[KVP_HEADER_SIZE];
        kvp_wbuf_init(&w);
        kvp_encode_error(&w, msg);
        struct kvp_header r = {.magic = KVP_MAGIC,
                               .version = KVP_PROTO_VERSION,
                               .opcode = (uint16_t)(h.opcode | KVP_REPLY_FLAG),
                               .request_id = h.request_id,
                               .body_len = (uint32_t)w.len,
                               .status = status};
        kvp_header_encode(&r, out);
        if (!w.err && send(fd, out, sizeof(out), MSG_NOSIGNAL | MSG_DONTWAIT) == sizeof(out))
            send(fd, w.data, w.len, MSG_NOSIGNAL | MSG_DONTWAIT);
        kvp_wbuf_free(&w);
    }
    close(fd);
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
 * thread. Refusals are answered (with a reason) rather than silently dropped.
 */
static void accept_one(struct kvp_server *s)
{
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
        if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
            log_error("accept: %s", strerror(errno));
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
        log_warn("Refusing a connection from pid %d uid %d gid %d: not allowed by "
                 "--allow-uid/--allow-gid",
                 (int)cr.pid, (int)cr.uid, (int)cr.gid);
        refuse(fd, -EACCES, msg);
        return;
    }
    pthread_mutex_lock(&s->conns_lock);
    bool full = s->nconns >= s->cfg.max_clients;
    pthread_mutex_unlock(&s->conns_lock);
    if (full) {
        KVP_COUNT(connections_rejected, 1);
        log_warn("Refusing a connection: %" PRIu32 " clients connected (--max-clients)",
                 s->cfg.max_clients);
        refuse(fd, -EUSERS, "too many clients connected (--max-clients)");
        return;
    }

    struct kvp_conn *c = calloc(1, sizeof(*c));
    if (!c) {
        log_error("Out of memory accepting a connection");
        close(fd);
        return;
    }
    c->srv = s;
    c->fd = fd;
    kvp_wbuf_init(&c->out);

    pthread_mutex_lock(&s->conns_lock);
    c->id = ++s->next_conn_id;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    pthread_mutex_unlock(&s->conns_lock);

    pthread_attr_t attr;
    pthread_t tid;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&tid, &attr, kvp_conn_main, c);
    pthread_attr_destroy(&attr);
    if (rc) {
        log_error("Cannot start a connection thread: %s", strerror(rc));
        kvp_server_conn_exit(s, c);
        close(fd);
        free(c);
        return;
    }
    KVP_COUNT(connections_accepted, 1);
}

/* The accept loop: returns when the self-pipe says stop. */
int kvp_server_run(struct kvp_server *s)
{
    struct pollfd p[2] = {{.fd = s->listen_fd, .events = POLLIN},
                          {.fd = s->wake_fds[0], .events = POLLIN}};

    while (!atomic_load(&s->stopping)) {
        int n = poll(p, 2, -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            log_error("poll: %s", strerror(errno));
            return -errno;
        }
        if (p[1].revents)
            break;
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
        unlink(s->cfg.socket_path);

    /* Wake every connection thread; each releases its holds and leaves the list. */
    pthread_mutex_lock(&s->conns_lock);
    for (struct kvp_conn *c = s->conns; c; c = c->next)
        shutdown(c->fd, SHUT_RDWR);
    while (s->nconns)
        pthread_cond_wait(&s->conns_cv, &s->conns_lock);
    pthread_mutex_unlock(&s->conns_lock);

    if (s->expiry_started) {
        pthread_mutex_lock(&s->expiry_lock);
        pthread_cond_signal(&s->expiry_cv);
        pthread_mutex_unlock(&s->expiry_lock);
        pthread_join(s->expiry_thread, NULL);
    }
    if (s->registry_ready)
        kvp_registry_destroy(&s->registry);
    if (s->store_ready)
        kvp_store_destroy(&s->store);
    kvp_segment_destroy(&s->seg);
    for (int i = 0; i < 2; i++)
        if (s->wake_fds[i] >= 0)
            close(s->wake_fds[i]);
    pthread_mutex_destroy(&s->conns_lock);
    pthread_cond_destroy(&s->conns_cv);
    pthread_mutex_destroy(&s->expiry_lock);
    pthread_cond_destroy(&s->expiry_cv);
}
