/*
 * fake_daemon.h - a scripted stand-in for kvpoold, for client library unit tests.
 *
 * A test lists the replies it wants (fake_add_*()), starts the fake, drives libkvpool against its
 * socket, closes the client, then joins the fake and inspects what the library sent (f->reqs:
 * header, body and payload of every request, in order). The fake serves one connection on a
 * Unix socket in a fresh temporary directory, runs in its own thread, and gives up after a few
 * seconds of silence, so a broken test cannot hang.
 *
 * Each step expects one request opcode and then acts: a normal reply (status, body, payload),
 * 32 bytes of garbage, silence, closing the connection, a reply with a wrong request id, a reply
 * whose header claims another protocol version, or a reply sent without reading the request's
 * payload followed by a hang-up (what kvpoold does with an unwanted STORE_INLINE payload).
 *
 * Reconnects: a HELLO step after the first is served on a new connection, as a restarted
 * daemon would: the fake waits for the client to close the current connection (recording what
 * it still sends), then accepts the next one. f->nconns counts the connections accepted.
 */
#ifndef KVP_TEST_FAKE_DAEMON_H
#define KVP_TEST_FAKE_DAEMON_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/msg.h"

#define FAKE_MAX_STEPS 64
#define FAKE_IDLE_MS 5000

enum fake_action {
    FAKE_REPLY,
    FAKE_GARBAGE,
    FAKE_SILENT,
    FAKE_CLOSE,
    FAKE_BAD_ID,
    FAKE_BAD_VERSION,
    FAKE_REPLY_EARLY, /* reply before reading the request's payload, then hang up */
};

struct fake_step {
    uint16_t op; /* expected request opcode */
    enum fake_action action;
    int32_t status;
    uint8_t *body; /* reply body (owned) */
    size_t body_len;
    uint8_t *payload; /* reply payload (owned) */
    size_t payload_len;
    uint64_t claim_payload; /* payload_len written in the header; payload_len if ~0 */
};

struct fake_req {
    struct kvp_header h;
    uint8_t *body;
    uint8_t *payload;
};

struct fake_daemon {
    char dir[64];
    char path[108];
    int listen_fd;
    pthread_t thread;
    bool started;
    struct fake_step steps[FAKE_MAX_STEPS];
    int nsteps;
    struct fake_req reqs[FAKE_MAX_STEPS + 4];
    int nreqs;
    int nconns;      /* connections accepted */
    char error[256]; /* what went wrong in the fake, "" if nothing */
};

/* Prepares f (a fresh temporary directory for the socket); nothing listens yet. */
void fake_init(struct fake_daemon *f);

/* Appends a step: expect a request with opcode op, then act. Returns the step, to adjust its
 * status, payload or claimed payload length; fails the test beyond FAKE_MAX_STEPS. */
struct fake_step *fake_add(struct fake_daemon *f, uint16_t op, enum fake_action action);

/* A success reply whose body is w's content (the step takes w's buffer and w is left empty);
 * w may be NULL for an empty body. */
struct fake_step *fake_add_reply(struct fake_daemon *f, uint16_t op, struct kvp_wbuf *w);

/* An error reply: status and the message msg. */
void fake_add_error(struct fake_daemon *f, uint16_t op, int32_t status, const char *msg);

/* A success reply carrying a count (STORE_INLINE, ABORT_STORE, COMMIT_*). */
void fake_add_count(struct fake_daemon *f, uint16_t op, uint32_t count);

/* A HELLO answer: major 1, 16 tokens per chunk; shm_name non-NULL offers that segment of
 * seg_size bytes with its nonce, NULL offers none and gives reason. */
struct kvp_hello_reply fake_hello_msg(const char *shm_name, uint64_t seg_size, const uint8_t *nonce,
                                      const char *reason);

/* A HELLO step answering h. */
void fake_add_hello_msg(struct fake_daemon *f, const struct kvp_hello_reply *h);

/* A HELLO step without shared memory ("SHM disabled by configuration"). */
void fake_add_hello(struct fake_daemon *f);

/* Listens on f->path and starts serving the steps in a thread of its own. */
void fake_start(struct fake_daemon *f);

/* Waits for the fake to finish (the client must be closed) and fails the test if the fake had
 * any trouble (f->error). */
void fake_join(struct fake_daemon *f);

/* Joins the thread if it still runs, removes the socket and the directory, and frees every
 * step and recorded request; f can be used again after fake_init(). */
void fake_cleanup(struct fake_daemon *f);

/* Monotonic time in milliseconds. */
uint64_t fake_now_ms(void);

#endif /* KVP_TEST_FAKE_DAEMON_H */
