/*
 * watch.c - `kvpool watch`: rates, hit ratio and pool usage on one screen, redrawn every
 * interval, and how the daemon started (warm restart: the adopted chunks still to verify).
 *
 * Design. A frame needs two readings of the status JSON's counters, an interval apart; a rate
 * is the increase over the time between the two replies. A reading from another daemon (a new
 * pid) or one where a counter went back (a restart) gives no rates ("-") rather than nonsense.
 * On a terminal each frame replaces the last (ANSI: cursor home, clear screen); anything else
 * gets the frames one after the other, so a log or a pipe keeps them all. A daemon that stops
 * answering is reported in the frame and watched again: the library reconnects at the next
 * call.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* Counters `watch` turns into rates, by their names in the status JSON. */
#define WATCH_COUNTERS(XX)      \
    XX(requests)                \
    XX(lmcache_requests)        \
    XX(request_errors)          \
    XX(lookups)                 \
    XX(lookup_chunks)           \
    XX(lookup_hit_chunks)       \
    XX(store_chunks_committed)  \
    XX(store_bytes_shm)         \
    XX(store_bytes_inline)      \
    XX(store_bytes_pickle)      \
    XX(store_bytes_envelope)    \
    XX(retrieve_chunks)         \
    XX(retrieve_bytes_shm)      \
    XX(retrieve_bytes_inline)   \
    XX(retrieve_bytes_pickle)   \
    XX(retrieve_bytes_envelope) \
    XX(evictions)

enum watch_counter {
#define WATCH_ENUM(name) W_##name,
    WATCH_COUNTERS(WATCH_ENUM)
#undef WATCH_ENUM
        W_N
};

static const char *const watch_name[W_N] = {
#define WATCH_NAME(name) #name,
    WATCH_COUNTERS(WATCH_NAME)
#undef WATCH_NAME
};

/* One reading of the counters. */
struct sample {
    bool valid;
    int64_t t_us; /* when the reply came (monotonic) */
    uint64_t pid; /* a new pid means a new daemon: its counters start again */
    uint64_t v[W_N];
    bool have[W_N]; /* the daemon reports it (an older one may not) */
};

static void take_sample(json_t *doc, struct sample *s)
{
    json_t *counters = jobj(doc, "counters");

    s->valid = true;
    s->t_us = now_us();
    s->pid = jnum(doc, "pid");
    for (int i = 0; i < W_N; i++)
        s->have[i] = jget(counters, watch_name[i], &s->v[i]);
}

/* Whether rates can be computed from prev to cur: the same daemon, no counter gone back. */
static bool comparable(const struct sample *prev, const struct sample *cur)
{
    if (!prev->valid || !cur->valid || prev->pid != cur->pid || cur->t_us <= prev->t_us)
        return false;
    for (int i = 0; i < W_N; i++)
        if (prev->have[i] && cur->have[i] && cur->v[i] < prev->v[i])
            return false;
    return true;
}

/* The increase of counter i per second, or -1 when unknown. */
static double rate(const struct sample *prev, const struct sample *cur, int i)
{
    if (!comparable(prev, cur) || !prev->have[i] || !cur->have[i])
        return -1;
    return (double)(cur->v[i] - prev->v[i]) * 1e6 / (double)(cur->t_us - prev->t_us);
}

/* A rate with its unit, "12.5/s" or "12.5 chunks/s", or "-". */
static const char *fmt_rate(double r, const char *unit, char *buf, size_t size)
{
    if (r < 0)
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.1f%s", r, unit);
    return buf;
}

/* A byte rate as "12.3 MiB/s", or "-". */
static const char *fmt_byte_rate(double r, char *buf, size_t size)
{
    char tmp[32];
    if (r < 0)
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%s/s", kvp_human_bytes(r, tmp, sizeof(tmp)));
    return buf;
}

/* The sum of two rates, -1 if either is unknown. */
static double sum2(double a, double b)
{
    return a < 0 || b < 0 ? -1 : a + b;
}

/* The transports the counters are kept by (the daemon's names), in the order of the rows of
 * a family by transport in the watch list. */
static const char *const transport_names[] = {"shm", "inline", "pickle", "envelope"};
#define NTRANSPORTS (sizeof(transport_names) / sizeof(transport_names[0]))

/* "Stores      1.2 MiB/s      3.0 chunks/s       (shm ..., inline ..., pickle ..., envelope ...)":
 * byte rates from counter first on, one per transport. A transport an older daemon does not
 * report counts as 0 in the total; shm and inline are always reported. */
static void print_transfers(const char *label, const struct sample *prev, const struct sample *cur,
                            int first, int chunks)
{
    char a[32], d[48], by[NTRANSPORTS][32];
    double total = 0;
    for (size_t t = 0; t < NTRANSPORTS; t++) {
        double r = rate(prev, cur, first + (int)t);
        fmt_byte_rate(r, by[t], sizeof(by[t]));
        if (t < 2 || r >= 0)
            total = sum2(total, r);
    }
    printf("%-11s %-14s %-18s (%s %s, %s %s, %s %s, %s %s)\n", label,
           fmt_byte_rate(total, a, sizeof(a)),
           fmt_rate(rate(prev, cur, chunks), " chunks/s", d, sizeof(d)), transport_names[0], by[0],
           transport_names[1], by[1], transport_names[2], by[2], transport_names[3], by[3]);
}

