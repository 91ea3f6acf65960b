/* Float rounding to F32, F16 and BF16 on bits, for casts and for the quantizers' scales
 * (float_round.c). */
#ifndef CKPT_FLOAT_ROUND_H
#define CKPT_FLOAT_ROUND_H

#include <stddef.h>
#include <stdint.h>

/* Rounds x to the binary float format with `mbits` stored mantissa bits and `ebits` exponent
 * bits (IEEE layout, subnormals, infinities), to nearest with ties to even; overflow gives
 * infinity; NaN stays NaN (sign and leading payload bits kept, quiet bit set). */
uint32_t ckpt_round_float(double x, int mbits, int ebits);

/* The same for a float's bits (as uint32_t) rounded to F32 (NaN quieted), BF16 or F16: the
 * very results of ckpt_round_float((double)value, ...), at the speed of a few integer ops. */
uint32_t ckpt_f32_to_f32(uint32_t u);
uint16_t ckpt_f32_to_bf16(uint32_t u);
uint16_t ckpt_f32_to_f16(uint32_t u);
/* ckpt_f32_to_f16 of n floats, with the CPU's F16C instructions where it has them. */
void ckpt_f32_to_f16_many(const float *in, size_t n, uint16_t *out);

#endif
