/*
 * l2_redis.h - Redis Cluster key slots, exposed for unit tests; the backend itself is
 * kvp_l2_redis_backend (l2_backend.h).
 */
#ifndef KVP_L2_REDIS_H
#define KVP_L2_REDIS_H

#include <stddef.h>
#include <stdint.h>

#define KVP_L2_CLUSTER_SLOTS 16384

/* CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), Redis Cluster's key hash. */
uint16_t kvp_l2_crc16(const void *data, size_t len);

/* The cluster slot of a key: CRC16 of the key mod 16384, or of its hash tag only (the bytes
 * between the first '{' and the next '}', when there is at least one). */
uint32_t kvp_l2_key_slot(const char *key, size_t len);

#endif /* KVP_L2_REDIS_H */
