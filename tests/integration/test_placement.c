/*
 * test_placement.c - where the daemon's work runs and what a worker's registration costs.
 *
 * CPU following (--follow-cpu, placement.c): a worker pinned to a CPU sends requests, and the
 * daemon thread serving its connection is then allowed on that CPU only; when the worker moves,
 * the thread moves with it; with --follow-cpu off no thread is ever bound. Read from
 * /proc/<daemon>/task/<tid>/status (Cpus_allowed_list). Needs two CPUs the test may use, else
 * skipped with a message.
 *
 * Registration: mapping a 1 GiB pool must not fault its pages on the caller's thread (the
 * library pre-faults on a thread of its own): the registering thread's minor faults, from
 * getrusage(RUSAGE_THREAD), stay far below the pool's 262144 pages.
 */
#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

/* Two CPUs this process may run on, or false. */
static bool two_cpus(int *a, int *b)
{
    cpu_set_t set;
    int n = 0;
    if (sched_getaffinity(0, sizeof(set), &set) != 0)
        return false;
    for (int i = 0; i < CPU_SETSIZE && n < 2; i++)
        if (CPU_ISSET(i, &set))
            *(n++ ? b : a) = i;
    return n == 2;
}

static void pin_self(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    assert_int_equal(sched_setaffinity(0, sizeof(set), &set), 0);
}

static void unpin_self(const cpu_set_t *all)
{
    assert_int_equal(sched_setaffinity(0, sizeof(*all), all), 0);
}

/* How many threads of pid are allowed exactly on CPU cpu and nowhere else. */
static int threads_bound_to(pid_t pid, int cpu)
{
    char path[64], want[32], line[256];
    int n = 0;
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    snprintf(want, sizeof(want), "Cpus_allowed_list:\t%d\n", cpu);
    DIR *d = opendir(path);
    assert_non_null(d);
    /* cppcheck-suppress readdirCalled ; readdir_r is deprecated, and d is private to this call */
    for (struct dirent *e = readdir(d); e; e = readdir(d)) {
        if (e->d_name[0] == '.')
            continue;
        char st[400];
        snprintf(st, sizeof(st), "%s/%s/status", path, e->d_name);
        FILE *f = fopen(st, "re");
        if (!f)
            continue; /* a thread that just ended */
        while (fgets(line, sizeof(line), f))
            if (strcmp(line, want) == 0)
                n++;
        fclose(f);
    }
    closedir(d);
    return n;
}

static void follow_case(bool on)
{
    int a, b;
    cpu_set_t all;
    if (!two_cpus(&a, &b)) {
        fprintf(stderr, "skipped: this test needs two CPUs it may run on\n");
        skip();
    }
    assert_int_equal(sched_getaffinity(0, sizeof(all), &all), 0);
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size",       "16MiB", "--chunk-size", "16", "--follow-cpu",
                          on ? "on" : "off", NULL};
    kvpt_daemon_start(&d, args);
    kvp_client *c = kvpt_connect(&d);

    pin_self(a);
    assert_int_equal(kvp_ping(c), 0);
    assert_int_equal(threads_bound_to(d.pid, a), on ? 1 : 0);
    pin_self(b);
    assert_int_equal(kvp_ping(c), 0);
    assert_int_equal(threads_bound_to(d.pid, b), on ? 1 : 0);
    assert_int_equal(threads_bound_to(d.pid, a), 0);
    unpin_self(&all);

    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

static void test_thread_follows_worker(void **state)
{
    (void)state;
    follow_case(true);
}

static void test_follow_off(void **state)
{
    (void)state;
    follow_case(false);
}

static long minor_faults(void)
{
    struct rusage ru;
    assert_int_equal(getrusage(RUSAGE_THREAD, &ru), 0);
    return ru.ru_minflt;
}

static void test_registration_does_not_fault_the_pool(void **state)
{
    (void)state;
    struct kvpt_daemon d;
    const char *args[] = {"--l1-size", "1GiB", "--chunk-size", "16", NULL};
    kvpt_daemon_start(&d, args);
    kvp_client *c = kvpt_connect(&d);
    kvp_register_opts o = kvpt_layout_big("reg-cost", KVP_TRANSPORT_SHM);
    kvp_instance *inst = NULL;

    long before = minor_faults();
    assert_int_equal(kvp_register(c, &o, &inst), 0);
    long faults = minor_faults() - before;
    assert_int_equal(kvp_instance_get_info(inst)->transport, KVP_TRANSPORT_SHM);
    if (faults > 4096)
        fail_msg("registering took %ld page faults on the caller's thread", faults);

    /* The mapping works at once, while (or after) the library pre-faults it. */
    assert_int_equal(kvpt_store_seq(inst, 3, 16), 16);
    kvpt_assert_seq(inst, 3, 16, 16);
    kvp_client_close(c);
    kvpt_daemon_stop(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_thread_follows_worker),
        cmocka_unit_test(test_follow_off),
        cmocka_unit_test(test_registration_does_not_fault_the_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
