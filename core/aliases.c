/* Tied and aliased tensors: two model tensors whose bytes are one stored extent (torch ties
 * lm_head to the embedding by sharing a storage). The model's storage counts such bytes once. */
#include "catalog.h"

#include <stdlib.h>
#include <string.h>

/* The stored extent a one-piece tensor reads: source, offset in it, byte count; and which
 * tensor. */
typedef struct extent {
    uint64_t source, offset, nbytes;
    size_t tensor;
} extent;

static int extent_order(const void *a, const void *b) {
    const extent *x = a, *y = b;
    if (x->source != y->source) return x->source < y->source ? -1 : 1;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return (x->tensor > y->tensor) - (x->tensor < y->tensor);
}

/* Sorted, not hashed: 32 bytes a tensor where a hash map of a million extents took ~100. */
size_t ckpt_mark_aliases(const ckpt_catalog *cat, bool *is_alias) {
    memset(is_alias, 0, cat->ntensors * sizeof *is_alias);
    extent *all = malloc((cat->ntensors ? cat->ntensors : 1) * sizeof *all);
    if (!all) return 0; /* out of memory: nothing is called an alias, which only overcounts */
    size_t n = 0;
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        /* Several pieces (shards, rank boxes) are never one shared storage. */
        if (t->aside || t->npieces != 1 || t->nbytes == 0) continue;
        all[n++] = (extent){t->pieces[0].source, t->pieces[0].file_offset, t->nbytes, i};
    }
    qsort(all, n, sizeof *all, extent_order);
    size_t aliases = 0;
    for (size_t i = 1; i < n; i++) {
        const extent *x = &all[i - 1], *y = &all[i];
        /* The first tensor of an extent (by index) is its owner, the later ones alias it. */
        if (x->source == y->source && x->offset == y->offset && x->nbytes == y->nbytes) {
            is_alias[y->tensor] = true;
            aliases++;
        }
    }
    free(all);
    return aliases;
}
