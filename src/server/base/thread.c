/*
 * thread.c - thread creation with the stop signals blocked, and thread names (thread.h).
 */
#include "base/thread.h"

void kvp_stop_signals_block(sigset_t *old)
{
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigaddset(&block, SIGUSR2);
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
