/* ckpt_to_f32 of F16 (eight at a time with F16C where the CPU has it, NaN lanes by hand) equals
 * ckpt_f16_to_f32 bit for bit on all 65,536 halves, in batches of odd lengths and offsets so
 * every lane position and the scalar tail are reached; and ckpt_f16_to_f32 itself equals the
 * value a half denotes, worked out here from its fields. */
#include "../../core/read/dequant.h"
#include "tap.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* The half's value from the IEEE fields: a NaN's float keeps sign and payload, shifted up. */
static uint32_t denoted(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = h >> 10 & 0x1f, m = h & 0x3ff;
    if (e == 0x1f) return sign | 0x7f800000u | m << 13;
    double v = e ? ldexp(1.0 + m / 1024.0, (int)e - 15) : ldexp(m / 1024.0, -14);
    return sign | bits((float)v);
}

int main(void) {
    static unsigned char src[2 * 65536 + 2];
    static float got[65536 + 1];
    unsigned long long bad_scalar = 0, bad_batch = 0;
    uint32_t first_scalar = 0, first_batch = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if (bits(ckpt_f16_to_f32((uint16_t)h)) != denoted((uint16_t)h) && !bad_scalar++)
            first_scalar = h;
    }
    /* a NaN among finite values in one lane of eight, each lane in turn, is what the batch
     * path must notice: runs of 13 or 29 from every start offset cover that */
    for (size_t run = 1; run <= 29; run += 4) {
        for (size_t off = 0; off < 8; off++) {
            for (uint32_t start = 0; start < 65536; start += (uint32_t)run) {
                size_t n = run;
                if (start + n > 65536) n = 65536 - start;
                for (size_t k = 0; k < n; k++) {
                    src[2 * (off + k)] = (unsigned char)(start + k);
                    src[2 * (off + k) + 1] = (unsigned char)((start + k) >> 8);
                }
                ckpt_to_f32(CKPT_F16, src + 2 * off, n, got);
                for (size_t k = 0; k < n; k++)
                    if (bits(got[k]) != bits(ckpt_f16_to_f32((uint16_t)(start + k))) &&
                        !bad_batch++)
                        first_batch = start + (uint32_t)k;
            }
        }
    }
    ok(bad_scalar == 0, "ckpt_f16_to_f32 gives the value each of the 65,536 halves denotes");
    if (bad_scalar) printf("#   %llu differ, the first 0x%04x\n", bad_scalar, first_scalar);
    ok(bad_batch == 0, "ckpt_to_f32(F16) equals ckpt_f16_to_f32 on every half, in runs of 1 to 29 "
                       "at each of 8 alignments (signaling NaNs kept as they are)");
    if (bad_batch) printf("#   %llu differ, the first 0x%04x\n", bad_batch, first_batch);
    return tap_done();
}
