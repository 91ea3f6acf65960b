/* torch.save archives embedded in other files: what the DCP decoder needs from the torch zip
 * reader. A DCP .distcp file is a concatenation of independent torch.save zips, one per write
 * item (a tensor chunk, or any other value saved as BYTE_IO); each is read here exactly as a
 * torch.save file would be — same restricted pickle reader, same checks — but its tensors are
 * handed back to the caller instead of being added to the catalog. */
#ifndef CKPT_TORCH_ZIP_H
#define CKPT_TORCH_ZIP_H

#include "formats.h"

typedef struct torch_embedded_tensor {
    char *name; /* dotted path (root_name for a tensor saved on its own); NUL-terminated */
    size_t name_len;
    ckpt_dtype dtype;
    uint32_t ndim;
    uint64_t shape[CKPT_MAX_DIMS];
    uint64_t stride[CKPT_MAX_DIMS]; /* in elements, as the pickle gives them */
    bool row_major;                 /* stride is the row-major one for shape */
    uint64_t storage_offset;        /* in elements */
    uint64_t file_offset;           /* absolute offset of element 0 in the source */
    bool requires_grad;
    uint64_t pos; /* file offset of the rebuild call in the pickle, for messages */
} torch_embedded_tensor;

typedef struct torch_embedded {
    torch_embedded_tensor *tensors;
    size_t ntensors;
    /* The non-tensor values as JSON object members `"path": value, ...` (no braces), keyed by
     * dotted path like the tensors: root_name alone for a plain value saved on its own. */
    char *values;
    size_t values_len;
    size_t nvalues;
} torch_embedded;

/* Reads the torch.save zip occupying [offset, offset+length) of a registered source. label names
 * it in messages ("dir/__0_0.distcp [offset 862]") and must outlive the call; root_name is the
 * dotted path the saved object's own names are appended to. Every tensor's bytes are checked to
 * lie inside the zip's storage records. On failure *out is left empty. */
int torch_zip_read_embedded(ckpt_catalog *cat, uint32_t source, uint64_t offset, uint64_t length,
                            const char *label, const char *root_name, size_t root_len,
                            torch_embedded *out, ckpt_err *err);
/* The same with the globals of extra_globals allowed besides torch's (a framework's own classes
 * and enums, carried as inert data: the pickle reader never imports or calls anything). */
struct pk_table;
int torch_zip_read_with(ckpt_catalog *cat, uint32_t source, uint64_t offset, uint64_t length,
                        const char *label, const char *root_name, size_t root_len,
                        const struct pk_table *extra_globals, torch_embedded *out, ckpt_err *err);
void torch_embedded_free(torch_embedded *e);

#endif
