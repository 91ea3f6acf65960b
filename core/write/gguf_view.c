/* -o view=gguf (gguf_view.h): convert's GGUF as a view file. Both go through
 * ckpt_profile_llamacpp and gguf_layout_build, so the view holds convert's bytes whatever
 * layout the source has: the profile carries each stored piece (a rank's chunk, a strided
 * view) over as pieces of the laid-out tensor, and the layout's parts plan those pieces. */
#include "gguf_view.h"

#include "cast.h"
#include "gguf_layout.h"
#include "profile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum { NAME_CAP = sizeof(((ckpt_hfview_file *)0)->name) };

/* NAME.gguf from the source path's last component (a GGUF source keeps its own name), cut so
 * that it fits the view's name field. */
static void view_name(const char *root, char out[NAME_CAP]) {
    size_t len = strlen(root);
    while (len > 1 && root[len - 1] == '/') len--;
    size_t start = len;
    while (start > 0 && root[start - 1] != '/') start--;
    const char *base = root + start;
    size_t n = len - start;
    if (n == 0) base = "model", n = 5;
    static const char ext[] = ".gguf";
    bool has_ext = n > 5 && memcmp(base + n - 5, ext, 5) == 0;
    if (has_ext) n -= 5;
    if (n > NAME_CAP - sizeof ext) n = NAME_CAP - sizeof ext;
    snprintf(out, NAME_CAP, "%.*s%s", (int)n, base, ext);
}

/* convert's --dtype names. */
static int parse_type(const char *type, ckpt_dtype *dt) {
    static const struct {
        const char *name;
        ckpt_dtype dt;
    } types[] = {{"f32", CKPT_F32},
                 {"f16", CKPT_F16},
                 {"bf16", CKPT_BF16},
                 {"q8_0", CKPT_Q8_0},
                 {"q4_0", CKPT_Q4_0}};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (strcasecmp(type, types[i].name) == 0) {
            *dt = types[i].dt;
            return 0;
        }
    return -1;
}

int ckpt_gguf_view_build(ckpt_catalog **cat, const char *type, ckpt_hfview *v, char **note,
                         ckpt_err *err) {
    memset(v, 0, sizeof *v);
    *note = NULL;
    ckpt_dtype to = CKPT_F32;
    if (type && parse_type(type, &to))
        return ckpt_fail(err, -EINVAL, "gguf_type=%s: expected f32, f16, bf16, q8_0 or q4_0", type);
    ckpt_catalog *mapped = NULL;
    int rc = ckpt_profile_llamacpp(*cat, &mapped, note, err);
    if (rc) return rc;
    if (mapped) {
        ckpt_close(*cat);
        *cat = mapped;
    }
    size_t cast;
    if (type && (to == CKPT_Q8_0 || to == CKPT_Q4_0))
        rc = ckpt_quantize_tensors(*cat, to, &cast, err);
    else if (type) /* as convert --dtype: a llama.cpp layout keeps its vectors F32 */
        rc = ckpt_cast_tensors(*cat, to, false, mapped != NULL, &cast, err);
    if (rc) return rc;
    if (!(v->files = calloc(1, sizeof *v->files))) return ckpt_fail(err, -ENOMEM, "out of memory");
    ckpt_hfview_file *f = &v->files[0];
    view_name((*cat)->root, f->name);
    gguf_layout L;
    if ((rc = gguf_layout_build(*cat, f->name, &L, err))) {
        free(v->files);
        v->files = NULL;
        return rc;
    }
    f->vf = L.vf; /* its first part is the header, which the file then owns */
    f->owned = L.header;
    v->nfiles = 1;
    return 0;
}
