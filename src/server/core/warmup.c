/*
 * warmup.c - reserving the rest of the pool in the background.
 *
 * Design. Reserving a pool (posix_fallocate plus the first touch of every page, segment.c) runs
 * at memory-zeroing speed: seconds for tens of GiB. Start-up reserves only the first
 * KVP_RESERVE_FIRST bytes, so the daemon serves within a second whatever the pool's size; this
 * thread reserves the rest step by step and after each step lets the store hand out the pages
 * just reserved (kvp_store_extend), once the warm-restart index's records of those pages are
 * reserved too (kvp_warm_cover). An adopted pool continues from the part its previous owner had
 * reserved. The no-SIGBUS guarantee holds throughout: the allocator
 * never returns a page beyond the reserved part, so a store during the warm-up gets space there
 * (evicting, as in a full pool) or the usual "no space" answer.
 *
 * Outcomes, each logged once: the whole pool reserved (INFO, with the time and GB/s); a failed
 * allocation (WARN: the pool stays at the part reserved so far, which the status report and the
 * pool_reserved_bytes gauge show); a stop request (nothing logged: the daemon is stopping).
 *
 * Threads: one thread, started after the socket listens and joined by kvp_server_destroy()
 * before the segment is unmapped. It touches the segment's pages beyond the reserved part, which
 * no other thread accesses, and the store only through its locked functions.
 */
#include "core/warmup.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "base/log.h"
#include "base/notify.h"
#include "common/errors.h"
#include "core/daemon.h"

/* Bytes [0, reserved) of the segment are reserved: so is the pool in them. */
static void on_step(void *arg, uint64_t reserved)
{
    struct kvp_server *s = arg;
    /* The index's records of those pages first: a chunk placed there is sealed into them. */
    kvp_warm_cover(&s->warm, kvp_segment_pool_bytes(reserved));
    kvp_store_extend(&s->store, kvp_segment_pool_bytes(reserved));
}

static void *warmup_main(void *arg)
{
    struct kvp_server *s = arg;
    kvp_thread_name("kvp-warmup");
    char why[256], status[400];

    int rc = kvp_segment_reserve_rest(&s->seg, on_step, s, why, sizeof(why));
    if (rc == -ECANCELED)
        return NULL;
    uint64_t pool = kvp_segment_pool_bytes(s->seg.reserved);
    if (rc) {
        snprintf(status, sizeof(status),
                 "Serving with a pool of %" PRIu64 " of the configured %" PRIu64 " bytes: %s", pool,
                 s->cfg.l1_size, why);
        log_warn("%s", status);
    } else {
        snprintf(status, sizeof(status), "Serving; the whole pool (%" PRIu64 " bytes) is reserved",
                 pool);
    }
    kvp_notify_status(status);
    return NULL;
}

int kvp_warmup_start(struct kvp_server *s)
{
    /* From here on seg.reserved is the warm-up thread's: others read this copy. */
    s->reserved_at_start = s->seg.reserved;
    if (s->seg.reserved >= s->seg.size)
        return 0;
    int rc = kvp_thread_create(&s->warmup_thread, NULL, warmup_main, s);
    if (rc) {
        log_warn("Cannot start reserving the rest of the pool (%s): serving with %" PRIu64 " bytes",
                 kvp_strerror(-rc), kvp_segment_pool_bytes(s->seg.reserved));
        /* Workers stop waiting for more (seg_header.h). */
        kvp_seg_header_publish_reserved(s->seg.base, s->seg.reserved, true);
        return rc;
    }
    s->warmup_started = true;
    return 0;
}

void kvp_warmup_join(struct kvp_server *s)
{
    if (!s->warmup_started)
        return;
    pthread_join(s->warmup_thread, NULL);
    s->warmup_started = false;
}
