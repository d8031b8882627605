/*
 * socket_path.c - the default socket path rule and the private-directory check (see
 * socket_path.h). $KVPOOL_SOCKET and --socket are applied by the callers, before this default.
 *
 * Why a directory: a socket file directly in /tmp can be created first by any local user, who
 * then receives the victim's KV (derived from prompts) and keeps the victim's daemon from
 * starting. A directory that only its owner can write cannot hold a planted socket, and a
 * directory planted by somebody else is refused by both sides (docs/SECURITY.md).
 */
#include "common/socket_path.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/why.h"

int kvp_socket_dir_default(char *buf, size_t size)
{
    const char *dir = getenv("XDG_RUNTIME_DIR");
    int n;

    if (!buf || size == 0)
        return -EINVAL;
    /* The XDG spec requires an absolute path; an empty or relative one is treated as unset. */
    if (dir && dir[0] == '/')
        n = snprintf(buf, size, "%s/kvpool", dir);
    else
        n = snprintf(buf, size, "/tmp/kvpool-%lu", (unsigned long)geteuid());
    if (n < 0 || (size_t)n >= size) {
        buf[0] = '\0';
        return -ENAMETOOLONG;
    }
    return n;
}

int kvp_socket_path_default(char *buf, size_t size)
{
    int n = kvp_socket_dir_default(buf, size);

    if (n < 0)
        return n;
    if ((size_t)n + 1 + strlen(KVP_SOCKET_FILE) >= size) {
        buf[0] = '\0';
        return -ENAMETOOLONG;
    }
    return n + snprintf(buf + n, size - (size_t)n, "/%s", KVP_SOCKET_FILE);
}

int kvp_socket_dir_check(const char *dir, uid_t uid, char *why, size_t why_size)
{
    struct stat st;

    if (why && why_size)
        why[0] = '\0';
    /* lstat: a symbolic link planted in the dir's place would lead anywhere. */
    if (lstat(dir, &st) != 0) {
        int err = -errno;
        return kvp_why(why, why_size, err, "the socket directory %s cannot be used: %s", dir,
                       strerror(-err));
    }
    if (S_ISLNK(st.st_mode))
        return kvp_why(why, why_size, -EPERM,
                       "the socket directory %s is a symbolic link, not a private directory", dir);
    if (!S_ISDIR(st.st_mode))
        return kvp_why(why, why_size, -ENOTDIR, "the socket directory %s is not a directory", dir);
    if (st.st_uid != uid)
        return kvp_why(
            why, why_size, -EPERM,
            "the socket directory %s belongs to uid %lu, not to uid %lu: another user may "
            "have created it to intercept kvpool traffic; remove it or set --socket / "
            "KVPOOL_SOCKET",
            dir, (unsigned long)st.st_uid, (unsigned long)uid);
    if (st.st_mode & (S_IWGRP | S_IWOTH))
        return kvp_why(why, why_size, -EPERM,
                       "the socket directory %s has mode %04o: writable by group or others, so "
                       "another user could replace the socket; chmod 700 it",
                       dir, (unsigned)(st.st_mode & 07777));
    return 0;
}

int kvp_socket_dir_prepare(const char *dir, uid_t uid, char *why, size_t why_size)
{
    /* mkdir never follows a symlink in the last component and fails with EEXIST on anything
     * already there, which the check then judges. */
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        int err = -errno;
        return kvp_why(why, why_size, err, "cannot create the socket directory %s: %s", dir,
                       strerror(-err));
    }
    return kvp_socket_dir_check(dir, uid, why, why_size);
}

bool kvp_socket_answers(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    int rc = connect(fd, (struct sockaddr *)&addr, sizeof(addr));
    close(fd);
    return rc == 0;
}
