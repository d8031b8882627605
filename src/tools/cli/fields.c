/*
 * fields.c - reading the daemon's status JSON, and writing numbers in human units (sizes with
 * units.h's kvp_human_bytes()).
 *
 * Design. The status JSON's field names are an interface (docs/HTTP.md), but another daemon
 * version may lack a field or add one: a field this program does not know is ignored, and one
 * it misses reads as absent (0, or "-" where a view prints it), so any daemon still gets a
 * view. Nothing here prints; the buffers are the caller's.
 */
#include <inttypes.h>
#include <stdio.h>
#include <time.h>

#include "cli.h"

json_t *jobj(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_object(v) ? v : NULL;
}

bool jget(json_t *o, const char *key, uint64_t *v)
{
    json_t *j = json_object_get(o, key);
    if (!json_is_integer(j) || json_integer_value(j) < 0)
        return false;
    *v = (uint64_t)json_integer_value(j);
    return true;
}

uint64_t jnum(json_t *o, const char *key)
{
    uint64_t v = 0;
    return jget(o, key, &v) ? v : 0;
}

const char *jstr(json_t *o, const char *key, const char *def)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : def;
}

/* The two largest units. */
const char *human_duration(uint64_t s, char *buf, size_t size)
{
    if (s < 60)
        snprintf(buf, size, "%" PRIu64 "s", s);
    else if (s < 3600)
        snprintf(buf, size, "%" PRIu64 "m %02" PRIu64 "s", s / 60, s % 60);
    else if (s < 86400)
        snprintf(buf, size, "%" PRIu64 "h %02" PRIu64 "m", s / 3600, s % 3600 / 60);
    else
        snprintf(buf, size, "%" PRIu64 "d %02" PRIu64 "h", s / 86400, s % 86400 / 3600);
    return buf;
}

/* part of whole as "12.5%", or "-" when whole is 0. */
const char *percent(uint64_t part, uint64_t whole, char *buf, size_t size)
{
    if (whole == 0)
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.1f%%", 100.0 * (double)part / (double)whole);
    return buf;
}

int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}
