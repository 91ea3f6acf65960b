/* Virtual files: every file the mount shows is an ordered list of memory and tensor parts, so
 * one read path serves raw tensors, sidecars and synthesized headers alike. */
#include "../ckpt.h"
#include "../util/search.h"

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

_Static_assert(offsetof(ckpt_vpart, start) == 0, "parts are searched by their first member");

static int add_part(ckpt_vfile *vf, ckpt_vpart part) {
    if (part.length == 0) return 0;
    if (vf->nparts == vf->cap) {
        size_t cap = vf->cap ? vf->cap * 2 : 4;
        ckpt_vpart *p = realloc(vf->parts, cap * sizeof *p);
        if (!p) return -ENOMEM;
        vf->parts = p;
        vf->cap = cap;
    }
    if (vf->size + part.length < vf->size) return -EOVERFLOW;
    part.start = vf->size;
    vf->parts[vf->nparts++] = part;
    vf->size += part.length;
    return 0;
}

int ckpt_vfile_reserve(ckpt_vfile *vf, size_t nparts) {
    if (nparts <= vf->cap) return 0;
    if (nparts > SIZE_MAX / sizeof(ckpt_vpart)) return -ENOMEM;
    ckpt_vpart *p = realloc(vf->parts, nparts * sizeof *p);
    if (!p) return -ENOMEM;
    vf->parts = p;
    vf->cap = nparts;
    return 0;
}

int ckpt_vfile_add_mem(ckpt_vfile *vf, const void *mem, uint64_t len) {
    return add_part(vf, (ckpt_vpart){.mem = mem, .length = len});
}

int ckpt_vfile_add_tensor(ckpt_vfile *vf, const ckpt_tensor *t, uint64_t off, uint64_t len) {
    if (off > t->nbytes || len > t->nbytes - off) return -EINVAL;
    return add_part(vf, (ckpt_vpart){.tensor = t, .tensor_off = off, .length = len});
}

int ckpt_vfile_add_gen(ckpt_vfile *vf, const ckpt_vgen *g, uint64_t len) {
    return add_part(vf, (ckpt_vpart){.mem = g, .length = len, .tensor_off = CKPT_VPART_GEN});
}

void ckpt_vfile_free(ckpt_vfile *vf) {
    free(vf->parts);
    vf->parts = NULL;
    vf->nparts = vf->cap = 0;
    vf->size = 0;
}

size_t ckpt_vfile_plan(const ckpt_vfile *vf, uint64_t off, uint64_t len, ckpt_segment *seg,
                       size_t cap, uint64_t *done) {
    *done = 0;
    if (off >= vf->size || len == 0) return 0;
    if (len > vf->size - off) len = vf->size - off;
    /* The part holding `off`: last part with start <= off. */
    size_t lo = last_at_or_before_in(vf->parts, sizeof *vf->parts, vf->nparts, off);
    size_t n = 0;
    uint64_t pos = off, end = off + len;
    for (size_t i = lo; i < vf->nparts && pos < end && n < cap; i++) {
        const ckpt_vpart *p = &vf->parts[i];
        uint64_t in = pos - p->start;
        uint64_t want = p->length - in;
        if (want > end - pos) want = end - pos;
        if (!p->tensor && p->tensor_off != CKPT_VPART_GEN) {
            seg[n++] = (ckpt_segment){
                .kind = CKPT_SEG_MEM, .mem = (const char *)p->mem + in, .length = want};
            pos += want;
            continue;
        }
        uint64_t got;
        size_t m;
        if (p->tensor) {
            m = ckpt_plan(p->tensor, p->tensor_off + in, want, seg + n, cap - n, &got);
        } else {
            const ckpt_vgen *g = p->mem;
            m = g->plan(g, in, want, seg + n, cap - n, &got);
        }
        n += m;
        pos += got;
        if (got < want) break;
    }
    *done = pos - off;
    return n;
}
