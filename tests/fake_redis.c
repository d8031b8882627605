/*
 * fake_redis.c - a misbehaving Redis server for tests (see fake_redis.h).
 *
 * Each connection's thread reads commands (RESP arrays of bulk strings, pipelined or not) and
 * answers each in order. Every wait (for a command, between dripped bytes, for the peer to take
 * bytes) is a poll() of at most 100 ms that checks the stop flag, so stopping takes no longer.
 */
#include "fake_redis.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

struct fconn {
    struct kvpt_fake_redis *f;
    int fd;
};

/* Waits up to ms for fd to be ready (events); false once the server is stopping. */
static bool wait_fd(struct kvpt_fake_redis *f, int fd, short events, int ms)
{
    while (!atomic_load(&f->stop)) {
        struct pollfd p = {.fd = fd, .events = events};
        int step = ms < 100 ? ms : 100;
        int n = poll(&p, 1, step);
        if (n > 0)
            return true;
        ms -= step;
        if (ms <= 0)
            return false;
    }
    return false;
}

/* Sends all of buf; false when the peer is gone or the server stops. */
static bool send_all(struct kvpt_fake_redis *f, int fd, const char *buf, size_t len)
{
    while (len) {
        ssize_t w = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            buf += w;
            len -= (size_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (!wait_fd(f, fd, POLLOUT, 100) && atomic_load(&f->stop))
                return false;
        } else {
            return false;
        }
    }
    return true;
}

/* One byte, then a pause of drip_ms, for every byte of s. */
static bool drip(struct kvpt_fake_redis *f, int fd, const char *s)
{
    for (; *s; s++) {
        if (!send_all(f, fd, s, 1))
            return false;
        struct timespec ts = {.tv_sec = f->drip_ms / 1000,
                              .tv_nsec = (f->drip_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        if (atomic_load(&f->stop))
            return false;
    }
    return true;
}

/* The endless bulk: streamed until huge_limit, then the connection idles until the peer closes
 * it. Returns false (the connection ends). */
static bool huge(struct kvpt_fake_redis *f, int fd)
{
    char chunk[65536]; /* one per connection thread: they run at once */
    const char head[] = "$1073741824\r\n";
    memset(chunk, 'x', sizeof(chunk));
    if (!send_all(f, fd, head, sizeof(head) - 1))
        return false;
    while (atomic_load(&f->sent) < f->huge_limit) {
        if (!send_all(f, fd, chunk, sizeof(chunk)))
            return false;
        atomic_fetch_add(&f->sent, sizeof(chunk));
    }
    char buf[4096];
    while (wait_fd(f, fd, POLLIN, 60000) && recv(fd, buf, sizeof(buf), 0) > 0)
        ;
    return false;
}

/* Answers one command (argv[0] of length len); false ends the connection. */
static bool answer(struct kvpt_fake_redis *f, int fd, const char *cmd, size_t len)
{
    atomic_fetch_add(&f->commands, 1);
#define IS(name) (len == strlen(name) && strncasecmp(cmd, name, len) == 0)
    if (IS("AUTH"))
        atomic_fetch_add(&f->auths, 1);
    if (f->mode == KVPT_FAKE_WRONGPASS) {
        const char *r = IS("AUTH") ? "-WRONGPASS invalid username-password pair or user is "
                                     "disabled.\r\n"
                                   : "-NOAUTH Authentication required.\r\n";
        return send_all(f, fd, r, strlen(r));
    }
    if (IS("PING"))
        return f->mode == KVPT_FAKE_HUGE ? huge(f, fd) : send_all(f, fd, "+PONG\r\n", 7);
    if (IS("AUTH") || IS("SELECT") || IS("ASKING"))
        return send_all(f, fd, "+OK\r\n", 5);
    const char *r = IS("EXISTS") || IS("DEL") ? ":1\r\n"
                    : IS("GETRANGE")          ? "$0\r\n\r\n"
                    : IS("SET")               ? "+OK\r\n"
                                              : "-ERR unknown command\r\n";
#undef IS
    return drip(f, fd, r);
}

/*
 * The first complete command in buf[0..n): its name in *cmd, *cmdlen; returns the bytes it
 * takes, 0 when it is not complete yet, -1 when it is not a RESP array of bulk strings.
 */
static long parse(const char *buf, size_t n, const char **cmd, size_t *cmdlen)
{
    const char *p = buf, *end = buf + n;
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl)
        return 0;
    if (*p != '*')
        return -1;
    long argc = strtol(p + 1, NULL, 10);
    p = nl + 1;
    for (long i = 0; i < argc; i++) {
        nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl)
            return 0;
        if (*p != '$')
            return -1;
        long blen = strtol(p + 1, NULL, 10);
        p = nl + 1;
        if (end - p < blen + 2)
            return 0;
        if (i == 0) {
            *cmd = p;
            *cmdlen = (size_t)blen;
        }
        p += blen + 2;
    }
    return (long)(p - buf);
}

