/*
 * socket_path.h - where the daemon listens by default. One rule for both sides, so a worker and
 * a daemon started with no configuration always find each other.
 */
#ifndef KVP_SOCKET_PATH_H
#define KVP_SOCKET_PATH_H

#include <stddef.h>

/*
 * Writes $XDG_RUNTIME_DIR/kvpool.sock (when XDG_RUNTIME_DIR is an absolute path) or
 * /tmp/kvpool-<uid>.sock into buf. Returns the length, -EINVAL for a NULL or empty buffer, or
 * -ENAMETOOLONG (buf is then "").
 */
int kvp_socket_path_default(char *buf, size_t size);

#endif /* KVP_SOCKET_PATH_H */
