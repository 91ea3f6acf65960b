/* Keras 3 weights: `model.weights.h5` (HDF5, what model.save_weights writes) and `.keras` (a zip
 * of config.json, metadata.json and model.weights.h5, what model.save writes).
 *
 * HDF5 is read with Debian's libhdf5, not by hand: its object headers, B-trees, heaps and
 * filter pipelines are a large format, and the library is the reference. It is used at open
 * only, to list the datasets and learn where their bytes are: a dataset stored contiguously
 * (what h5py and Keras write by default) is one piece at its file address, served in place; a
 * compact or chunked (possibly compressed) one is read whole through libhdf5 into memory once,
 * at most DECODED_LIMIT bytes for all of them together, and served from a virtual source.
 * libhdf5 opens files by path, so a .keras member is opened as a file image read into memory
 * at open (at most IMAGE_LIMIT bytes) and its datasets' addresses are then offsets in the
 * member, which lies STORED at a known offset of the zip. libhdf5 built without thread safety
 * (Debian's serial build) is entered under one lock.
 *
 * Names are the datasets' HDF5 paths (layers/dense/vars/0): the tree shows their groups. */
#include "formats.h"
#include "../parse/zip.h"
#include "../util/grow.h"
#include "../util/strbuf.h"

#include <errno.h>
#include <hdf5.h>
#include <hdf5_hl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum {
    DECODED_LIMIT = 256 << 20,
    IMAGE_LIMIT = 1 << 30,
    CONFIG_LIMIT = 16 << 20,
};

