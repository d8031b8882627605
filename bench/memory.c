/*
 * memory.c - the "memory" section: the daemon's resident memory beyond its pool, with 64
 * connected workers.
 *
 * The pool is shared memory, counted by the kernel in RssShmem; everything else the daemon
 * holds (its heap: per-connection state, the object index, buffers; thread stacks; its code)
 * is RssAnon + RssFile. The section reads /proc/<daemon pid>/status twice: with only the
 * bench's own client connected ("daemon-rss-base"), and after 64 more clients have each
 * registered one instance ("daemon-rss-64"). It runs last, on the run's daemon, after the
 * other sections have filled its pool with chunks, as a long-running daemon's is.
 *
 * The 64 clients live in a child process (kvp_client_open 64 times; the daemon allows 256
 * connections by default, --max-clients), each registering on the auto transport, so shm
 * wherever the daemon offers it. The child sets KVPOOL_PREFAULT=0 for its library: the
 * library's pre-fault of each client's mapping changes nothing in the daemon, and 64 walks
 * over the pool would only load the machine. The child reports over a pipe, then holds its
 * connections until the parent has read the daemon's status.
 *
 * A client that fails to connect or register makes the row invalid (the message says why); a
 * daemon that is not the bench's child (--socket) skips the section, with a note.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#define MEM_CLIENTS 64u
#define MEM_TIMEOUT_MS 120000

/* What the child reports. */
struct mem_report {
    int rc;
    uint32_t shm; /* instances on the shm transport */
    char err[224];
};

/* Fills the four RSS figures of r (MiB) from /proc/pid/status. Returns 0 or -errno. */
static int read_status(pid_t pid, struct kvpb_row *r)
{
    char path[64], line[256];
    uint64_t kib;
    int found = 0;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -errno;
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "VmRSS: %" SCNu64, &kib) == 1)
            r->vm_rss_mib = (double)kib / 1024.0, found++;
        else if (sscanf(line, "RssAnon: %" SCNu64, &kib) == 1)
            r->rss_anon_mib = (double)kib / 1024.0, found++;
        else if (sscanf(line, "RssFile: %" SCNu64, &kib) == 1)
            r->rss_file_mib = (double)kib / 1024.0, found++;
        else if (sscanf(line, "RssShmem: %" SCNu64, &kib) == 1)
            r->rss_shmem_mib = (double)kib / 1024.0, found++;
    }
    fclose(f);
    if (found != 4)
        return -ENODATA;
    r->rss_mib = r->rss_anon_mib + r->rss_file_mib;
    return 0;
}

