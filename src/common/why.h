/*
 * why.h - the one way a function that can refuse says why: it formats the reason into the
 * caller's buffer (when it gave one) and returns its error code, so that a refusal is one line:
 *
 *     if (len > KVP_MAX_NAME)
 *         return kvp_why(why, why_size, -EINVAL, "name of %zu bytes", len);
 */
#ifndef KVP_WHY_H
#define KVP_WHY_H

#include <stddef.h>

/* Formats fmt into why[why_size] (nothing when why is NULL or why_size 0); returns rc. */
__attribute__((format(printf, 4, 5))) int kvp_why(char *why, size_t why_size, int rc,
                                                  const char *fmt, ...);

#endif /* KVP_WHY_H */
