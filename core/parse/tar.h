/* The members of an uncompressed tar archive (POSIX ustar, pax extended headers, GNU long
 * names): where each regular file's bytes lie in the archive, so that a member can be read in
 * place as a source of its own. */
#ifndef CKPT_TAR_H
#define CKPT_TAR_H

#include "../model/catalog.h"

typedef struct tar_member {
    char *name;           /* normalized: no "./" in front, never absolute, no ".." */
    uint64_t header;      /* offset of its (first) header block, for messages */
    uint64_t data_offset; /* where its bytes start in the archive */
    uint64_t size;
} tar_member;

typedef struct tar_index {
    tar_member *members; /* regular files, in archive order */
    size_t count;
    /* How the archive ends. A tar ends with two zero blocks; GNU tar accepts fewer (and says
     * "A lone zero block" for one), so these are warnings, never errors: end_blocks zero
     * blocks were found at offset end (0, 1 or 2: more are not looked at), and the last
     * member's padding was cut off when unpadded. */
    unsigned end_blocks;
    uint64_t end;
    bool unpadded;
} tar_index;

/* True when the first bytes are a ustar header (POSIX or GNU magic) with a valid checksum. */
bool tar_probe(const unsigned char *head, size_t n);
/* Reads every header of the archive in `source`. Refuses names that leave the archive (absolute
 * or with a ".." component), members whose data runs past the end of the file (truncated, or a
 * size field that lies: the message names the member and its offsets), headers whose checksum is
 * wrong (what a lying size of the member before them leads to), sparse members and names given
 * twice. */
int tar_read_index(const ckpt_catalog *cat, uint32_t source, tar_index *out, ckpt_err *err);
void tar_index_free(tar_index *ix);
const tar_member *tar_find(const tar_index *ix, const char *name);

#endif
