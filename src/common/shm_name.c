/*
 * shm_name.c - segment name normalisation, shared by the daemon and the client library so that
 * both always agree on the file under /dev/shm.
 */
#include "shm_name.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define KVP_SHM_NAME_MAX 127

int kvp_shm_name_normalize(const char *name, char *out, size_t size)
{
    if (!name)
        return -EINVAL;
    if (name[0] == '/')
        name++;
    if (name[0] == '\0')
        return -EINVAL;
    for (const char *p = name; *p; p++)
        if (*p == '/' || (unsigned char)*p < 0x20 || *p == 0x7f)
            return -EINVAL;

    const char *prefix = strncmp(name, KVP_SHM_PREFIX, strlen(KVP_SHM_PREFIX)) == 0
                             ? ""
                             : KVP_SHM_PREFIX;
    int n = snprintf(out, size, "%s%s", prefix, name);
    if (n < 0 || (size_t)n >= size || n > KVP_SHM_NAME_MAX)
        return -ENAMETOOLONG;
    return 0;
}

int kvp_shm_name_default(long pid, char *out, size_t size)
{
    int n = snprintf(out, size, "%s%ld", KVP_SHM_PREFIX, pid);
    if (n < 0 || (size_t)n >= size)
        return -ENAMETOOLONG;
    return 0;
}
