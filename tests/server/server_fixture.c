/*
 * server_fixture.c - a real kvp_server inside the test process (see server_fixture.h).
 */
#include "server_fixture.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "common/kvp_assert.h"

static char fx_dir[64];

void fx_config(struct kvp_config *cfg, bool shm, const char *http)
{
    static unsigned counter;

    kvp_log_threshold = KVP_LOG_ERROR;
    kvp_config_defaults(cfg);
    snprintf(fx_dir, sizeof(fx_dir), "/tmp/kvpfx-XXXXXX");
    assert_non_null(mkdtemp(fx_dir));
    snprintf(cfg->socket_path, sizeof(cfg->socket_path), "%s/kvpool.sock", fx_dir);
    cfg->l1_size = FX_POOL;
    cfg->chunk_tokens = FX_CHUNK_TOKENS;
    cfg->shm_enabled = shm;
    if (shm)
        snprintf(cfg->shm_name, sizeof(cfg->shm_name), "kvpool_l1_pool_fx_%d_%u", (int)getpid(),
                 counter++);
    else
        cfg->shm_name[0] = '\0';
    snprintf(cfg->http, sizeof(cfg->http), "%s", http);
}

void fx_server_start_http(struct kvp_server *s, bool shm, const char *http)
{
    struct kvp_config cfg;
    fx_config(&cfg, shm, http);
    assert_rc(kvp_server_init(s, &cfg), 0);
    assert_rc(kvp_server_start(s), 0);
}

void fx_server_start(struct kvp_server *s, bool shm)
{
    fx_server_start_http(s, shm, "off");
}

void fx_server_stop(struct kvp_server *s)
{
    char cmd[128];
    kvp_server_destroy(s);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", fx_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", fx_dir);
}

void fx_spec(struct kvp_reg_spec *q, const char *id, uint8_t transport, const char *reason)
{
    memset(q, 0, sizeof(*q));
    snprintf(q->instance_id, sizeof(q->instance_id), "%s", id);
    snprintf(q->model_name, sizeof(q->model_name), "fixture-model");
    snprintf(q->dtype, sizeof(q->dtype), "float16");
    snprintf(q->reason, sizeof(q->reason), "%s", reason ? reason : "");
    q->world_size = 2;
    q->worker_rank = 1;
    q->block_size = 16;
    q->num_layers = 2;
    q->hidden_dim = 64;
    q->transport = transport;
}

uint32_t fx_register(struct kvp_server *s, const char *id, uint64_t owner, uint8_t transport,
                     const char *reason)
{
    struct kvp_reg_spec q;
    struct kvp_registration inst;
    char msg[256];
    bool existing;

    fx_spec(&q, id, transport, reason);
    assert_rc(kvp_registry_validate(&s->registry, &q, &inst, msg, sizeof(msg)), 0);
    assert_rc(kvp_registry_choose_transport(&s->registry, &inst, NULL, msg, sizeof(msg)), 0);
    inst.connected_since_ms = kvp_wall_ms();
    inst.owner = owner;
    inst.owner_pid = (int32_t)(1000 + owner);
    snprintf(inst.frontend, sizeof(inst.frontend), "kvpool");
    assert_rc(kvp_registry_add(&s->registry, &inst, 0, &existing, msg, sizeof(msg)), 0);
    assert_false(existing);
    return inst.handle;
}

char *fx_read_file(const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return NULL;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (size_t n; buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0;) {
        len += n;
        if (cap - len < 2) {
            char *b = realloc(buf, cap * 2);
            if (!b) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf)
        buf[len] = '\0';
    return buf;
}