/* One frame of `watch`: rates over the last interval, then the pool and the instances now. */
static void print_frame(const struct cli *x, json_t *doc, const struct sample *prev,
                        const struct sample *cur)
{
    char a[32], b[32], c[32], d[48], l2[L2_LINE];
    json_t *pool = jobj(doc, "pool");
    time_t now = time(NULL);
    struct tm tm;

    print_headline(x, doc);
    if (localtime_r(&now, &tm))
        strftime(d, sizeof(d), "%Y-%m-%d %H:%M:%S", &tm);
    else
        snprintf(d, sizeof(d), "-");
    printf("%s, rates over the last %.1f s\n\n", d,
           comparable(prev, cur) ? (double)(cur->t_us - prev->t_us) / 1e6 : 0.0);

    /* Every front end's requests; kvpool's less the one status request of this watch. */
    double kvp = rate(prev, cur, W_requests), lmc = rate(prev, cur, W_lmcache_requests);
    if (kvp >= 0 && comparable(prev, cur)) {
        kvp -= 1e6 / (double)(cur->t_us - prev->t_us);
        kvp = kvp < 0 ? 0 : kvp;
    }
    printf("Requests    %-14s errors %s (kvpool %s, lmcache %s; not counting this watch)\n",
           fmt_rate(sum2(kvp, lmc), "/s", a, sizeof(a)),
           fmt_rate(rate(prev, cur, W_request_errors), "/s", b, sizeof(b)),
           fmt_rate(kvp, "/s", c, sizeof(c)), fmt_rate(lmc, "/s", d, sizeof(d)));
    /* The hit ratio of the interval: chunks found over chunks asked about. */
    double asked = rate(prev, cur, W_lookup_chunks), hit = rate(prev, cur, W_lookup_hit_chunks);
    if (asked > 0 && hit >= 0)
        snprintf(c, sizeof(c), "%.1f%%", 100.0 * hit / asked);
    else
        snprintf(c, sizeof(c), "- (no lookups)");
    printf("Lookups     %-14s hit ratio %s\n",
           fmt_rate(rate(prev, cur, W_lookups), "/s", a, sizeof(a)), c);
    _Static_assert(W_store_bytes_envelope - W_store_bytes_shm == NTRANSPORTS - 1 &&
                       W_retrieve_bytes_envelope - W_retrieve_bytes_shm == NTRANSPORTS - 1,
                   "WATCH_COUNTERS lists the byte counters of every transport in order");
    print_transfers("Stores", prev, cur, W_store_bytes_shm, W_store_chunks_committed);
    print_transfers("Retrieves", prev, cur, W_retrieve_bytes_shm, W_retrieve_chunks);
    printf("Evictions   %s\n\n", fmt_rate(rate(prev, cur, W_evictions), "/s", a, sizeof(a)));

    if (pool) {
        printf("Pool        ");
        print_pool(pool);
        putchar('\n');
    }
    /* While adopted chunks are verified by their first reads, "to verify" goes down. */
    if (warm_line(doc, l2, sizeof(l2)))
        printf("Restart     %s\n", l2);
    if (l2_line(doc, l2, sizeof(l2)))
        printf("L2          %s\n", l2);
    json_t *list = json_object_get(doc, "instances");
    char counts[COUNTS], clients[COUNTS];
    printf("Instances   %zu (%s); clients connected besides this watch: %s\n",
           json_array_size(list), transport_counts(list, counts, sizeof(counts)),
           client_counts(doc, false, clients, sizeof(clients)));
}

/* Sleeps for seconds, through signals that do not end the program. */
static void sleep_s(double seconds)
{
    struct timespec ts = {.tv_sec = (time_t)seconds,
                          .tv_nsec = (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/*
 * A frame needs two readings, an interval apart. --once waits one interval and prints one
 * frame; otherwise a frame follows every interval until interrupted. On a terminal each frame
 * replaces the last (ANSI: cursor home, clear screen); anything else gets the frames one after
 * the other, separated by a blank line, so a log or a pipe keeps them all.
 */
int cmd_watch(struct cli *x, const struct cmd_opts *o)
{
    struct sample prev = {.valid = false}, cur;
    bool tty = !o->once && isatty(STDOUT_FILENO);
    int code = cli_connect(x);

    if (code)
        return code;
    json_t *doc = cli_get_status(x, false, &code);
    if (!doc)
        return code;
    take_sample(doc, &prev);
    json_decref(doc);
    for (bool first = true;; first = false) {
        sleep_s(o->interval);
        doc = cli_get_status(x, !o->once, &code);
        if (!doc) {
            if (o->once)
                return code;
            /* Keep watching: the library reconnects at the next call if the daemon restarts. */
            const char *msg = kvp_last_error(x->client);
            printf("%skvpoold at %s: not answering: ",
                   tty     ? "\033[H\033[2J"
                   : first ? ""
                           : "\n",
                   x->path);
            term_puts(stdout, msg[0] ? msg : "-");
            printf("; trying again every %.1f s\n", o->interval);
            fflush(stdout);
            prev.valid = false;
            continue;
        }
        take_sample(doc, &cur);
        fputs(tty ? "\033[H\033[2J" : first ? "" : "\n", stdout);
        print_frame(x, doc, &prev, &cur);
        fflush(stdout);
        json_decref(doc);
        if (o->once)
            return EXIT_SUCCESS;
        prev = cur;
    }
}
