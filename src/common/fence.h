/*
 * fence.h - the one fence for memory another process reads: a page of the shared segment or of
 * the warm-restart index, which a worker maps or the next kvpoold reads after this one died.
 * Writes before a release fence are seen before the write after it (the "magic last" rule of
 * every header), also on weakly ordered CPUs.
 *
 * ThreadSanitizer does not model fences, and GCC refuses them under -fsanitize=thread: there a
 * compiler barrier stands in (TSan runs on x86, whose stores are not reordered with each other,
 * and nothing of these pages synchronises two threads of the daemon).
 */
#ifndef KVP_FENCE_H
#define KVP_FENCE_H

#include <stdatomic.h>

#if defined(__SANITIZE_THREAD__)
#define kvp_shared_fence(order) atomic_signal_fence(order)
#else
#define kvp_shared_fence(order) atomic_thread_fence(order)
#endif

#endif /* KVP_FENCE_H */
