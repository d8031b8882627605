/*
 * config_file.h - the reader of kvpoold's configuration file (--config FILE): "key = value"
 * lines. It knows the syntax only; which keys exist and what values they take is config.c's
 * business, through the callback.
 */
#ifndef KVP_CONFIG_FILE_H
#define KVP_CONFIG_FILE_H

#include <stdio.h>

#define KVP_CONF_MAX_SIZE (1u << 20) /* bytes in a configuration file */
#define KVP_CONF_MAX_LINE 4096       /* bytes in one line, without its newline */

/*
 * Called for every "key = value" line, in file order: key and value trimmed of surrounding
 * blanks, value without its quotes; line counts from 1. Returns 0 to go on, or a negative errno
 * (after printing why) to stop the read with it.
 */
typedef int (*kvp_conf_entry_fn)(void *arg, const char *key, const char *value, unsigned line);

/*
 * Reads the file at path and calls fn for each entry. The syntax, per line: blank; a comment,
 * '#' first; or "key = value", where the value may be quoted with " or ' (no escapes; "" is an
 * empty value) and an unquoted value ends at a '#' that begins it or follows a blank (a trailing
 * comment). A UTF-8 byte order mark at the start is skipped. Returns 0; the first non-zero
 * return of fn; or -EINVAL after printing to err one
 * line "kvpoold: PATH:LINE: what is wrong" (a syntax error, a line over KVP_CONF_MAX_LINE bytes,
 * a NUL byte) or "kvpoold: cannot read configuration file PATH: reason" (it cannot be opened or
 * read, is a directory, or is over KVP_CONF_MAX_SIZE bytes).
 */
int kvp_conf_file_read(const char *path, kvp_conf_entry_fn fn, void *arg, FILE *err);

#endif /* KVP_CONFIG_FILE_H */
