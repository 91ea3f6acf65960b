/* The Hugging Face layout view of a catalog (see hfview.c). */
#ifndef CKPT_HFVIEW_H
#define CKPT_HFVIEW_H

#include "../ckpt.h"
#include "../model/st_names.h"

/* A run of a source's bytes that a view file shows as they are: a one-piece U8 tensor over
 * them, so that the run is one part of the file (see ckpt_hfview_build_spans). */
typedef struct ckpt_hfview_span {
    ckpt_tensor t;
    ckpt_piece piece;
    uint64_t len;
    uint64_t zero;
} ckpt_hfview_span;

typedef struct hfview_pages hfview_pages;

typedef struct ckpt_hfview_file {
    char name[64]; /* model.safetensors, model-00001-of-00002.safetensors, the index */
    ckpt_vfile vf;
    char *owned;             /* the synthesized header or index text */
    ckpt_hfview_span *spans; /* the source's header entries and data section, or NULL */
    hfview_pages *pages;     /* header entries and tensors worked out when read, or NULL */
} ckpt_hfview_file;

typedef struct ckpt_hfview {
    ckpt_hfview_file *files;
    size_t nfiles;
    uint32_t *order; /* the catalog's tensors the view shows, in view order */
    size_t norder;
    size_t skipped_dtype;      /* tensors whose dtype safetensors cannot hold */
    size_t skipped_incomplete; /* tensors with holes */
    bool tied_head_left_out;   /* lm_head.weight, tied to the embedding as config.json says */
    size_t skipped_name;       /* names that are not UTF-8 */
} ckpt_hfview;

#define CKPT_HF_MAX_SHARD_DEFAULT 5000000000ull /* huggingface_hub's "5GB" */

/* max_shard_size 0 = never split. */
int ckpt_hfview_build(const ckpt_catalog *cat, uint64_t max_shard_size, ckpt_hfview *v,
                      ckpt_err *err);
/* The same files, byte for byte, holding about 4 bytes a tensor however many there are: where
 * a shard's data section is one source's bytes in view order (a safetensors file as its writer
 * laid it out), that section is one part; where the source's header holds the shard's entries
 * as the view writes them, they are served from the source. Other entries are rendered when
 * read, HFVIEW_PAGE at a time, and other data sections planned from a page index: at a million
 * tensors, a mount would otherwise hold a header as big as the source's and 40 bytes a tensor.
 * Its parts then name no tensor of the catalog (the mount's view; not for counting the view's
 * tensors: ckpt_hfview_each_tensor visits those a file reads). */
int ckpt_hfview_build_spans(const ckpt_catalog *cat, uint64_t max_shard_size, ckpt_hfview *v,
                            ckpt_err *err);
void ckpt_hfview_free(ckpt_hfview *v);
/* Calls fn for every tensor whose bytes file f serves (its parts' and its pages'). */
void ckpt_hfview_each_tensor(const ckpt_hfview_file *f, void (*fn)(void *ctx, const ckpt_tensor *t),
                             void *ctx);

#endif
