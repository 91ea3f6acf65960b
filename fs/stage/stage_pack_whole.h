/* stage_pack_whole.c: files of the --from source that a directory OUT links as shards. */
#ifndef CKPTFS_STAGE_PACK_WHOLE_H
#define CKPTFS_STAGE_PACK_WHOLE_H

#include "stage_pack.h"

#include "core/util/json.h"

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

/* A safetensors file's header (the file behind fd, size bytes): 0 with *text (malloc'd, the
 * document points into it), *doc and *data (where the data starts), or -1. */
int pack_read_header(int fd, uint64_t size, char **text, json_doc *doc, uint64_t *data);
/* A header entry's data_offsets [*a, *b), within room bytes of data. */
bool pack_entry_span(const json_value *m, uint64_t room, uint64_t *a, uint64_t *b);
bool pack_is_metadata(const json_value *m);
/* Whether header entry m names staged tensor t with its dtype and shape. */
bool pack_entry_is(const json_value *m, const ckpt_tensor *t);

#endif
