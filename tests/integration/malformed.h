/*
 * malformed.h - what the test_malformed_*.c programs share: the layout's sizes and the daemon
 * each of them starts (a 16 MiB pool, 16-token chunks, and a 500 ms --io-timeout so that a
 * stalled frame is dropped quickly; info-level logging keeps floods of bad traffic readable).
 */
#ifndef KVPT_MALFORMED_H
#define KVPT_MALFORMED_H

#define C 16
#define CHUNK_BYTES 8192 /* kvpt_layout(): 2 x 2 layers x 16 tokens x 64 x float16 */

/* The daemon's arguments, as an initializer: const char *const args[] = MALFORMED_DAEMON_ARGS; */
#define MALFORMED_DAEMON_ARGS                                                                     \
    {                                                                                             \
        "--l1-size", "16MiB", "--chunk-size", "16", "--io-timeout", "500", "--log-level", "info", \
            NULL                                                                                  \
    }

#endif /* KVPT_MALFORMED_H */
