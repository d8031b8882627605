/*
 * placement.c - running a connection's thread on the CPU of the worker it serves.
 *
 * Design. A request is a synchronous round trip: the worker sends and sleeps until the reply
 * comes, and the connection thread works only while the worker waits. When the two run on
 * different CPUs, every request wakes an idle CPU and every reply wakes another; on virtual
 * machines an idle virtual CPU sleeps in the hypervisor, and each such wake-up costs tens of
 * microseconds (measured on the 2-vCPU development VM: a Unix-socket ping-pong between two
 * processes on different CPUs takes 65-80 us, on one CPU 4 us). The kernel's wake-up placement
 * does not put them together for a daemon's long-lived thread. So each request carries its
 * sender's CPU (KVP_REQ_CPU_SHIFT in the header's flags; the library takes it from
 * sched_getcpu()), and the connection thread binds itself to that CPU whenever it changes: the
 * worker's send then wakes a thread on the CPU that is about to go idle, and the reply wakes the
 * worker there. Nothing is lost in parallelism, since the two never run at the same time; with
 * many workers each connection thread follows its own worker, so the load spreads as the
 * workers do. The library's half is in src/client/conn.c: it yields its CPU for a moment before
 * it sleeps for a reply, so that it is not woken on another, idle CPU.
 *
 * A CPU outside the daemon's allowed set (a container's cpuset, a CPUAffinity= of the service)
 * makes sched_setaffinity fail with EINVAL: following stops for that connection and its thread
 * keeps the affinity it had. --follow-cpu off disables it (the threads then float as before).
 *
 * Threads: each connection thread, for itself only.
 */
#include "kvp/placement.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>

#include "base/log.h"
#include "kvp/session.h"

void kvp_placement_follow(struct kvp_session *c, uint32_t hint, bool on)
{
    if (hint == 0 || c->placement_off || !on)
        return;
    int cpu = (int)hint - 1;
    if (cpu == c->cpu || cpu >= CPU_SETSIZE)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    if (rc) {
        c->placement_off = true;
        log_debug("Connection %llu: cannot run on CPU %d of its worker (%s); not following it",
                  (unsigned long long)c->owner.id, cpu,
                  rc == EINVAL ? "not allowed here" : "error");
        return;
    }
    c->cpu = cpu;
}
