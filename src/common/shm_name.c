/*
 * shm_name.c - segment name normalisation, shared by the daemon and the client library so that
 * both always agree on the file under /dev/shm; and the daemon's default names.
 *
 * A default name carries a random part: with a predictable one (the pid alone), any local user
 * could create and lock the names of the pids a daemon will get, and so keep it from starting or
 * from offering shared memory. Nobody can plant a file under a name nobody can predict.
 */
#include "common/shm_name.h"

#include <ctype.h>
#include <errno.h>
#include <sodium.h>
#include <stdint.h>
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

int kvp_shm_name_random(long pid, char *out, size_t size)
{
    uint8_t r[KVP_SHM_NAME_RANDOM_HEX / 2];
    char hex[KVP_SHM_NAME_RANDOM_HEX + 1];

    if (sodium_init() < 0)
        return -ENOMEM;
    randombytes_buf(r, sizeof(r));
    sodium_bin2hex(hex, sizeof(hex), r, sizeof(r));
    int n = snprintf(out, size, "%s%ld_%s", KVP_SHM_PREFIX, pid, hex);
    if (n < 0 || (size_t)n >= size)
        return -ENAMETOOLONG;
    return 0;
}

bool kvp_shm_name_is_default(const char *name)
{
    size_t plen = strlen(KVP_SHM_PREFIX);
    const char *p = name + plen;

    if (strncmp(name, KVP_SHM_PREFIX, plen) != 0 || !isdigit((unsigned char)*p))
        return false;
    while (isdigit((unsigned char)*p))
        p++;
    if (*p == '\0')
        return true;
    if (*p++ != '_' || strlen(p) != KVP_SHM_NAME_RANDOM_HEX)
        return false;
    for (; *p; p++)
        if (!isxdigit((unsigned char)*p) || isupper((unsigned char)*p))
            return false;
    return true;
}
