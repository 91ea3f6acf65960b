/* gpt-rs writer: GPTRSCHK v2 checkpoints (.gptrs) and GPTRSTEN v2 tensor archives (.gptrsten),
 * byte for byte as gpt-rs's own savers write them:
 *
 *   "GPTRSCHK", u32 2, u32 config_len, config JSON, u32 index_len, index, payloads
 *   "GPTRSTEN", u32 2, u32 index_len, index, payloads
 *   index: u32 tensor_count, then per tensor u32 name_len, name, [checkpoints: 16-byte
 *          stored_base_id = BLAKE3(name)[0..16]], u32 rank, rank x u64 dims, u32 dtype_tag,
 *          u8 reserved = 0, u64 offset (absolute), u64 byte_len
 *
 * Tensors are sorted by name bytewise and their payloads packed back to back from the end of
 * the index, with no padding, as gpt-rs does. Base ids are the real BLAKE3 ids (gpt-rs's Rust
 * saver), not 0 (its Python helper), so gpt-rs and ckptfs can check them.
 *
 * The config of a checkpoint (gpt-rs parses it as a ModelConfig: a "kind" string is all it
 * requires; kind "gpt" needs the seven GptConfig fields):
 * - from a gpt-rs checkpoint, its config, written compact like serde_json; a legacy untagged
 *   GPT config becomes {"kind":"gpt","config":{...}} with its functional_overrides moved to
 *   "runtime", the form gpt-rs reads today;
 * - from anything else, {"kind":"ckptfs","config":{"source_format":"..."}}: a valid ModelConfig
 *   that says where the tensors came from without claiming a model gpt-rs could build (no
 *   GptConfig can be derived from tensors: num_heads is not in any shape). gpt-rs loads its
 *   tensors; building a model from it fails on the unknown kind, as it should.
 *
 * Refused, naming the tensor: dtypes without a tag (gpt-rs has F32, F16, BF16, I32 only),
 * names that are not UTF-8 (GPTRSTEN) or not ASCII (GPTRSCHK: base ids are defined on ASCII
 * names), names over 65535 bytes (what ckptfs reads back), incomplete tensors, two model
 * tensors with one name, and an index or config over 4 GiB (u32 lengths). */
#include "writers.h"
#include "../../util/json_emit.h"

#include "../../util/blake3.h"
#include "../../model/catalog.h"
#include "../../util/json.h"
#include "../../util/strbuf.h"
#include "../../util/utf8.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum { NAME_LIMIT = 65535, BASE_ID_LEN = 16 };

static int dtype_tag_of(ckpt_dtype dt) {
    switch (dt) {
    case CKPT_F32:
        return 0;
    case CKPT_F16:
        return 1;
    case CKPT_BF16:
        return 2;
    case CKPT_I32:
        return 3;
    default:
        return -1;
    }
}

/* ---- what may be written ---- */

static int check_name(const out_file *f, const ckpt_tensor *t, bool archive, ckpt_err *err) {
    const unsigned char *p = (const unsigned char *)t->name;
    const char *shown = ckpt_shown(t->name, t->name_len);
    int n = -1; /* "%.*s" prints all of shown */
    if (t->name_len > NAME_LIMIT)
        return ckpt_fail(err, -EINVAL,
                         "%s: tensor \"%.*s\": the name has %zu bytes, more than the %d ckptfs "
                         "reads back from gpt-rs files",
                         f->final_path, n, shown, t->name_len, NAME_LIMIT);
    for (size_t i = 0; i < t->name_len;) {
        size_t k = utf8_seq_len(p + i, t->name_len - i);
        if (!k)
            return ckpt_fail(err, -EINVAL,
                             "%s: tensor \"%.*s\": the name is not UTF-8 (byte 0x%02x at %zu), "
                             "which gpt-rs requires",
                             f->final_path, n, shown, p[i], i);
        if (!archive && k > 1)
            return ckpt_fail(err, -EINVAL,
                             "%s: tensor \"%.*s\": the name is not ASCII, and a GPTRSCHK "
                             "checkpoint derives base ids from ASCII names only (write a "
                             ".gptrsten archive instead)",
                             f->final_path, n, shown);
        i += k;
    }
    return 0;
}

