/* The GGUF file ckptfs writes for a catalog, laid out once (gguf_layout.c): its header (magic,
 * KVs, tensor infos, padding) in memory and the whole file as a virtual file of that header,
 * each tensor's bytes and its padding. `convert OUT.gguf` streams it (writers/gguf.c) and the
 * mount's `-o view=gguf` serves it (gguf_view.c), so the two are the same bytes by
 * construction. */
#ifndef CKPT_GGUF_LAYOUT_H
#define CKPT_GGUF_LAYOUT_H

#include "../ckpt.h"

#include <stddef.h>

typedef struct gguf_layout {
    char *header; /* "GGUF" .. the zeros before the first tensor */
    size_t header_len;
    ckpt_vfile vf; /* the file: header, then each tensor and the zeros after it */
} gguf_layout;

/* The layout of cat's model tensors (not those aside); `what` names the file in messages (OUT,
 * or the view's name). 0, or a negative errno with err filled (a tensor GGUF cannot hold is
 * -EINVAL, naming it). The vfile's parts point into cat's tensors: cat must outlive it. */
int gguf_layout_build(const ckpt_catalog *cat, const char *what, gguf_layout *L, ckpt_err *err);
void gguf_layout_free(gguf_layout *L);

#endif
