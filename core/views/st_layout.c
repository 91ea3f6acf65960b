/* The safetensors layout encoder (st_layout.h): compact JSON as the reference writer prints
 * it, so that a header made here is byte for byte the one safetensors.torch.save_file and
 * huggingface_hub's sharding would write for the same tensors in the same order. */
#include "st_layout.h"

#include "../util/le.h"
#include "../util/text.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char st_header_start[] = "{\"__metadata__\":{\"format\":\"pt\"}";

_Static_assert(sizeof st_header_start - 1 == ST_HEADER_START_LEN, "ST_HEADER_START_LEN");

void st_put_entry(strbuf *sb, const ckpt_tensor *t, uint64_t at) {
    sb_putc(sb, ',');
    sb_json_str(sb, t->name, t->name_len);
    sb_puts(sb, ":{\"dtype\":\"");
    sb_puts(sb, ckpt_dtype_info_of(t->dtype)->name);
    sb_puts(sb, "\",\"shape\":[");
    for (uint32_t d = 0; d < t->ndim; d++) {
        if (d) sb_putc(sb, ',');
        sb_u64(sb, t->shape[d]);
    }
    sb_puts(sb, "],\"data_offsets\":[");
    sb_u64(sb, at);
    sb_putc(sb, ',');
    sb_u64(sb, at + t->nbytes);
    sb_puts(sb, "]}");
}

int st_header(const ckpt_catalog *cat, const st_placed *p, size_t n, uint64_t room, char **out,
              size_t *len) {
    *out = NULL;
    *len = 0;
    strbuf sb;
    sb_init(&sb);
    sb_put(&sb, "\0\0\0\0\0\0\0\0", 8); /* the length field, filled in below */
    sb_put(&sb, st_header_start, ST_HEADER_START_LEN);
    for (size_t i = 0; i < n; i++) st_put_entry(&sb, &cat->tensors[p[i].tensor], p[i].at);
    sb_putc(&sb, '}');
    if (sb.failed) {
        sb_free(&sb);
        return -ENOMEM;
    }
    uint64_t json = sb.len - 8, field = room ? room : st_padded_len(json);
    if (json > field) {
        sb_free(&sb);
        return 1;
    }
    if (!sb_reserve(&sb, (size_t)(field - json))) {
        sb_free(&sb);
        return -ENOMEM;
    }
    memset(sb.data + sb.len, ' ', (size_t)(field - json));
    sb.len += (size_t)(field - json);
    put_le64((unsigned char *)sb.data, field);
    size_t got;
    *out = sb_take(&sb, &got);
    if (!*out) return -ENOMEM;
    *len = got;
    return 0;
}

void st_shard_name(char out[ST_SHARD_NAME_MAX], size_t nth, size_t nshards) {
    if (nshards <= 1)
        snprintf(out, ST_SHARD_NAME_MAX, "%s", ST_SINGLE_NAME);
    else
        snprintf(out, ST_SHARD_NAME_MAX, "model-%05zu-of-%05zu.safetensors", nth + 1, nshards);
}

int st_name_cmp(const ckpt_catalog *cat, size_t a, size_t b) {
    const ckpt_tensor *x = &cat->tensors[a], *y = &cat->tensors[b];
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(x->name, y->name, n);
    return c ? c : (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

void st_index_json(strbuf *sb, const ckpt_catalog *cat, const st_placed *by_name, size_t n,
                   size_t nshards, uint64_t total) {
    sb_puts(sb, "{\n  \"metadata\": {\n    \"total_size\": ");
    sb_u64(sb, total);
    sb_puts(sb, "\n  },\n  \"weight_map\": {");
    for (size_t i = 0; i < n; i++) {
        const ckpt_tensor *t = &cat->tensors[by_name[i].tensor];
        char shard[ST_SHARD_NAME_MAX];
        st_shard_name(shard, (size_t)by_name[i].at, nshards);
        sb_puts(sb, i ? ",\n    " : "\n    ");
        sb_json_str(sb, t->name, t->name_len);
        sb_puts(sb, ": ");
        sb_json_str(sb, shard, strlen(shard));
    }
    sb_puts(sb, n ? "\n  }\n}\n" : "}\n}\n");
}

bool st_written_name(const char *name) {
    return text_ends_with(name, ".safetensors") || strcmp(name, ST_INDEX_NAME) == 0;
}
