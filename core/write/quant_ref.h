/* ggml's reference quantizers (quantize_row_q8_0_ref, quantize_row_q4_0_ref), from the GGUF
 * and ggml type notes: the bytes gguf-py's gguf.quants.quantize gives, bit for bit, since both
 * compute each block in float32 the same way (quant_ref.c). */
#ifndef CKPT_QUANT_REF_H
#define CKPT_QUANT_REF_H

#include "../ckpt.h"

#include <stddef.h>

/* Whether `to` is a type quant_ref_rows makes. */
bool quant_ref_supported(ckpt_dtype to);
/* n floats (a whole number of 32-element blocks) quantized to `to` into out; the bytes
 * written. */
size_t quant_ref_rows(ckpt_dtype to, const float *x, size_t n, unsigned char *out);

#endif
