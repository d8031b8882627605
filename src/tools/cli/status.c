/*
 * status.c - `kvpool status` and `kvpool instances`: the daemon's state at a glance, made from
 * its status JSON (STATUS in docs/PROTOCOL.md, the same document as GET /api/status).
 *
 * Design. A headline (version, socket, state, pid, uptime), then one line per concern (pool,
 * chunk size, SHM, how the daemon started with the pool a previous one left (warm restart), the
 * L2 tier, clients, totals) and a table of the instances whose columns are as wide as their
 * widest cell. `status --json` prints the document as it came, for jq and scripts.
 * Every string the daemon supplies goes through term.c before it is printed. The headline, the
 * pool line, the warm-restart line and the counts of instances and clients are shared with
 * `watch` (watch.c).
 *
 * The daemon may serve several front ends (kvpool's own protocol, LMCache's): each instance and
 * client names its own ("front_end"), shown in a column and in the counts of clients. Transports
 * and front ends are shown by the name the daemon gives them, so one this program has never seen
 * ("pickle", or a later one) is counted and shown as itself, never folded into another.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

#define WORD 64                      /* a short escaped word: a version, a state, a transport */
#define REASON TERM_ESCAPED_MAX(255) /* an escaped reason (the daemon's are 255 bytes at most) */
#define CELL (WORD + 3 + REASON)     /* one table cell: a name, or a transport and its reason */

/* "kvpoold 1.0.0 at PATH: serving, pid 4863, up 2h 03m" */
void print_headline(const struct cli *x, json_t *doc)
{
    char up[32] = "-", version[WORD], st[WORD];
    uint64_t v;

    if (jget(doc, "uptime_s", &v))
        human_duration(v, up, sizeof(up));
    printf("kvpoold %s at %s: %s, pid %" PRIu64 ", up %s\n",
           term_safe(version, sizeof(version), jstr(doc, "version", "-")), x->path,
           term_safe(st, sizeof(st), jstr(doc, "state", "-")), jnum(doc, "pid"), up);
}

/* "Health:     degraded: <reason>" for each reason of a degraded daemon; nothing when it does
 * its whole job (or does not report it). */
void print_health(json_t *doc)
{
    json_t *health = jobj(doc, "health"), *r;
    char reason[TERM_ESCAPED_MAX(1024)];
    size_t i;
    if (!health || !json_is_true(json_object_get(health, "degraded")))
        return;
    json_array_foreach(json_object_get(health, "reasons"), i, r)
    {
        term_safe(reason, sizeof(reason), json_is_string(r) ? json_string_value(r) : "?");
        printf("%s%s\n", i ? "            " : "Health:     degraded: ", reason);
    }
}

/*
 * "3.00 MiB of 4.00 MiB used (75.0%), 48 objects (2 pinned, 1 reserved)", and while the daemon
 * still reserves the pool in the background ", 256 MiB of 4.00 GiB reserved so far".
 */
void print_pool(json_t *pool)
{
    char used[32], cap[32], pct[16], res[32];
    uint64_t u = jnum(pool, "used_bytes"), c = jnum(pool, "capacity_bytes");

    printf("%s of %s used (%s), %" PRIu64 " objects (%" PRIu64 " pinned, %" PRIu64 " reserved)",
           kvp_human_bytes((double)u, used, sizeof(used)),
           kvp_human_bytes((double)c, cap, sizeof(cap)), percent(u, c, pct, sizeof(pct)),
           jnum(pool, "objects"), jnum(pool, "pinned_objects"), jnum(pool, "reserved_objects"));
    if (json_is_true(json_object_get(pool, "warming")))
        printf(", %s of %s reserved so far",
               kvp_human_bytes((double)jnum(pool, "reserved_bytes"), res, sizeof(res)), cap);
}

/*
 * The L2 tier after its label: "redis://10.0.0.5:6379 up (backlog 3 chunks, 24.0 KiB)",
 * "unix:///run/redis.sock down: Connection refused (backlog 0 chunks, 0 B)", or "off" when the
 * daemon runs without one ("l2": null). "state" ("up", "down", "auth_failed") and "reason" come
 * from newer daemons; without them "up" (a boolean) decides between up and down. The URL is the
 * daemon's masked one (no password). Returns false when the status has no "l2" at all (an older
 * daemon): nothing to print.
 */
