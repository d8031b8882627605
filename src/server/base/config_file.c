/*
 * config_file.c - the syntax of kvpoold's configuration file.
 *
 *   # the pool for a 4-GPU-equivalent host
 *   l1-size = 4GiB
 *   shm-name = ""          # inline transport only
 *
 * The file is read whole (at most KVP_CONF_MAX_SIZE bytes, checked before anything is
 * allocated for a regular file), then split into lines of at most KVP_CONF_MAX_LINE bytes. Each
 * line is blank, a comment or one "key = value" entry, handed to the caller's callback in file
 * order; the callback (config.c) decides what the key means and whether the value is valid, so
 * this file stays free of any knowledge of options. Every error names the file and the line.
 *
 * A UTF-8 byte order mark at the start of the file is skipped. Each key may appear once: a key
 * given twice is an error (config.c), since which value was meant is anybody's guess.
 *
 * Quoting exists for values that would otherwise be trimmed away or cut by a comment: the empty
 * string (shm-name = ""), leading or trailing blanks, a " #". There are no escapes: a value
 * cannot contain its own quote character (use the other one).
 *
 * Threads: called once, by the main thread, before the daemon starts any.
 */
#include "base/config_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errors.h"

static bool is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
}

static char *skip_blanks(char *s)
{
    while (is_blank(*s))
        s++;
    return s;
}

/* Cuts the blanks off the end of s, in place. Returns s. */
static char *trim_end(char *s)
{
    size_t n = strlen(s);
    while (n && is_blank(s[n - 1]))
        s[--n] = '\0';
    return s;
}

/* Prints "kvpoold: PATH:LINE: <message>" and returns -EINVAL. */
__attribute__((format(printf, 4, 5))) static int bad_line(FILE *err, const char *path,
                                                          unsigned line, const char *fmt, ...)
{
    va_list ap;
    fprintf(err, "kvpoold: %s:%u: ", path, line);
    va_start(ap, fmt);
    vfprintf(err, fmt, ap);
    va_end(ap);
    fputc('\n', err);
    return -EINVAL;
}

static int cannot_read(FILE *err, const char *path, const char *why)
{
    fprintf(err, "kvpoold: cannot read configuration file %s: %s\n", path, why);
    return -EINVAL;
}

/* Reads the whole file into *buf (malloc'd, the caller frees it), *len bytes. */
static int read_all(const char *path, char **buf, size_t *len, FILE *err)
{
    char why[96];
    struct stat st;
    int rc = 0;

    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return cannot_read(err, path, kvp_strerror(-errno));
    if (fstat(fd, &st) != 0) {
        rc = cannot_read(err, path, kvp_strerror(-errno));
        goto out_close;
    }
    if (S_ISDIR(st.st_mode)) {
        rc = cannot_read(err, path, "it is a directory");
        goto out_close;
    }
    if (S_ISREG(st.st_mode) && st.st_size > (off_t)KVP_CONF_MAX_SIZE) {
        snprintf(why, sizeof(why), "%lld bytes, more than the limit of %u", (long long)st.st_size,
                 KVP_CONF_MAX_SIZE);
        rc = cannot_read(err, path, why);
        goto out_close;
    }

    /* A regular file's size is known; a pipe (--config /dev/stdin) grows the buffer. One byte
     * more than the limit is room to notice a file that grew past it. */
    size_t cap = S_ISREG(st.st_mode) ? (size_t)st.st_size + 1 : 4096, n = 0;
    char *b = malloc(cap);
    if (!b) {
        rc = cannot_read(err, path, kvp_strerror(-ENOMEM));
        goto out_close;
    }
    for (;;) {
        if (n == cap) {
            if (cap > KVP_CONF_MAX_SIZE)
                break;
            cap = cap * 2 > KVP_CONF_MAX_SIZE ? KVP_CONF_MAX_SIZE + 1 : cap * 2;
            char *nb = realloc(b, cap);
            if (!nb) {
                rc = cannot_read(err, path, kvp_strerror(-ENOMEM));
                goto out_free;
            }
            b = nb;
        }
        ssize_t r = read(fd, b + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = cannot_read(err, path, kvp_strerror(-errno));
            goto out_free;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    if (n > KVP_CONF_MAX_SIZE) {
        snprintf(why, sizeof(why), "more than the limit of %u bytes", KVP_CONF_MAX_SIZE);
        rc = cannot_read(err, path, why);
        goto out_free;
    }
    *buf = b;
    *len = n;
    close(fd);
    return 0;

out_free:
    free(b);
out_close:
    close(fd);
    return rc;
}

/* One line, NUL-terminated and modifiable: blank, comment, or an entry for fn. */
static int parse_line(char *line, const char *path, unsigned lineno, kvp_conf_entry_fn fn,
                      void *arg, FILE *err)
{
    char *p = skip_blanks(line);
    if (*p == '\0' || *p == '#')
        return 0;
    char *eq = strchr(p, '=');
    if (!eq)
        return bad_line(err, path, lineno, "expected 'key = value', found '%s'", trim_end(p));
    *eq = '\0';
    char *key = trim_end(p);
    if (!*key)
        return bad_line(err, path, lineno, "no key before '='");

    char *value = skip_blanks(eq + 1);
    if (*value == '"' || *value == '\'') {
        char *close = strchr(value + 1, *value);
        if (!close)
            return bad_line(err, path, lineno, "the quoted value of %s has no closing %c", key,
                            *value);
        char *rest = skip_blanks(close + 1);
        if (*rest && *rest != '#')
            return bad_line(err, path, lineno, "unexpected '%s' after the quoted value of %s",
                            trim_end(rest), key);
        *close = '\0';
        value++;
    } else {
        /* A trailing comment: '#' at the start of the value or after a blank. */
        for (char *q = value; *q; q++) {
            if (*q == '#' && (q == value || is_blank(q[-1]))) {
                *q = '\0';
                break;
            }
        }
        trim_end(value);
    }
    return fn(arg, key, value, lineno);
}

int kvp_conf_file_read(const char *path, kvp_conf_entry_fn fn, void *arg, FILE *err)
{
    char line[KVP_CONF_MAX_LINE + 1];
    char *buf;
    size_t len;
    unsigned lineno = 0;

    int rc = read_all(path, &buf, &len, err);
    if (rc)
        return rc;
    /* A UTF-8 byte order mark, which some editors write first: not part of the first key. */
    size_t pos = len >= 3 && memcmp(buf, "\xef\xbb\xbf", 3) == 0 ? 3 : 0;
    while (pos < len && rc == 0) {
        const char *start = buf + pos;
        const char *nl = memchr(start, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - start) : len - pos;
        pos += n + (nl ? 1 : 0);
        lineno++;
        if (n > KVP_CONF_MAX_LINE) {
            rc = bad_line(err, path, lineno, "line of %zu bytes, more than the limit of %d", n,
                          KVP_CONF_MAX_LINE);
        } else if (memchr(start, '\0', n)) {
            rc = bad_line(err, path, lineno, "a NUL byte (is this a text file?)");
        } else {
            memcpy(line, start, n);
            line[n] = '\0';
            rc = parse_line(line, path, lineno, fn, arg, err);
        }
    }
    free(buf);
    return rc;
}
