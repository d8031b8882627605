/*
 * limits.h - the limits on what a client of any protocol controls: the sizes of the names,
 * keys and ranges the daemon accepts, and that kvpool's library checks before it sends.
 *
 * One definition for the native protocol (wire.h, which includes this header), the daemon's
 * core and every front end: a front end that decodes another protocol (LMCache's) refuses what
 * exceeds these limits in its own terms, before the core sees it.
 */
#ifndef KVP_LIMITS_H
#define KVP_LIMITS_H

#define KVP_MAX_TOKENS (1u << 20) /* token ids in one key */
#define KVP_MAX_SALT 256u         /* cache salt bytes */
#define KVP_MAX_NAME 127u         /* instance id, model name, dtype name, shm name */
#define KVP_MAX_REASON 255u       /* transport reason strings */
#define KVP_MAX_ERRMSG 255u       /* error messages given back to a client */
#define KVP_MAX_CHUNKS 4096u      /* chunks in one request range */

#endif /* KVP_LIMITS_H */
