/* Source files that a directory OUT takes whole: a commit after `--from` costs what changed.
 *
 * A safetensors file of the --from source (the single file, or a shard of an HF directory,
 * typically OUT's own shard after a commit of `--from OUT/`) none of whose tensors changed,
 * was renamed or removed, and to which nothing was added, is exactly a shard the commit would
 * otherwise copy byte for byte. It is hard-linked into the new OUT as it is instead: its
 * header is its own (whatever wrote it), its bytes are not read or written. The file is never
 * written to, so the old OUT stays intact through every point of the commit, and a link is
 * all a kill -9 can leave behind (in the partial directory the stage's clean-up removes).
 *
 * The check (ckpt_packed_holds_exactly) reads the file's own header, not the catalog the stage
 * loaded: an entry the source's reader did not show (a tensor missing from an index's weight_map)
 * would otherwise come along into OUT unseen. Every entry must be a staged tensor of that file at
 * the same offset with the same name, dtype and shape, and the file must end at its data's end. */
#include "stage_pack_whole.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int off_cmp(const void *a, const void *b) {
    uint64_t x = ((const placed *)a)->off, y = ((const placed *)b)->off;
    return (x > y) - (x < y);
}

int pack_take_whole(const ckpt_catalog *cat, dev_t dev, uint64_t max, size_t *rest, size_t *nrest,
                    snode **moving, whole_file **out, size_t *nout) {
    *out = NULL;
    *nout = 0;
    whole_file *w = NULL;
    size_t nw = 0;
    placed *p = malloc((*nrest ? *nrest : 1) * sizeof *p);
    bool *taken = calloc(*nrest ? *nrest : 1, sizeof *taken);
    if (!p || !taken) {
        free(p);
        free(taken);
        return -ENOMEM;
    }
    int rc = 0;
    for (uint32_t u = 0; !rc && u < cat->nsources; u++) {
        const ckpt_source *s = &cat->sources[u];
        if (!ckpt_source_whole_file(s) || s->owned || s->dev != dev) continue;
        size_t n = 0;
        uint64_t bytes = 0;
        bool whole = true;
        for (size_t k = 0; k < *nrest; k++) {
            const ckpt_tensor *t = &cat->tensors[rest[k]];
            if (t->npieces != 1 || t->pieces[0].source != u) continue;
            /* a file moved out of a cut pack, a view of strided bytes: not a file's own */
            if (moving[k] || t->pieces[0].strides || !t->nbytes) whole = false;
            p[n++] = (placed){rest[k], t->pieces[0].file_offset};
            bytes += t->nbytes;
        }
        /* more than one tensor over the shard limit: the writer's cut applies */
        if (!n || !whole || (n > 1 && bytes > max)) continue;
        qsort(p, n, sizeof *p, off_cmp);
        int fd = ckpt_source_open_again(s);
        if (fd < 0) continue;
        struct stat fs;
        if (fstat(fd, &fs) != 0 || !S_ISREG(fs.st_mode) ||
            !ckpt_packed_holds_exactly(cat, fd, (uint64_t)fs.st_size, p, n)) {
            close(fd);
            continue;
        }
        whole_file *grown = realloc(w, (nw + 1) * sizeof *w);
        placed *mine = malloc(n * sizeof *mine);
        if (!grown || !mine) {
            if (grown) w = grown;
            free(mine);
            close(fd);
            rc = -ENOMEM;
            break;
        }
        w = grown;
        memcpy(mine, p, n * sizeof *mine);
        w[nw++] = (whole_file){.fd = fd, .dev = fs.st_dev, .ino = fs.st_ino, .t = mine, .n = n};
        for (size_t k = 0; k < *nrest; k++) {
            const ckpt_tensor *t = &cat->tensors[rest[k]];
            if (t->npieces == 1 && t->pieces[0].source == u) taken[k] = true;
        }
    }
    if (rc) {
        for (size_t i = 0; i < nw; i++) {
            close(w[i].fd);
            free(w[i].t);
        }
        free(w);
        w = NULL;
        nw = 0;
    }
    size_t keep = 0;
    for (size_t k = 0; !rc && k < *nrest; k++)
        if (!taken[k]) {
            rest[keep] = rest[k];
            moving[keep++] = moving[k];
        }
    if (!rc) *nrest = keep;
    free(p);
    free(taken);
    *out = w;
    *nout = nw;
    return rc;
}
