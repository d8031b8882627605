/*
 * seg_guard.c - the daemon outlives a POSIX segment that shrinks under it (see seg_guard.h).
 *
 * Design. A segment that shrinks cannot be prevented (a POSIX shm file cannot be sealed, and
 * whoever may write it may truncate it), and the data beyond the new end is gone. What matters
 * is that the daemon survives it, and everybody else with it. The guard trips on the first sign:
 * a SIGBUS at an address inside the mapping (the daemon's own read or write, for example the L2
 * write-behind computing a chunk's checksum), an EFAULT of a copy the kernel made for the daemon
 * (the caller asks kvp_seg_guard_check(), which compares the file's size with the mapping's), or
 * the once-a-second check of the expiry thread. Tripping replaces the whole mapping, at the same
 * address, by private anonymous memory (MAP_FIXED, no reserve): from then on nothing the daemon
 * does with the pool can fault, whatever is done to the file, and the faulting access simply
 * runs again on the new memory. The rest (one log line, dropping the chunks, serving every
 * worker inline) is done outside the signal handler by whoever takes the report
 * (kvp_seg_guard_take_report(), server.c).
 *
 * The signal handler only uses atomics, fstat and mmap (system calls); a SIGBUS outside the
 * mapping goes to the handler that was there before, or gets the default action.
 *
 * Threads: arm and disarm on the main thread (start-up, shutdown); the rest on any thread. The
 * state is atomics: epoch moves once, from 0 to 1, by the one thread that remaps; threads that
 * fault meanwhile wait for remapped.
 */
#include "core/seg_guard.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

static struct {
    uint8_t *base;
    uint64_t size;
    int fd;
    atomic_bool armed;
    atomic_uint epoch;       /* 0, then 1 once tripped */
    atomic_int remapped;     /* 0 until the trip's remap is done, then 1 (or -1: it failed) */
    atomic_bool reported;    /* kvp_seg_guard_take_report() answered true */
    _Atomic int64_t size_at; /* file size when the trip was seen, -1 unknown */
    struct sigaction old;
} g = {.fd = -1};

/*
 * The one transition. Returns true once the mapping is private memory (now or earlier), false
 * when the remap failed. Async-signal-safe.
 */
static bool trip(void)
{
    unsigned zero = 0;
    struct stat st;

    if (atomic_compare_exchange_strong(&g.epoch, &zero, 1u)) {
        atomic_store(&g.size_at, fstat(g.fd, &st) == 0 ? (int64_t)st.st_size : -1);
        int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE;
        /* cppcheck-suppress invalidFunctionArg ; an anonymous mapping takes fd -1 */
        void *p = mmap(g.base, g.size, PROT_READ | PROT_WRITE, flags, -1, 0);
        atomic_store(&g.remapped, p == (void *)g.base ? 1 : -1);
    }
    /* Another thread trips it: its remap is a system call away. */
    int r;
    while ((r = atomic_load(&g.remapped)) == 0)
        ;
    return r > 0;
}

static void on_sigbus(int sig, siginfo_t *si, void *uctx)
{
    int saved = errno;
    const uint8_t *a = si->si_addr;
    bool ours = si->si_code > 0 && atomic_load(&g.armed) && a >= g.base && a < g.base + g.size;
    if (ours && trip()) {
        errno = saved;
        return; /* the access runs again, on private memory */
    }
    errno = saved;
    /* Not ours (or the remap failed): as if this handler had never been installed. */
    if ((g.old.sa_flags & SA_SIGINFO) && g.old.sa_sigaction) {
        g.old.sa_sigaction(sig, si, uctx);
        return;
    }
    if (g.old.sa_handler == SIG_IGN)
        return;
    if (g.old.sa_handler != SIG_DFL) {
        g.old.sa_handler(sig);
        return;
    }
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGBUS, &dfl, NULL);
    /* A fault runs again and gets the default action; a sent signal is sent again. */
    if (si->si_code <= 0)
        raise(SIGBUS);
}

int kvp_seg_guard_arm(uint8_t *base, uint64_t size, int fd)
{
    g.base = base;
    g.size = size;
    g.fd = fd;
    atomic_store(&g.epoch, 0u);
    atomic_store(&g.remapped, 0);
    atomic_store(&g.reported, false);
    atomic_store(&g.size_at, (int64_t)-1);
    struct sigaction sa = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO};
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &g.old) != 0)
        return -errno;
    atomic_store(&g.armed, true);
    return 0;
}

void kvp_seg_guard_disarm(void)
{
    if (!atomic_exchange(&g.armed, false))
        return;
    sigaction(SIGBUS, &g.old, NULL);
}

bool kvp_seg_guard_check(void)
{
    struct stat st;
    if (!atomic_load(&g.armed))
        return false;
    if (atomic_load(&g.epoch))
        return true;
    if (fstat(g.fd, &st) == 0 && (uint64_t)st.st_size < g.size)
        trip();
    return atomic_load(&g.epoch) != 0;
}

bool kvp_seg_guard_tripped(void)
{
    return atomic_load(&g.epoch) != 0;
}

uint32_t kvp_seg_guard_epoch(void)
{
    return atomic_load(&g.epoch);
}

bool kvp_seg_guard_take_report(int64_t *size_now)
{
    if (!atomic_load(&g.epoch) || atomic_exchange(&g.reported, true))
        return false;
    *size_now = atomic_load(&g.size_at);
    return true;
}

const char *kvp_seg_guard_reason(void)
{
    return "the shared segment shrank under kvpoold (another process truncated it): kvpoold "
           "has stopped using shared memory and serves every worker inline";
}
