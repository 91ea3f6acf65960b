/* Tensor names a safetensors header cannot hold besides those that are not UTF-8. */
#ifndef CKPT_ST_NAMES_H
#define CKPT_ST_NAMES_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

/* A safetensors header keeps the key "__metadata__" for its metadata: a tensor of that name
 * (a torch or DeepSpeed state dict may have one) would be a second value of that key, which
 * readers refuse or take as the metadata. */
static inline bool ckpt_safetensors_reserved_name(const char *name, size_t len) {
    return len == 12 && memcmp(name, "__metadata__", 12) == 0;
}

/* Files a Hugging Face model keeps beside its weights (config, tokenizer, PEFT config;
 * formats/dirlist.c): the view and a staged HF directory carry them as they are. */
extern const char *const ckpt_hf_aux_names[];
extern const size_t ckpt_hf_aux_count;

#endif
