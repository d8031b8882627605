/*
 * codec.h - a small, strict and bounded MessagePack codec for the LMCache front end.
 *
 * LMCache's multiprocess protocol encodes every frame with msgspec's msgpack encoder: ints in
 * their smallest form, dataclasses and structs as maps keyed by field name, bytes as bin, str
 * as str (docs/LMCACHE.md). The reader is a cursor over one frame: every length is checked
 * against the bytes left before it is used, it never allocates, and skipping a value is
 * iterative (no recursion, however deep the nesting). The writer appends to a growable buffer
 * and remembers the first failure, so an encoder checks once at the end.
 *
 * Errors: -EPROTO for bytes that are not msgpack (truncated, reserved byte 0xc1), -EINVAL for a
 * value of another type than asked, -ERANGE for an integer outside the asked range, -E2BIG for
 * a string, array or map longer than the caller's bound. On any error the cursor is left where
 * it was, so a caller can peek and try another reader.
 */
#ifndef KVP_LMC_CODEC_H
#define KVP_LMC_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The kinds of value the reader tells apart. */
enum lmc_mp_type {
    LMC_MP_NIL,
    LMC_MP_BOOL,
    LMC_MP_INT, /* any integer, signed or unsigned, of any width */
    LMC_MP_FLOAT,
    LMC_MP_STR,
    LMC_MP_BIN,
    LMC_MP_ARRAY,
    LMC_MP_MAP,
    LMC_MP_EXT,
};

struct lmc_mp_reader {
    const uint8_t *p, *end;
};

/* What a reader's error rc (-EPROTO, -ERANGE, -E2BIG, else a wrong type) says of the value, for
 * a refusal's reason: "is not valid msgpack (truncated?)", "is out of range", ... */
const char *lmc_mp_error_words(int rc);

/* Starts reading the n bytes at p. */
void lmc_mp_reader_init(struct lmc_mp_reader *r, const void *p, size_t n);

/* Bytes not read yet. */
size_t lmc_mp_left(const struct lmc_mp_reader *r);

/* The type of the next value, without consuming it. 0, or -EPROTO (nothing left, 0xc1). */
int lmc_mp_peek(const struct lmc_mp_reader *r, enum lmc_mp_type *t);

/* True (and consumed) when the next value is nil. */
bool lmc_mp_try_nil(struct lmc_mp_reader *r);

int lmc_mp_read_nil(struct lmc_mp_reader *r);
int lmc_mp_read_bool(struct lmc_mp_reader *r, bool *v);

/* An integer of any width in [min, max]. uint64 values above INT64_MAX are -ERANGE. */
int lmc_mp_read_int(struct lmc_mp_reader *r, int64_t min, int64_t max, int64_t *v);

/* A non-negative integer of any width, up to max. */
int lmc_mp_read_uint(struct lmc_mp_reader *r, uint64_t max, uint64_t *v);

/* A float32, float64 or integer (msgspec accepts an int where a float is declared). */
int lmc_mp_read_float(struct lmc_mp_reader *r, double *v);

/* A str of at most max bytes: *s points into the frame (not NUL-terminated), *len its length. */
int lmc_mp_read_str(struct lmc_mp_reader *r, uint32_t max, const char **s, uint32_t *len);

/* A str copied into buf (cap bytes, NUL-terminated): at most cap - 1 bytes, else -E2BIG. A
 * str holding a NUL byte is -EINVAL (no C string could carry it). */
int lmc_mp_read_cstr(struct lmc_mp_reader *r, char *buf, size_t cap);

/* A bin of at most max bytes; *b points into the frame. */
int lmc_mp_read_bin(struct lmc_mp_reader *r, uint64_t max, const uint8_t **b, uint64_t *len);

/* The header of an array (or map) of at most max elements (pairs). Each element takes at least
 * one byte, so a count larger than the bytes left is -EPROTO before anything is read. */
int lmc_mp_read_array(struct lmc_mp_reader *r, uint32_t max, uint32_t *n);
int lmc_mp_read_map(struct lmc_mp_reader *r, uint32_t max, uint32_t *n);

/* Steps over one whole value, nested ones included (ext values by their length, never
 * decoded). Iterative: the depth of nesting costs nothing. */
int lmc_mp_skip(struct lmc_mp_reader *r);

/* Checks that buf holds exactly one well-formed value and nothing after it. */
int lmc_mp_check_one(const void *buf, size_t n);

/* The growable output buffer. A failed allocation sets failed; later puts do nothing. */
struct lmc_mp_writer {
    uint8_t *buf;
    size_t len, cap;
    bool failed;
    bool fixed; /* buf is the caller's, of cap bytes: never grown nor freed */
};

void lmc_mp_writer_init(struct lmc_mp_writer *w);
/* A writer into the caller's buf of cap bytes: what does not fit sets failed. No free needed. */
void lmc_mp_writer_init_fixed(struct lmc_mp_writer *w, uint8_t *buf, size_t cap);
void lmc_mp_writer_reset(struct lmc_mp_writer *w); /* len = 0, failed = false; keeps buf */
void lmc_mp_writer_free(struct lmc_mp_writer *w);

void lmc_mp_put_nil(struct lmc_mp_writer *w);
void lmc_mp_put_bool(struct lmc_mp_writer *w, bool v);
void lmc_mp_put_int(struct lmc_mp_writer *w, int64_t v); /* smallest form, as msgspec */
void lmc_mp_put_uint(struct lmc_mp_writer *w, uint64_t v);
void lmc_mp_put_str(struct lmc_mp_writer *w, const char *s, size_t len);
void lmc_mp_put_cstr(struct lmc_mp_writer *w, const char *s);
void lmc_mp_put_bin(struct lmc_mp_writer *w, const void *b, size_t len);
/* The header of a bin of len bytes (smallest form); the caller writes the bytes. */
void lmc_mp_put_bin_header(struct lmc_mp_writer *w, size_t len);
/* Room for n raw bytes at the end of the output, or NULL (failed set). */
uint8_t *lmc_mp_put_room(struct lmc_mp_writer *w, size_t n);
void lmc_mp_put_array(struct lmc_mp_writer *w, uint32_t n);
void lmc_mp_put_map(struct lmc_mp_writer *w, uint32_t n);

#endif /* KVP_LMC_CODEC_H */
