/*
 * fuzz_http.c - the daemon's HTTP endpoint (http.c on libmicrohttpd), end to end: the bytes an
 * HTTP client sends go over a real TCP connection to the endpoint of a server built in this
 * process (a 64 KiB pool, an shm and an inline instance registered), exactly as kvpoold serves
 * them, with the routing, the status JSON, the metrics and the page behind it.
 *
 * Input: what a client writes on its connection (a request, several pipelined, or anything);
 * the write side is then shut down, so the endpoint sees the end of the stream and the exchange
 * ends without waiting for the inactivity timeout.
 *
 * What must hold, beyond "no crash, no leak":
 *   - the endpoint answers with HTTP (a status line "HTTP/1.x DDD") or closes without a byte,
 *     never with anything else;
 *   - an answer's status is one the endpoint documents (docs/HTTP.md);
 *   - the endpoint still serves a health check afterwards.
 */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "base/log.h"
#include "core/daemon.h"
#include "fuzz.h"
#include "http/http.h"

#define POOL_SIZE (64u << 10)
#define CHUNK_TOKENS 4u
#define MAX_REPLY (8u << 20)

static struct kvp_server srv;
static uint16_t port;

/* Registers an instance straight into the registry, as the REGISTER handler does. */
static void add_instance(const char *id, uint8_t transport, uint64_t owner)
{
    struct kvp_register_req q = {.world_size = 1,
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
    FUZZ_CHECK(kvp_registry_add(&srv.registry, owner, 1, &inst, &existing, msg, sizeof(msg)) == 0);
}

static void init_once(void)
{
    static bool done;
    if (done)
        return;
    done = true;
    kvp_log_threshold = (enum kvp_log_level)(KVP_LOG_ERROR + 1); /* silence */
    kvp_config_defaults(&srv.cfg);
    srv.cfg.l1_size = POOL_SIZE;
    srv.cfg.chunk_tokens = CHUNK_TOKENS;
    snprintf(srv.cfg.http, sizeof(srv.cfg.http), "127.0.0.1:0");
    srv.listen_fd = -1;
    srv.wake_fds[0] = srv.wake_fds[1] = -1;
    srv.started_mono_ms = kvp_mono_ms();
    srv.started_wall_ms = kvp_wall_ms();
    pthread_mutex_init(&srv.conns_lock, NULL);
    pthread_cond_init(&srv.conns_cv, NULL);

    uint8_t *mem = malloc(KVP_SEG_HEADER + POOL_SIZE);
    FUZZ_CHECK(mem != NULL);
    srv.seg = (struct kvp_segment)KVP_SEGMENT_INIT;
    srv.seg.base = mem;
    srv.seg.size = KVP_SEG_HEADER + POOL_SIZE;
    srv.seg.shared = true;
    snprintf(srv.seg.name, sizeof(srv.seg.name), "kvpool_l1_pool_fuzz");
    FUZZ_CHECK(kvp_store_init(&srv.store, KVP_SEG_HEADER, POOL_SIZE, POOL_SIZE) == 0);
    struct kvp_offer offer = {
        .shm_enabled = true,
        .shm_name = srv.seg.name,
        .shm_reason = "",
        .pool_size = POOL_SIZE,
        .chunk_tokens = CHUNK_TOKENS,
    };
    kvp_registry_init(&srv.registry, &offer);
    add_instance("fuzz-shm", KVP_WIRE_SHM, 1);
    add_instance("fuzz-inline", KVP_WIRE_INLINE, 2);
    atomic_store(&srv.serving, true);
    FUZZ_CHECK(kvp_http_start(&srv) == 0);
    port = kvp_http_port(&srv);
    FUZZ_CHECK(port != 0);
}

/* Sends data on a fresh connection, shuts the write side, reads until the end. Returns the
 * bytes read into buf (at most MAX_REPLY). */
static size_t exchange(const uint8_t *data, size_t size, uint8_t *buf)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    struct timeval tv = {.tv_sec = 10};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(fd >= 0);
    FUZZ_CHECK(connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    /* The endpoint may answer and close before it has read everything: not an error. */
    for (size_t off = 0; off < size;) {
        ssize_t w = send(fd, data + off, size - off, MSG_NOSIGNAL);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    shutdown(fd, SHUT_WR);
    size_t n = 0;
    while (n < MAX_REPLY) {
        ssize_t r = recv(fd, buf + n, MAX_REPLY - n, 0);
        if (r > 0)
            n += (size_t)r;
        else if (r == 0 || errno != EINTR)
            break;
    }
    close(fd);
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
