/*
 * redis_cmp.c - the Redis comparator: what a user would run instead of kvpool.
 *
 * The bench starts Debian's redis-server itself, on a private Unix socket in its temporary
 * directory (no TCP port, no persistence, no size limits below 1 GiB), and talks to it with
 * hiredis exactly as an application would: SET key <chunk> and GET key, binary-safe "%b"
 * arguments, then a copy of the reply into the caller's buffer (a KV chunk has to end up in
 * the worker's memory, as kvp_retrieve() leaves it); MSET and MGET when a call carries several
 * chunks (--batch). Nothing is tuned in Redis' favour or
 * against it; the limits that matter (hiredis reads replies 16 KiB at a time and formats every
 * command into one buffer, Redis copies values through its query buffer) are what a user of
 * this stack gets. docs/PERFORMANCE.md discusses them.
 *
 * Built only when pkg-config finds hiredis (KVPB_HAVE_HIREDIS); otherwise every function
 * reports that the comparator was not compiled in and the bench says it skips Redis.
 *
 * A kvpb_redis is one connection, used by one worker process only.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#ifdef KVPB_HAVE_HIREDIS
#include <hiredis/hiredis.h>

struct kvpb_redis {
    redisContext *ctx;
};

bool kvpb_redis_compiled(void)
{
    return true;
}

kvpb_redis *kvpb_redis_connect(const char *socket, char *err, size_t err_size)
{
    kvpb_redis *r = calloc(1, sizeof(*r));
    if (!r) {
        snprintf(err, err_size, "out of memory");
        return NULL;
    }
    r->ctx = redisConnectUnix(socket);
    if (!r->ctx || r->ctx->err) {
        snprintf(err, err_size, "cannot connect to Redis at %s: %s", socket,
                 r->ctx ? r->ctx->errstr : "out of memory");
        kvpb_redis_close(r);
        return NULL;
    }
    return r;
}

void kvpb_redis_close(kvpb_redis *r)
{
    if (!r)
        return;
    if (r->ctx)
        redisFree(r->ctx);
    free(r);
}

/* Checks a reply; returns 0 or -EIO with a message. Frees nothing. */
static int check_reply(kvpb_redis *r, const redisReply *rep, const char *what, char *err,
                       size_t err_size)
{
    if (!rep) {
        snprintf(err, err_size, "Redis %s: %s", what, r->ctx->errstr);
        return -EIO;
    }
    if (rep->type == REDIS_REPLY_ERROR) {
        snprintf(err, err_size, "Redis %s: %.*s", what, (int)rep->len, rep->str);
        return -EIO;
    }
    return 0;
}

/*
 * SET for one value (what an application does for one chunk), MSET for several (one round trip
 * for a call's chunks, as kvpool's multi-chunk calls).
 */
int kvpb_redis_set(kvpb_redis *r, const char *const *keys, const void *const *values, size_t n,
                   size_t len, char *err, size_t err_size)
{
    const char *argv[1 + 2 * KVPB_MAX_BATCH];
    size_t lens[1 + 2 * KVPB_MAX_BATCH];
    redisReply *rep;

    if (n == 1) {
        rep = redisCommand(r->ctx, "SET %b %b", keys[0], strlen(keys[0]), values[0], len);
    } else {
        argv[0] = "MSET";
        lens[0] = 4;
        for (size_t i = 0; i < n && i < KVPB_MAX_BATCH; i++) {
            argv[1 + 2 * i] = keys[i];
            lens[1 + 2 * i] = strlen(keys[i]);
            argv[2 + 2 * i] = values[i];
            lens[2 + 2 * i] = len;
        }
        rep = redisCommandArgv(r->ctx, (int)(1 + 2 * n), argv, lens);
    }
    int rc = check_reply(r, rep, n == 1 ? "SET" : "MSET", err, err_size);
    if (rep)
        freeReplyObject(rep);
    return rc;
}

/* Checks one returned value and copies it out, as a user has to. */
static int take_value(const redisReply *v, const char *key, void *dst, size_t len, char *err,
                      size_t err_size)
{
    if (v->type != REDIS_REPLY_STRING || v->len != len) {
        snprintf(err, err_size, "Redis GET %s: expected %zu bytes, got type %d length %zu", key,
                 len, v->type, (size_t)v->len);
        return -EIO;
    }
    memcpy(dst, v->str, len);
    return 0;
}

