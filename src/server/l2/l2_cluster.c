/*
 * l2_cluster.c - Redis Cluster for the L2 tier's Redis backend: hiredis 0.14 knows nothing of
 * it, so the routing is done here.
 *
 * A key's slot is CRC16(key) mod 16384 (kvp_l2_key_slot). The slot map comes from CLUSTER SLOTS
 * of any reachable node: the connected ones first, then the others the connection knows (the
 * seeds and every node a map or a redirection named). A -MOVED reply updates its slot at once
 * and marks the map stale, so that the next routing fetches the whole map again (a resharding
 * moves many slots); -ASK names the node for one command, preceded by ASKING, without touching
 * the map. Callers follow at most KVP_REDIRECTS redirections per command.
 *
 * The node table only grows (KVP_MAX_NODES at most): indices stay valid for the connection's
 * life, so the slot map can hold them.
 *
 * Threads: the connection's thread only.
 */
#include "l2/l2_cluster.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/stats.h"
#include "l2/l2_node.h"

uint16_t kvp_l2_crc16(const void *data, size_t len)
{
    const uint8_t *p = data;
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)(p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = crc & 0x8000 ? (uint16_t)(crc << 1 ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

uint32_t kvp_l2_key_slot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open) {
        size_t rest = len - (size_t)(open + 1 - key);
        const char *close = memchr(open + 1, '}', rest);
        if (close && close > open + 1)
            return kvp_l2_crc16(open + 1, (size_t)(close - open - 1)) % KVP_L2_CLUSTER_SLOTS;
    }
    return kvp_l2_crc16(key, len) % KVP_L2_CLUSTER_SLOTS;
}

/* ---- the slot map ---- */

/* Applies a CLUSTER SLOTS reply from node `from`. Returns the number of slots mapped. */
static uint32_t apply_slots(struct kvp_l2_conn *c, const redisReply *r, uint32_t from)
{
    uint32_t mapped = 0;
    memset(c->slot_node, 0, sizeof(c->slot_node));
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER ||
            e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2 ||
            e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
            e->element[2]->element[1]->type != REDIS_REPLY_INTEGER)
            continue;
        long long lo = e->element[0]->integer, hi = e->element[1]->integer;
        long long port = e->element[2]->element[1]->integer;
        const redisReply *h = e->element[2]->element[0];
        if (lo < 0 || hi >= KVP_L2_CLUSTER_SLOTS || lo > hi || port < 1 || port > 65535)
            continue;
        /* An empty host means "the node you asked" (cluster-announce-hostname unset). */
        const char *host = h->len ? h->str : c->nodes[from].host;
        size_t hlen = h->len ? h->len : strlen(c->nodes[from].host);
        int idx = kvp_l2r_node_find_add(c, host, hlen, (uint16_t)port);
        if (idx < 0)
            continue;
        for (long long s = lo; s <= hi; s++)
            c->slot_node[s] = (uint8_t)(idx + 1);
        mapped += (uint32_t)(hi - lo + 1);
    }
    return mapped;
}

/* Fetches the slot map from the first node that answers: connected nodes first. */
int kvp_l2r_cluster_refresh(struct kvp_l2_conn *c, char *why, size_t why_size)
{
    int rc = -ECONNREFUSED;
    snprintf(why, why_size, "no cluster node reachable");
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < c->nnodes; i++) {
            if ((pass == 0) != (c->nodes[i].ctx != NULL))
                continue;
            redisContext *ctx;
            redisReply *r = NULL;
            const char *argv[2] = {"CLUSTER", "SLOTS"};
            size_t lens[2] = {7, 5};
            rc = kvp_l2r_node_ctx(c, i, &ctx, why, why_size);
            if (rc == 0)
                rc = kvp_l2r_node_cmd(c, i, 2, argv, lens, &r, why, why_size);
            if (rc)
                continue;
            if (r->type != REDIS_REPLY_ARRAY) {
                rc = r->type == REDIS_REPLY_ERROR
                         ? kvp_l2r_reply_error(r, "CLUSTER SLOTS", why, why_size)
                         : -EPROTO;
                if (rc == -EPROTO)
                    freeReplyObject(r);
                continue;
            }
            uint32_t mapped = apply_slots(c, r, i);
            freeReplyObject(r);
            if (mapped == 0) {
                snprintf(why, why_size, "CLUSTER SLOTS of %s:%u maps no slot", c->nodes[i].host,
                         (unsigned)c->nodes[i].port);
                rc = -EREMOTEIO;
                continue;
            }
            c->stale = false;
            return 0;
        }
    }
    return rc;
}

/* The node that serves key. */
int kvp_l2r_route(struct kvp_l2_conn *c, const char *key, uint32_t *node, char *why,
                  size_t why_size)
{
    if (!c->cluster) {
        *node = 0;
        return 0;
    }
    uint32_t slot = kvp_l2_key_slot(key, strlen(key));
    if (c->stale || c->slot_node[slot] == 0) {
        int rc = kvp_l2r_cluster_refresh(c, why, why_size);
        if (rc)
            return rc;
    }
    if (c->slot_node[slot] == 0) {
        snprintf(why, why_size, "no cluster node serves slot %u", (unsigned)slot);
        return -EREMOTEIO;
    }
    *node = c->slot_node[slot] - 1u;
    return 0;
}

/*
 * A -MOVED or -ASK error (its text, without '-'): the node it names (added to the table) in *node;
 * for MOVED the slot map is updated and marked stale. Returns 1 for MOVED, 2 for ASK, 0 for another
 * reply.
 */
int kvp_l2r_redirect_msg(struct kvp_l2_conn *c, const char *msg, uint32_t from, uint32_t *node)
{
    if (!c->cluster)
        return 0;
    int kind = strncmp(msg, "MOVED ", 6) == 0 ? 1 : strncmp(msg, "ASK ", 4) == 0 ? 2 : 0;
    if (!kind)
        return 0;
    /* "MOVED <slot> <host>:<port>"; the host may be empty (":7001"): the node asked. */
    char *end;
    const char *p = msg + (kind == 1 ? 6 : 4);
    unsigned long slot = strtoul(p, &end, 10);
    if (end == p || *end != ' ' || slot >= KVP_L2_CLUSTER_SLOTS)
        return 0;
    const char *hp = end + 1, *colon = strrchr(hp, ':');
    if (!colon)
        return 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (port < 1 || port > 65535 || *end)
        return 0;
    const char *host = colon > hp ? hp : c->nodes[from].host;
    size_t hlen = colon > hp ? (size_t)(colon - hp) : strlen(c->nodes[from].host);
    int idx = kvp_l2r_node_find_add(c, host, hlen, (uint16_t)port);
    if (idx < 0)
        return 0;
    *node = (uint32_t)idx;
    KVP_COUNT(l2_redirects, 1);
    if (kind == 1) {
        c->slot_node[slot] = (uint8_t)(idx + 1);
        c->stale = true;
    }
    return kind;
}

int kvp_l2r_redirect(struct kvp_l2_conn *c, const redisReply *r, uint32_t from, uint32_t *node)
{
    return r->type == REDIS_REPLY_ERROR ? kvp_l2r_redirect_msg(c, r->str, from, node) : 0;
}
