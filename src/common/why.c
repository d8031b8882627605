/*
 * why.c - a refusal's reason and code in one call (why.h).
 */
#include "common/why.h"

#include <stdarg.h>
#include <stdio.h>

int kvp_why(char *why, size_t why_size, int rc, const char *fmt, ...)
{
    if (why && why_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_size, fmt, ap);
        va_end(ap);
    }
    return rc;
}
