/*
 * thread.h - how the daemon creates and names its threads: every thread but the main one has
 * the stop signals (SIGINT, SIGTERM, SIGHUP, SIGUSR2) and SIGPIPE blocked, so that only the main
 * thread handles them, whatever library (libzmq, libmicrohttpd) creates threads of its own.
 */
#ifndef KVP_THREAD_H
#define KVP_THREAD_H

#include <pthread.h>
#include <signal.h>

/* Blocks SIGINT, SIGTERM, SIGHUP, SIGUSR2 and SIGPIPE in the calling thread, saving its mask in
 * *old, so that threads it creates (itself or through a library) leave the stop signals to the main
 * thread; kvp_stop_signals_restore() puts the mask back. */
void kvp_stop_signals_block(sigset_t *old);
void kvp_stop_signals_restore(const sigset_t *old);

/* pthread_create() with SIGINT, SIGTERM, SIGHUP, SIGUSR2 and SIGPIPE blocked in the new thread, so
 * that only the main thread handles the stop signals. Returns 0 or a positive errno. */
int kvp_thread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);

/* Names the calling thread (at most 15 bytes: "kvp-lmcache"), as top -H, ps -L, perf and
 * /proc/PID/task/TID/comm show it. Best effort: a failure changes nothing else. */
void kvp_thread_name(const char *name);

#endif /* KVP_THREAD_H */