static pthread_mutex_t h5_lock = PTHREAD_MUTEX_INITIALIZER;
static const unsigned char hdf5_magic[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

typedef struct decoded {
    size_t tensor;
    uint64_t at;
} decoded;

typedef struct loader {
    ckpt_catalog *cat;
    uint32_t source;   /* where the HDF5 bytes lie */
    uint64_t base;     /* of the HDF5 file within the source (a .keras member) */
    const char *label; /* how messages name the HDF5 file */
    hid_t file;
    unsigned char *mem; /* compact and chunked datasets, decoded */
    size_t mem_len, mem_cap;
    decoded *dec;
    size_t ndec, cap_dec;
    size_t datasets;
    int rc;
    ckpt_err *err;
} loader;

/* The ckptfs dtype of an HDF5 datatype: little-endian IEEE floats of 2, 4, 8 bytes, integers of
 * 1 to 8 bytes, and h5py's bool (an enum of int8 with FALSE/TRUE). */
static bool h5_dtype(hid_t t, ckpt_dtype *out) {
    H5T_class_t cls = H5Tget_class(t);
    size_t size = H5Tget_size(t);
    if (cls == H5T_ENUM) {
        hid_t super = H5Tget_super(t);
        bool ok = super >= 0 && H5Tget_size(super) == 1 && H5Tget_nmembers(t) == 2;
        if (super >= 0) H5Tclose(super);
        if (ok) *out = CKPT_BOOL;
        return ok;
    }
    if (H5Tget_order(t) != H5T_ORDER_LE && size > 1) return false;
    if (cls == H5T_FLOAT) {
        size_t spos, epos, esize, mpos, msize;
        if (H5Tget_fields(t, &spos, &epos, &esize, &mpos, &msize) < 0) return false;
        if (size == 2 && esize == 5 && msize == 10)
            *out = CKPT_F16;
        else if (size == 2 && esize == 8 && msize == 7)
            *out = CKPT_BF16;
        else if (size == 4 && esize == 8 && msize == 23)
            *out = CKPT_F32;
        else if (size == 8 && esize == 11 && msize == 52)
            *out = CKPT_F64;
        else
            return false;
        return true;
    }
    if (cls == H5T_INTEGER) {
        bool sign = H5Tget_sign(t) == H5T_SGN_2;
        static const ckpt_dtype s[] = {CKPT_I8, CKPT_I16, 0, CKPT_I32, 0, 0, 0, CKPT_I64};
        static const ckpt_dtype u[] = {CKPT_U8, CKPT_U16, 0, CKPT_U32, 0, 0, 0, CKPT_U64};
        if (size != 1 && size != 2 && size != 4 && size != 8) return false;
        *out = sign ? s[size - 1] : u[size - 1];
        return true;
    }
    return false;
}

static int bad(loader *l, const char *name, const char *what) {
    return l->rc = ckpt_fail(l->err, -EINVAL, "%s: dataset \"%s\": %s", l->label,
                             ckpt_shown(name, strlen(name)), what);
}

/* Reads a dataset that is not stored contiguously through libhdf5 into the decoded bytes. */
static int decode(loader *l, hid_t d, hid_t type, const char *name, uint64_t nbytes, size_t index) {
    if (nbytes > DECODED_LIMIT - l->mem_len)
        return l->rc = ckpt_fail(l->err, -EFBIG,
                                 "%s: chunked or compact datasets take more than 256 MiB once "
                                 "decoded (at \"%s\"); save the weights without chunks or "
                                 "compression (h5py's default) to have them read in place",
                                 l->label, ckpt_shown(name, strlen(name)));
    if (GROW(l->mem, l->mem_cap, l->mem_len + nbytes + 1) || GROW(l->dec, l->cap_dec, l->ndec + 1))
        return l->rc = ckpt_fail(l->err, -ENOMEM, "out of memory");
    hid_t mem_type = H5Tget_native_type(type, H5T_DIR_ASCEND);
    herr_t r = mem_type < 0
                   ? -1
                   : H5Dread(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, l->mem + l->mem_len);
    if (mem_type >= 0) H5Tclose(mem_type);
    if (r < 0) return bad(l, name, "libhdf5 cannot read it (a damaged chunk or a filter it lacks)");
    l->dec[l->ndec++] = (decoded){index, l->mem_len};
    l->mem_len += nbytes;
    return 0;
}

static int dataset(loader *l, const char *name) {
    hid_t d = H5Dopen2(l->file, name, H5P_DEFAULT);
    if (d < 0) return bad(l, name, "libhdf5 cannot open it");
    hid_t type = H5Dget_type(d), space = H5Dget_space(d), plist = H5Dget_create_plist(d);
    int rc = 0;
    ckpt_dtype dt = CKPT_F32;
    int ndim = space < 0 ? -1 : H5Sget_simple_extent_ndims(space);
    hsize_t dims[CKPT_MAX_DIMS];
    uint64_t shape[CKPT_MAX_DIMS], numel, nbytes = 0;
    if (type < 0 || plist < 0 || ndim < 0 || ndim > CKPT_MAX_DIMS) {
        rc = bad(l, name,
                 "its type, dataspace or layout cannot be read, or it has more than "
                 "32 dims");
    } else if (!h5_dtype(type, &dt)) {
        rc = bad(l, name,
                 "its datatype is not one ckptfs has (little-endian IEEE float, "
                 "integer or h5py's bool)");
    } else if (H5Sget_simple_extent_dims(space, dims, NULL) < 0) {
        rc = bad(l, name, "its dataspace cannot be read");
    } else {
        for (int i = 0; i < ndim; i++) shape[i] = dims[i];
        if (!catalog_shape_nbytes(shape, (uint32_t)ndim, dt, &numel, &nbytes))
            rc = bad(l, name, "its dims overflow");
    }
    size_t index = 0;
    if (!rc && (rc = catalog_add_tensor(l->cat, name, strlen(name), dt, (uint32_t)ndim, shape,
                                        &index, l->err)))
        l->rc = rc;
    if (!rc) {
        l->datasets++;
        haddr_t at = H5Pget_layout(plist) == H5D_CONTIGUOUS ? H5Dget_offset(d) : HADDR_UNDEF;
        if (at != HADDR_UNDEF && nbytes && H5Dget_storage_size(d) == nbytes) {
            /* catalog_finish checks the range against the file */
            if ((rc = catalog_add_piece(l->cat, index, l->source, l->base + at, NULL, NULL, NULL,
                                        l->err)))
                l->rc = rc;
        } else {
            rc = decode(l, d, type, name, nbytes, index);
        }
    }
    if (plist >= 0) H5Pclose(plist);
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    H5Dclose(d);
    return rc;
}

static herr_t visit(hid_t obj, const char *name, const H5O_info_t *info, void *ctx) {
    (void)obj;
    loader *l = ctx;
    if (info->type != H5O_TYPE_DATASET) return 0;
    return dataset(l, name) ? -1 : 0;
}

static int add_decoded(loader *l) {
    if (!l->ndec) return 0;
    uint32_t src;
    int rc = catalog_add_memory_source(l->cat, "(hdf5 decoded datasets)", l->mem, l->mem_len, &src,
                                       l->err);
    l->mem = NULL;
    for (size_t i = 0; !rc && i < l->ndec; i++)
        rc = catalog_add_piece(l->cat, l->dec[i].tensor, src, l->dec[i].at, NULL, NULL, NULL,
                               l->err);
    return rc;
}

/* Lists the datasets of the open file l->file into the catalog. */
static int walk(loader *l) {
    hsize_t userblock = 0;
    hid_t fcpl = H5Fget_create_plist(l->file);
    if (fcpl >= 0) {
        H5Pget_userblock(fcpl, &userblock);
        H5Pclose(fcpl);
    }
    l->base += userblock; /* dataset addresses are relative to the superblock's base */
    herr_t r = H5Ovisit2(l->file, H5_INDEX_NAME, H5_ITER_INC, visit, l, H5O_INFO_BASIC);
    if (l->rc) return l->rc;
    if (r < 0)
        return ckpt_fail(l->err, -EINVAL, "%s: libhdf5 cannot walk its groups (a damaged file)",
                         l->label);
    return add_decoded(l);
}

static void loader_free(loader *l) {
    free(l->mem);
    free(l->dec);
}

/* The local file a source reads from, or NULL: libhdf5 opens files by path. */
static bool local_file(const ckpt_source *s) {
    return !s->zst && !s->member_of && !s->remote && !s->virt;
}

static bool probe_h5(const unsigned char *head, size_t n, uint64_t file_size) {
    (void)file_size;
    return n >= 8 && memcmp(head, hdf5_magic, 8) == 0;
}

static int load_h5(ckpt_catalog *cat, uint32_t source, ckpt_err *err) {
    const ckpt_source *s = &cat->sources[source];
    if (!local_file(s))
        return ckpt_fail(err, -EOPNOTSUPP,
                         "%s: an HDF5 file is read with libhdf5, which needs a local file (not "
                         "a URL, a .zst or an archive member): copy it to a local disk first",
                         s->path);
    loader l = {.cat = cat, .source = source, .label = s->path, .err = err};
    pthread_mutex_lock(&h5_lock);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* errors come back as return values, not prints */
    l.file = H5Fopen(s->path, H5F_ACC_RDONLY, H5P_DEFAULT);
    int rc = l.file < 0 ? ckpt_fail(err, -EINVAL,
                                    "%s: libhdf5 cannot open it as HDF5 (a "
                                    "damaged superblock?)",
                                    s->path)
                        : walk(&l);
    if (l.file >= 0) H5Fclose(l.file);
    pthread_mutex_unlock(&h5_lock);
    loader_free(&l);
    return rc;
}

/* A .keras file: a zip whose members include model.weights.h5 (STORED, else refused with the
 * way out), config.json and metadata.json (kept in metadata.json as "keras"). */
static bool probe_keras(const unsigned char *head, size_t n, uint64_t file_size) {
    (void)file_size;
    static const char *const first[] = {"metadata.json", "config.json", "model.weights.h5"};
    if (n < 30 || memcmp(head, "PK\3\4", 4) != 0) return false;
    size_t len = (size_t)head[26] | (size_t)head[27] << 8;
    for (size_t i = 0; i < sizeof first / sizeof *first; i++)
        if (len == strlen(first[i]) && 30 + len <= n && memcmp(head + 30, first[i], len) == 0)
            return true;
    return false;
}

static int keras_docs(ckpt_catalog *cat, const zip_archive *z, ckpt_err *err) {
    strbuf doc;
    sb_init(&doc);
    sb_printf(&doc, "{");
    int rc = 0;
    static const char *const members[] = {"config", "metadata"};
    for (size_t i = 0; !rc && i < 2; i++) {
        char name[32];
        snprintf(name, sizeof name, "%s.json", members[i]);
        const zip_entry *e = zip_find(z, name, strlen(name));
        if (!e || e->method != ZIP_STORED) continue; /* deflated: not kept, nothing is lost */
        char *data;
        size_t len;
        if ((rc = zip_read(z, e, CONFIG_LIMIT, &data, &len, err))) break;
        sb_printf(&doc, "%s\"%s\": %.*s", doc.len > 1 ? ", " : "", members[i], (int)len, data);
        free(data);
    }
    sb_printf(&doc, "}");
    if (!rc)
        rc = doc.failed ? ckpt_fail(err, -ENOMEM, "out of memory")
                        : catalog_add_doc(cat, "keras", doc.data, doc.len, err);
    sb_free(&doc);
    return rc;
}

static int load_keras(ckpt_catalog *cat, uint32_t source, ckpt_err *err) {
    zip_archive z;
    const ckpt_source *s = &cat->sources[source];
    int rc = zip_open(&z, cat, source, 0, s->size, NULL, err);
    if (rc) return rc;
    const zip_entry *e = zip_find(&z, "model.weights.h5", 16);
    uint64_t at = 0;
    if (!e)
        rc = ckpt_fail(err, -EINVAL, "%s: no member model.weights.h5: not a Keras 3 .keras file",
                       s->path);
    else if (e->method != ZIP_STORED)
        rc = ckpt_fail(err, -EINVAL,
                       "%s: member model.weights.h5 is compressed (zip method %u): ckptfs reads "
                       "weights in place; extract it (unzip %s model.weights.h5) and mount that",
                       s->path, e->method, s->path);
    else if (e->usize > IMAGE_LIMIT)
        rc = ckpt_fail(err, -EFBIG,
                       "%s: member model.weights.h5 is larger than 1 GiB, which ckptfs would "
                       "hold in memory to read its HDF5 structure; extract it (unzip %s "
                       "model.weights.h5) and mount that",
                       s->path, s->path);
    else
        rc = zip_data_offset(&z, e, &at, err);
    char *image = NULL;
    size_t len = 0;
    if (!rc) rc = zip_map(&z, e, IMAGE_LIMIT, &image, &len, err);
    if (!rc) rc = keras_docs(cat, &z, err);
    zip_close(&z);
    if (rc) {
        if (image) zip_unmap(image, len);
        return rc;
    }
    char label[512];
    snprintf(label, sizeof label, "%s [model.weights.h5]", s->path);
    loader l = {.cat = cat, .source = source, .base = at, .label = label, .err = err};
    pthread_mutex_lock(&h5_lock);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    l.file =
        H5LTopen_file_image(image, len, H5LT_FILE_IMAGE_DONT_COPY | H5LT_FILE_IMAGE_DONT_RELEASE);
    rc = l.file < 0 ? ckpt_fail(err, -EINVAL, "%s: libhdf5 cannot open it as HDF5", label)
                    : walk(&l);
    if (l.file >= 0) H5Fclose(l.file);
    pthread_mutex_unlock(&h5_lock);
    zip_unmap(image, len);
    loader_free(&l);
    return rc;
}

static const char *const h5_suffixes[] = {".h5", ".hdf5", NULL};
static const char *const keras_suffixes[] = {".keras", NULL};

const ckpt_format format_keras_h5 = {
    .name = "hdf5",
    .label = "HDF5 (Keras weights)",
    .probe = probe_h5,
    .load = load_h5,
    .suffixes = h5_suffixes,
    .integrity = "structure, as libhdf5 checks it (no checksums of tensor data)",
};

const ckpt_format format_keras = {
    .name = "keras",
    .label = "Keras .keras",
    .probe = probe_keras,
    .load = load_keras,
    .suffixes = keras_suffixes,
    .integrity = "structure; the CRC-32 of every zip record is checked by verify",
};
