/*
 * harness.h - integration-test helpers: run the real kvpoold on a temporary socket, read its
 * log, talk to it through the real client library or raw frames; the clock, /dev/shm and
 * cmocka fixture helpers every integration test shares.
 */
#ifndef KVPT_HARNESS_H
#define KVPT_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvpool.h"

/* Monotonic time in milliseconds. */
uint64_t kvpt_now_ms(void);

/* Sleeps for ms milliseconds. */
void kvpt_sleep_ms(int ms);

/* True if /dev/shm holds a file of that name (a posix segment, by its name without '/'). */
bool kvpt_shm_exists(const char *name);

/*
 * Moves the calling process into a mount namespace of its own with a fresh tmpfs, mounted with
 * tmpfs_opts (e.g. "size=64m,mode=1777"), on /dev/shm: no other test's segment is in view.
 * Returns 0, or -1 with the reason on stderr ("skipped: ...") when the environment does not
 * allow it (it needs root or CAP_SYS_ADMIN); the caller then exits 77.
 */
int kvpt_private_devshm(const char *tmpfs_opts);

struct kvpt_daemon {
    pid_t pid;
    char dir[64]; /* temporary directory */
    char socket[128];
    char log[128];
    char shm_name[96]; /* "" when started with --shm-name "" */
};

/*
 * Starts kvpoold with --socket in a fresh temporary directory, --log-level debug (unless args
 * contain --config: the file sets the level), a unique
 * --shm-name (unless args contain --shm-name, or --shm-backend memfd or none, which have no
 * name: d->shm_name is then "") and the extra args (NULL-terminated, may be
 * NULL). Waits until it answers a ping. Fails the test (abort via cmocka) if it does not.
 */
void kvpt_daemon_start(struct kvpt_daemon *d, const char *const *args);

/*
 * Like kvpt_daemon_start() but returns at once, without waiting for the daemon to answer; with
 * socket non-NULL the daemon listens there instead of in its own directory (which still holds
 * its log).
 */
void kvpt_daemon_spawn(struct kvpt_daemon *d, const char *socket, const char *const *args);

/* Waits up to timeout_ms for d to exit by itself. Returns its exit status (or 128+signal), or
 * -1 if it is still running. */
int kvpt_daemon_wait_exit(struct kvpt_daemon *d, int timeout_ms);

/* Sends sig and waits up to 20 s for exit. Returns the exit status (or 128+signal). */
int kvpt_daemon_signal_wait(struct kvpt_daemon *d, int sig);

/* SIGTERM, wait, assert a clean exit (unless already stopped), remove the temporary directory. */
void kvpt_daemon_stop(struct kvpt_daemon *d);

/* True if the daemon's log contains s (waits up to timeout_ms for it to appear). */
bool kvpt_log_wait(const struct kvpt_daemon *d, const char *s, int timeout_ms);

/* Number of lines of the log that contain s. */
int kvpt_log_count(const struct kvpt_daemon *d, const char *s);

/* Opens a client to d; fails the test on error. */
kvp_client *kvpt_connect(const struct kvpt_daemon *d);

/* The value of a daemon statistic; fails the test if it does not exist. */
uint64_t kvpt_stat(kvp_client *c, const char *name);

/* Polls a statistic through its own connection until it equals want (up to timeout_ms).
 * Returns the last value. */
uint64_t kvpt_stat_wait(const struct kvpt_daemon *d, const char *name, uint64_t want,
                        int timeout_ms);

/* Like kvpt_stat_wait() on the open client c: no connection of its own, so "connections" can
 * be polled too. */
uint64_t kvpt_stat_poll(kvp_client *c, const char *name, uint64_t want, int timeout_ms);

/* A fresh client to d answers a ping; fails the test otherwise. */
void kvpt_assert_serves(const struct kvpt_daemon *d);

/*
 * cmocka group fixtures for a test program whose cases share one daemon. In the group setup,
 * kvpt_group_start() starts d with args (kvpt_daemon_start()) and makes it the group's state;
 * kvpt_group_stop(), the group teardown, stops it. Both return 0.
 */
