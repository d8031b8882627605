/*
 * fuzz.h - shared by the fuzz drivers in fuzz/.
 *
 * Every driver defines LLVMFuzzerTestOneInput(). Built with clang and KVP_FUZZ it links
 * libFuzzer; built with any other compiler it links replay.c instead, whose main() feeds it every
 * file of the committed corpus, so each input that ever crashed a driver stays a regression test
 * in the normal build (ctest label "fuzz").
 *
 * A driver checks more than "did not crash": FUZZ_CHECK() states what a decoder promises about
 * what it accepted (limits respected, the encoding round-trips), and aborts when it does not.
 */
#ifndef KVP_FUZZ_H
#define KVP_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                  \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

#endif /* KVP_FUZZ_H */
