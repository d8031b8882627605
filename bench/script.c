/*
 * script.c - a helper script as a child process that answers one line per command: the Python
 * sides of the benchmark (bench/python_path.py for the "python" section, bench/lmcache_worker.py
 * for the "lmcache" section) run this way, so that their repetitions interleave with the C
 * side's and share its clock.
 *
 * The child gets the command lines on its stdin and writes its answers on its stdout; its stderr
 * goes to a log file in the bench's directory, whose tail is printed when something fails. It
 * gets SIGTERM if the bench dies (PR_SET_PDEATHSIG) and exits at EOF on its stdin. Every wait for
 * an answer is bounded (KVPB_SCRIPT_TIMEOUT_MS). An answer that does not start with "ok" ends the
 * run with the command, the answer and the log: no number from a script that failed.
 * Single-threaded.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#define SCRIPT_LINE_MAX (1 << 20)

int kvpb_script_start(struct kvpb_script *s, const char *name, char *const argv[],
                      char *const env[], const char *log)
{
    int in[2], out[2], rc;

    *s = (struct kvpb_script){.in = -1, .out = -1};
    snprintf(s->ch.name, sizeof(s->ch.name), "%s", name);
    snprintf(s->ch.log, sizeof(s->ch.log), "%s", log);
    s->line = malloc(SCRIPT_LINE_MAX);
    if (!s->line)
        return -ENOMEM;
    s->line[0] = '\0';
    if (pipe2(in, O_CLOEXEC) < 0) {
        rc = -errno;
        goto out_free;
    }
    if (pipe2(out, O_CLOEXEC) < 0) {
        rc = -errno;
        goto out_close_in;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        rc = -errno;
        goto out_close_out;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd < 0 || dup2(in[0], STDIN_FILENO) < 0 || dup2(out[1], STDOUT_FILENO) < 0 ||
            dup2(fd, STDERR_FILENO) < 0)
            _exit(126);
        for (size_t i = 0; env && env[i]; i++)
            putenv(env[i]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    s->ch.pid = pid;
    s->in = in[1];
    s->out = out[0];
    return 0;

out_close_out:
    close(out[0]);
    close(out[1]);
out_close_in:
    close(in[0]);
    close(in[1]);
out_free:
    free(s->line);
    s->line = NULL;
    return rc;
}

int kvpb_script_read(struct kvpb_script *s)
{
    /* Drop the previous line, keep what followed it. */
    memmove(s->line, s->line + s->next, s->have - s->next);
    s->have -= s->next;
    s->next = 0;
    s->line[s->have] = '\0';
    for (;;) {
        char *nl = memchr(s->line, '\n', s->have);
        if (nl) {
            *nl = '\0';
            s->next = (size_t)(nl - s->line) + 1;
            return 0;
        }
        if (s->have + 1 >= SCRIPT_LINE_MAX)
            return -E2BIG;
        struct pollfd pfd = {.fd = s->out, .events = POLLIN};
        int r = poll(&pfd, 1, KVPB_SCRIPT_TIMEOUT_MS);
        if (r == 0)
            return -ETIMEDOUT;
        if (r < 0 && errno == EINTR)
            continue;
        ssize_t n = read(s->out, s->line + s->have, SCRIPT_LINE_MAX - 1 - s->have);
        if (n == 0)
            return -EPIPE;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        s->have += (size_t)n;
        s->line[s->have] = '\0';
    }
}

char *kvpb_script_cmd(struct kvpb_script *s, const char *cmd)
{
    size_t len = strlen(cmd);
    int rc = write(s->in, cmd, len) == (ssize_t)len ? kvpb_script_read(s) : -EPIPE;
    if (rc < 0 || strncmp(s->line, "ok", 2) != 0) {
        fprintf(stderr, "kvpool-bench: %s: %.*s -> %s\n", s->ch.name, (int)(len - 1), cmd,
                rc < 0 ? strerror(-rc) : s->line);
        kvpb_child_print_log(&s->ch, 20);
        exit(1);
    }
    return s->line + 2;
}

void kvpb_script_timed(struct kvpb_script *s, const char *cmd, uint32_t nops, uint64_t want_bytes,
                       double *ns, double *lat)
{
    char *a = kvpb_script_cmd(s, cmd), *end;
    *ns = strtod(a, &end);
    uint64_t bytes = strtoull(end, &end, 10);
    uint32_t k = 0;
    for (char *e = end; k < nops; k++, end = e) {
        lat[k] = strtod(end, &e);
        if (e == end)
            break;
    }
    if (!(*ns > 0) || bytes != want_bytes || k != nops) {
        fprintf(stderr, "kvpool-bench: %s: '%.*s' answered '%.80s' for %u operations\n", s->ch.name,
                (int)strcspn(cmd, "\n"), cmd, a, nops);
        exit(1);
    }
}

void kvpb_script_stop(struct kvpb_script *s)
{
    if (s->in >= 0)
        close(s->in); /* EOF on its stdin: the script exits */
    if (s->out >= 0)
        close(s->out);
    s->in = s->out = -1;
    /* Give it 5 s to finish before a signal. */
    int st = -1;
    for (int waited = 0; s->ch.pid > 0 && waited < 5000; waited += 10) {
        if (waitpid(s->ch.pid, &st, WNOHANG) == s->ch.pid) {
            s->ch.pid = 0;
            break;
        }
        kvpb_sleep_ms(10);
    }
    if (s->ch.pid > 0)
        st = kvpb_child_stop(&s->ch, 5000);
    else
        st = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (st != 0) {
        fprintf(stderr, "kvpool-bench: %s exited with status %d\n", s->ch.name, st);
        kvpb_child_print_log(&s->ch, 20);
    }
    free(s->line);
    s->line = NULL;
}
