/*
 * daemon.c - the helpers that every module of the daemon shares (daemon.h): thread creation with
 * the stop signals blocked, the clocks, and the note of a request of an unknown instance. The
 * context itself, struct kvp_server, is built and torn down by server.c.
 */
#include "core/daemon.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <time.h>

#include "base/log.h"
#include "core/stats.h"

void kvp_note_unknown_instance(struct kvp_server *s)
{
    KVP_COUNT(unknown_instance_requests, 1);
    atomic_store_explicit(&s->unknown_instance_ms, kvp_mono_ms(), memory_order_relaxed);
}

void kvp_stop_signals_block(sigset_t *old)
{
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigaddset(&block, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &block, old);
}

void kvp_stop_signals_restore(const sigset_t *old)
{
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

/* A new thread inherits the creator's mask: blocked around its creation, the stop signals stay
 * blocked in it, so only the main thread handles them. */
int kvp_thread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    sigset_t old;
    kvp_stop_signals_block(&old);
    int rc = pthread_create(t, attr, fn, arg);
    kvp_stop_signals_restore(&old);
    return rc;
}

void kvp_thread_name(const char *name)
{
    (void)pthread_setname_np(pthread_self(), name);
}

uint64_t kvp_mono_ms(void)
{
    return kvp_log_now_ms();
}

uint64_t kvp_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int64_t kvp_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
