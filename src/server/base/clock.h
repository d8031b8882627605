/*
 * clock.h - the daemon's clocks: CLOCK_MONOTONIC in milliseconds (ages, deadlines, timeouts,
 * the log's rate limiter) and nanoseconds (request latencies), and CLOCK_REALTIME in
 * milliseconds (the times a report shows). One definition for every module of the daemon.
 */
#ifndef KVP_CLOCK_H
#define KVP_CLOCK_H

#include <stdint.h>

/* Milliseconds of CLOCK_MONOTONIC. */
uint64_t kvp_mono_ms(void);

/* Nanoseconds of CLOCK_MONOTONIC. */
uint64_t kvp_mono_ns(void);

/* Milliseconds since the epoch (CLOCK_REALTIME). */
int64_t kvp_wall_ms(void);

/*
 * Milliseconds from then to now on the monotonic clock, 0 when then is later: a clock read
 * before a lock can be older than a time another thread stamped since, and the unsigned
 * difference must not wrap around into an age of 584 million years.
 */
static inline uint64_t kvp_ms_since(uint64_t now, uint64_t then)
{
    return now > then ? now - then : 0;
}

#endif /* KVP_CLOCK_H */
