/*
 * daemon.c - the servers the benchmark starts: kvpoold and redis-server, as child processes;
 * and the host's room for one (free memory, free /dev/shm).
 *
 * A server runs with stdout and stderr appended to a log file in the bench's temporary
 * directory (printed when it fails to start), asks the kernel for SIGTERM if the bench dies
 * (PR_SET_PDEATHSIG), and is stopped with SIGTERM, then SIGKILL after a timeout. Readiness is
 * an answered request (a kvpool ping, a Redis PING), never a sleep, and every wait is bounded.
 *
 * kvpoold gets a private socket, a unique segment name and --log-level warn, so that logging
 * costs nothing during the measurements. Its pool is pre-faulted at start-up (that is the
 * daemon's design), which for 1 GiB takes a second or two on a small VM: hence the generous
 * start-up timeout.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

uint64_t kvpb_mem_available(void)
{
    char line[256];
    uint64_t kib = 0;
    FILE *f = fopen("/proc/meminfo", "r");

    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib * KVPB_KiB;
}

uint64_t kvpb_free_devshm(void)
{
    struct statvfs v;
    return statvfs("/dev/shm", &v) == 0 ? (uint64_t)v.f_bavail * v.f_frsize : 0;
}

void kvpb_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

int kvpb_child_spawn(struct kvpb_child *ch, const char *name, char *const argv[], const char *log)
{
    snprintf(ch->name, sizeof(ch->name), "%s", name);
    snprintf(ch->log, sizeof(ch->log), "%s", log);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0)
            _exit(126);
        execv(argv[0], argv);
        _exit(127);
    }
    ch->pid = pid;
    return 0;
}

bool kvpb_child_alive(struct kvpb_child *ch)
{
    if (ch->pid <= 0)
        return false;
    if (waitpid(ch->pid, NULL, WNOHANG) == ch->pid) {
        ch->pid = 0;
        return false;
    }
    return true;
}

int kvpb_child_stop(struct kvpb_child *ch, int timeout_ms)
{
    int status = 0;

    if (ch->pid <= 0)
        return 0;
    kill(ch->pid, SIGTERM);
    for (int waited = 0;; waited += 10) {
        pid_t r = waitpid(ch->pid, &status, WNOHANG);
        if (r == ch->pid)
            break;
        if (r < 0 || waited >= timeout_ms) {
            kill(ch->pid, SIGKILL);
            waitpid(ch->pid, &status, 0);
            ch->pid = 0;
            return -1;
        }
        kvpb_sleep_ms(10);
    }
    ch->pid = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void kvpb_child_print_log(const struct kvpb_child *ch, int lines)
{
    char buf[64 * 1024];
    FILE *f = fopen(ch->log, "r");
    if (!f) {
        fprintf(stderr, "(no log from %s)\n", ch->name);
        return;
    }
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* Print from the start of the lines-th last line. */
    size_t start = n;
    for (int seen = 0; start > 0; start--)
        if (buf[start - 1] == '\n' && ++seen > lines)
            break;
    fprintf(stderr, "--- last lines of the %s log (%s) ---\n%s", ch->name, ch->log, buf + start);
}

bool kvpb_find_exe(const char *name, char *out, size_t size)
{
    if (strchr(name, '/')) {
        snprintf(out, size, "%s", name);
        return access(out, X_OK) == 0;
    }
    const char *path = getenv("PATH");
    if (!path || !path[0])
        path = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";
    /* Debian puts redis-server in /usr/bin, but a root PATH may differ: try sbin too. */
    char dirs[4096];
    snprintf(dirs, sizeof(dirs), "%s:/usr/sbin:/usr/bin", path);
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        struct stat st;
        snprintf(out, size, "%s/%s", d, name);
        if (stat(out, &st) == 0 && S_ISREG(st.st_mode) && access(out, X_OK) == 0)
            return true;
    }
    out[0] = '\0';
    return false;
}

int kvpb_wait_kvpoold(const char *socket, struct kvpb_child *ch, int timeout_ms)
{
    for (int waited = 0;; waited += 20) {
        kvp_client *c = NULL;
        kvp_opts o = {.socket_path = socket, .timeout_ms = 5000};
        int rc = kvp_client_open(&o, &c);
        if (rc == 0) {
            rc = kvp_ping(c);
            kvp_client_close(c);
            if (rc == 0)
                return 0;
        }
        if (ch && !kvpb_child_alive(ch)) {
            fprintf(stderr, "kvpool-bench: kvpoold exited during start-up\n");
            kvpb_child_print_log(ch, 20);
            return -ECHILD;
        }
        if (waited >= timeout_ms) {
            fprintf(stderr, "kvpool-bench: kvpoold did not answer on %s within %d s: %s\n", socket,
                    timeout_ms / 1000, kvp_strerror(rc));
            if (ch)
                kvpb_child_print_log(ch, 20);
            return -ETIMEDOUT;
        }
        kvpb_sleep_ms(20);
    }
}

int kvpb_kvpoold_start(struct kvpb_child *ch, const char *binary, const char *dir, uint64_t l1_size,
                       uint32_t chunk_tokens, char *socket, size_t size)
{
    char l1[32], tokens[16], shm[64], log[256];

    snprintf(socket, size, "%s/kvpoold.sock", dir);
    snprintf(log, sizeof(log), "%s/kvpoold.log", dir);
    snprintf(l1, sizeof(l1), "%" PRIu64, l1_size);
    snprintf(tokens, sizeof(tokens), "%u", chunk_tokens);
    snprintf(shm, sizeof(shm), "bench_%d", (int)getpid());
    char *const argv[] = {
        (char *)binary, "--socket", socket,        "--l1-size", l1,       "--chunk-size", tokens,
        "--shm-name",   shm,        "--log-level", "warn",      "--http", "off",          NULL,
    };
    int rc = kvpb_child_spawn(ch, "kvpoold", argv, log);
    if (rc < 0)
        return rc;
    rc = kvpb_wait_kvpoold(socket, ch, 120000);
    if (rc < 0)
        kvpb_child_stop(ch, 5000);
    return rc;
}
