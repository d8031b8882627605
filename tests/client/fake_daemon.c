/*
 * fake_daemon.c - the scripted stand-in for kvpoold (see fake_daemon.h for its use).
 *
 * fake_start() runs fake_main() in a thread of its own. It owns the listening socket and the
 * connection it accepted, walks f->steps in order and appends every request it reads to
 * f->reqs; the test thread touches neither until fake_join() or fake_cleanup() has joined the
 * thread. Every socket wait is bounded by FAKE_IDLE_MS, so a test whose client never comes,
 * never writes or never closes fails with a message in f->error instead of hanging.
 */
#include "client/fake_daemon.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/kvp_assert.h"

void fake_init(struct fake_daemon *f)
{
    memset(f, 0, sizeof(*f));
    f->listen_fd = -1;
    snprintf(f->dir, sizeof(f->dir), "/tmp/kvp-test-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->path, sizeof(f->path), "%s/kvpool.sock", f->dir);
}

struct fake_step *fake_add(struct fake_daemon *f, uint16_t op, enum fake_action action)
{
    assert_true(f->nsteps < FAKE_MAX_STEPS);
    struct fake_step *s = &f->steps[f->nsteps++];
    *s = (struct fake_step){.op = op, .action = action, .claim_payload = ~0ull};
    return s;
}

struct fake_step *fake_add_reply(struct fake_daemon *f, uint16_t op, struct kvp_wbuf *w)
{
    struct fake_step *s = fake_add(f, op, FAKE_REPLY);
    if (w) {
        assert_rc(w->err, 0);
        s->body = w->data;
        s->body_len = w->len;
        kvp_wbuf_init(w);
    }
    return s;
}

void fake_add_error(struct fake_daemon *f, uint16_t op, int32_t status, const char *msg)
{
    struct kvp_wbuf w;
    kvp_wbuf_init(&w);
    kvp_encode_error(&w, msg);
    fake_add_reply(f, op, &w)->status = status;
}

void fake_add_count(struct fake_daemon *f, uint16_t op, uint32_t count)
{
    struct kvp_wbuf w;
    kvp_wbuf_init(&w);
    kvp_encode_count_reply(&w, count);
    fake_add_reply(f, op, &w);
}

struct kvp_hello_reply fake_hello_msg(const char *shm_name, uint64_t seg_size, const uint8_t *nonce,
                                      const char *reason)
{
    struct kvp_hello_reply h = {.major = 1, .minor = 0, .pid = 4242, .chunk_tokens = 16};
    if (shm_name) {
        h.shm_backend = 1;
        h.segment_size = seg_size;
        snprintf(h.shm_name, sizeof(h.shm_name), "%s", shm_name);
        memcpy(h.nonce, nonce, KVP_NONCE_SIZE);
    } else {
        snprintf(h.shm_reason, sizeof(h.shm_reason), "%s", reason ? reason : "");
    }
    return h;
}

void fake_add_hello_msg(struct fake_daemon *f, const struct kvp_hello_reply *h)
{
    struct kvp_wbuf w;
    kvp_wbuf_init(&w);
    kvp_encode_hello_reply(&w, h);
    fake_add_reply(f, KVP_OP_HELLO, &w);
}

void fake_add_hello(struct fake_daemon *f)
{
    struct kvp_hello_reply h = fake_hello_msg(NULL, 0, NULL, "SHM disabled by configuration");
    fake_add_hello_msg(f, &h);
}

static int fake_io(int fd, void *p, size_t n, bool write_it)
{
    uint8_t *b = p;
    while (n) {
        ssize_t r = write_it ? send(fd, b, n, MSG_NOSIGNAL) : recv(fd, b, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r == 0 ? -ECONNRESET : -errno;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Reads one request into f->reqs (its payload only if read_payload). Returns 0, or <0 at EOF
 * or error. */
static int fake_read_req(struct fake_daemon *f, int fd, bool read_payload)
{
    uint8_t raw[KVP_HEADER_SIZE];
    struct fake_req *q;

    if (fake_io(fd, raw, sizeof(raw), false) < 0)
        return -1;
    if (f->nreqs >= FAKE_MAX_STEPS + 4) {
        snprintf(f->error, sizeof(f->error), "too many requests");
        return -1;
    }
    q = &f->reqs[f->nreqs++];
    if (kvp_header_decode(raw, &q->h) < 0 || q->h.payload_len > (64u << 20)) {
        snprintf(f->error, sizeof(f->error), "client sent a malformed header");
        return -1;
    }
    q->body = malloc(q->h.body_len + 1);
    q->payload = malloc(q->h.payload_len + 1);
    if (!q->body || !q->payload || fake_io(fd, q->body, q->h.body_len, false) < 0)
        return -1;
    if (read_payload && fake_io(fd, q->payload, q->h.payload_len, false) < 0)
        return -1;
    return 0;
}

static int fake_reply(int fd, const struct fake_req *q, const struct fake_step *s)
{
    uint8_t raw[KVP_HEADER_SIZE];
    struct kvp_header h = {
        .magic = KVP_MAGIC,
        .version = KVP_PROTO_VERSION,
        .opcode = (uint16_t)(q->h.opcode | KVP_REPLY_FLAG),
        .request_id = q->h.request_id,
        .body_len = (uint32_t)s->body_len,
        .status = s->status,
        .payload_len = s->claim_payload != ~0ull ? s->claim_payload : s->payload_len,
    };

    if (s->action == FAKE_GARBAGE) {
        memset(raw, 0xab, sizeof(raw));
        return fake_io(fd, raw, sizeof(raw), true);
    }
    if (s->action == FAKE_BAD_ID)
        h.request_id++;
    if (s->action == FAKE_BAD_VERSION)
        h.version = KVP_PROTO_VERSION + 1;
    kvp_header_encode(&h, raw);
    if (fake_io(fd, raw, sizeof(raw), true) < 0 || fake_io(fd, s->body, s->body_len, true) < 0 ||
        fake_io(fd, s->payload, s->payload_len, true) < 0)
        return -1;
    return 0;
}

/* Accepts the next connection, or returns -1 with f->error set after FAKE_IDLE_MS. */
static int fake_accept(struct fake_daemon *f)
{
    struct pollfd p = {.fd = f->listen_fd, .events = POLLIN};
    struct timeval tv = {.tv_sec = FAKE_IDLE_MS / 1000};
    int fd;

    if (poll(&p, 1, FAKE_IDLE_MS) != 1) {
        snprintf(f->error, sizeof(f->error), "no client connected (connection %d)", f->nconns + 1);
        return -1;
    }
    fd = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
        snprintf(f->error, sizeof(f->error), "accept: %s", strerror(errno));
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    f->nconns++;
    return fd;
}

/* True if step i + 1 opens a new connection. */
static bool fake_reconnect_next(const struct fake_daemon *f, int i)
{
    return i + 1 < f->nsteps && f->steps[i + 1].op == KVP_OP_HELLO;
}

static void *fake_main(void *arg)
{
    struct fake_daemon *f = arg;
    int fd = fake_accept(f);

    if (fd < 0)
        return NULL;
    for (int i = 0; i < f->nsteps; i++) {
        const struct fake_step *s = &f->steps[i];
        if (i > 0 && s->op == KVP_OP_HELLO) {
            /* Like a restarted daemon: the client has to give up this connection first. */
            if (fd >= 0) {
                while (fake_read_req(f, fd, true) == 0)
                    ;
                close(fd);
            }
            fd = fake_accept(f);
            if (fd < 0)
                return NULL;
        }
        if (fake_read_req(f, fd, s->action != FAKE_REPLY_EARLY) < 0)
            goto out; /* the client went away early; the test checks f->nreqs */
        const struct fake_req *q = &f->reqs[f->nreqs - 1];
        if (q->h.opcode != s->op) {
            snprintf(f->error, sizeof(f->error), "step %d: got %s, expected %s", i,
                     kvp_opcode_name(q->h.opcode), kvp_opcode_name(s->op));
            goto out;
        }
        if (s->action == FAKE_SILENT && fake_reconnect_next(f, i))
            continue;
        if (s->action == FAKE_SILENT)
            break;
        if (s->action != FAKE_CLOSE && fake_reply(fd, q, s) < 0)
            goto out;
        if (s->action == FAKE_CLOSE || s->action == FAKE_REPLY_EARLY) {
            close(fd);
            fd = -1;
            if (fake_reconnect_next(f, i))
                continue;
            return NULL;
        }
    }
    /* Record whatever else arrives until the client closes (unexpected requests show up in
     * f->nreqs). */
    while (fake_read_req(f, fd, true) == 0)
        ;
out:
    close(fd);
    return NULL;
}

void fake_start(struct fake_daemon *f)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};

    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", f->path);
    f->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(f->listen_fd >= 0);
    assert_rc(bind(f->listen_fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    assert_rc(listen(f->listen_fd, 4), 0);
    assert_rc(pthread_create(&f->thread, NULL, fake_main, f), 0);
    f->started = true;
}

void fake_join(struct fake_daemon *f)
{
    if (f->started) {
        pthread_join(f->thread, NULL);
        f->started = false;
    }
    if (f->error[0])
        fail_msg("fake daemon: %s", f->error);
}

void fake_cleanup(struct fake_daemon *f)
{
    if (f->started) {
        pthread_join(f->thread, NULL);
        f->started = false;
    }
    if (f->listen_fd >= 0)
        close(f->listen_fd);
    unlink(f->path);
    rmdir(f->dir);
    for (int i = 0; i < f->nsteps; i++) {
        free(f->steps[i].body);
        free(f->steps[i].payload);
    }
    for (int i = 0; i < f->nreqs; i++) {
        free(f->reqs[i].body);
        free(f->reqs[i].payload);
    }
    memset(f, 0, sizeof(*f));
    f->listen_fd = -1;
}

uint64_t fake_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}