bool l2_line(json_t *doc, char *buf, size_t size)
{
    json_t *l2 = json_object_get(doc, "l2");
    char url[REASON], state[WORD], reason[REASON], backlog[32];
    const char *st;

    if (!l2)
        return false;
    if (!json_is_object(l2)) {
        snprintf(buf, size, "off");
        return true;
    }
    st = jstr(l2, "state", NULL);
    if (!st)
        st = json_is_true(json_object_get(l2, "up")) ? "up" : "down";
    else if (strcmp(st, "auth_failed") == 0)
        st = "authentication failed";
    term_safe(url, sizeof(url), jstr(l2, "url", "-"));
    term_safe(state, sizeof(state), st);
    term_safe(reason, sizeof(reason), jstr(l2, "reason", ""));
    snprintf(buf, size, "%s %s%s%s (backlog %" PRIu64 " chunks, %s)", url, state,
             reason[0] ? ": " : "", reason, jnum(l2, "backlog_chunks"),
             kvp_human_bytes((double)jnum(l2, "backlog_bytes"), backlog, sizeof(backlog)));
    return true;
}

/*
 * How the daemon started, after "Warm restart: ": "adopted 512 chunks (1.00 GiB) of pid 4863
 * after a crash in 12 ms, 3 dropped; 509 to verify, 0 corrupt" (the adopted chunks not read yet,
 * and those a first read found corrupt, from the gauges and counters: they change while the
 * daemon serves), "on, cold start (<why a pool it found was refused>)", "off", or "off for this
 * run, cold start (<reason>)" when a pool was refused and the daemon keeps no index of its own
 * (its name was another user's file, say). Returns false when the status has no
 * "warm_restart" (an older daemon): nothing to print.
 */
bool warm_line(json_t *doc, char *buf, size_t size)
{
    json_t *w = jobj(doc, "warm_restart");
    char bytes[32], reason[REASON];
    uint64_t pid;

    if (!w)
        return false;
    if (strcmp(jstr(w, "kind", "cold"), "adopted") == 0) {
        char of[48] = "";
        if (jget(w, "previous_pid", &pid))
            snprintf(of, sizeof(of), " of pid %" PRIu64, pid);
        snprintf(buf, size,
                 "adopted %" PRIu64 " chunks (%s)%s after %s in %" PRIu64 " ms, %" PRIu64
                 " dropped; %" PRIu64 " to verify, %" PRIu64 " corrupt",
                 jnum(w, "adopted_chunks"),
                 kvp_human_bytes((double)jnum(w, "adopted_bytes"), bytes, sizeof(bytes)), of,
                 json_is_true(json_object_get(w, "planned")) ? "a planned restart" : "a crash",
                 jnum(w, "duration_ms"), jnum(w, "dropped_chunks"),
                 jnum(jobj(doc, "gauges"), "warm_restart_unverified_chunks"),
                 jnum(jobj(doc, "counters"), "warm_restart_corrupt_chunks"));
    } else {
        bool on = json_is_true(json_object_get(w, "enabled"));
        term_safe(reason, sizeof(reason), jstr(w, "reason", ""));
        if (on)
            snprintf(buf, size, "on, cold start (%s)",
                     reason[0] ? reason : "no pool was left to adopt");
        else if (reason[0]) /* a pool was refused, and this daemon keeps none of its own */
            snprintf(buf, size, "off for this run, cold start (%s)", reason);
        else
            snprintf(buf, size, "off");
    }
    return true;
}

/* Columns of the instance tables. */
enum col {
    C_ID,
    C_MODEL,
    C_RANK,
    C_DTYPE,
    C_CHUNK,
    C_PID,
    C_STORED,
    C_RETRIEVED,
    C_FRONT_END,
    C_TRANSPORT
};
static const char *const col_title[] = {"ID",  "MODEL",  "RANK",      "DTYPE",     "CHUNK BYTES",
                                        "PID", "STORED", "RETRIEVED", "FRONT END", "TRANSPORT"};

/* The text of one cell. The transport comes with the fallback reason when there is one (an
 * instance not on shm); an older daemon names no front end ("-"). */
