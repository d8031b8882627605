/*
 * expiry.c - the daemon's housekeeping thread: once a second it cancels the reservations older
 * than --reserve-timeout, reports the counts of rate-limited log lines (log.c), and looks for a
 * shared segment that shrank under the daemon (seg_guard.h). Woken early at shutdown.
 *
 * A lost segment is the core's decision, told to the front ends through the owners (owner.h),
 * never acted on here in any front end's terms. The guard has replaced the mapping with private
 * memory already; this thread then, once:
 *   - stops the registry offering shared memory (kvp_registry_lose_shm(): a new registration
 *     that claims it gets inline) and learns which owners have an instance on it;
 *   - tells those owners' front ends (KVP_OWNER_SHM_LOST): each moves its workers off shared
 *     memory in its own terms (kvpool's connections are closed, and their libraries reconnect
 *     and register again, inline), since a reservation written through a mapping the daemon no
 *     longer shares could only be refused;
 *   - drops the chunks, whose bytes are lost (kvp_store_clear()), and says so in one ERROR line;
 *   - a second later drops again the chunks reserved before the loss (the ones pinned the first
 *     time, once the transfers that pinned them have ended, and the ones committed meanwhile).
 * It also ends a warm restart's hold on the pages of the previous daemon's stores in progress
 * once --reserve-timeout has passed (kvp_warm_tick()).
 *
 * Threads: the thread itself, and kvp_expiry_stop() on the main thread; expiry_lock guards only
 * the sleep (with expiry_cv) and is released before the store, registry or owners are touched.
 */
#include "core/expiry.h"

#include <inttypes.h>
#include <pthread.h>
#include <time.h>

#include "base/log.h"
#include "core/daemon.h"
#include "core/owner.h"
#include "core/seg_guard.h"
#include "core/stats.h"

/* The segment shrank to size_now bytes (-1: unknown): see the design note. */
static void segment_lost(struct kvp_server *s, int64_t size_now)
{
    static uint64_t owners[KVP_MAX_INSTANCES]; /* this thread's only */
    struct kvp_clear_result r;
    uint32_t nowners = 0;

    uint32_t on_shm = kvp_registry_lose_shm(&s->registry, kvp_seg_guard_reason(), owners,
                                            KVP_MAX_INSTANCES, &nowners);
    uint32_t told = kvp_owners_notify(&s->owners, KVP_OWNER_SHM_LOST, owners, nowners);
    kvp_store_clear(&s->store, &r);
    log_error("The shared segment /dev/shm/%s shrank to %lld of %" PRIu64 " bytes under kvpoold "
              "(another process truncated it). kvpoold no longer uses shared memory: its pool is "
              "private memory now, the %" PRIu64 " chunks it held are dropped (%" PRIu64
              " pinned ones once released), and every worker is served inline (%" PRIu32
              " instance(s) on shm had their connection closed, to register again)",
              s->seg.name, (long long)size_now, s->seg.size, r.dropped, r.pinned, on_shm);
    log_debug("Told %" PRIu32 " of the %" PRIu32 " owner(s) with an instance on shm that the "
              "segment is lost",
              told, nowners);
}

static void *expiry_main(void *arg)
{
    struct kvp_server *s = arg;
    kvp_thread_name("kvp-expiry");
    /* The chunks pinned when the segment was lost are still there, reserved before lost_ms;
     * the ones stored since, in private memory, are sound. */
    bool clear_again = false;
    uint64_t lost_ms = 0;

    pthread_mutex_lock(&s->expiry_lock);
    while (!atomic_load(&s->stopping)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&s->expiry_cv, &s->expiry_lock, &ts);
        if (atomic_load(&s->stopping))
            break;
        pthread_mutex_unlock(&s->expiry_lock);
        kvp_log_rl_flush(kvp_mono_ms());
        int64_t size_now;
        kvp_seg_guard_check();
        if (clear_again) {
            struct kvp_clear_result r;
            kvp_store_clear_older(&s->store, lost_ms, &r);
            clear_again = false;
            log_debug("Dropped %" PRIu64 " more chunks of the lost segment", r.dropped);
        }
        if (kvp_seg_guard_take_report(&size_now)) {
            lost_ms = kvp_mono_ms();
            segment_lost(s, size_now);
            clear_again = true;
        }
        /* SIGHUP may change it: every round reads it anew. */
        uint32_t timeout_s = atomic_load_explicit(&s->reserve_timeout_s, memory_order_relaxed);
        uint32_t n = kvp_store_expire(&s->store, kvp_mono_ms(), (uint64_t)timeout_s * 1000);
        if (n) {
            KVP_COUNT(reservations_expired, n);
            log_warn("Cancelled %" PRIu32 " reserved chunk(s) not committed within %" PRIu32 " s",
                     n, timeout_s);
        }
        /* A warm restart's pages held back from the previous daemon's stores, in time. */
        kvp_warm_tick(&s->warm, &s->store, kvp_mono_ms());
        pthread_mutex_lock(&s->expiry_lock);
    }
    pthread_mutex_unlock(&s->expiry_lock);
    return NULL;
}

int kvp_expiry_start(struct kvp_server *s)
{
    pthread_mutex_init(&s->expiry_lock, NULL);
    pthread_cond_init(&s->expiry_cv, NULL);
    int rc = kvp_thread_create(&s->expiry_thread, NULL, expiry_main, s);
    if (rc) {
        pthread_mutex_destroy(&s->expiry_lock);
        pthread_cond_destroy(&s->expiry_cv);
        return -rc;
    }
    s->expiry_started = true;
    return 0;
}

void kvp_expiry_stop(struct kvp_server *s)
{
    if (!s->expiry_started)
        return;
    pthread_mutex_lock(&s->expiry_lock);
    pthread_cond_signal(&s->expiry_cv);
    pthread_mutex_unlock(&s->expiry_lock);
    pthread_join(s->expiry_thread, NULL);
    pthread_mutex_destroy(&s->expiry_lock);
    pthread_cond_destroy(&s->expiry_cv);
    s->expiry_started = false;
}
