/* Stored tensors shown as float32: a virtual source, the tensors' F32 bytes end to end, that
 * converts the stored elements as they are read (nothing is converted ahead or kept). For a
 * decoder whose reference reader returns a tensor as float32 that the file holds in another
 * dtype: zero_to_fp32 returns the module's buffers as `v.float()` whatever they were saved as. */
#ifndef CKPT_F32_SOURCE_H
#define CKPT_F32_SOURCE_H

#include "../ckpt.h"

typedef struct f32_source f32_source;

/* Whether a stored dtype converts: the floats (F64, F16, BF16, F8), the integers and bool. */
bool f32_source_converts(ckpt_dtype dt);
/* An empty set of up to n tensors, read through cat's sources. NULL when out of memory. */
f32_source *f32_source_new(const ckpt_catalog *cat, size_t n);
/* Adds numel row-major elements of dtype dt stored at file_offset of source: 0 and *at, where
 * their F32 bytes start in the virtual source, or a negative errno (a full set, a dtype that
 * does not convert, an element count whose bytes overflow). */
int f32_source_add(f32_source *f, uint32_t source, uint64_t file_offset, ckpt_dtype dt,
                   uint64_t numel, uint64_t *at, ckpt_err *err);
/* Registers the set as a virtual source of cat: 0 and *index, or a negative errno. The catalog
 * owns f from then on (also when registering failed). */
int f32_source_attach(ckpt_catalog *cat, f32_source *f, uint32_t *index, ckpt_err *err);

#endif
