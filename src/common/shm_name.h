/*
 * shm_name.h - naming of the POSIX shared-memory segment that holds the pool.
 */
#ifndef KVP_SHM_NAME_H
#define KVP_SHM_NAME_H

#include <stdbool.h>
#include <stddef.h>

#define KVP_SHM_PREFIX "kvpool_l1_pool_"

/*
 * Normalises a configured segment name: strips one leading '/', adds KVP_SHM_PREFIX when the
 * name does not start with it. Writes the result (without '/') to out. Returns 0, -EINVAL for an
 * empty name, a name made only of '/', or a name containing '/' or a control character, and
 * -ENAMETOOLONG when the result exceeds 127 bytes or size.
 */
int kvp_shm_name_normalize(const char *name, char *out, size_t size);

/* Hex digits of the random part of a default name: 64 bits nobody can predict. */
#define KVP_SHM_NAME_RANDOM_HEX 16

/*
 * A default name: KVP_SHM_PREFIX, the pid (for the operator's eyes), '_' and
 * KVP_SHM_NAME_RANDOM_HEX random lowercase hex digits (libsodium's randombytes), such as
 * kvpool_l1_pool_4863_9f2c61d04ab7e358. Another local user cannot know it in advance, so cannot
 * plant a file of that name. Returns 0, -ENAMETOOLONG (size too small) or -ENOMEM (libsodium
 * cannot start).
 */
int kvp_shm_name_random(long pid, char *out, size_t size);

/* True when name has the form of a default name: KVP_SHM_PREFIX and digits (the pid-only names
 * of earlier versions), optionally followed by '_' and KVP_SHM_NAME_RANDOM_HEX hex digits. */
bool kvp_shm_name_is_default(const char *name);

#endif /* KVP_SHM_NAME_H */
