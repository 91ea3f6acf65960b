/* An uncompressed tar archive as a container: its members are read in place (a source each, at
 * their offset in the archive) and mounted as what they are.
 *   NeMo 1.x .nemo   model_config.yaml + model_weights.ckpt (torch.save of the state_dict), or
 *                    model-parallel weights mp_rank_NN/model_weights.ckpt (or
 *                    tp_rank_NN_pp_rank_NNN/...): the weights tree, one subtree per rank when
 *                    sharded (ranks are not merged: their split dimensions are not recorded)
 *   any other tar    every member whose first bytes are a checkpoint format: one is the model,
 *                    several are subtrees named after the members (as a folder of files)
 * Config and tokenizer files at the top of the archive (model_config.yaml, config.json, ...) are
 * shown in .ckptfs/hf/ as they are. metadata.json "tar" lists the members. */
#include "formats.h"

#include "../util/strbuf.h"
#include "../parse/tar.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static bool probe(const unsigned char *head, size_t n, uint64_t file_size) {
    (void)file_size;
    return tar_probe(head, n);
}

static bool is_aux(const char *name) {
    if (strcmp(name, "model_config.yaml") == 0) return true;
    for (size_t i = 0; i < ckpt_hf_aux_count; i++)
        if (strcmp(name, ckpt_hf_aux_names[i]) == 0) return true;
    return false;
}

/* mp_rank_NN/model_weights.ckpt or tp_rank_NN_pp_rank_NNN/model_weights.ckpt */
static bool rank_weights(const char *name) {
    const char *slash = strchr(name, '/');
    return slash && strcmp(slash + 1, "model_weights.ckpt") == 0 &&
           (strncmp(name, "mp_rank_", 8) == 0 || strncmp(name, "tp_rank_", 8) == 0);
}

static int members_doc(ckpt_catalog *cat, const tar_index *ix, const char *kind, ckpt_err *err) {
    strbuf sb;
    sb_init(&sb);
    sb_printf(&sb, "{\"kind\": \"%s\", \"members\": [", kind);
    for (size_t i = 0; i < ix->count; i++) {
        const tar_member *m = &ix->members[i];
        sb_puts(&sb, i ? ", {\"name\": " : "{\"name\": ");
        sb_json_str(&sb, m->name, strlen(m->name));
        sb_printf(&sb, ", \"offset\": %llu, \"size\": %llu}", (unsigned long long)m->data_offset,
                  (unsigned long long)m->size);
    }
    sb_puts(&sb, "]}");
    int rc = sb.failed ? ckpt_fail(err, -ENOMEM, "out of memory")
                       : catalog_add_doc(cat, "tar", sb.data, sb.len, err);
    sb_free(&sb);
    return rc;
}

/* An archive without its end-of-archive blocks may have been cut after a whole member: every
 * member it lists is complete (a cut inside one is refused), but there may have been more. */
static void warn_ending(ckpt_catalog *cat, const tar_index *ix, const char *archive) {
    if (ix->end_blocks == 1)
        catalog_warn(cat,
                     "%s: a lone zero block at offset %llu: the second end-of-archive block is "
                     "missing (the archive may be truncated)",
                     archive, (unsigned long long)ix->end);
    else if (ix->end_blocks == 0)
        catalog_warn(cat,
                     "%s: the archive ends at offset %llu without its two end-of-archive zero "
                     "blocks%s (it may be truncated: members after that offset would be "
                     "missing)",
                     archive, (unsigned long long)ix->end,
                     ix->unpadded ? ", and its last member without its padding" : "");
}

static int load(ckpt_catalog *cat, uint32_t archive, ckpt_err *err) {
    tar_index ix;
    int rc = tar_read_index(cat, archive, &ix, err);
    if (rc) return rc;
    uint32_t *srcs = calloc(ix.count ? ix.count : 1, sizeof *srcs);
    const ckpt_format **fmts = calloc(ix.count ? ix.count : 1, sizeof *fmts);
    if (!srcs || !fmts) rc = ckpt_fail(err, -ENOMEM, "out of memory");
    const tar_member *config = tar_find(&ix, "model_config.yaml");
    const tar_member *weights = tar_find(&ix, "model_weights.ckpt");
    size_t n = 0, ranks = 0;
    for (size_t i = 0; i < ix.count && !rc; i++) ranks += rank_weights(ix.members[i].name);
    const char *kind = config && (weights || ranks) ? "nemo" : "tar";
    for (size_t i = 0; i < ix.count && !rc; i++) {
        const tar_member *m = &ix.members[i];
        bool nemo_weights = m == weights || rank_weights(m->name);
        bool aux = !strchr(m->name, '/') && is_aux(m->name);
        if (strcmp(kind, "nemo") == 0 && !nemo_weights && !aux) continue;
        uint32_t src;
        if (aux) {
            if (!(rc = catalog_add_member(cat, archive, m->name, m->data_offset, m->size, &src,
                                          err)))
                rc = catalog_add_aux(cat, m->name, src, err);
            continue;
        }
        unsigned char head[PROBE_BYTES];
        size_t len = m->size < sizeof head ? (size_t)m->size : sizeof head;
        if ((rc = ckpt_source_read(cat, archive, m->data_offset, head, len,
                                   "a member's first bytes", err)))
            break;
        const ckpt_format *f = ckpt_format_probe_bytes(head, len, m->size);
        if (nemo_weights && f != &format_torch_zip)
            rc = ckpt_fail(err, -EINVAL, "%s: member %s (at offset %llu) is not a torch.save file",
                           cat->sources[archive].path, m->name, (unsigned long long)m->data_offset);
        if (rc || !f || f == &format_tar) continue; /* README, nested archives: left alone */
        if ((rc = catalog_add_member(cat, archive, m->name, m->data_offset, m->size, &src, err)))
            break;
        srcs[n] = src;
        fmts[n++] = f;
    }
    if (!rc && n == 0)
        rc = ckpt_fail(err, -ENOENT,
                       "%s: none of the %zu files in the archive is a checkpoint ckptfs knows",
                       cat->sources[archive].path, ix.count);
    if (!rc) rc = folder_load_set(cat, srcs, fmts, n, kind, err);
    if (!rc && strcmp(kind, "nemo") == 0) cat->format = n > 1 ? "nemo-model-parallel" : "nemo";
    if (!rc) rc = members_doc(cat, &ix, kind, err);
    if (!rc) warn_ending(cat, &ix, cat->sources[archive].path);
    free(srcs);
    free(fmts);
    tar_index_free(&ix);
    return rc;
}

const ckpt_format format_tar = {.name = "tar", .label = "tar", .probe = probe, .load = load};
