/* The mount's `-o view=gguf`: the GGUF file `ckptfs convert SOURCE NAME.gguf` writes, shown as
 * one file whose bytes are planned on read (gguf_view.c). */
#ifndef CKPT_GGUF_VIEW_H
#define CKPT_GGUF_VIEW_H

#include "../ckpt.h"
#include "../views/hfview.h"

/* Lays *cat out as convert would (ckpt_profile_llamacpp: llama.cpp's names, q/k rows in its
 * rope order, Conv1D weights transposed, the KVs; other families: a tensor container) and
 * fills v with one file, NAME.gguf (NAME: the source's last path component), whose parts are
 * the GGUF header and the laid-out tensors, read from the sources where they are. When the
 * source was laid out, *cat is replaced by the laid-out catalog (the old one is closed): the
 * view's parts point into it, so it must outlive v. *note (malloc'd or NULL) is the profile's
 * note. 0, or a negative errno with err filled. */
/* type (NULL: the stored dtypes) is convert's --dtype: f32, f16, bf16 (float tensors cast, a
 * llama.cpp layout's vectors kept), q8_0 or q4_0 (ckpt_quantize_tensors), done as the file is
 * read. */
int ckpt_gguf_view_build(ckpt_catalog **cat, const char *type, ckpt_hfview *v, char **note,
                         ckpt_err *err);

#endif