static int check_tensor(const out_file *f, const ckpt_tensor *t, bool archive, ckpt_err *err) {
    if (t->incomplete)
        return ckpt_fail(err, -EIO,
                         "%s: tensor \"%.*s\" is incomplete (part of it is stored nowhere)",
                         f->final_path, SHOWN_NAME(t->name, t->name_len));
    if (dtype_tag_of(t->dtype) < 0)
        return ckpt_fail(err, -EINVAL,
                         "%s: tensor \"%.*s\" is %s, which gpt-rs cannot hold (its dtypes are "
                         "F32, F16, BF16 and I32)",
                         f->final_path, SHOWN_NAME(t->name, t->name_len),
                         ckpt_dtype_info_of(t->dtype)->name);
    return check_name(f, t, archive, err);
}

static int by_name(const void *a, const void *b) {
    const ckpt_tensor *x = *(const ckpt_tensor *const *)a, *y = *(const ckpt_tensor *const *)b;
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(x->name, y->name, n);
    return c ? c : (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

/* The model's tensors (not those aside), checked and sorted by name. */
static int select_tensors(const out_file *f, const ckpt_catalog *cat, bool archive,
                          const ckpt_tensor ***out, size_t *count, ckpt_err *err) {
    const ckpt_tensor **sel = malloc((cat->ntensors ? cat->ntensors : 1) * sizeof *sel);
    if (!sel) return ckpt_fail(err, -ENOMEM, "out of memory");
    size_t n = 0;
    int rc = 0;
    for (size_t i = 0; i < cat->ntensors && !rc; i++) {
        if (cat->tensors[i].aside) continue;
        if (!(rc = check_tensor(f, &cat->tensors[i], archive, err))) sel[n++] = &cat->tensors[i];
    }
    if (!rc && n > 1) qsort(sel, n, sizeof *sel, by_name);
    for (size_t i = 1; i < n && !rc; i++) {
        const ckpt_tensor *t = sel[i], *prev = sel[i - 1];
        if (t->name_len == prev->name_len && memcmp(t->name, prev->name, t->name_len) == 0)
            rc = ckpt_fail(err, -EINVAL,
                           "%s: tensor \"%.*s\": two tensors of the model have this name (under "
                           "different directories); a gpt-rs file holds one",
                           f->final_path, SHOWN_NAME(t->name, t->name_len));
    }
    if (rc) {
        free(sel);
        return rc;
    }
    *out = sel;
    *count = n;
    return 0;
}

/* ---- config JSON ---- */

/* The source's config when it is a gpt-rs checkpoint; false when there is none. */
static bool source_config(const ckpt_catalog *cat, strbuf *sb) {
    const ckpt_doc *doc = NULL;
    for (size_t i = 0; i < cat->ndocs; i++)
        if (strcmp(cat->docs[i].key, "gpt-rs") == 0) doc = &cat->docs[i];
    if (!doc) return false;
    json_doc jd;
    json_error jerr;
    if (json_parse(&jd, doc->json, doc->len, &jerr)) return false;
    const json_value *cfg = json_member(jd.root, "config");
    const json_value *legacy = json_member(jd.root, "legacy_config");
    bool found = cfg && cfg->type == JSON_OBJECT;
    if (found && legacy && legacy->type == JSON_TRUE) {
        sb_puts(sb, "{\"kind\":\"gpt\",\"config\":");
        json_emit(sb, cfg, false, "functional_overrides");
        const json_value *fo = json_member(cfg, "functional_overrides");
        if (fo && fo->type == JSON_OBJECT && fo->count) {
            sb_puts(sb, ",\"runtime\":{\"functional_overrides\":");
            json_emit(sb, fo, false, NULL);
            sb_putc(sb, '}');
        }
        sb_putc(sb, '}');
    } else if (found) {
        json_emit(sb, cfg, false, NULL);
    }
    json_doc_free(&jd);
    return found;
}

static int build_config(const ckpt_catalog *cat, strbuf *sb, ckpt_err *err) {
    if (!source_config(cat, sb)) {
        sb_clear(sb);
        sb_puts(sb, "{\"kind\":\"ckptfs\",\"config\":{\"source_format\":");
        const char *fmt = cat->format ? cat->format : "unknown";
        sb_json_str(sb, fmt, strlen(fmt));
        sb_puts(sb, "}}");
    }
    return sb->failed ? ckpt_fail(err, -ENOMEM, "out of memory") : 0;
}

/* ---- the file ---- */

static int write_gptrs(out_file *f, const ckpt_catalog *cat, bool archive, ckpt_err *err) {
    const ckpt_tensor **sel = NULL;
    size_t n = 0;
    int rc = select_tensors(f, cat, archive, &sel, &n, err);
    if (rc) return rc;
    strbuf config;
    sb_init(&config);
    if (!archive && (rc = build_config(cat, &config, err))) goto out;

    /* Every field has a fixed width, so the index length is known before any offset. */
    uint64_t index_len = 4;
    for (size_t i = 0; i < n; i++) {
        const ckpt_tensor *t = sel[i];
        index_len +=
            4 + t->name_len + (archive ? 0 : BASE_ID_LEN) + 4 + 8ull * t->ndim + 4 + 1 + 8 + 8;
    }
    if (index_len > UINT32_MAX || config.len > UINT32_MAX) {
        rc = ckpt_fail(err, -EINVAL, "%s: the %s takes %llu bytes, more than its u32 length holds",
                       f->final_path, index_len > UINT32_MAX ? "index" : "config",
                       (unsigned long long)(index_len > UINT32_MAX ? index_len : config.len));
        goto out;
    }
    uint64_t offset = 8 + 4 + (archive ? 0 : 4 + config.len) + 4 + index_len;

    out_bytes(f, archive ? "GPTRSTEN" : "GPTRSCHK", 8);
    out_le32(f, 2);
    if (!archive) {
        out_le32(f, (uint32_t)config.len);
        out_bytes(f, config.data, config.len);
    }
    out_le32(f, (uint32_t)index_len);
    out_le32(f, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        const ckpt_tensor *t = sel[i];
        out_le32(f, (uint32_t)t->name_len);
        out_bytes(f, t->name, t->name_len);
        if (!archive) {
            uint8_t digest[BLAKE3_OUT_LEN];
            blake3_hash(t->name, t->name_len, digest);
            out_bytes(f, digest, BASE_ID_LEN);
        }
        out_le32(f, t->ndim);
        for (uint32_t d = 0; d < t->ndim; d++) out_le64(f, t->shape[d]);
        out_le32(f, (uint32_t)dtype_tag_of(t->dtype));
        out_bytes(f, "", 1); /* reserved */
        out_le64(f, offset);
        out_le64(f, t->nbytes);
        offset += t->nbytes;
    }
    for (size_t i = 0; i < n && !f->failed; i++) out_tensor(f, cat, sel[i]);
    rc = f->failed;
out:
    sb_free(&config);
    free(sel);
    return rc;
}

/* .gptrs: a GPTRSCHK checkpoint, config + tensors */
static int write_checkpoint(out_file *f, const ckpt_catalog *cat, ckpt_err *err) {
    return write_gptrs(f, cat, false, err);
}

/* .gptrsten: a GPTRSTEN tensor archive, no config */
static int write_tensors(out_file *f, const ckpt_catalog *cat, ckpt_err *err) {
    return write_gptrs(f, cat, true, err);
}

const ckpt_writer writer_gptrs = {.suffix = ".gptrs", .write = write_checkpoint, .zst_ok = true};
const ckpt_writer writer_gptrsten = {.suffix = ".gptrsten", .write = write_tensors, .zst_ok = true};
