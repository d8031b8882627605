/*
 * units.h - sizes in words a person reads: binary units, three significant digits. Shared by
 * the daemon (its health reasons) and the command-line client (its views).
 */
#ifndef KVP_UNITS_H
#define KVP_UNITS_H

#include <stddef.h>

/* v bytes in the largest binary unit that keeps the number at least 1, with three significant
 * digits: 1536 -> "1.50 KiB", 1073741824 -> "1.00 GiB", 512 -> "512 B". Writes at most size
 * bytes into buf (NUL-terminated) and returns buf. */
const char *kvp_human_bytes(double v, char *buf, size_t size);

#endif /* KVP_UNITS_H */
