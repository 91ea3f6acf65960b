/* Minimal TAP producer for C unit tests run by prove. */
#ifndef CKPT_TAP_H
#define CKPT_TAP_H

#include <stdio.h>
#include <string.h>

static int tap_n, tap_failed;

#define ok(cond, ...)                                                                              \
    do {                                                                                           \
        int ok_ = (cond) ? 1 : 0;                                                                  \
        printf("%sok %d - ", ok_ ? "" : "not ", ++tap_n);                                          \
        printf(__VA_ARGS__);                                                                       \
        printf("\n");                                                                              \
        if (!ok_) {                                                                                \
            tap_failed++;                                                                          \
            printf("#   failed at %s:%d\n", __FILE__, __LINE__);                                   \
        }                                                                                          \
    } while (0)

#define is_u64(got, want, ...)                                                                     \
    do {                                                                                           \
        unsigned long long g_ = (got), w_ = (want);                                                \
        ok(g_ == w_, __VA_ARGS__);                                                                 \
        if (g_ != w_) printf("#   got %llu, want %llu\n", g_, w_);                                 \
    } while (0)

static inline int tap_done(void) {
    printf("1..%d\n", tap_n);
    return tap_failed ? 1 : 0;
}

#endif
