/* The safetensors header reader, shared by the plain decoder and the DCP-HF directory decoder. */
#ifndef CKPT_SAFETENSORS_H
#define CKPT_SAFETENSORS_H

#include "../util/json.h"
#include "formats.h"

typedef struct st_entry {
    const char *name; /* in the header's names arena (NUL-terminated, may hold NUL) */
    size_t name_len;
    uint64_t *shape;      /* ndim dims, in the header's dims arena */
    uint64_t begin, end;  /* data_offsets */
    uint64_t offset;      /* absolute file offset of the bytes */
    uint32_t pos;         /* header offset of the entry's key (for messages) */
    uint32_t offsets_pos; /* header offset of its data_offsets */
    ckpt_dtype dtype;
    uint32_t ndim;
} st_entry;

/* What a header holds once read: its text and its values are gone (the members were parsed
 * one at a time), only these compact entries, the names and dims, and __metadata__ stay. */
typedef struct st_header {
    json_doc doc;      /* holds only __metadata__ */
    arena names, dims; /* packed names; shapes as u64 */
    st_entry *entries; /* sorted by data offset */
    size_t nentries;
    const json_value *metadata; /* __metadata__ (object of strings), or NULL */
    uint64_t data_start;
} st_header;

/* Reads and validates the whole header of a registered source (see safetensors.c). Only reads
 * the catalog, so headers of several sources may be read on several threads. */
int safetensors_read_header(const ckpt_catalog *cat, uint32_t source, st_header *h, ckpt_err *err);
void safetensors_header_free(st_header *h);
/* Adds every tensor of a header read from source, whole, and its metadata document. */
int safetensors_add_tensors(ckpt_catalog *cat, uint32_t source, const st_header *h, ckpt_err *err);
/* Adds {"__metadata__": {...}} under the file's relative path to metadata.json. */
int safetensors_metadata_doc(ckpt_catalog *cat, uint32_t source, const st_header *h, ckpt_err *err);

#endif
