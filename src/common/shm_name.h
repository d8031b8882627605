/*
 * shm_name.h - naming of the POSIX shared-memory segment that holds the pool.
 */
#ifndef KVP_SHM_NAME_H
#define KVP_SHM_NAME_H

#include <stddef.h>

#define KVP_SHM_PREFIX "kvpool_l1_pool_"

/*
 * Normalises a configured segment name: strips one leading '/', adds KVP_SHM_PREFIX when the
 * name does not start with it. Writes the result (without '/') to out. Returns 0, -EINVAL for an
 * empty name, a name made only of '/', or a name containing '/' or a control character, and
 * -ENAMETOOLONG when the result exceeds 127 bytes or size.
 */
int kvp_shm_name_normalize(const char *name, char *out, size_t size);

/* The default name, KVP_SHM_PREFIX followed by the pid. Returns 0 or -ENAMETOOLONG. */
int kvp_shm_name_default(long pid, char *out, size_t size);

#endif /* KVP_SHM_NAME_H */
