/*
 * errors.c - what a return code is called and what it means, and the library's version call.
 *
 * Design. kvpool's own codes come from the one KVP_ERRNO_MAP table in include/kvpool.h (its
 * name, value and text); every other negative value is an errno, named and described by glibc
 * (strerrorname_np(), strerrordesc_np()), which return constant strings and are thread-safe,
 * unlike strerror(). Both functions never return NULL: an unknown code is formatted into a
 * thread-local buffer. The daemon links this file too (src/common), so its log lines use the
 * same texts from any thread.
 *
 * This file is compiled with KVP_BUILDING_LIBRARY (src/common/CMakeLists.txt) so that the
 * KVP_EXPORT functions below leave libkvpool.so.
 */
#include "common/errors.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

KVP_EXPORT uint32_t kvp_version(void)
{
    return ((uint32_t)KVP_VERSION_MAJOR << 16) | ((uint32_t)KVP_VERSION_MINOR << 8) |
           (uint32_t)KVP_VERSION_PATCH;
}

/* glibc 2.32 added the constant, thread-safe name and description lookups. */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
#define KVP_HAVE_ERRNO_NP 1
#endif

KVP_EXPORT const char *kvp_strerror(int err)
{
    static _Thread_local char unknown[48];

    if (err >= 0)
        return "success";
    switch (err) {
#define KVP_STRERROR_CASE(name, val, msg) \
    case val:                             \
        return msg;
        KVP_ERRNO_MAP(KVP_STRERROR_CASE)
#undef KVP_STRERROR_CASE
    default:
        break;
    }
#if defined(KVP_HAVE_ERRNO_NP)
    if (err != INT_MIN) {
        const char *s = strerrordesc_np(-err);
        if (s)
            return s;
    }
#elif defined(__GLIBC__)
    if (err != INT_MIN) {
        /* The GNU strerror_r may return a static string instead of filling the buffer. */
        const char *s = strerror_r(-err, unknown, sizeof(unknown));
        if (s)
            return s;
    }
#else
    if (err != INT_MIN && strerror_r(-err, unknown, sizeof(unknown)) == 0)
        return unknown;
#endif
    snprintf(unknown, sizeof(unknown), "unknown error %d", err);
    return unknown;
}

KVP_EXPORT const char *kvp_err_name(int err)
{
    static _Thread_local char unknown[24];

    if (err >= 0)
        return "OK";
    switch (err) {
#define KVP_ERRNAME_CASE(name, val, msg) \
    case val:                            \
        return "KVP_E" #name;
        KVP_ERRNO_MAP(KVP_ERRNAME_CASE)
#undef KVP_ERRNAME_CASE
    default:
        break;
    }
#if defined(KVP_HAVE_ERRNO_NP)
    if (err != INT_MIN) {
        const char *s = strerrorname_np(-err);
        if (s)
            return s;
    }
#endif
    snprintf(unknown, sizeof(unknown), "E%lld", -(long long)err);
    return unknown;
}
