/* Helpers of the C test programs (api_check.c, forward_check.c): bf16
   conversion, expectations on statuses and messages, device buffers. */
#ifndef AEC_CHECK_UTIL_H
#define AEC_CHECK_UTIL_H

#include "aec_library.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_failures = 0;

/* bf16 bits of `x`, rounded to nearest even (NaN stays NaN). */
static inline uint16_t check_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float check_from_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Records a failure unless the status is `want` and the message contains
   `needle` (NULL: any message). */
static inline void check_status(const aec_library *lib, int got, int want, const char *needle, const char *what)
{
    const char *msg = aec_last_error(lib);
    if (got != want || (needle != NULL && strstr(msg, needle) == NULL)) {
        fprintf(stderr, "FAIL %s: %s (want %s); message \"%s\" (want it to contain \"%s\")\n", what,
                aec_status_name(got), aec_status_name(want), msg, needle != NULL ? needle : "");
        check_failures++;
    } else {
        printf("ok   %s: %s%s%s\n", what, aec_status_name(got), msg[0] ? ": " : "", msg);
    }
}

static inline void check_true(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "FAIL %s\n", what);
        check_failures++;
    } else {
        printf("ok   %s\n", what);
    }
}

/* A device buffer of `bytes` holding `host` (or zeros when host is NULL);
   exits on failure. */
static inline void *check_upload(aec_library *lib, const void *host, size_t bytes, const char *what)
{
    void *d = NULL;
    void *zeros = NULL;
    int st = aec_device_alloc(lib, bytes, &d);
    if (st == AEC_OK) {
        if (host == NULL) {
            zeros = calloc(1, bytes);
            host = zeros;
        }
        st = host != NULL ? aec_copy_to_device(lib, d, host, bytes) : AEC_ERROR_MEMORY;
        free(zeros);
    }
    if (st != AEC_OK) {
        fprintf(stderr, "FAIL uploading %s (%lu bytes): %s\n", what, (unsigned long)bytes, aec_last_error(lib));
        exit(1);
    }
    return d;
}

/* `n` bf16 values of a pseudo-random sequence in (-1, 1). */
static inline uint16_t *check_random_bf16(size_t n, uint32_t seed)
{
    uint16_t *h = (uint16_t *)malloc(n * sizeof *h);
    size_t i;
    uint32_t x = seed * 2654435761u + 1u;
    if (h == NULL) {
        fprintf(stderr, "FAIL out of memory\n");
        exit(1);
    }
    for (i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        h[i] = check_to_bf16((float)((double)x / 2147483648.0 - 1.0));
    }
    return h;
}

#endif
