/*
 * term.c - terminal-safe copies of the strings the daemon supplies.
 *
 * Design. Instance ids, model names and reasons are chosen by workers, and the daemon passes
 * them on as they are: printed raw, a control character could move the cursor, rewrite what the
 * operator sees or talk to the terminal. Every such string goes through this file before it is
 * printed.
 */
#include "cli.h"

const char *term_safe(char *buf, size_t size, const char *s)
{
    size_t i = 0;
    for (; s[i] && i + 1 < size; i++)
        buf[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
    buf[i] = '\0';
    return buf;
}
