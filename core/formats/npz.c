/* NumPy .npz (np.savez): a zip archive whose members are .npy files, one per array, named
 * KEY.npy (arr_0.npy, ... for positional arrays). np.savez stores members uncompressed, so each
 * array's bytes are read in place at its member's data offset plus the .npy header length;
 * a Fortran-ordered array is one strided piece. np.savez_compressed deflates its members: a
 * deflate stream cannot be entered at an offset, and inflating whole members into memory would
 * let a small file claim any amount of it, so those are refused with the way out (re-save with
 * np.savez). Members that are not .npy files are refused by name: np.savez writes none. */
#include "formats.h"
#include "../parse/npy_header.h"
#include "../parse/zip.h"
#include "../util/le.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum { LOCAL_HEADER = 30, NPY_PREFIX_MAX = 12 };

static bool ends_with_npy(const unsigned char *name, size_t n) {
    return n > 4 && memcmp(name + n - 4, ".npy", 4) == 0;
}

/* A zip whose first local header names an .npy member: torch.save archives start with
 * ".../data.pkl" and a Keras .keras with its JSON files, so this never takes theirs. */
static bool probe(const unsigned char *head, size_t n, uint64_t file_size) {
    (void)file_size;
    if (n < LOCAL_HEADER || memcmp(head, "PK\3\4", 4) != 0) return false;
    size_t name_len = le16(head + 26);
    if (LOCAL_HEADER + name_len > n) return false;
    return ends_with_npy(head + LOCAL_HEADER, name_len);
}

static int add_member(ckpt_catalog *cat, uint32_t source, const zip_archive *z, const zip_entry *e,
                      ckpt_err *err) {
    const char *path = cat->sources[source].path;
    if (!ends_with_npy((const unsigned char *)e->name, e->name_len))
        return ckpt_fail(err, -EINVAL,
                         "%s: member \"%.*s\" (central directory offset %llu) is not an .npy "
                         "file: np.savez writes only .npy members",
                         path, SHOWN_NAME(e->name, e->name_len),
                         (unsigned long long)e->central_offset);
    if (e->method != ZIP_STORED)
        return ckpt_fail(err, -EINVAL,
                         "%s: member \"%.*s\" is compressed (zip method %u, as "
                         "np.savez_compressed writes): ckptfs reads arrays in place and cannot "
                         "seek in a deflate stream; re-save it uncompressed: python3 -c \"import "
                         "numpy as np; d = np.load('IN.npz'); np.savez('OUT.npz', **d)\"",
                         path, SHOWN_NAME(e->name, e->name_len), e->method);
    uint64_t data;
    int rc = zip_data_offset(z, e, &data, err);
    if (rc) return rc;
    size_t want = e->usize < NPY_MAX_HEADER + NPY_PREFIX_MAX ? (size_t)e->usize
                                                             : NPY_MAX_HEADER + NPY_PREFIX_MAX;
    unsigned char *head = malloc(want ? want : 1);
    if (!head) return ckpt_fail(err, -ENOMEM, "out of memory");
    rc = ckpt_source_read(cat, source, data, head, want, "npy header", err);
    npy_header npy;
    char why[256];
    if (!rc && npy_header_parse(head, want, &npy, why, sizeof why))
        rc = ckpt_fail(err, -EINVAL, "%s: member \"%.*s\" (at byte offset %llu): %s", path,
                       SHOWN_NAME(e->name, e->name_len), (unsigned long long)data, why);
    free(head);
    if (rc) return rc;
    uint64_t numel, nbytes;
    if (!catalog_shape_nbytes(npy.shape, npy.ndim, npy.dtype, &numel, &nbytes))
        return ckpt_fail(err, -EINVAL,
                         "%s: member \"%.*s\": the shape in its .npy header overflows", path,
                         SHOWN_NAME(e->name, e->name_len));
    if (npy.data_offset > e->usize || e->usize - npy.data_offset != nbytes)
        return ckpt_fail(
            err, -EINVAL,
            "%s: member \"%.*s\" (at byte offset %llu) holds %llu bytes after its "
            ".npy header, but its dtype and shape take %llu",
            path, SHOWN_NAME(e->name, e->name_len), (unsigned long long)data,
            (unsigned long long)(e->usize -
                                 (npy.data_offset > e->usize ? e->usize : npy.data_offset)),
            (unsigned long long)nbytes);
    size_t index;
    if ((rc = catalog_add_tensor(cat, e->name, e->name_len - 4, npy.dtype, npy.ndim, npy.shape,
                                 &index, err)))
        return rc;
    uint64_t strides[CKPT_MAX_DIMS], step = 1;
    if (npy.fortran_order)
        for (uint32_t d = 0; d < npy.ndim; d++) {
            strides[d] = step;
            step *= npy.shape[d] ? npy.shape[d] : 1; /* no overflow: numel fits in u64 */
        }
    return catalog_add_piece(cat, index, source, data + npy.data_offset, NULL, NULL,
                             npy.fortran_order && npy.ndim > 1 ? strides : NULL, err);
}

static int load(ckpt_catalog *cat, uint32_t source, ckpt_err *err) {
    zip_archive z;
    int rc = zip_open(&z, cat, source, 0, cat->sources[source].size, NULL, err);
    if (rc) return rc;
    if ((rc = catalog_reserve_tensors(cat, z.count, err)) == 0)
        for (size_t i = 0; !rc && i < z.count; i++)
            rc = add_member(cat, source, &z, &z.entries[i], err);
    zip_close(&z);
    return rc;
}

static const char *const suffixes[] = {".npz", NULL};

const ckpt_format format_npz = {
    .name = "npz",
    .label = "NumPy .npz",
    .probe = probe,
    .load = load,
    .suffixes = suffixes,
    .integrity = "structure; the CRC-32 of every zip record is checked by verify",
};