int kvpb_redis_get(kvpb_redis *r, const char *const *keys, void *const *dsts, size_t n, size_t len,
                   char *err, size_t err_size)
{
    const char *argv[1 + KVPB_MAX_BATCH];
    size_t lens[1 + KVPB_MAX_BATCH];
    redisReply *rep;

    if (n == 1) {
        rep = redisCommand(r->ctx, "GET %b", keys[0], strlen(keys[0]));
    } else {
        argv[0] = "MGET";
        lens[0] = 4;
        for (size_t i = 0; i < n && i < KVPB_MAX_BATCH; i++) {
            argv[1 + i] = keys[i];
            lens[1 + i] = strlen(keys[i]);
        }
        rep = redisCommandArgv(r->ctx, (int)(1 + n), argv, lens);
    }
    int rc = check_reply(r, rep, n == 1 ? "GET" : "MGET", err, err_size);
    if (rc == 0 && n == 1) {
        rc = take_value(rep, keys[0], dsts[0], len, err, err_size);
    } else if (rc == 0 && (rep->type != REDIS_REPLY_ARRAY || rep->elements != n)) {
        snprintf(err, err_size, "Redis MGET: expected %zu values", n);
        rc = -EIO;
    }
    for (size_t i = 0; rc == 0 && n > 1 && i < n; i++)
        rc = take_value(rep->element[i], keys[i], dsts[i], len, err, err_size);
    if (rep)
        freeReplyObject(rep);
    return rc;
}

int kvpb_redis_ping(kvpb_redis *r, char *err, size_t err_size)
{
    redisReply *rep = redisCommand(r->ctx, "PING");
    int rc = check_reply(r, rep, "PING", err, err_size);
    if (rep)
        freeReplyObject(rep);
    return rc;
}

/* Reads "redis_version:X" from INFO server. */
static void read_version(kvpb_redis *r, char *version, size_t size)
{
    redisReply *rep = redisCommand(r->ctx, "INFO server");
    snprintf(version, size, "redis-server (unknown version)");
    if (rep && rep->type == REDIS_REPLY_STRING) {
        const char *v = strstr(rep->str, "redis_version:");
        if (v) {
            v += strlen("redis_version:");
            size_t n = strcspn(v, "\r\n");
            snprintf(version, size, "redis-server %.*s", (int)n, v);
        }
    }
    if (rep)
        freeReplyObject(rep);
}

int kvpb_redis_start(struct kvpb_child *ch, const char *binary, const char *dir, char *socket,
                     size_t socket_size, char *version, size_t version_size)
{
    char log[256], err[256];

    snprintf(socket, socket_size, "%s/redis.sock", dir);
    snprintf(log, sizeof(log), "%s/redis.log", dir);
    char *const argv[] = {
        (char *)binary,
        "--port",
        "0",
        "--unixsocket",
        socket,
        "--unixsocketperm",
        "700",
        "--dir",
        (char *)dir,
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--loglevel",
        "warning",
        "--protected-mode",
        "no",
        "--proto-max-bulk-len",
        "1gb",
        "--client-query-buffer-limit",
        "1gb",
        NULL,
    };
    int rc = kvpb_child_spawn(ch, "redis-server", argv, log);
    if (rc < 0)
        return rc;
    for (int waited = 0;; waited += 20) {
        kvpb_redis *r = kvpb_redis_connect(socket, err, sizeof(err));
        if (r && kvpb_redis_ping(r, err, sizeof(err)) == 0) {
            read_version(r, version, version_size);
            kvpb_redis_close(r);
            return 0;
        }
        kvpb_redis_close(r);
        if (!kvpb_child_alive(ch) || waited >= 20000) {
            fprintf(stderr, "kvpool-bench: redis-server did not start: %s\n", err);
            kvpb_child_print_log(ch, 20);
            kvpb_child_stop(ch, 5000);
            return -ECHILD;
        }
        kvpb_sleep_ms(20);
    }
}

#else /* !KVPB_HAVE_HIREDIS */

struct kvpb_redis {
    int unused;
};

bool kvpb_redis_compiled(void)
{
    return false;
}

kvpb_redis *kvpb_redis_connect(const char *socket, char *err, size_t err_size)
{
    (void)socket;
    snprintf(err, err_size, "built without hiredis");
    return NULL;
}

void kvpb_redis_close(kvpb_redis *r)
{
    (void)r;
}

int kvpb_redis_set(kvpb_redis *r, const char *const *keys, const void *const *values, size_t n,
                   size_t len, char *err, size_t err_size)
{
    (void)r, (void)keys, (void)values, (void)n, (void)len;
    snprintf(err, err_size, "built without hiredis");
    return -ENOTSUP;
}

int kvpb_redis_get(kvpb_redis *r, const char *const *keys, void *const *dsts, size_t n, size_t len,
                   char *err, size_t err_size)
{
    (void)r, (void)keys, (void)dsts, (void)n, (void)len;
    snprintf(err, err_size, "built without hiredis");
    return -ENOTSUP;
}

int kvpb_redis_ping(kvpb_redis *r, char *err, size_t err_size)
{
    (void)r;
    snprintf(err, err_size, "built without hiredis");
    return -ENOTSUP;
}

int kvpb_redis_start(struct kvpb_child *ch, const char *binary, const char *dir, char *socket,
                     size_t socket_size, char *version, size_t version_size)
{
    (void)ch, (void)binary, (void)dir, (void)socket, (void)socket_size;
    snprintf(version, version_size, "built without hiredis");
    return -ENOTSUP;
}

#endif /* KVPB_HAVE_HIREDIS */