static void *conn_main(void *arg)
{
    struct fconn *c = arg;
    struct kvpt_fake_redis *f = c->f;
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    bool alive = buf != NULL;
    while (alive && wait_fd(f, c->fd, POLLIN, 60000)) {
        ssize_t r = recv(c->fd, buf + n, cap - n, MSG_DONTWAIT);
        if (r <= 0) {
            if (r < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            break;
        }
        n += (size_t)r;
        for (;;) {
            const char *cmd = NULL;
            size_t cmdlen = 0;
            long used = parse(buf, n, &cmd, &cmdlen);
            if (used < 0)
                alive = false;
            if (used <= 0 || !alive)
                break;
            alive = answer(f, c->fd, cmd, cmdlen);
            memmove(buf, buf + used, n - (size_t)used);
            n -= (size_t)used;
        }
        if (n == cap)
            break; /* a command larger than the buffer: not one of ours */
    }
    free(buf);
    close(c->fd);
    free(c);
    return NULL;
}

static void *accept_main(void *arg)
{
    struct kvpt_fake_redis *f = arg;
    while (!atomic_load(&f->stop)) {
        if (!wait_fd(f, f->listen_fd, POLLIN, 100))
            continue;
        int fd = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        struct fconn *c = malloc(sizeof(*c));
        if (c)
            *c = (struct fconn){.f = f, .fd = fd};
        pthread_mutex_lock(&f->lock);
        if (!c || f->nconns == KVPT_FAKE_MAX_CONNS ||
            pthread_create(&f->conns[f->nconns], NULL, conn_main, c) != 0) {
            pthread_mutex_unlock(&f->lock);
            free(c);
            close(fd);
            continue;
        }
        f->nconns++;
        pthread_mutex_unlock(&f->lock);
    }
    return NULL;
}

int kvpt_fake_redis_start(struct kvpt_fake_redis *f, enum kvpt_fake_mode mode)
{
    static atomic_int seq;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    f->mode = mode;
    atomic_store(&f->sent, 0);
    atomic_store(&f->commands, 0);
    atomic_store(&f->auths, 0);
    atomic_store(&f->stop, false);
    f->nconns = 0;
    snprintf(f->path, sizeof(f->path), "/tmp/kvpt-fake-redis-%d-%d.sock", (int)getpid(),
             atomic_fetch_add(&seq, 1));
    snprintf(f->url, sizeof(f->url), "unix://%s", f->path);
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", f->path);
    unlink(f->path);
    f->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (f->listen_fd < 0)
        return -errno;
    if (bind(f->listen_fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(f->listen_fd, 64)) {
        int err = errno;
        close(f->listen_fd);
        return -err;
    }
    pthread_mutex_init(&f->lock, NULL);
    int rc = pthread_create(&f->acceptor, NULL, accept_main, f);
    if (rc) {
        close(f->listen_fd);
        unlink(f->path);
        return -rc;
    }
    return 0;
}

void kvpt_fake_redis_stop(struct kvpt_fake_redis *f)
{
    atomic_store(&f->stop, true);
    pthread_join(f->acceptor, NULL);
    /* No new connection thread starts once the acceptor is gone. */
    for (int i = 0; i < f->nconns; i++)
        pthread_join(f->conns[i], NULL);
    close(f->listen_fd);
    unlink(f->path);
    pthread_mutex_destroy(&f->lock);
}