int kvpt_group_start(void **state, struct kvpt_daemon *d, const char *const *args);
int kvpt_group_stop(void **state);

/* Registration options for a small test layout: 2 layers, hidden 64, float16. */
kvp_register_opts kvpt_layout(const char *instance_id, uint32_t transport);

/* Deterministic token ids: seq_id selects the sequence, n tokens. Caller frees. */
uint32_t *kvpt_tokens(uint32_t seq_id, uint32_t n);

/* Fills buf with bytes derived from (seed, chunk index). */
void kvpt_fill(void *buf, size_t len, uint32_t seed, uint32_t chunk);

/* True if buf holds exactly what kvpt_fill(seed, chunk) writes. */
bool kvpt_check(const void *buf, size_t len, uint32_t seed, uint32_t chunk);

/* Registration options for large chunks: kvpt_layout() with 8 layers, hidden 1024 and float32,
 * 1 MiB per chunk at --chunk-size 16, so that a few chunks make a large transfer. */
kvp_register_opts kvpt_layout_big(const char *instance_id, uint32_t transport);

/* Stores chunks [0, n) of sequence seq (kvpt_tokens(seq, ...), in inst's chunk size) with the
 * content kvpt_fill(seq, i); some may be cached already, but all n must end up in the pool
 * (checked by a lookup, which also makes a pipelined commit visible to every client).
 * Returns how many were newly stored. */
uint32_t kvpt_store_seq(kvp_instance *inst, uint32_t seq, uint32_t n);

/* Retrieves chunks [0, n) of sequence seq (no lookup first), asserts that all n came back
 * byte-exact (kvpt_fill content). */
void kvpt_retrieve_seq(kvp_instance *inst, uint32_t seq, uint32_t n);

/* Asserts that exactly the first n of the total chunks of seq are cached, byte-exact. */
void kvpt_assert_seq(kvp_instance *inst, uint32_t seq, uint32_t n, uint32_t total);

/*
 * Starts kvpoold again after d's daemon has exited (d->pid == 0): same directory, socket path
 * and segment name, plus the extra args; the new daemon's log is appended to d->log. Waits
 * until it answers a ping, like kvpt_daemon_start().
 */
void kvpt_daemon_restart(struct kvpt_daemon *d, const char *const *args);

/*
 * Runs a daemon with an argument list of the caller's own (argv[0] the binary, NULL-ended), in
 * d's directory as the caller set it up (d->dir, d->socket, d->log), its log appended to
 * d->log; waits until it answers a ping, like kvpt_daemon_start().
 */
void kvpt_daemon_exec(struct kvpt_daemon *d, const char **argv);

/* Waits up to timeout_ms for child pid to exit and stores its status. Returns false if it had
 * not: it is then killed with SIGKILL and reaped (status is that of the kill). */
bool kvpt_reap(pid_t pid, int timeout_ms, int *status);

/* Sends SIGSTOP to pid and waits (up to 5 s) until the kernel reports it stopped ('T' in
 * /proc/<pid>/stat): kill() returns before the target's threads have stopped. */
void kvpt_stop_process(pid_t pid);

/* Resident set size of a process in KiB (VmRSS of /proc/<pid>/status); fails the test if
 * it cannot be read. */
uint64_t kvpt_rss_kib(pid_t pid);

/*
 * Raw protocol access, for tests that send what the client library never would. None of these
 * fail the test by themselves (they are safe in a forked child): they return negative errors.
 * The socket is blocking with 10 s timeouts, so a daemon that never answers cannot hang a test.
 */
struct kvpt_reply {
    int32_t status;
    uint16_t opcode; /* with the reply flag */
    uint64_t request_id;
    uint64_t payload_len; /* left unread in the socket */
    uint32_t body_len;
    uint8_t *body; /* malloc'd, body_len bytes plus a NUL; the caller frees it */
    char msg[256]; /* the daemon's message when status < 0 */
};

/* Connects a raw socket to d. Returns the descriptor or a negative errno. */
int kvpt_raw_connect(const struct kvpt_daemon *d);