static void cell(json_t *inst, enum col col, char *buf, size_t size)
{
    char tmp[REASON], word[WORD];
    uint64_t v;

    switch (col) {
    case C_ID:
        term_safe(buf, size, jstr(inst, "instance_id", "-"));
        break;
    case C_MODEL:
        term_safe(buf, size, jstr(inst, "model_name", "-"));
        break;
    case C_RANK:
        snprintf(buf, size, "%" PRIu64 "/%" PRIu64, jnum(inst, "worker_rank"),
                 jnum(inst, "world_size"));
        break;
    case C_DTYPE:
        term_safe(buf, size, jstr(inst, "dtype", "-"));
        break;
    case C_CHUNK:
        kvp_human_bytes((double)jnum(inst, "chunk_bytes"), buf, size);
        break;
    case C_PID:
        if (jget(inst, "pid", &v))
            snprintf(buf, size, "%" PRIu64, v);
        else
            snprintf(buf, size, "-");
        break;
    case C_STORED:
        kvp_human_bytes((double)jnum(inst, "stored_bytes"), buf, size);
        break;
    case C_RETRIEVED:
        kvp_human_bytes((double)jnum(inst, "retrieved_bytes"), buf, size);
        break;
    case C_FRONT_END:
        term_safe(buf, size, jstr(inst, "front_end", "-"));
        break;
    case C_TRANSPORT:
        term_safe(word, sizeof(word), jstr(inst, "transport", "-"));
        term_safe(tmp, sizeof(tmp), jstr(inst, "fallback_reason", ""));
        if (tmp[0])
            snprintf(buf, size, "%s (%s)", word, tmp);
        else
            snprintf(buf, size, "%s", word);
        break;
    }
}

/* A table of the instances with the given columns, each as wide as its widest cell. */
static void print_instance_table(json_t *list, const enum col *cols, size_t ncols,
                                 const char *indent)
{
    int width[C_TRANSPORT + 1] = {0};
    char buf[CELL];
    size_t i;
    json_t *inst;

    for (size_t k = 0; k < ncols; k++)
        width[cols[k]] = (int)strlen(col_title[cols[k]]);
    json_array_foreach(list, i, inst)
    {
        for (size_t k = 0; k < ncols; k++) {
            cell(inst, cols[k], buf, sizeof(buf));
            if ((int)strlen(buf) > width[cols[k]])
                width[cols[k]] = (int)strlen(buf);
        }
    }
    /* The last column is not padded: no trailing blanks. */
    fputs(indent, stdout);
    for (size_t k = 0; k < ncols; k++) {
        if (k + 1 < ncols)
            printf("%-*s  ", width[cols[k]], col_title[cols[k]]);
        else
            printf("%s\n", col_title[cols[k]]);
    }
    json_array_foreach(list, i, inst)
    {
        fputs(indent, stdout);
        for (size_t k = 0; k < ncols; k++) {
            cell(inst, cols[k], buf, sizeof(buf));
            if (k + 1 < ncols)
                printf("%-*s  ", width[cols[k]], buf);
            else
                printf("%s\n", buf);
        }
    }
}

/*
 * Counts of the values of one string member over the objects of a list, in order of first
 * appearance after the values given up front (shown even at 0). Bounded: values beyond
 * TALLY_MAX (a daemon gives a handful) are counted under "other".
 */
#define TALLY_MAX 8
struct tally {
    size_t n;
    struct {
        const char *name; /* points into the document or at a literal */
        size_t count;
    } v[TALLY_MAX + 1];
};

static void tally_add(struct tally *t, const char *name)
{
    size_t i = 0;
    while (i < t->n && strcmp(t->v[i].name, name) != 0)
        i++;
    if (i == t->n) {
        if (t->n >= TALLY_MAX)
            name = "other";
        for (i = 0; i < t->n && strcmp(t->v[i].name, name) != 0;)
            i++;
        if (i == t->n) {
            t->v[i].name = name;
            t->v[i].count = 0;
            t->n++;
        }
    }
    t->v[i].count++;
}

/* "1 shm, 1 inline, 2 pickle": the instances of a list by transport, shm and inline always. */
const char *transport_counts(json_t *list, char *buf, size_t size)
{
    struct tally t = {.n = 2, .v = {{"shm", 0}, {"inline", 0}}};
    size_t i, len = 0;
    json_t *inst;
    char word[WORD];

    json_array_foreach(list, i, inst)
    {
        tally_add(&t, jstr(inst, "transport", "-"));
    }
    buf[0] = '\0';
    for (i = 0; i < t.n && len < size; i++) {
        int n = snprintf(buf + len, size - len, "%s%zu %s", i ? ", " : "", t.v[i].count,
                         term_safe(word, sizeof(word), t.v[i].name));
        len += n > 0 ? (size_t)n : 0;
    }
    return buf;
}

/* "3 connected besides this command (max 256)" (with_max) or "3", then "; lmcache 2" for
 * every other front end with clients: the kvpool connections the daemon counts
 * ("clients.connected", what --max-clients bounds) less this command's own, through which it
 * asked, and the clients of other front ends from "clients.list", as the status page and
 * /metrics count them. */
