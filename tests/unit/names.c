/* Tree paths: escaping, collisions between names, tensors that are also directories; and the
 * dtype table. */
#include "model/catalog.h"
#include "tap.h"

#include <stdlib.h>
#include <unistd.h>

int main(void) {
    char path[] = "/tmp/ckpt-names-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || ftruncate(fd, 4096) != 0) return 1;
    close(fd);
    ckpt_catalog *cat = catalog_new("/unit", "unit");
    ckpt_err err;
    uint32_t src;
    catalog_add_source(cat, path, "f", &src, &err);
    static const struct {
        const char *name;
        size_t len;
        const char *want;
    } cases[] = {
        {"model.layers.0.weight", 21, "model/layers/0/weight"},
        {"a/b", 3, "a/b%~2"},
        {"a.b", 3, "a/b"},
        {"a.b.c", 5, "a/b/c"},
        {"x..y", 4, "x/%_/y"},
        {".lead", 5, "%_/lead"},
        {"p%q", 3, "p%25q"},
        {"nul\0z", 5, "nul%00z"},
        {"tab\tz\x7f", 6, "tab%09z%7F"},
        {"", 0, "%_"},
        {"a.b%~2", 6, "a/b%25~2"},
        {"trail.", 6, "trail/%_"},
        {"caf\xc3\xa9.w", 7, "caf\xc3\xa9/w"},
    };
    size_t n = sizeof cases / sizeof *cases;
    for (size_t i = 0; i < n; i++) {
        size_t ti;
        uint64_t shape[] = {1};
        catalog_add_tensor(cat, cases[i].name, cases[i].len, CKPT_U8, 1, shape, &ti, &err);
        catalog_add_piece(cat, ti, src, i, NULL, NULL, NULL, &err);
    }
    ok(catalog_finish(cat, &err) == 0, "catalog with tricky names finishes");
    for (size_t i = 0; i < n; i++) {
        const ckpt_tensor *t = NULL;
        for (size_t k = 0; k < cat->ntensors; k++)
            if (cat->tensors[k].name_len == cases[i].len &&
                memcmp(cat->tensors[k].name, cases[i].name, cases[i].len) == 0)
                t = &cat->tensors[k];
        const char *want = cases[i].want;
        char buf[64];
        /* a.b is also the directory of a.b.c (and "" that of ".lead"): the raw file gets .raw,
         * the sidecar does not */
        if (strcmp(want, "a/b") == 0) want = "a/b.raw";
        if (strcmp(want, "%_") == 0) want = "%_.raw";
        ok(t && strcmp(t->path, want) == 0, "%s -> %s (got %s)", want, want, t ? t->path : "?");
        snprintf(buf, sizeof buf, "%s.json", cases[i].want);
        char *side = t ? ckpt_sidecar_path(t) : NULL;
        ok(side && strcmp(side, buf) == 0 && ckpt_is_sidecar_path(t, buf, strlen(buf)),
           "sidecar %s", buf);
        free(side);
    }
    ckpt_close(cat);

    /* one long component: truncated with a hash, still a valid file name */
    cat = catalog_new("/unit", "unit");
    catalog_add_source(cat, path, "f", &src, &err);
    char longname[600];
    memset(longname, 'q', sizeof longname);
    size_t ti;
    uint64_t shape[] = {1};
    catalog_add_tensor(cat, longname, sizeof longname, CKPT_U8, 1, shape, &ti, &err);
    catalog_add_piece(cat, ti, src, 0, NULL, NULL, NULL, &err);
    ok(catalog_finish(cat, &err) == 0 && strlen(cat->tensors[0].path) <= 220 &&
           strstr(cat->tensors[0].path, "%#"),
       "600-byte component shortened with a hash: %.40s...", cat->tensors[0].path);
    ckpt_close(cat);

    /* 224 bytes is the longest component kept whole */
    cat = catalog_new("/unit", "unit");
    catalog_add_source(cat, path, "f", &src, &err);
    catalog_add_tensor(cat, longname, 224, CKPT_U8, 1, shape, &ti, &err);
    catalog_add_piece(cat, ti, src, 0, NULL, NULL, NULL, &err);
    ok(catalog_finish(cat, &err) == 0 && strlen(cat->tensors[0].path) == 224 &&
           !strchr(cat->tensors[0].path, '%'),
       "a 224-byte component is kept as it is");
    ckpt_close(cat);

    /* a prefix can make a plain name meet another: "opt/" + "x" and "opt.x" */
    cat = catalog_new("/unit", "unit");
    catalog_add_source(cat, path, "f", &src, &err);
    size_t plain_i, prefixed_i;
    catalog_add_tensor(cat, "x", 1, CKPT_U8, 1, shape, &prefixed_i, &err);
    catalog_add_piece(cat, prefixed_i, src, 0, NULL, NULL, NULL, &err);
    catalog_set_prefix(cat, prefixed_i, "opt/", false, &err);
    catalog_add_tensor(cat, "opt.x", 5, CKPT_U8, 1, shape, &plain_i, &err);
    catalog_add_piece(cat, plain_i, src, 1, NULL, NULL, NULL, &err);
    ok(catalog_finish(cat, &err) == 0 && strcmp(cat->tensors[0].path, "opt/x") == 0 &&
           strcmp(cat->tensors[1].path, "opt/x%~2") == 0,
       "prefixed x and opt.x: opt/x and opt/x%%~2 (got %s, %s)", cat->tensors[0].path,
       cat->tensors[1].path);
    ckpt_close(cat);
    unlink(path);

    ckpt_dtype dt;
    static const char *spellings[] = {
        "BOOL",    "U8",          "I8",          "U16", "I16",     "F16",    "BF16",    "U32",
        "I32",     "F32",         "U64",         "I64", "F64",     "C64",    "F8_E4M3", "F8_E5M2",
        "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4",  "F6_E2M3", "F6_E3M2"};
    size_t all = 0;
    for (size_t i = 0; i < sizeof spellings / sizeof *spellings; i++)
        all += ckpt_dtype_parse(spellings[i], strlen(spellings[i]), &dt) &&
               strcmp(ckpt_dtype_info_of(dt)->name, spellings[i]) == 0;
    is_u64(all, 22, "all 22 safetensors dtype spellings round-trip");
    ok(!ckpt_dtype_parse("f32", 3, &dt) && !ckpt_dtype_parse("F128", 4, &dt),
       "lowercase and F128 are not dtypes");
    ok(ckpt_dtype_parse("C128", 4, &dt) && !ckpt_dtype_info_of(dt)->safetensors,
       "C128 exists for torch but is not a safetensors dtype");
    ok(ckpt_dtype_parse("Q4_K", 4, &dt) && ckpt_dtype_info_of(dt)->block == 256 &&
           ckpt_dtype_info_of(dt)->block_bytes == 144,
       "Q4_K: 256 elements in 144 bytes");
    ok(ckpt_dtype_parse("F4", 2, &dt) && ckpt_dtype_info_of(dt)->block == 2 &&
           ckpt_dtype_info_of(dt)->block_bytes == 1,
       "F4 packs 2 elements per byte");
    ok(ckpt_dtype_parse("F6_E3M2", 7, &dt) && ckpt_dtype_info_of(dt)->block == 4 &&
           ckpt_dtype_info_of(dt)->block_bytes == 3,
       "F6 packs 4 elements in 3 bytes");
    ok(ckpt_dtype_parse("BF16", 4, &dt) && !ckpt_dtype_info_of(dt)->numpy,
       "BF16 has no numpy dtype");
    ok(ckpt_dtype_parse("C64", 3, &dt) && strcmp(ckpt_dtype_info_of(dt)->numpy, "<c8") == 0,
       "C64 is numpy <c8");
    return tap_done();
}
