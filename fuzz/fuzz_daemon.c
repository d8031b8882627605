/*
 * fuzz_daemon.c - one daemon connection, end to end: the bytes a client sends go through the
 * daemon's real connection code (sessions.c and session.c: the request loop, framing, header and
 * body decoding, every handler in handlers.c, the store and the registry), exactly as kvpoold
 * runs them, minus the listening socket (listener.c).
 *
 * Input: the byte stream a client writes on its connection (frames back to back; a committed
 * seed is a plausible session: HELLO, REGISTER, PREPARE_STORE, STORE_INLINE with payload, ...).
 * For each input: a fresh store (64 KiB pool, so eviction and "no space" are reachable) and
 * registry; a socketpair; a feeder thread that writes the input, closes its write side and reads
 * every reply; the connection served by kvp_session_main() in this thread until EOF.
 *
 * What must hold, beyond "no crash, no leak":
 *   - the reply stream is well formed: every header decodes, has the reply flag, status <= 0;
 *   - requests are answered in order, one reply each: reply k echoes request k's id;
 *   - every complete request is answered, unless the connection was closed after an error reply;
 *   - once the connection is gone it holds nothing: no reservation, no pin, no instance.
 *
 * The pool is a heap buffer of exactly the segment's size, so ASan sees any access past it.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "common/wire.h"
#include "core/daemon.h"
#include "core/owner.h"
#include "fuzz.h"
#include "kvp/sessions.h"
#include "server_setup.h"

#define POOL_SIZE (64u << 10)
#define CHUNK_TOKENS 4u

static struct kvp_server srv;
static struct kvp_sessions *sessions; /* the connection's set, as the listener's would be */
static struct kvp_offer offer;

static uint64_t rd_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

struct reply {
    uint64_t request_id;
    int32_t status;
};

/* The client side: writes the input, then reads and parses replies until the daemon closes. */
struct feeder {
    int fd;
    const uint8_t *data;
    size_t size;
    struct reply *replies;
    size_t nreplies, max_replies;
    bool bad_reply; /* a header that does not decode, lacks the flag, status > 0 */
    uint8_t hdr[KVP_HEADER_SIZE];
    size_t hdr_got;
    uint64_t skip; /* body and payload bytes of the current reply still to come */
};

static void feeder_consume(struct feeder *f, const uint8_t *p, size_t n)
{
    while (n) {
        if (f->skip) {
            size_t k = f->skip < n ? (size_t)f->skip : n;
            f->skip -= k;
            p += k;
            n -= k;
            continue;
        }
        size_t k = KVP_HEADER_SIZE - f->hdr_got < n ? KVP_HEADER_SIZE - f->hdr_got : n;
        memcpy(f->hdr + f->hdr_got, p, k);
        f->hdr_got += k;
        p += k;
        n -= k;
        if (f->hdr_got < KVP_HEADER_SIZE)
            continue;
        f->hdr_got = 0;
        struct kvp_header h;
        if (kvp_header_decode(f->hdr, &h) != 0 || !(h.opcode & KVP_REPLY_FLAG) || h.status > 0 ||
            f->nreplies == f->max_replies) {
            f->bad_reply = true;
            continue;
        }
        f->replies[f->nreplies++] = (struct reply){.request_id = h.request_id, .status = h.status};
        f->skip = (uint64_t)h.body_len + h.payload_len;
    }
}

