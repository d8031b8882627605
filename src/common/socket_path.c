/*
 * socket_path.c - the default socket path rule (see socket_path.h). $KVPOOL_SOCKET is applied
 * by the callers, before this default.
 */
#include "socket_path.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int kvp_socket_path_default(char *buf, size_t size)
{
    const char *dir = getenv("XDG_RUNTIME_DIR");
    int n;

    if (!buf || size == 0)
        return -EINVAL;
    /* The XDG spec requires an absolute path; an empty or relative one is treated as unset. */
    if (dir && dir[0] == '/')
        n = snprintf(buf, size, "%s/kvpool.sock", dir);
    else
        n = snprintf(buf, size, "/tmp/kvpool-%lu.sock", (unsigned long)getuid());
    if (n < 0 || (size_t)n >= size) {
        buf[0] = '\0';
        return -ENAMETOOLONG;
    }
    return n;
}
