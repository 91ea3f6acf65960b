/* The float casts of convert --dtype on a float's bits (ckpt_f32_to_f32/_bf16/_f16) against the
 * general rounding (ckpt_round_float of the value as a double, which tests/t/69 checks against
 * numpy): every exponent and sign with the mantissa's low bits at and around each rounding
 * boundary, plus random patterns; CAST_EXHAUSTIVE=1 compares all 2^32 patterns (minutes). */
#include "../../core/write/cast.h"
#include "tap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static unsigned long long checked, bad[4];
static uint32_t first_bad[4];

/* ckpt_f32_to_f16_many (F16C where the CPU has it) on the same patterns, a batch at a time;
 * odd batch lengths leave tails for its scalar end. */
static uint32_t batch[1021];
static uint16_t batch_want[1021];
static size_t batched;

static void flush_batch(void) {
    uint16_t got[1021];
    float in[1021];
    memcpy(in, batch, batched * 4);
    ckpt_f32_to_f16_many(in, batched, got);
    for (size_t i = 0; i < batched; i++)
        if (got[i] != batch_want[i] && !bad[3]++) first_bad[3] = batch[i];
    batched = 0;
}

static void check(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    double x = f;
    uint32_t want[3] = {ckpt_round_float(x, 23, 8), ckpt_round_float(x, 7, 8),
                        ckpt_round_float(x, 10, 5)};
    uint32_t got[3] = {ckpt_f32_to_f32(u), ckpt_f32_to_bf16(u), ckpt_f32_to_f16(u)};
    for (int k = 0; k < 3; k++)
        if (got[k] != want[k] && !bad[k]++) first_bad[k] = u;
    batch[batched] = u;
    batch_want[batched++] = (uint16_t)want[2];
    if (batched == sizeof batch / sizeof *batch) flush_batch();
    checked++;
}

int main(void) {
    /* the low 17 bits at and around each bit a rounding may start at (bits 12 to 16) */
    static const uint32_t low[] = {0,       1,       2,       0x7FF,  0x800,  0x801,  0xFFF,
                                   0x1000,  0x1001,  0x1FFF,  0x2000, 0x2001, 0x3000, 0x3FFF,
                                   0x4000,  0x4001,  0x7FFF,  0x8000, 0x8001, 0xC000, 0xFFFF,
                                   0x10000, 0x10001, 0x18000, 0x1FFFF};
    const char *all = getenv("CAST_EXHAUSTIVE");
    if (all && *all == '1') {
        uint32_t u = 0;
        do check(u);
        while (++u != 0);
    } else {
        /* every sign, exponent and top mantissa bits (bits 31..17), with the low 17 bits at
         * the boundaries of BF16 (16 bits dropped) and F16 (13 bits, more for subnormals) */
        for (uint32_t hi = 0; hi < (1u << 15); hi++)
            for (size_t k = 0; k < sizeof low / sizeof *low; k++) check(hi << 17 | low[k]);
        /* random patterns anywhere, and as many in F16's subnormal range, where the point
         * rounding starts at moves with the exponent */
        uint64_t r = 0x9E3779B97F4A7C15ull;
        for (int i = 0; i < 2000000; i++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            check((uint32_t)r);
            uint32_t sub = 0x33000000u + (uint32_t)(r >> 32) % (0x38800000u - 0x33000000u);
            check(sub | (uint32_t)r << 31);
        }
    }
    flush_batch();
    static const char *name[4] = {"F32 (NaN quieted)", "BF16", "F16",
                                  "F16 in batches (F16C where the CPU has it)"};
    for (int k = 0; k < 4; k++) {
        ok(bad[k] == 0, "float -> %s: the bit cast equals the general rounding on %llu patterns",
           name[k], checked);
        if (bad[k]) printf("#   %llu differ, the first 0x%08x\n", bad[k], first_bad[k]);
    }
    return tap_done();
}
