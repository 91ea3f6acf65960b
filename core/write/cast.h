/* Casting a catalog's tensors to another float dtype before it is written (convert --dtype). */
#ifndef CKPT_CAST_H
#define CKPT_CAST_H

#include "../ckpt.h"

#include <sys/types.h>

/* Whether a tensor of dtype `from` is cast to `to`: float tensors (F64, F32, F16, BF16,
 * F8_E4M3, F8_E5M2) of another dtype always; the ggml block types that dequantize (Q8_0, Q4_0,
 * Q4_K, Q6_K) only with `quantized`; integers, bool, complex and other types never. */
bool ckpt_cast_applies(ckpt_dtype from, ckpt_dtype to, bool quantized);

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

/* Casts every model tensor (not aside) that ckpt_cast_applies to `to` (F32, F16 or BF16): the
 * catalog gets a virtual source that converts the original bytes as they are read (nothing is
 * written ahead), and the tensor then reads from there with its new dtype. For a catalog about
 * to be written: it changes tensors in place, after catalog_finish. With keep_vectors, tensors
 * of fewer than 2 dims stay as they are (llama.cpp needs its norms F32). *count says how many
 * were cast. */
int ckpt_cast_tensors(ckpt_catalog *cat, ckpt_dtype to, bool quantized, bool keep_vectors,
                      size_t *count, ckpt_err *err);

#endif
