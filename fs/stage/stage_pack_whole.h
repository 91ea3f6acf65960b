/* stage_pack_whole.c: files of the --from source that a directory OUT links as shards. */
#ifndef CKPTFS_STAGE_PACK_WHOLE_H
#define CKPTFS_STAGE_PACK_WHOLE_H

#include "stage_pack.h"

typedef struct whole_file {
    int fd;
    dev_t dev;
    ino_t ino;
    placed *t; /* its tensors, by offset in the file */
    size_t n;
} whole_file;

/* Takes out of rest[0..*nrest) (and moving[], kept in step) the tensors of every source file
 * on device dev that is exactly a shard of them as it is (see stage_pack_whole.c), and returns
 * those files in *out (malloc'd; each fd open, each t malloc'd). 0, or -ENOMEM (then rest is
 * as it was and *out empty). */
int pack_take_whole(const ckpt_catalog *cat, dev_t dev, uint64_t max, size_t *rest, size_t *nrest,
                    snode **moving, whole_file **out, size_t *nout);

#endif
