/*
 * units.c - sizes in words a person reads (units.h). No state, no allocation.
 */
#include "common/units.h"

#include <stdio.h>

const char *kvp_human_bytes(double v, char *buf, size_t size)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;

    while (v >= 1024 && u < 6) {
        v /= 1024;
        u++;
    }
    int prec = u == 0 ? 0 : v < 10 ? 2 : v < 100 ? 1 : 0;
    snprintf(buf, size, "%.*f %s", prec, v, unit[u]);
    return buf;
}
