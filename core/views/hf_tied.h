/* Which tensor the HF view leaves out as save_pretrained does (hf_tied.c). */
#ifndef CKPT_HF_TIED_H
#define CKPT_HF_TIED_H

#include "../ckpt.h"

#include <stddef.h>

/* The index of lm_head.weight when it is the very bytes of another tensor and config.json ties
 * the embeddings; SIZE_MAX otherwise. */
size_t ckpt_hf_tied_head(const ckpt_catalog *cat);

#endif