const char *client_counts(json_t *doc, bool with_max, char *buf, size_t size)
{
    json_t *clients = jobj(doc, "clients"), *gauges = jobj(doc, "gauges"), *c;
    struct tally t = {.n = 0};
    char word[WORD];
    size_t i, len;
    int n;
    uint64_t mine = clients ? jnum(clients, "connected") : gauges ? jnum(gauges, "connections") : 0;

    n = snprintf(buf, size, "%" PRIu64, mine ? mine - 1 : 0);
    len = n > 0 ? (size_t)n : 0;
    if (with_max && clients && len < size) {
        n = snprintf(buf + len, size - len, " connected besides this command (max %" PRIu64 ")",
                     jnum(clients, "max"));
        len += n > 0 ? (size_t)n : 0;
    }
    json_array_foreach(json_object_get(clients, "list"), i, c)
    {
        const char *fe = jstr(c, "front_end", "kvpool");
        if (strcmp(fe, "kvpool") != 0)
            tally_add(&t, fe);
    }
    for (i = 0; i < t.n && len < size; i++) {
        n = snprintf(buf + len, size - len, "; %s %zu", term_safe(word, sizeof(word), t.v[i].name),
                     t.v[i].count);
        len += n > 0 ? (size_t)n : 0;
    }
    return buf;
}

/*
 * The LMCache front end: its address and instances, what it answered and what it refused, from
 * the status's "lmcache" and counters: "tcp://127.0.0.1:5555, 2 instances; 1523 requests;
 * refused: 12 prepares (unread replies), 3 connections" (only the refusals that happened), or
 * "off". A daemon that does not say where it serves LMCache: the counters' part alone, or NULL
 * when it has served nothing and refused nothing.
 */
const char *lmcache_line(json_t *doc, char *buf, size_t size)
{
    static const struct {
        const char *counter, *what;
    } refusals[] = {
        {"lmcache_replies_refused", "prepares (unread replies)"},
        {"lmcache_connections_refused", "connections"},
        {"lmcache_instances_refused", "registrations"},
        {"lmcache_foreign_commits", "commits from another connection"},
        {"lmcache_malformed", "malformed requests"},
    };
    json_t *counters = jobj(doc, "counters"), *lm = json_object_get(doc, "lmcache");
    uint64_t requests = jnum(counters, "lmcache_requests"), unknown;
    size_t len = 0, i;
    int n, shown = 0;
    char addr[TERM_ESCAPED_MAX(255)];

    if (json_is_null(lm)) {
        snprintf(buf, size, "off");
        return buf;
    }
    for (i = 0; i < sizeof(refusals) / sizeof(refusals[0]); i++)
        shown += jnum(counters, refusals[i].counter) > 0;
    unknown = jnum(counters, "lmcache_unknown_pings");
    if (!json_is_object(lm) && requests == 0 && shown == 0)
        return NULL;
    buf[0] = '\0';
    if (json_is_object(lm)) {
        uint64_t ni = jnum(lm, "instances");
        n = snprintf(buf, size, "%s, %" PRIu64 " instance%s; ",
                     term_safe(addr, sizeof(addr), jstr(lm, "address", "-")), ni,
                     ni == 1 ? "" : "s");
        len = n > 0 ? (size_t)n : 0;
    }
    if (len < size) {
        n = snprintf(buf + len, size - len, "%" PRIu64 " requests", requests);
        len += n > 0 ? (size_t)n : 0;
    }
    for (i = 0, shown = 0; i < sizeof(refusals) / sizeof(refusals[0]) && len < size; i++) {
        uint64_t v = jnum(counters, refusals[i].counter);
        if (!v)
            continue;
        n = snprintf(buf + len, size - len, "%s%" PRIu64 " %s", shown++ ? ", " : "; refused: ", v,
                     refusals[i].what);
        len += n > 0 ? (size_t)n : 0;
    }
    if (unknown && len < size)
        snprintf(buf + len, size - len,
                 "; %" PRIu64 " pings of unknown instances (told to "
                 "register again)",
                 unknown);
    return buf;
}

