/*
 * fuzz_client.c - the client library against a hostile daemon: everything libkvpool.so reads from
 * its socket (reply headers, bodies, error messages, inline payloads) comes from the input, and
 * the library runs a worker's usual calls over it through its public API only: open (HELLO),
 * ping, stats, an inline registration, lookup, store, retrieve, unregister, then an operator's
 * status, metrics and clear, and close.
 *
 * Input: the byte stream the "daemon" writes on the connection (a seed is what a real kvpoold
 * answers to that script: request ids 1, 2, ...). A thread plays the daemon: it accepts the
 * connection and, after each request, writes the next frame of the input (as far as that frame's
 * header says), then closes its write side once the input is used up. The registration is forced
 * inline, so no input can make the library map a segment.
 *
 * Reconnects: when the input ends (EOF) the library takes the connection for lost, and its next
 * call connects again. The thread serves every connection the same way, one after the other,
 * with the same input (each connection numbers its requests from 1, so a seed's HELLO reply
 * fits again), until the driver stops it after kvp_client_close(). So the reconnect path (HELLO,
 * registering the instance again) is fuzzed too, and it is bounded: at most one connection per
 * call of the fixed script below.
 *
 * What must hold, beyond "no crash, no leak, no hang": every call returns 0, a count or a
 * negative error; a count is within what was asked (lookup <= chunks of the sequence, store and
 * retrieve <= chunks of the range); a text (status, metrics) is a string of the length returned,
 * and nothing on failure; the instance stays on the inline transport and keeps its chunk
 * layout; no call takes as long as the 5 s timeout (nobody is left waiting for a reply).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/wire.h"
#include "fuzz.h"
#include "kvpool.h"

#define NTOKENS 8u
#define MAX_CHUNK_BYTES (64u << 10)

static int listen_fd = -1;
static char socket_path[108];

struct daemon {
    const uint8_t *data;
    size_t size;
    int stop_fd; /* readable once the driver is done with the client */
    int nconns;
};

static void cleanup(void)
{
    if (socket_path[0])
        unlink(socket_path);
}