/* Sends a request header and body (payload_len is announced, not sent). Returns 0 or a
 * negative errno: the daemon may legitimately have closed the connection. */
int kvpt_raw_send(int fd, uint16_t opcode, const void *body, uint32_t body_len,
                  uint64_t payload_len);

/* The same with request flags (KVP_REQ_*) in the header. */
int kvpt_raw_send_flags(int fd, uint16_t opcode, const void *body, uint32_t body_len,
                        uint64_t payload_len, uint32_t flags);

/* Reads one reply header and body. Returns 0, -ECONNRESET at EOF or reset, -ETIMEDOUT, or
 * -EPROTO when the header does not decode or is not a reply. */
int kvpt_raw_recv(int fd, struct kvpt_reply *r);

/* Sends a request and reads its reply. Returns the reply's status, or a negative error from
 * the socket (-EPROTO for a reply to another opcode); r->body is set only on a reply. */
int kvpt_raw_call(int fd, uint16_t opcode, const void *body, uint32_t body_len,
                  struct kvpt_reply *r);

/* True once the daemon has closed fd (EOF or reset) within timeout_ms; bytes still queued are
 * discarded. */
bool kvpt_raw_closed(int fd, int timeout_ms);

/* HELLO and REGISTER of o on a raw connection: fills *handle and *chunk_bytes (may be NULL).
 * Returns 0, the daemon's error status or a socket error. */
int kvpt_raw_register(int fd, const kvp_register_opts *o, uint32_t *handle, uint64_t *chunk_bytes);

/* A reference request (COMMIT_STORE, ABORT_STORE, COMMIT_RETRIEVE, UNREGISTER) of (handle, id).
 * Returns the reply's status or a socket error, like kvpt_raw_call(). */
int kvpt_raw_ref(int fd, uint16_t op, uint32_t handle, uint64_t id, struct kvpt_reply *r);

/* A keyed request (LOOKUP, PREPARE_*, RETRIEVE_INLINE) of the first ntokens tokens of
 * kvpt_tokens(seq) through handle. Returns the reply's status or a socket error, like
 * kvpt_raw_call(); a payload is left unread. */
int kvpt_raw_keyed(int fd, uint16_t op, uint32_t handle, uint32_t seq, uint32_t ntokens,
                   struct kvpt_reply *r);

/*
 * Raw helpers that fail the test when the daemon does not answer as they expect: not for a
 * forked child. Token counts are those of kvpt_raw_keyed().
 */
struct kvp_slots_reply;

/* kvpt_raw_connect(), failing the test if it cannot connect. */
int kvpt_raw_connect_or_fail(const struct kvpt_daemon *d);

/* Sends what it can of n bytes at p: the daemon may close first, and a short or failed send is
 * then part of the test. */
void kvpt_raw_send_bytes(int fd, const void *p, size_t n);

/* A reference request that must be refused with -ENOENT on a connection that stays usable (a
 * PING after it is answered). */
void kvpt_raw_ref_refused(int fd, uint16_t op, uint32_t handle, uint64_t id);

/* PREPARE_STORE or PREPARE_RETRIEVE; on success *sr (may be NULL; its slots in the caller's
 * array) is the decoded reply. Returns the status. */
int kvpt_raw_prepare(int fd, uint16_t op, uint32_t handle, uint32_t seq, uint32_t ntokens,
                     struct kvp_slots_reply *sr);

/* LOOKUP; returns the number of cached chunks. */
int kvpt_raw_lookup(int fd, uint32_t handle, uint32_t seq, uint32_t ntokens);

/* STORE_INLINE of reservation id with payload_len announced and the first send_len bytes of data
 * actually sent. Returns the reply's status; *r holds the reply (the caller frees r->body). */
int kvpt_raw_store_inline(int fd, uint32_t handle, uint64_t id, uint64_t payload_len,
                          const void *data, size_t send_len, struct kvpt_reply *r);

/* A fresh client to d pings, and nothing is held by anybody: one connection (its own), no
 * reservation, pin, expired reservation or instance. */
void kvpt_assert_clean(const struct kvpt_daemon *d);

#endif /* KVPT_HARNESS_H */
