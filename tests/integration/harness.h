/*
 * harness.h - integration-test helpers: run the real kvpoold on a temporary socket, read its
 * log, talk to it through the real client library.
 */
#ifndef KVPT_HARNESS_H
#define KVPT_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvpool.h"

struct kvpt_daemon {
    pid_t pid;
    char dir[64];        /* temporary directory */
    char socket[128];
    char log[128];
    char shm_name[96];   /* "" when started with --shm-name "" */
};

/*
 * Starts kvpoold with --socket in a fresh temporary directory, --log-level debug, a unique
 * --shm-name (unless args contain --shm-name) and the extra args (NULL-terminated, may be
 * NULL). Waits until it answers a ping. Fails the test (abort via cmocka) if it does not.
 */
void kvpt_daemon_start(struct kvpt_daemon *d, const char *const *args);

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

/* Polls a statistic until it equals want (up to timeout_ms). Returns the last value. */
uint64_t kvpt_stat_wait(const struct kvpt_daemon *d, const char *name, uint64_t want,
                        int timeout_ms);

/* Registration options for a small test layout: 2 layers, hidden 64, float16. */
kvp_register_opts kvpt_layout(const char *instance_id, uint32_t transport);

/* Deterministic token ids: seq_id selects the sequence, n tokens. Caller frees. */
uint32_t *kvpt_tokens(uint32_t seq_id, uint32_t n);

/* Fills buf with bytes derived from (seed, chunk index). */
void kvpt_fill(void *buf, size_t len, uint32_t seed, uint32_t chunk);

/* True if buf holds exactly what kvpt_fill(seed, chunk) writes. */
bool kvpt_check(const void *buf, size_t len, uint32_t seed, uint32_t chunk);

#endif /* KVPT_HARNESS_H */
