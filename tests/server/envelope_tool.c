/*
 * envelope_tool.c - a command-line face of lmc/envelope.c for envelope_lmcache.py, which checks
 * it against the real LMCache 0.5.7 (tensor_wire.py) of an LMCache virtual environment.
 *
 *   envelope_tool decode IN OUT DTYPE MIN MAX D0 [D1 ...]
 *       Decodes the TensorEnvelope in file IN as MIN..MAX tensors of DTYPE and shape
 *       D0 x D1 x ...; writes their bytes, one after the other, to OUT and prints "ok N". A
 *       refused payload prints "refused: <reason>" and exits 1.
 *   envelope_tool encode IN OUT DTYPE N D0 [D1 ...]
 *       Reads N chunks of DTYPE and shape D0 x D1 x ... from IN (their bytes one after the
 *       other) and writes the envelope a worker decodes to OUT.
 *
 * Exit 0 on success, 1 on a refused payload, 2 on a usage or I/O error.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lmc/envelope.h"

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            uint8_t *bigger = realloc(buf, cap * 2);
            if (!bigger) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
            cap *= 2;
        }
    }
    fclose(f);
    *len = n;
    return buf;
}

static int spill(const char *path, const uint8_t *p, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t put = len ? fwrite(p, 1, len, f) : 0;
    return (fclose(f) == 0 && put == len) ? 0 : -1;
}

static int usage(void)
{
    fprintf(stderr, "usage: envelope_tool decode IN OUT DTYPE MIN MAX D0 [D1 ...]\n"
                    "       envelope_tool encode IN OUT DTYPE N D0 [D1 ...]\n");
    return 2;
}

static int layout_from(struct kvp_envelope_layout *l, const char *dtype, int argc, char **argv)
{
    if (argc < 1 || argc > (int)KVP_ENVELOPE_MAX_RANK)
        return -1;
    l->dtype = dtype;
    l->ndim = (uint32_t)argc;
    for (int i = 0; i < argc; i++)
        l->shape[i] = strtoull(argv[i], NULL, 10);
    return 0;
}

static int decode(int argc, char **argv)
{
    struct kvp_envelope_expect e = {0};
    char why[256];
    size_t len;
    if (argc < 7 || layout_from(&e.layout, argv[3], argc - 6, argv + 6) < 0)
        return usage();
    e.min_tensors = (uint32_t)strtoul(argv[4], NULL, 10);
    e.max_tensors = (uint32_t)strtoul(argv[5], NULL, 10);
    uint8_t *buf = slurp(argv[1], &len);
    struct kvp_envelope_tensor *out = calloc(e.max_tensors + 1, sizeof(*out));
    if (!buf || !out) {
        fprintf(stderr, "envelope_tool: cannot read %s\n", argv[1]);
        free(out);
        free(buf);
        return 2;
    }
    uint32_t n = 0;
    int ret = 0;
    int rc = kvp_envelope_decode(buf, len, &e, out, e.max_tensors, &n, why, sizeof(why));
    if (rc == -EINVAL) {
        fprintf(stderr, "envelope_tool: %s\n", why);
        ret = 2;
    } else if (rc < 0) {
        printf("refused: %s\n", why);
        ret = 1;
    } else {
        FILE *f = fopen(argv[2], "wb");
        bool ok = f != NULL;
        for (uint32_t i = 0; ok && i < n; i++)
            ok = fwrite(out[i].data, 1, out[i].len, f) == out[i].len;
        if (f && fclose(f) != 0)
            ok = false;
        if (ok)
            printf("ok %u\n", n);
        else
            fprintf(stderr, "envelope_tool: cannot write %s\n", argv[2]);
        ret = ok ? 0 : 2;
    }
    free(out);
    free(buf);
    return ret;
}

static int encode(int argc, char **argv)
{
    struct kvp_envelope_layout l;
    struct kvp_envelope_template t;
    char why[256];
    size_t len;
    uint64_t size;
    if (argc < 6 || layout_from(&l, argv[3], argc - 5, argv + 5) < 0)
        return usage();
    uint32_t n = (uint32_t)strtoul(argv[4], NULL, 10);
    if (kvp_envelope_template_init(&t, &l, why, sizeof(why)) < 0) {
        fprintf(stderr, "envelope_tool: %s\n", why);
        return 2;
    }
    uint8_t *in = slurp(argv[1], &len);
    const uint8_t **chunks = calloc(n + 1, sizeof(*chunks));
    uint8_t *dst = NULL;
    int ret = 2;
    if (!in || !chunks || len != t.chunk_bytes * n || kvp_envelope_encoded_size(&t, n, &size) < 0) {
        fprintf(stderr, "envelope_tool: %s does not hold %u chunks\n", argv[1], n);
        goto out_free;
    }
    dst = malloc(size + 1);
    if (!dst)
        goto out_free;
    for (uint32_t i = 0; i < n; i++)
        chunks[i] = in + i * t.chunk_bytes;
    if (kvp_envelope_encode(&t, n, chunks, dst, size) != (int64_t)size ||
        spill(argv[2], dst, size) < 0) {
        fprintf(stderr, "envelope_tool: cannot write %s\n", argv[2]);
        goto out_free;
    }
    ret = 0;
out_free:
    free(dst);
    free(chunks);
    free(in);
    return ret;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "decode") == 0)
        return decode(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "encode") == 0)
        return encode(argc - 1, argv + 1);
    return usage();
}
