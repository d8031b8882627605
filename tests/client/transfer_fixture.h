/*
 * transfer_fixture.h - what the client transfer tests (test_client_register.c,
 * test_client_shm.c, test_client_inline.c, test_client_reconnect.c) share: a fixture holding
 * the scripted fake daemon, the segment the test makes in its place and the client, and the
 * scripting and decoding helpers around them.
 *
 * Layout used throughout: 16 tokens per chunk (the fake's HELLO), float16, 1 layer, hidden 4,
 * so a chunk is 2 * 1 * 16 * 4 * 2 = 256 bytes.
 */
#ifndef KVP_TEST_TRANSFER_FIXTURE_H
#define KVP_TEST_TRANSFER_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "client/fake_daemon.h"
#include "common/msg.h"
#include "kvpool.h"

#define CT 16                        /* tokens per chunk */
#define CHUNK 256u                   /* bytes per chunk */
#define SEG_SIZE (4096u + 8 * CHUNK) /* the segment HELLO announces: header page, 8 chunks */
#define HANDLE 0x00050001u           /* the handle the scripted REGISTER replies give */

/* Two segment nonces: the daemon's, and one that is not. */
extern const uint8_t xfer_nonce_a[KVP_NONCE_SIZE];
extern const uint8_t xfer_nonce_b[KVP_NONCE_SIZE];

struct xfer_fixture {
    struct fake_daemon f;
    char seg_name[64];
    uint8_t *seg; /* the test's own mapping of the segment */
    size_t seg_size;
    kvp_client *c;
    uint32_t ids[256]; /* token ids for the cases' sequences */
};

/* cmocka per-case setup and teardown: a fresh fixture in *state, and everything it holds
 * closed, unlinked and freed. Both return 0. */
int xfer_setup(void **state);
int xfer_teardown(void **state);

/* Creates a segment as the daemon would (its header page announces SEG_SIZE bytes, the size
 * HELLO announces), file_size bytes long, and maps it into x->seg. */
void xfer_seg_create(struct xfer_fixture *x, const uint8_t *nonce, size_t file_size);

/* Steps for the fake: HELLO offering the fixture's segment (announced as SEG_SIZE) with nonce;
 * a REGISTER reply; a slots reply to op. */
void xfer_add_hello_shm(struct xfer_fixture *x, const uint8_t *nonce);
void xfer_add_register_reply(struct xfer_fixture *x, const struct kvp_register_reply *r);
void xfer_add_slots_reply(struct xfer_fixture *x, uint16_t op, struct kvp_slots_reply *m);

/* A REGISTER reply for the test layout: shm_name NULL for inline, reason may be NULL. */
struct kvp_register_reply xfer_register_reply(uint8_t transport, const char *shm_name,
                                              const char *reason);

/* Registration options for the test layout ("worker-0", model "tiny"). */
kvp_register_opts xfer_reg_opts(uint32_t transport);

/* The opening of a script: a segment and an shm HELLO and REGISTER, or an inline HELLO (no
 * shm) and REGISTER. */
void xfer_script_shm(struct xfer_fixture *x);
void xfer_script_inline(struct xfer_fixture *x);

/* Starts the fake and opens x->c on it (2 s timeout). */
void xfer_start_and_open(struct xfer_fixture *x);

/* Registers "worker-0" and checks that it got the shm (resp. inline) transport. */
kvp_instance *xfer_register_shm(struct xfer_fixture *x);
kvp_instance *xfer_register_inline(struct xfer_fixture *x);

/* Closes the client and joins the fake, failing the test if the fake had trouble; then
 * x->f.reqs holds everything the library sent. */
void xfer_finish(struct xfer_fixture *x);

/* Decodes request number i, which must be a REGISTER (resp. a reference request of op). */
struct kvp_register_req xfer_sent_register(struct xfer_fixture *x, int i);
struct kvp_ref_req xfer_sent_ref(struct xfer_fixture *x, int i, uint16_t op);

#endif /* KVP_TEST_TRANSFER_FIXTURE_H */
