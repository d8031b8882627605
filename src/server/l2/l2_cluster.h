/*
 * l2_cluster.h - Redis Cluster for the L2 tier's Redis backend: key slots (also used by the
 * unit tests), the slot map and redirections (l2_cluster.c).
 */
#ifndef KVP_L2_CLUSTER_H
#define KVP_L2_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include "l2/l2_node.h" /* KVP_L2_CLUSTER_SLOTS */

struct kvp_l2_conn;
struct redisReply;

/* CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), Redis Cluster's key hash. */
uint16_t kvp_l2_crc16(const void *data, size_t len);

/* The cluster slot of a key: CRC16 of the key mod 16384, or of its hash tag only (the bytes
 * between the first '{' and the next '}', when there is at least one). */
uint32_t kvp_l2_key_slot(const char *key, size_t len);

/* Fetches the slot map (CLUSTER SLOTS) from the first node that answers, connected ones
 * first. Returns 0 or an error (no node reachable, or none maps a slot). */
int kvp_l2r_cluster_refresh(struct kvp_l2_conn *c, char *why, size_t why_size);

/* The node that serves key: node 0 for a single server; for a cluster, from the slot map,
 * fetched first when it is stale or does not know the slot. */
int kvp_l2r_route(struct kvp_l2_conn *c, const char *key, uint32_t *node, char *why,
                  size_t why_size);

/*
 * A -MOVED or -ASK error (its text, without '-') received from node `from`: the node it names
 * (added to the table) in *node; for MOVED the slot map is updated and marked stale. Returns 1
 * for MOVED, 2 for ASK, 0 for any other error (or a single server). kvp_l2r_redirect() does
 * the same for a reply object.
 */
int kvp_l2r_redirect_msg(struct kvp_l2_conn *c, const char *msg, uint32_t from, uint32_t *node);
int kvp_l2r_redirect(struct kvp_l2_conn *c, const struct redisReply *r, uint32_t from,
                     uint32_t *node);

#endif /* KVP_L2_CLUSTER_H */
