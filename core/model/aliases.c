/* Tied and aliased tensors: two model tensors whose bytes are one stored extent (torch ties
 * lm_head to the embedding by sharing a storage). The model's storage counts such bytes once. */
#include "catalog.h"

#include <stdlib.h>
#include <string.h>

/* Extents go in an open-addressing table of 8-byte slots, 2 to 4 a tensor: a slot holds a
 * tensor (its index + 1; 0 = empty) and 32 bits of its extent's hash, so a probe reads the
 * tensor only when those match. 16 MB at a million tensors, where sorting 32-byte records
 * took 64 MB (the records and qsort's copy of them: the peak of `ckptfs info`), and a
 * general hash map about 100 bytes an extent. */
typedef struct slot {
    uint32_t tensor_plus1;
    uint32_t tag;
} slot;

static uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

static uint64_t extent_hash(const ckpt_tensor *t) {
    return mix(mix(t->pieces[0].source ^ mix(t->pieces[0].file_offset)) ^ t->nbytes);
}

static bool same_extent(const ckpt_tensor *a, const ckpt_tensor *b) {
    return a->pieces[0].source == b->pieces[0].source &&
           a->pieces[0].file_offset == b->pieces[0].file_offset && a->nbytes == b->nbytes;
}

size_t ckpt_mark_aliases(const ckpt_catalog *cat, bool *is_alias) {
    memset(is_alias, 0, cat->ntensors * sizeof *is_alias);
    if (cat->ntensors >= UINT32_MAX / 4) return 0; /* nothing is called an alias: overcounts */
    size_t cap = 16;
    while (cap < 2 * cat->ntensors) cap *= 2;
    slot *table = calloc(cap, sizeof *table);
    if (!table) return 0; /* out of memory: nothing is called an alias, which only overcounts */
    size_t aliases = 0;
    /* In index order: the first tensor of an extent is its owner, the later ones alias it. */
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        /* Several pieces (shards, rank boxes) are never one shared storage. */
        if (t->aside || t->npieces != 1 || t->nbytes == 0) continue;
        uint64_t h = extent_hash(t);
        uint32_t tag = (uint32_t)(h >> 32);
        size_t at = (size_t)h & (cap - 1);
        for (;; at = (at + 1) & (cap - 1)) {
            slot *sl = &table[at];
            if (!sl->tensor_plus1) {
                *sl = (slot){(uint32_t)i + 1, tag};
                break;
            }
            if (sl->tag == tag && same_extent(&cat->tensors[sl->tensor_plus1 - 1], t)) {
                is_alias[i] = true;
                aliases++;
                break;
            }
        }
    }
    free(table);
    return aliases;
}
