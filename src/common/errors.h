/*
 * errors.h - return-code names and texts for both sides: the library's public kvp_strerror()
 * and kvp_err_name() (declared in include/kvpool.h) are defined in errors.c, and the daemon
 * uses the same thread-safe text for its log lines instead of strerror().
 */
#ifndef KVP_ERRORS_H
#define KVP_ERRORS_H

#include "kvpool.h"

#endif /* KVP_ERRORS_H */
