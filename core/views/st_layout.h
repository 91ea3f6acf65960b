/* The safetensors layout as the reference writers lay it out, written in one place: a header's
 * entries and padding, the shard names of a Hugging Face directory, its index JSON. The HF
 * view (hfview.c), the safetensors writers (write/writers/) and a stage's packs
 * (write/shards.c) all encode through it, so a file written by one is the file another would
 * show. */
#ifndef CKPT_ST_LAYOUT_H
#define CKPT_ST_LAYOUT_H

#include "../ckpt.h"
#include "../util/strbuf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A single-file checkpoint, the index of a sharded one. */
#define ST_SINGLE_NAME "model.safetensors"
#define ST_INDEX_NAME "model.safetensors.index.json"

/* Every header starts with the metadata the reference writer puts first (without the
 * closing brace of the header). */
extern const char st_header_start[];
enum { ST_HEADER_START_LEN = 31 }; /* strlen(st_header_start) */

/* The longest shard name (model-NNNNN-of-NNNNN.safetensors for counts of any size_t). */
enum { ST_SHARD_NAME_MAX = 64 };

/* A tensor of the catalog and the offset of its first byte in the data section. */
typedef struct st_placed {
    size_t tensor;
    uint64_t at;
} st_placed;

/* One entry of a header, with its leading comma:
 * ,"NAME":{"dtype":"F32","shape":[2,3],"data_offsets":[at,at+nbytes]} */
void st_put_entry(strbuf *sb, const ckpt_tensor *t, uint64_t at);

/* The length field of a header whose JSON is json_len bytes: padded with spaces so that the
 * data section (and every naturally aligned tensor in it) starts at a multiple of 8. */
static inline uint64_t st_padded_len(uint64_t json_len) {
    return json_len + (8 - json_len % 8) % 8;
}

/* A whole header (length field, JSON, padding) of the tensors p[0..n), in the order of their
 * bytes, into a malloc'd buffer: padded to a multiple of 8 (room 0: *len is what it takes), or
 * to exactly `room` bytes after the length field (*len = 8 + room). 0, 1 when the JSON does
 * not fit in room, or -ENOMEM. */
int st_header(const ckpt_catalog *cat, const st_placed *p, size_t n, uint64_t room, char **out,
              size_t *len);

/* The name of shard nth (0-based) of nshards: model.safetensors when there is one, else
 * model-0000i-of-0000N.safetensors, as huggingface_hub names them. */
void st_shard_name(char out[ST_SHARD_NAME_MAX], size_t nth, size_t nshards);

/* Byte order of the names of tensors a and b of cat (memcmp, then length). */
int st_name_cmp(const ckpt_catalog *cat, size_t a, size_t b);

/* The index as transformers writes it (json.dumps(index, indent=2, sort_keys=True)) into sb:
 * total_size and the weight map of p[0..n), whose `at` is each tensor's shard (0-based) of
 * nshards; p must be in st_name_cmp order. */
void st_index_json(strbuf *sb, const ckpt_catalog *cat, const st_placed *by_name, size_t n,
                   size_t nshards, uint64_t total);

/* A file name the safetensors directory writer writes (a shard or the index). */
bool st_written_name(const char *name);

#endif
