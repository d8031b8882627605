/*
 * warm_fixture.h - what the warm-restart tests (test_warm_*.c) share: the files a kvpoold leaves
 * in /dev/shm (its pool segment and the index kvpool_widx_<euid>_<XXH3-64 of the socket path>),
 * mapped as any process of the daemon's uid can map them; the adoption and refusal lines of its
 * log; this process as workers on three instances (shm, inline, 1 MiB chunks) with a data set
 * whose bytes tell each chunk apart; the status's "warm_restart"; and a teardown that removes
 * what a failed test leaves behind.
 */
#ifndef KVPT_WARM_FIXTURE_H
#define KVPT_WARM_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "harness.h"
#include "server/core/warm_index.h"

#define KVPW_C 16                             /* --chunk-size of the daemons (kvpw_args64) */
#define KVPW_SMALL (2u * 2 * KVPW_C * 64 * 2) /* kvpt_layout(): 8 KiB */
#define KVPW_BIG (2u * 8 * KVPW_C * 1024 * 4) /* kvpt_layout_big(): 1 MiB */
#define KVPW_TEST_USER "kvpt-warm"            /* owner of the files in the other-user refusal */
#define KVPW_ADOPTED "Adopted the pool of kvpoold pid "
#define KVPW_REFUSED "Not adopting the pool left in /dev/shm/"

/* --l1-size 64MiB --chunk-size 16. */
extern const char *const kvpw_args64[];

/* ---- Files in /dev/shm ---- */

/* The index's name for a socket path: kvpool_widx_<euid>_<16 hex digits of XXH3-64(path)>. */
void kvpw_widx_name(const char *socket, char *out, size_t size);

/* Fails the test when the index of d's socket is not in /dev/shm, listing what is there. */
void kvpw_assert_widx_exists(const struct kvpt_daemon *d);

/* Removes the index of d's socket and the named segments (NULL-terminated; may be NULL). */
void kvpw_remove_leftovers(const struct kvpt_daemon *d, const char *const *segments);

/* A /dev/shm file mapped read-write (MAP_SHARED). */
struct kvpw_map {
    int fd;
    uint8_t *p;
    size_t len;
};

/* Maps /dev/shm/<name> whole, as a worker (or anyone of the daemon's uid) can; fails the test
 * when it cannot. */
void kvpw_map_shm(const char *name, struct kvpw_map *m);
void kvpw_unmap_shm(struct kvpw_map *m);

/* The index header, and the record of pool page i, of a mapped index. */
struct kvp_widx_header *kvpw_widx_header(const struct kvpw_map *m);
struct kvp_widx_record *kvpw_widx_record(const struct kvpw_map *m, uint64_t i);

/* XXH3-64 of a whole /dev/shm file: to tell that nobody wrote it. */
uint64_t kvpw_file_sum(const char *name);

/* ---- The daemon's log ---- */

/* The last line of d's log that contains s, into out; false when there is none. */
bool kvpw_log_line(const struct kvpt_daemon *d, const char *s, char *out, size_t size);

/* Asserts that d's log has exactly n lines that contain s (printing the log otherwise). */
void kvpw_assert_log_count(const struct kvpt_daemon *d, const char *s, int n);

/* The last adoption line of d's log (waiting up to 5 s for one): the dead daemon's pid, how it
 * ended (*kind "crash" or "planned"), the chunks and bytes adopted; the line into line. */
void kvpw_adopted_line(const struct kvpt_daemon *d, int *pid, const char **kind,
                       unsigned long long *chunks, unsigned long long *bytes, char *line,
                       size_t size);

/* ---- Workers and the data set ---- */

/* This process as the workers: one client, an shm, an inline and a large-chunk (1 MiB) instance,
 * all of one model and rank, so that each finds what the others stored. */
struct kvpw_workers {
    kvp_client *c;
    kvp_instance *shm, *inl, *big;
};

/* Registers o on c; fails the test on an error. */
kvp_instance *kvpw_register(kvp_client *c, kvp_register_opts o);

/* Opens the workers' client on d and registers the three instances (asserting transports and
 * chunk sizes). */
void kvpw_workers_open(const struct kvpt_daemon *d, struct kvpw_workers *w);

/* The sequences of the data set: which instance stores each (0 shm, 1 inline, 2 big), and how
 * many chunks. Sequence numbers are unique, so that a chunk's bytes tell which one it is. */
struct kvpw_seq {
    uint32_t seq, n;
    int inst;
};
#define KVPW_NDATA 4
extern const struct kvpw_seq kvpw_data_set[KVPW_NDATA];

kvp_instance *kvpw_inst(const struct kvpw_workers *w, int i);
uint64_t kvpw_data_set_chunks(void);
uint64_t kvpw_data_set_bytes(void);
/* Stores every sequence (all new). */
void kvpw_store_data_set(const struct kvpw_workers *w);
/* Every chunk is cached and byte-exact (lookup, then retrieve). */
void kvpw_check_data_set(const struct kvpw_workers *w);
/* None is cached. */
void kvpw_check_data_set_gone(const struct kvpw_workers *w);

/* ---- The status ---- */

/* The status document (STATUS over the socket: what GET /api/status serves); json_decref it. */
json_t *kvpw_status(kvp_client *c);
/* Its "warm_restart" object (borrowed), failing the test when there is none. */
json_t *kvpw_warm_of(json_t *doc);
/* An integer member, failing the test when it is not one. */
long long kvpw_jint(json_t *o, const char *key);

/* A cold start that serves: nothing of the data set is cached, stores and retrieves work on both
 * transports, and the status says "cold" with "enabled" as given (1 true, 0 false, -1 either). */
void kvpw_assert_cold_and_serving(const struct kvpt_daemon *d, int enabled);

/* ---- Daemons ---- */

/* The daemon of the running test, zeroed: a static one, which the teardown finds even when the
 * test failed half-way. */
struct kvpt_daemon *kvpw_fresh_daemon(void);

/*
 * Starts kvpoold on d's socket (d's directory, socket and log made at the first call, on a zeroed
 * d) WITHOUT --shm-name: its default segment name, kvpool_l1_pool_<pid>_<random>, new at every
 * start, as in production. Like the harness otherwise (--log-level debug, --http off, then
 * args; the log appended). Waits until it answers a ping; d->shm_name gets the segment's name
 * from its ready line.
 */
void kvpw_start_default_name(struct kvpt_daemon *d, const char *const *args);

/* Starts d with kvpw_args64, stores the data set, SIGKILLs it. */
void kvpw_crashed_with_data(struct kvpt_daemon *d);

/* Notes a segment an earlier daemon of the running test left (a default name, which d->shm_name
 * no longer holds): the teardown removes it, should the test fail before it does. */
void kvpw_note_leftover(const char *name);

/* cmocka teardown: kills the daemon a failed test left running, removes its index, its segment,
 * the "<segment>_b" some tests use and the noted ones (kvpw_note_leftover()), and its
 * directory. */
int kvpw_teardown(void **state);

#endif /* KVPT_WARM_FIXTURE_H */
