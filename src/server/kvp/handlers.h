/*
 * handlers.h - the request dispatcher: one handler per opcode (handlers.c), called by a
 * connection's thread (session.c) for each request whose header and body it has read.
 */
#ifndef KVP_HANDLERS_H
#define KVP_HANDLERS_H

#include "common/wire.h"

struct kvp_session;

/*
 * Performs request h (its body is in c->body) and sends exactly one reply. Returns 0 to keep the
 * connection, or a negative errno to close it: a framing error or failed socket I/O, after
 * which the byte stream cannot be trusted. A bad value is an error reply and returns 0.
 */
int kvp_handle_request(struct kvp_session *c, const struct kvp_header *h);

#endif /* KVP_HANDLERS_H */
