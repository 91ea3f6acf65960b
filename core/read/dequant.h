/* float32 views of narrower and block-quantized dtypes (see dequant.c). */
#ifndef CKPT_DEQUANT_H
#define CKPT_DEQUANT_H

#include "../ckpt.h"

bool ckpt_to_f32_supported(ckpt_dtype dt);
/* Converts nblocks whole blocks (block = 1 element for F16, BF16, F8). */
void ckpt_to_f32(ckpt_dtype dt, const unsigned char *src, size_t nblocks, float *dst);
float ckpt_f16_to_f32(uint16_t h);

#endif
