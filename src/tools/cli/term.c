/*
 * term.c - terminal-safe output: every string the daemon supplies goes through here before the
 * command line prints it.
 *
 * Design. Instance ids, model names, dtypes and reasons are chosen by workers, and the daemon
 * passes them on as they are (the protocol bounds their length, not their bytes). Printed raw,
 * a control character moves the cursor, rewrites what the operator sees or talks to the
 * terminal: ESC starts a sequence, and so do the C1 controls (U+0080..U+009F, for example
 * U+009B CSI and U+009D OSC), which many terminals obey both as UTF-8 (c2 9b) and as a raw
 * byte (9b). One function, escape_unit(), decides what each character becomes:
 *
 *   - C0 controls and DEL: \xNN (a line break and a tab are kept in multi-line text);
 *   - C1 controls, and the Unicode characters that reorder or break text (the bidirectional
 *     embeddings, overrides and isolates U+202A..U+202E, U+2066..U+2069, and U+2028/U+2029):
 *     \uNNNN;
 *   - a byte that is not part of well-formed UTF-8 (a raw 9b among them): \xNN;
 *   - everything else, printable ASCII and well-formed UTF-8, as it is.
 *
 * In a JSON document (`status --json`) every escape is JSON's own \u00NN form, which leaves
 * the document's meaning unchanged (jansson already escapes C0 inside strings; C1 and bad
 * bytes can only occur inside strings). A backslash is left alone: the escapes are for the
 * eye, not a reversible encoding.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

#define UNIT_MAX 8 /* the longest escape, "\u202e", plus its NUL */

/* Length of the well-formed UTF-8 sequence at s (len bytes available) and its code point, or
 * 0 when s does not start one (RFC 3629: no overlong forms, no surrogates, nothing past
 * U+10FFFF). */
static size_t utf8_decode(const unsigned char *s, size_t len, unsigned *cp)
{
    unsigned lo = 0x80, hi = 0xbf; /* the range of the second byte */
    size_t n;

    if (s[0] >= 0xc2 && s[0] <= 0xdf)
        n = 2;
    else if (s[0] >= 0xe0 && s[0] <= 0xef)
        n = 3;
    else if (s[0] >= 0xf0 && s[0] <= 0xf4)
        n = 4;
    else
        return 0;
    if (s[0] == 0xe0)
        lo = 0xa0;
    else if (s[0] == 0xed)
        hi = 0x9f;
    else if (s[0] == 0xf0)
        lo = 0x90;
    else if (s[0] == 0xf4)
        hi = 0x8f;
    if (len < n || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    *cp = n == 2 ? (s[0] & 0x1fu) << 6 | (s[1] & 0x3fu)
          : n == 3
              ? (s[0] & 0x0fu) << 12 | (s[1] & 0x3fu) << 6 | (s[2] & 0x3fu)
              : (s[0] & 0x07u) << 18 | (s[1] & 0x3fu) << 12 | (s[2] & 0x3fu) << 6 | (s[3] & 0x3fu);
    return n;
}

/* Whether a code point beyond ASCII changes how a terminal shows the text around it. */
static bool is_unsafe_code_point(unsigned cp)
{
    return (cp >= 0x80 && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029 ||
           (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

/*
 * The one decision: what the character at s (len > 0 bytes left) becomes. Writes the text to
 * print into out (UNIT_MAX bytes, NUL-terminated, possibly the character itself) and returns
 * how many input bytes it stands for.
 */
static size_t escape_unit(const char *s, size_t len, enum term_mode mode, char out[UNIT_MAX])
{
    const unsigned char *u = (const unsigned char *)s;
    unsigned cp;
    size_t n;

    if (u[0] < 0x80) {
        bool keep = u[0] >= 0x20 && u[0] != 0x7f;
        if (mode != TERM_LINE && (u[0] == '\n' || u[0] == '\t'))
            keep = true;
        if (keep)
            snprintf(out, UNIT_MAX, "%c", u[0]);
        else
            snprintf(out, UNIT_MAX, mode == TERM_JSON ? "\\u%04x" : "\\x%02x", u[0]);
        return 1;
    }
    n = utf8_decode(u, len, &cp);
    if (n == 0) {
        /* Not UTF-8: a JSON document reads the byte as Latin-1, which keeps it valid. */
        snprintf(out, UNIT_MAX, mode == TERM_JSON ? "\\u%04x" : "\\x%02x", u[0]);
        return 1;
    }
    if (is_unsafe_code_point(cp))
        snprintf(out, UNIT_MAX, "\\u%04x", cp);
    else
        snprintf(out, UNIT_MAX, "%.*s", (int)n, s);
    return n;
}

const char *term_safe(char *buf, size_t size, const char *s)
{
    size_t len = strlen(s), o = 0, total = 0;
    char unit[UNIT_MAX];

    if (size == 0)
        return buf;
    for (size_t i = 0; i < len; total += strlen(unit))
        i += escape_unit(s + i, len - i, TERM_LINE, unit);
    /* When it does not all fit, room is kept for "..." after the last whole escape. */
    size_t room = total <= size - 1 ? size - 1 : size - 1 < 3 ? 0 : size - 1 - 3;
    for (size_t i = 0; i < len;) {
        size_t used = escape_unit(s + i, len - i, TERM_LINE, unit), n = strlen(unit);
        if (o + n > room)
            break;
        memcpy(buf + o, unit, n);
        o += n;
        i += used;
    }
    if (total > size - 1 && size - 1 >= 3) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
    return buf;
}

void term_write(FILE *f, const char *s, size_t len, enum term_mode mode)
{
    char unit[UNIT_MAX];

    for (size_t i = 0; i < len;) {
        i += escape_unit(s + i, len - i, mode, unit);
        fputs(unit, f);
    }
}

void term_puts(FILE *f, const char *s)
{
    term_write(f, s, strlen(s), TERM_LINE);
}
