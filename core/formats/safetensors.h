/* The safetensors header reader, shared by the plain decoder and the DCP-HF directory decoder. */
#ifndef CKPT_SAFETENSORS_H
#define CKPT_SAFETENSORS_H

#include "../json.h"
#include "formats.h"

typedef struct st_entry {
    const json_value *v; /* the tensor's header object (for messages: v->pos) */
    const char *name;    /* points into the header */
    size_t name_len;
    ckpt_dtype dtype;
    uint32_t ndim;
    uint64_t shape[CKPT_MAX_DIMS];
    uint64_t begin, end; /* data_offsets */
    uint64_t offset;     /* absolute file offset of the bytes */
} st_entry;

typedef struct st_header {
    char *text;
    json_doc doc;
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
