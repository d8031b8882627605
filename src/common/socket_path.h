/*
 * socket_path.h - where the daemon listens by default, and when that place can be trusted. One
 * rule for both sides, so a worker and a daemon started with no configuration always find each
 * other, and neither talks through a socket another user could have put there.
 */
#ifndef KVP_SOCKET_PATH_H
#define KVP_SOCKET_PATH_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* File name of the default socket inside its directory. */
#define KVP_SOCKET_FILE "kvpool.sock"

/*
 * Writes the private directory of the default socket into buf: $XDG_RUNTIME_DIR/kvpool (when
 * XDG_RUNTIME_DIR is an absolute path) or /tmp/kvpool-<uid>. Returns the length, -EINVAL for a
 * NULL or empty buffer, or -ENAMETOOLONG (buf is then "").
 */
int kvp_socket_dir_default(char *buf, size_t size);

/* Writes the default socket path, <kvp_socket_dir_default()>/kvpool.sock. Same returns. */
int kvp_socket_path_default(char *buf, size_t size);

/*
 * The tmux / ssh-agent rule for a socket directory: it must be a directory (not a symbolic link)
 * owned by uid and writable by nobody else (no group or other write bit). Returns 0, -ENOENT when
 * it does not exist, -ENOTDIR, or -EPERM when it is not private; why (why_size bytes, may be
 * NULL) then says what is wrong in words.
 */
int kvp_socket_dir_check(const char *dir, uid_t uid, char *why, size_t why_size);

/*
 * The daemon's side: creates dir with mode 0700 if it is missing (its parent must exist), then
 * applies kvp_socket_dir_check(). Same returns, plus the errno of a failed mkdir().
 */
int kvp_socket_dir_prepare(const char *dir, uid_t uid, char *why, size_t why_size);

/* True if something accepts connections on the Unix socket path: a live daemon (or anything
 * else listening), where a dead socket file refuses them. */
bool kvp_socket_answers(const char *path);

#endif /* KVP_SOCKET_PATH_H */