/* The readable summary of `kvpool status`. */
void print_status(const struct cli *x, json_t *doc)
{
    json_t *pool = jobj(doc, "pool"), *shm = jobj(doc, "shm"), *clients = jobj(doc, "clients");
    json_t *counters = jobj(doc, "counters");
    json_t *list = json_object_get(doc, "instances");
    char a[32], b[32], c[32], reason[CELL], word[WORD], line[L2_LINE], counts[COUNTS];

    print_headline(x, doc);
    print_health(doc);
    if (!pool) {
        /* A daemon still starting has no pool yet: say why, and nothing more. */
        term_safe(reason, sizeof(reason), jstr(doc, "reason", "-"));
        printf("  %s\n", reason);
        return;
    }
    printf("Pool:       ");
    print_pool(pool);
    printf("\nChunk size: %" PRIu64 " tokens\n", jnum(doc, "chunk_tokens"));
    if (shm && json_is_true(json_object_get(shm, "enabled"))) {
        const char *backend = jstr(shm, "backend", "-");
        if (strcmp(backend, "memfd") == 0) {
            printf("SHM:        enabled, memfd segment of %s (passed to workers over the socket)\n",
                   kvp_human_bytes((double)jnum(shm, "segment_size"), a, sizeof(a)));
        } else {
            term_safe(reason, sizeof(reason), jstr(shm, "name", "-"));
            printf("SHM:        enabled, %s segment /dev/shm/%s of %s\n",
                   term_safe(word, sizeof(word), backend), reason,
                   kvp_human_bytes((double)jnum(shm, "segment_size"), a, sizeof(a)));
        }
    } else {
        term_safe(reason, sizeof(reason), jstr(shm, "disabled_reason", "-"));
        /* The daemon's reasons say "SHM disabled ..." themselves: the label already says SHM. */
        if (strncmp(reason, "SHM disabled", 12) == 0)
            printf("SHM:        %s (every worker uses the inline transport)\n", reason + 4);
        else
            printf("SHM:        disabled: %s (every worker uses the inline transport)\n", reason);
    }
    if (warm_line(doc, line, sizeof(line)))
        printf("Warm restart: %s\n", line);
    if (l2_line(doc, line, sizeof(line)))
        printf("L2:         %s\n", line);
    if (clients)
        printf("Clients:    %s\n", client_counts(doc, true, counts, sizeof(counts)));
    if (counters) {
        /* Every transport's (an older daemon's missing ones read as 0). */
        uint64_t stored = 0, got = 0;
        for (const char *t = "shm\0inline\0pickle\0envelope\0"; *t; t += strlen(t) + 1) {
            char name[48];
            snprintf(name, sizeof(name), "store_bytes_%s", t);
            stored += jnum(counters, name);
            snprintf(name, sizeof(name), "retrieve_bytes_%s", t);
            got += jnum(counters, name);
        }
        printf("Totals:     %s stored, %s retrieved, %" PRIu64 " evictions, lookup hit ratio %s\n",
               kvp_human_bytes((double)stored, a, sizeof(a)),
               kvp_human_bytes((double)got, b, sizeof(b)), jnum(counters, "evictions"),
               percent(jnum(counters, "lookup_hit_chunks"), jnum(counters, "lookup_chunks"), c,
                       sizeof(c)));
    }
    if (lmcache_line(doc, line, sizeof(line)))
        printf("LMCache:    %s\n", line);
    if (!json_is_array(list))
        return;
    printf("Instances:  %zu (%s)\n", json_array_size(list),
           transport_counts(list, counts, sizeof(counts)));
    if (json_array_size(list) > 0) {
        static const enum col cols[] = {C_ID, C_MODEL, C_RANK, C_PID, C_FRONT_END, C_TRANSPORT};
        print_instance_table(list, cols, sizeof(cols) / sizeof(cols[0]), "  ");
    }
}

/* --json prints the daemon's document as it came, for jq and scripts, with any terminal
 * control inside its strings in JSON's \u00NN form (which jq reads back as the same text). */
int cmd_status(struct cli *x, const struct cmd_opts *o)
{
    int code = cli_connect(x);
    if (code)
        return code;
    if (o->json) {
        char *text = NULL;
        int n = kvp_get_status(x->client, &text);
        if (n < 0)
            return cli_failed(x, "status", n);
        term_write(stdout, text, (size_t)n, TERM_JSON);
        if (n == 0 || text[n - 1] != '\n')
            putchar('\n');
        kvp_free(text);
        return EXIT_SUCCESS;
    }
    json_t *doc = cli_get_status(x, false, &code);
    if (!doc)
        return code;
    print_status(x, doc);
    json_decref(doc);
    return EXIT_SUCCESS;
}

int cmd_instances(struct cli *x, const struct cmd_opts *o)
{
    static const enum col cols[] = {C_ID,  C_MODEL,  C_RANK,      C_DTYPE,     C_CHUNK,
                                    C_PID, C_STORED, C_RETRIEVED, C_FRONT_END, C_TRANSPORT};
    int code = cli_connect(x);

    (void)o;
    if (code)
        return code;
    json_t *doc = cli_get_status(x, false, &code);
    if (!doc)
        return code;
    json_t *list = json_object_get(doc, "instances");
    if (json_array_size(list) == 0)
        printf("No instance is registered.\n");
    else
        print_instance_table(list, cols, sizeof(cols) / sizeof(cols[0]), "");
    json_decref(doc);
    return EXIT_SUCCESS;
}
