/* Casting a catalog's tensors to another float dtype before it is written (convert --dtype). */
#ifndef CKPT_CAST_H
#define CKPT_CAST_H

#include "../ckpt.h"
#include "float_round.h"

#include <sys/types.h>

/* Whether a tensor of dtype `from` is cast to `to`: float tensors (F64, F32, F16, BF16,
 * F8_E4M3, F8_E5M2) of another dtype always; the ggml block types that dequantize (Q8_0, Q4_0,
 * Q4_K, Q6_K) only with `quantized`; integers, bool, complex and other types never. */
bool ckpt_cast_applies(ckpt_dtype from, ckpt_dtype to, bool quantized);

/* Casts every model tensor (not aside) that ckpt_cast_applies to `to` (F32, F16 or BF16): the
 * catalog gets a virtual source that converts the original bytes as they are read (nothing is
 * written ahead), and the tensor then reads from there with its new dtype. For a catalog about
 * to be written: it changes tensors in place, after catalog_finish. With keep_vectors, tensors
 * of fewer than 2 dims stay as they are (llama.cpp needs its norms F32). *count says how many
 * were cast. */
int ckpt_cast_tensors(ckpt_catalog *cat, ckpt_dtype to, bool quantized, bool keep_vectors,
                      size_t *count, ckpt_err *err);

/* Quantizes a catalog laid out for llama.cpp (ckpt_profile_llamacpp) to `to` (Q8_0 or Q4_0)
 * as llama.cpp's converter chooses: vectors and position embeddings stay, a matrix whose rows
 * are not whole blocks of 32 becomes F16, every other float matrix is quantized with ggml's
 * reference quantizer (bit-exact with gguf-py's), block by block as it is read. Quantized and
 * integer tensors are left as they are. */
int ckpt_quantize_tensors(ckpt_catalog *cat, ckpt_dtype to, size_t *count, ckpt_err *err);

#endif