static void init_once(void)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (listen_fd >= 0)
        return;
    snprintf(socket_path, sizeof(socket_path), "/tmp/kvp-fuzz-client-%d.sock", (int)getpid());
    unlink(socket_path);
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", socket_path);
    listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(listen_fd >= 0);
    FUZZ_CHECK(bind(listen_fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    FUZZ_CHECK(listen(listen_fd, 4) == 0);
    atexit(cleanup);
}

/* Reads exactly len bytes (or discards them when buf is NULL). False at EOF or on an error. */
static bool read_exact(int fd, uint8_t *buf, uint64_t len)
{
    static uint8_t sink[16384]; /* what is discarded lands here */
    while (len) {
        size_t want = len < sizeof(sink) ? (size_t)len : sizeof(sink);
        ssize_t n = recv(fd, buf ? buf : sink, want, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        if (buf)
            buf += n;
        len -= (uint64_t)n;
    }
    return true;
}

static bool send_exact(int fd, const uint8_t *p, size_t len)
{
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

static uint64_t rd_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/*
 * The daemon side of one connection, paced like a daemon: after each request the library sends
 * (header, body and payload read and dropped), the next frame of the input goes out, as long as
 * its own header says (a header that lies about its lengths is part of the input); a short
 * remainder goes out whole. When the input is used up the write side is closed, so the next
 * request meets EOF. A daemon that answered ahead of the requests would only ever meet the
 * library's check for data nobody asked for.
 */
static void serve(const struct daemon *d, int fd)
{
    size_t off = 0;

    if (d->size == 0)
        shutdown(fd, SHUT_WR);
    for (;;) {
        /* The library's own request: its lengths are trusted (body_len at 16, payload_len at
         * 24, as docs/PROTOCOL.md lays the header out). */
        uint8_t hdr[KVP_HEADER_SIZE];
        if (!read_exact(fd, hdr, sizeof(hdr)) ||
            !read_exact(fd, NULL, rd_le(hdr + 16, 4) + rd_le(hdr + 24, 8)))
            break;
        if (off == d->size)
            continue;
        size_t left = d->size - off, len = left;
        if (left >= KVP_HEADER_SIZE) {
            /* Each length is checked against what is left before they are added: a payload
             * length near 2^64 must not wrap the sum around to a short, never-finished frame. */
            uint64_t body = rd_le(d->data + off + 16, 4), payload = rd_le(d->data + off + 24, 8);
            if (body < left && payload < left && KVP_HEADER_SIZE + body + payload < left)
                len = (size_t)(KVP_HEADER_SIZE + body + payload);
        }
        bool ok = send_exact(fd, d->data + off, len);
        off += len;
        if (!ok || off == d->size)
            shutdown(fd, SHUT_WR);
        if (!ok)
            off = d->size;
    }
    close(fd);
}

/* Serves connections one after the other until the driver says stop. */
static void *daemon_main(void *arg)
{
    struct daemon *d = arg;

    for (;;) {
        struct pollfd p[2] = {{.fd = d->stop_fd, .events = POLLIN},
                              {.fd = listen_fd, .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[0].revents)
            break;
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        d->nconns++;
        serve(d, fd);
    }
    return NULL;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Set before each call: a call must not wait for its timeout, the daemon never goes silent. */
static uint64_t call_start;

/* A call returns at most max, and a failed one has an error string and a message. */
static void check_rc(kvp_client *c, int rc, int max)
{
    FUZZ_CHECK(rc <= max);
    if (rc < 0)
        FUZZ_CHECK(kvp_strerror(rc) != NULL && kvp_last_error(c) != NULL);
    FUZZ_CHECK(now_ms() - call_start < 4500);
    call_start = now_ms();
}

/* The data calls, when the registration announced a chunk small enough to allocate. */
static void run_transfers(kvp_client *c, kvp_instance *inst)
{
    static const uint32_t ids[NTOKENS] = {11, 12, 13, 14, 15, 16, 17, 18};
    const kvp_instance_info *info = kvp_instance_get_info(inst);
    kvp_tokens seq = {.ids = ids, .count = NTOKENS};
    uint8_t *bufs[NTOKENS] = {0};

    FUZZ_CHECK(info->chunk_tokens > 0 && info->chunk_bytes > 0);
    uint32_t nchunks = NTOKENS / info->chunk_tokens;
    uint64_t chunk_bytes = info->chunk_bytes;
    int rc = kvp_lookup(inst, &seq);
    check_rc(c, rc, (int)nchunks);
    /* A reconnect may register the instance again, never with another layout. */
    FUZZ_CHECK(info->chunk_bytes == chunk_bytes && info->transport == KVP_TRANSPORT_INLINE);
    if (info->chunk_bytes > MAX_CHUNK_BYTES)
        return;

    for (uint32_t i = 0; i < nchunks; i++) {
        bufs[i] = malloc((size_t)info->chunk_bytes);
        FUZZ_CHECK(bufs[i] != NULL);
        memset(bufs[i], (int)i + 1, (size_t)info->chunk_bytes);
    }
    kvp_store_result res;
    rc = kvp_store(inst, &seq, 0, NTOKENS, (const void *const *)bufs, &res);
    check_rc(c, rc, (int)nchunks);
    if (rc >= 0)
        FUZZ_CHECK(res.nchunks == nchunks && res.stored == (uint32_t)rc);
    rc = kvp_retrieve(inst, &seq, 0, NTOKENS, (void *const *)bufs);
    check_rc(c, rc, (int)nchunks);
    FUZZ_CHECK(info->chunk_bytes == chunk_bytes && info->transport == KVP_TRANSPORT_INLINE);
    for (uint32_t i = 0; i < nchunks; i++)
        free(bufs[i]);
}

/* kvp_get_status() or kvp_get_metrics(): a string of the returned length, or nothing. */
static void check_text(kvp_client *c, int (*get)(kvp_client *, char **))
{
    char *text = NULL;
    int rc = get(c, &text);
    check_rc(c, rc, (int)KVP_MAX_TEXT);
    FUZZ_CHECK((rc >= 0) == (text != NULL));
    if (text)
        FUZZ_CHECK(strlen(text) == (size_t)rc);
    kvp_free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct daemon d = {.data = data, .size = size};
    kvp_opts o = {.socket_path = socket_path, .timeout_ms = 5000};
    kvp_client *c = NULL;
    pthread_t tid;
    int stop[2];

    init_once();
    FUZZ_CHECK(pipe2(stop, O_CLOEXEC) == 0);
    d.stop_fd = stop[0];
    FUZZ_CHECK(pthread_create(&tid, NULL, daemon_main, &d) == 0);
    call_start = now_ms();
    int rc = kvp_client_open(&o, &c);
    FUZZ_CHECK(rc <= 0 && (rc == 0) == (c != NULL));
    if (c) {
        kvp_stat st[8];
        check_rc(c, kvp_ping(c), 0);
        rc = kvp_stats(c, st, 8);
        check_rc(c, rc, 128);

        kvp_register_opts ro = {
            .instance_id = "fuzz-worker",
            .model_name = "fuzz-model",
            .world_size = 1,
            .block_size = 16,
            .num_layers = 1,
            .hidden_dim = 4,
            .dtype = "uint8",
            .transport = KVP_TRANSPORT_INLINE,
        };
        kvp_instance *inst = NULL;
        rc = kvp_register(c, &ro, &inst);
        check_rc(c, rc, 0);
        FUZZ_CHECK((rc == 0) == (inst != NULL));
        if (inst) {
            FUZZ_CHECK(kvp_instance_get_info(inst)->transport == KVP_TRANSPORT_INLINE);
            run_transfers(c, inst);
            check_rc(c, kvp_unregister(inst), 0);
        }
        check_text(c, kvp_get_status);
        check_text(c, kvp_get_metrics);
        check_rc(c, kvp_clear(c), INT_MAX);
        kvp_client_close(c);
    }
    FUZZ_CHECK(write(stop[1], "x", 1) == 1);
    pthread_join(tid, NULL);
    close(stop[0]);
    close(stop[1]);
    /* The open and at most one reconnect per later call. */
    FUZZ_CHECK(d.nconns <= 15);
    return 0;
}
