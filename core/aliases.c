/* Tied and aliased tensors: two model tensors whose bytes are one stored extent (torch ties
 * lm_head to the embedding by sharing a storage). The model's storage counts such bytes once. */
#include "catalog.h"
#include "hashmap.h"

#include <stdlib.h>
#include <string.h>

/* The stored extent a one-piece tensor reads: source, offset in it, byte count. */
typedef struct extent_key {
    uint64_t source, offset, nbytes;
} extent_key;

size_t ckpt_mark_aliases(const ckpt_catalog *cat, bool *is_alias) {
    memset(is_alias, 0, cat->ntensors * sizeof *is_alias);
    extent_key *keys = malloc((cat->ntensors ? cat->ntensors : 1) * sizeof *keys);
    hashmap seen;
    if (!keys) return 0;
    if (!hm_init(&seen, cat->ntensors)) {
        free(keys);
        return 0; /* out of memory: nothing is called an alias, which only overcounts */
    }
    size_t aliases = 0;
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        /* Several pieces (shards, rank boxes) are never one shared storage. */
        if (t->aside || t->npieces != 1 || t->nbytes == 0) continue;
        keys[i] = (extent_key){t->pieces[0].source, t->pieces[0].file_offset, t->nbytes};
        bool added;
        if (!hm_put(&seen, (const char *)&keys[i], sizeof keys[i], i, &added)) break;
        if (!added) {
            is_alias[i] = true;
            aliases++;
        }
    }
    hm_free(&seen);
    free(keys);
    return aliases;
}