static void *feeder_main(void *arg)
{
    struct feeder *f = arg;
    uint8_t buf[16384];
    size_t off = 0;
    bool writing = true;

    if (f->size == 0) {
        shutdown(f->fd, SHUT_WR);
        writing = false;
    }
    for (;;) {
        struct pollfd p = {.fd = f->fd, .events = (short)(POLLIN | (writing ? POLLOUT : 0))};
        if (poll(&p, 1, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (writing && (p.revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t n = send(f->fd, f->data + off, f->size - off, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0)
                off += (size_t)n;
            else if (n < 0 && errno != EAGAIN && errno != EINTR)
                writing = false; /* the daemon closed the connection */
            if (off == f->size) {
                shutdown(f->fd, SHUT_WR);
                writing = false;
            }
        }
        if (p.revents & (POLLIN | POLLERR | POLLHUP)) {
            ssize_t n = recv(f->fd, buf, sizeof(buf), MSG_DONTWAIT);
            if (n == 0)
                break;
            if (n < 0 && errno != EAGAIN && errno != EINTR)
                break;
            if (n > 0)
                feeder_consume(f, buf, (size_t)n);
        }
    }
    return NULL;
}

static void init_once(void)
{
    static bool done;
    if (done)
        return;
    done = true;
    fuzz_server_init(&srv, POOL_SIZE, CHUNK_TOKENS);
    srv.cfg.io_timeout_ms = 5000;
    kvp_owners_init(&srv.owners);
    FUZZ_CHECK(kvp_sessions_new(&srv, NULL, &sessions) == 0);
    /* SHM offered, so that shm registrations and PREPARE_RETRIEVE are reachable too. */
    offer = fuzz_shm_offer("kvpool_l1_pool_fuzz", POOL_SIZE, CHUNK_TOKENS);
}

/*
 * A commit sent with KVP_REQ_NOREPLY that the daemon takes as such: valid header, a commit
 * opcode, NOREPLY and no other flag below bit 16, no payload. It gets no reply (its failure answers
 * the next request instead), and a malformed body closes the connection without one.
 */
static bool silent_frame(const uint8_t *h)
{
    uint16_t op = (uint16_t)rd_le(h + 6, 2);
    uint32_t flags = (uint32_t)rd_le(h + 20, 4);
    return rd_le(h, 4) == KVP_MAGIC && rd_le(h + 4, 2) == KVP_PROTO_VERSION &&
           (op == KVP_OP_COMMIT_STORE || op == KVP_OP_COMMIT_RETRIEVE) &&
           (flags & 0xffffu) == KVP_REQ_NOREPLY && rd_le(h + 16, 4) <= KVP_MAX_BODY &&
           rd_le(h + 24, 8) == 0;
}

/*
 * Checks the replies against the request frames of the input: one reply per frame that expects
 * one, in order, with its request id. When complete frames were left unanswered, the
 * connection was closed: after an error reply, or after a silent frame (a malformed body).
 */
static void check_replies(const struct feeder *f)
{
    size_t off = 0, nexpect = 0, ncomplete = 0;
    bool silent_since = false, closed_ok = false;

    FUZZ_CHECK(!f->bad_reply);
    FUZZ_CHECK(f->hdr_got == 0 && f->skip == 0); /* no truncated reply */
    while (f->size - off >= KVP_HEADER_SIZE) {
        const uint8_t *h = f->data + off;
        uint64_t id = rd_le(h + 8, 8);
        uint64_t len = KVP_HEADER_SIZE + rd_le(h + 16, 4);
        bool silent = silent_frame(h);
        if (rd_le(h + 6, 2) == KVP_OP_STORE_INLINE)
            len += rd_le(h + 24, 8);
        if (!silent) {
            /* A reply may come for a frame whose body never arrived (a refused header). */
            if (nexpect < f->nreplies)
                FUZZ_CHECK(f->replies[nexpect].request_id == id);
            else if (nexpect == f->nreplies)
                closed_ok = silent_since;
            nexpect++;
            if (nexpect <= f->nreplies)
                silent_since = false;
        } else if (nexpect <= f->nreplies) {
            silent_since = true;
        }
        if (len > f->size - off)
            break;
        if (!silent)
            ncomplete++;
        off += len;
    }
    FUZZ_CHECK(f->nreplies <= nexpect);
    if (f->nreplies < ncomplete)
        FUZZ_CHECK(closed_ok || (f->nreplies > 0 && f->replies[f->nreplies - 1].status < 0));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int sv[2];
    pthread_t tid;

    init_once();
    fuzz_server_pool(&srv, NULL);
    kvp_registry_init(&srv.registry, &offer);
    FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);

    struct kvp_session *c = kvp_session_new(sessions, sv[0]);
    FUZZ_CHECK(c != NULL && kvp_sessions_count(sessions) == 1);
    FUZZ_CHECK(kvp_owners_count(&srv.owners) == 1);

    struct feeder f = {
        .fd = sv[1],
        .data = data,
        .size = size,
        .max_replies = size / KVP_HEADER_SIZE + 1,
    };
    f.replies = calloc(f.max_replies, sizeof(*f.replies));
    FUZZ_CHECK(f.replies != NULL);
    FUZZ_CHECK(pthread_create(&tid, NULL, feeder_main, &f) == 0);

    kvp_session_main(c); /* frees c and closes sv[0] */
    pthread_join(tid, NULL);
    close(sv[1]);

    FUZZ_CHECK(kvp_sessions_count(sessions) == 0);
    /* Its owner left the list before its socket closed: no callback can reach it. */
    FUZZ_CHECK(kvp_owners_count(&srv.owners) == 0);
    FUZZ_CHECK(kvp_owners_notify(&srv.owners, KVP_OWNER_DROP, NULL, 0) == 0);
    check_replies(&f);
    struct kvp_store_gauges g;
    kvp_store_get_gauges(&srv.store, &g);
    FUZZ_CHECK(g.reserved == 0 && g.expired == 0 && g.pinned == 0);
    FUZZ_CHECK(kvp_registry_count(&srv.registry) == 0);

    free(f.replies);
    kvp_registry_destroy(&srv.registry);
    kvp_store_destroy(&srv.store);
    free(srv.seg.base);
    return 0;
}
