/*
 * fake_redis.h - a Redis server that misbehaves on purpose, for the tests of the L2 tier: one
 * thread in the test process listens on a Unix socket and answers the commands the daemon sends
 * (PING, AUTH, SELECT, EXISTS, GETRANGE, SET, DEL, ASKING) in RESP, the way the test asks:
 * dripping the bytes of its answers, answering PING with an endless bulk, refusing every
 * password. One thread per connection; every wait is bounded and kvpt_fake_redis_stop() ends
 * them all.
 */
#ifndef KVPT_FAKE_REDIS_H
#define KVPT_FAKE_REDIS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

enum kvpt_fake_mode {
    /* PING, AUTH, SELECT answered at once; the answers to data commands (EXISTS :1, GETRANGE
     * an empty value, SET +OK, DEL :1) sent one byte every drip_ms. */
    KVPT_FAKE_DRIP,
    /* PING answered "$1073741824" and then bytes as fast as the peer takes them, up to
     * huge_limit bytes (counted in sent); the connection stays open until the peer closes it. */
    KVPT_FAKE_HUGE,
    /* AUTH answered -WRONGPASS (as Redis 6+ does), anything else -NOAUTH; each AUTH counted. */
    KVPT_FAKE_WRONGPASS,
};

#define KVPT_FAKE_MAX_CONNS 64

struct kvpt_fake_redis {
    enum kvpt_fake_mode mode;
    int drip_ms;
    uint64_t huge_limit;
    char path[108];                /* the Unix socket */
    char url[128];                 /* what --l2 takes: unix:///... */
    atomic_uint_fast64_t sent;     /* bytes of huge answers sent so far */
    atomic_uint_fast64_t commands; /* commands received */
    atomic_uint_fast64_t auths;    /* AUTH commands received */
    atomic_bool stop;
    int listen_fd;
    pthread_t acceptor;
    pthread_mutex_t lock;
    pthread_t conns[KVPT_FAKE_MAX_CONNS];
    int nconns;
};

/* Starts a fake server in mode on a fresh socket in /tmp; fills path and url. Returns 0 or a
 * negative errno. drip_ms and huge_limit are read from f (set them first). */
int kvpt_fake_redis_start(struct kvpt_fake_redis *f, enum kvpt_fake_mode mode);

/* Stops the server and every connection thread, removes the socket. */
void kvpt_fake_redis_stop(struct kvpt_fake_redis *f);

#endif /* KVPT_FAKE_REDIS_H */
