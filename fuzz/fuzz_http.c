/*
 * fuzz_http.c - the daemon's HTTP endpoint (http.c on libmicrohttpd), end to end: the bytes an
 * HTTP client sends reach the endpoint of a server built in this process (a 64 KiB pool, an shm
 * and an inline instance registered), through the same libmicrohttpd options and handlers as
 * kvpoold serves on the network, with the routing, the status JSON, the metrics and the page
 * behind it.
 *
 * Speed. Over real TCP, with the endpoint's own thread, an input that is not a complete request
 * makes the exchange wait for a timeout, and each connection costs a handshake: a few inputs a
 * second. So the endpoint runs here without its thread and without a listening socket
 * (kvp_http_start_unthreaded()): each input gets one end of a socketpair handed to it
 * (kvp_http_add_connection()), and this driver runs the endpoint (kvp_http_run()) until the
 * exchange is over. It is over when the endpoint closed the connection, or when it has read
 * every byte sent and answers nothing more for two rounds in a row: it waits for bytes that
 * will never come, and its side of the socket is then shut down, which makes it close the
 * connection at once. Nothing waits on a clock.
 *
 * Input: what a client writes on its connection (a request, several pipelined, or anything);
 * the write side is then shut down.
 *
 * What must hold, beyond "no crash, no leak":
 *   - the endpoint answers with HTTP (a status line "HTTP/1.x DDD") or closes without a byte,
 *     never with anything else;
 *   - an answer's status is one the endpoint documents (docs/HTTP.md);
 *   - the endpoint still serves a health check afterwards, and every connection is closed.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "core/daemon.h"
#include "fuzz.h"
#include "http/http.h"
#include "server_setup.h"

#define POOL_SIZE (64u << 10)
#define CHUNK_TOKENS 4u
#define MAX_REPLY (8u << 20)
#define MAX_ROUNDS 100000 /* an exchange that needs more is a hang */

static struct kvp_server srv;

/* Registers an instance straight into the registry, as the REGISTER handler does. */
static void add_instance(const char *id, uint8_t transport, uint64_t owner)
{
    struct kvp_reg_spec q = {.world_size = 1,
                             .block_size = 16,
                             .num_layers = 2,
                             .hidden_dim = 8,
                             .transport = transport};
    struct kvp_registration inst;
    char msg[256];
    bool existing;

    snprintf(q.instance_id, sizeof(q.instance_id), "%s", id);
    snprintf(q.model_name, sizeof(q.model_name), "fuzz-model");
    snprintf(q.dtype, sizeof(q.dtype), "float16");
    FUZZ_CHECK(kvp_registry_validate(&srv.registry, &q, &inst, msg, sizeof(msg)) == 0);
    FUZZ_CHECK(kvp_registry_choose_transport(&srv.registry, &inst, NULL, msg, sizeof(msg)) == 0);
    inst.owner = owner;
    inst.owner_pid = 1;
    FUZZ_CHECK(kvp_registry_add(&srv.registry, &inst, 0, &existing, msg, sizeof(msg)) == 0);
}

static void init_once(void)
{
    static bool done;
    if (done)
        return;
    done = true;
    fuzz_server_init(&srv, POOL_SIZE, CHUNK_TOKENS);
    srv.started_mono_ms = kvp_mono_ms();
    srv.started_wall_ms = kvp_wall_ms();

    fuzz_server_pool(&srv, "kvpool_l1_pool_fuzz");
    struct kvp_offer offer = fuzz_shm_offer(srv.seg.name, POOL_SIZE, CHUNK_TOKENS);
    kvp_registry_init(&srv.registry, &offer);
    add_instance("fuzz-shm", KVP_REG_SHM, 1);
    add_instance("fuzz-inline", KVP_REG_INLINE, 2);
    atomic_store(&srv.serving, true);
    FUZZ_CHECK(kvp_http_start_unthreaded(&srv) == 0);
}

/* Bytes waiting to be read on fd. */
static int pending(int fd)
{
    int n = 0;
    FUZZ_CHECK(ioctl(fd, FIONREAD, &n) == 0);
    return n;
}

/*
 * Sends data on a fresh connection to the endpoint, shuts the write side, runs the endpoint
 * until the exchange is over (see the top of the file), and leaves no connection open. Returns
 * the bytes of answer read into buf (at most MAX_REPLY).
 */
static size_t exchange(const uint8_t *data, size_t size, uint8_t *buf)
{
    int sv[2];
    FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) == 0);
    int ours = sv[0], theirs = sv[1];
    FUZZ_CHECK(kvp_http_add_connection(&srv, theirs) == 0);

    size_t off = 0, n = 0;
    bool shut = false, eof = false;
    int quiet = 0, rounds = 0;
    while (!eof && quiet < 2) {
        FUZZ_CHECK(++rounds < MAX_ROUNDS);
        /* The endpoint may answer and close before it has read everything: not an error. */
        while (off < size) {
            ssize_t w = send(ours, data + off, size - off, MSG_NOSIGNAL);
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        if (off == size && !shut) {
            shutdown(ours, SHUT_WR);
            shut = true;
        }
        kvp_http_run(&srv);
        bool progress = false;
        for (;;) {
            ssize_t r = recv(ours, buf + n, MAX_REPLY - n, 0);
            if (r > 0) {
                n += (size_t)r;
                progress = true;
                FUZZ_CHECK(n < MAX_REPLY);
            } else {
                eof = r == 0 || (errno != EAGAIN && errno != EINTR);
                break;
            }
        }
        /* Quiet: everything sent was read by the endpoint, and nothing more came back. Until
         * our end sees the end of the stream, the endpoint has not closed theirs (it closes it
         * only inside kvp_http_run(), on this thread), so theirs is still its descriptor. */
        if (!eof)
            quiet = shut && !progress && pending(theirs) == 0 ? quiet + 1 : 0;
    }
    /* The endpoint waits for bytes that will not come: its side ends, and it closes it. */
    if (!eof)
        shutdown(theirs, SHUT_RDWR);
    while (kvp_http_run(&srv) > 0)
        FUZZ_CHECK(++rounds < MAX_ROUNDS);
    close(ours);
    return n;
}

static bool is_digit(uint8_t c)
{
    return c >= '0' && c <= '9';
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t *buf;
    static const char health[] = "GET /api/healthcheck HTTP/1.1\r\nHost: x\r\n\r\n";

    init_once();
    if (!buf)
        buf = malloc(MAX_REPLY);
    FUZZ_CHECK(buf != NULL);

    size_t n = exchange(data, size, buf);
    if (n > 0) {
        FUZZ_CHECK(n >= 12 && memcmp(buf, "HTTP/1.", 7) == 0 && buf[8] == ' ');
        FUZZ_CHECK(is_digit(buf[9]) && is_digit(buf[10]) && is_digit(buf[11]));
        int status = (buf[9] - '0') * 100 + (buf[10] - '0') * 10 + (buf[11] - '0');
        FUZZ_CHECK(status == 200 || status == 400 || status == 404 || status == 405 ||
                   status == 413 || status == 414 || status == 431 || status == 500 ||
                   status == 501 || status == 505);
    }
    n = exchange((const uint8_t *)health, sizeof(health) - 1, buf);
    FUZZ_CHECK(n >= 15 && memcmp(buf, "HTTP/1.1 200 OK", 15) == 0);
    return 0;
}