/* The child: 64 clients, one instance each; reports on out, holds them until `go` closes. */
static void clients_main(const char *socket, uint32_t chunk_tokens, uint64_t chunk, int out, int go)
{
    static kvp_client *c[MEM_CLIENTS];
    struct mem_report rep = {0};
    kvp_register_opts ro;
    char id[64], b;

    setenv("KVPOOL_PREFAULT", "0", 1);
    if (kvpb_register_opts(id, chunk, chunk_tokens, KVP_TRANSPORT_AUTO, &ro) < 0) {
        rep.rc = -EINVAL;
        snprintf(rep.err, sizeof(rep.err), "no layout has %" PRIu64 "-byte chunks", chunk);
        goto out_report;
    }
    for (uint32_t i = 0; i < MEM_CLIENTS; i++) {
        kvp_opts o = {.socket_path = socket, .timeout_ms = 60000};
        kvp_instance *inst;
        int rc = kvp_client_open(&o, &c[i]);
        if (rc < 0) {
            rep.rc = rc;
            snprintf(rep.err, sizeof(rep.err), "client %u: connect: %s (%s)", i, kvp_strerror(rc),
                     kvp_last_error(NULL));
            goto out_report;
        }
        snprintf(id, sizeof(id), "bench-memory-%u", i);
        rc = kvp_register(c[i], &ro, &inst);
        if (rc < 0) {
            rep.rc = rc;
            snprintf(rep.err, sizeof(rep.err), "client %u: register: %s (%s)", i, kvp_strerror(rc),
                     kvp_last_error(c[i]));
            goto out_report;
        }
        rep.shm += kvp_instance_get_info(inst)->transport == KVP_TRANSPORT_SHM;
    }
out_report:
    if (write(out, &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
        _exit(1);
    /* Hold the connections until the parent has read the daemon's status. */
    while (read(go, &b, 1) < 0 && errno == EINTR)
        ;
    for (uint32_t i = 0; i < MEM_CLIENTS; i++)
        kvp_client_close(c[i]);
    _exit(0);
}

/* Starts the clients' process and waits for its report. Returns its pid, or -1 (said). */
static pid_t start_clients(const char *socket, uint32_t chunk_tokens, uint64_t chunk,
                           struct mem_report *rep, int *go)
{
    int up[2], down[2];

    if (pipe2(up, O_CLOEXEC) < 0 || pipe2(down, O_CLOEXEC) < 0) {
        perror("kvpool-bench: memory: pipe");
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("kvpool-bench: memory: fork");
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        close(up[0]);
        close(down[1]);
        clients_main(socket, chunk_tokens, chunk, up[1], down[0]);
    }
    close(up[1]);
    close(down[0]);
    *go = down[1];
    struct pollfd pfd = {.fd = up[0], .events = POLLIN};
    ssize_t n = -1;
    if (poll(&pfd, 1, MEM_TIMEOUT_MS) == 1)
        n = read(up[0], rep, sizeof(*rep));
    close(up[0]);
    if (n != (ssize_t)sizeof(*rep)) {
        printf("memory: the clients' process did not report within %d s\n", MEM_TIMEOUT_MS / 1000);
        kill(pid, SIGKILL);
        close(*go);
        waitpid(pid, NULL, 0);
        return -1;
    }
    return pid;
}

void kvpb_memory_phase(const struct kvpb_config *cfg, const char *socket, pid_t daemon_pid,
                       uint32_t chunk_tokens, struct kvpb_rows *rows)
{
    struct kvpb_row base = kvpb_row_blank(KVPB_T_KVPOOL, KVPB_OP_RSS_BASE, "");
    struct kvpb_row full = kvpb_row_blank(KVPB_T_KVPOOL, KVPB_OP_RSS64, "");
    struct mem_report rep = {0};
    uint64_t chunk = cfg->quick ? 256 * KVPB_KiB : 4 * KVPB_MiB;
    int go = -1, rc;
    double load;

    if (daemon_pid <= 0) {
        printf("memory: skipped: the daemon was not started by the bench (--socket), its "
               "memory is not read\n");
        return;
    }
    printf("memory: the daemon's RSS, then %u clients with one instance each ...", MEM_CLIENTS);
    fflush(stdout);
    full.workers = MEM_CLIENTS;
    base.samples = full.samples = 1;
    if ((rc = read_status(daemon_pid, &base)) < 0) {
        printf(" cannot read /proc/%d/status: %s\n", (int)daemon_pid, strerror(-rc));
        base.invalid = full.invalid = true;
        goto out_rows;
    }
    pid_t pid = start_clients(socket, chunk_tokens, chunk, &rep, &go);
    if (pid < 0) {
        full.invalid = true;
        goto out_rows;
    }
    if (rep.rc < 0) {
        printf(" %s\n", rep.err);
        full.invalid = true;
    } else if ((rc = read_status(daemon_pid, &full)) < 0) {
        printf(" cannot read /proc/%d/status: %s\n", (int)daemon_pid, strerror(-rc));
        full.invalid = true;
    } else {
        printf(" %u of them on shm; beyond the pool %.1f MiB -> %.1f MiB\n", rep.shm, base.rss_mib,
               full.rss_mib);
    }
    close(go);
    waitpid(pid, NULL, 0);
out_rows:
    if (full.invalid)
        full.rss_mib = full.vm_rss_mib = full.rss_anon_mib = full.rss_file_mib =
            full.rss_shmem_mib = NAN;
    if (getloadavg(&load, 1) == 1)
        base.load1 = full.load1 = load;
    kvpb_rows_push(rows, &base);
    kvpb_rows_push(rows, &full);
    fflush(stdout);
}
