/* convert --profile lightwatch-gpt2: a Hugging Face GPT-2 checkpoint as LightwatchAI2 expects
 * it in a .lwt file (gptrs-burnpack-lwt-tp.md 3.4): names "transformer.*" (added when the
 * checkpoint lacks the prefix), the tied lm_head and the attention-mask buffers (attn.bias,
 * attn.masked_bias) left out, and the Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc,
 * mlp.c_proj), which HF stores [in, out], transposed to [out, in] as the contract's text says
 * (its table contradicts it; the text is followed). The transposition is a strided view of the
 * same bytes: nothing is copied until the writer reads it. The header gets model_type "gpt2"
 * and the config numbers from config.json. */
#include "profile.h"
#include "../util/text.h"

#include "../formats/formats.h"
#include "../util/json.h"
#include "../util/strbuf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool starts_with(const char *s, size_t n, const char *p) {
    size_t m = strlen(p);
    return n >= m && memcmp(s, p, m) == 0;
}

/* "h.<digits>.<rest>": the block-local part, or NULL. */
static const char *block_rest(const char *s, size_t n, size_t *rest_len) {
    if (!starts_with(s, n, "h.")) return NULL;
    size_t i = 2;
    while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    if (i == 2 || i >= n || s[i] != '.') return NULL;
    *rest_len = n - i - 1;
    return s + i + 1;
}

static bool is_conv1d_weight(const char *rest, size_t n) {
    static const char *const w[] = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                                    "mlp.c_proj.weight"};
    for (size_t i = 0; i < sizeof w / sizeof *w; i++)
        if (strlen(w[i]) == n && memcmp(rest, w[i], n) == 0) return true;
    return false;
}

/* config.json numbers for the header: n_layer, n_head, n_embd, vocab_size, block_size. */
static int header_doc(ckpt_catalog *out, const ckpt_catalog *in, ckpt_err *err) {
    const ckpt_aux_file *cfg = NULL;
    for (size_t i = 0; i < in->naux; i++)
        if (strcmp(in->aux[i].name, "config.json") == 0) cfg = &in->aux[i];
    if (!cfg)
        return ckpt_fail(err, -EINVAL,
                         "%s: the lightwatch-gpt2 profile needs the model's "
                         "config.json next to the weights (an HF model directory)",
                         in->root);
    const ckpt_source *s = &in->sources[cfg->source];
    if (s->size > (16u << 20)) return ckpt_fail(err, -EFBIG, "%s: config.json too large", s->path);
    char *text = malloc(s->size ? s->size : 1);
    if (!text) return ckpt_fail(err, -ENOMEM, "out of memory");
    int rc = ckpt_source_read(in, cfg->source, 0, text, s->size, "config.json", err);
    json_doc doc;
    json_error jerr;
    if (!rc && (rc = json_parse(&doc, text, s->size, &jerr)))
        ckpt_fail(err, rc, "%s: %s (byte offset %zu)", s->path, jerr.msg, jerr.pos);
    if (rc) {
        free(text);
        return rc;
    }
    static const struct {
        const char *lwt, *hf, *hf_alt;
    } keys[] = {{"n_layer", "n_layer", NULL},
                {"n_head", "n_head", NULL},
                {"n_embd", "n_embd", NULL},
                {"vocab_size", "vocab_size", NULL},
                {"block_size", "n_positions", "n_ctx"}};
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\"header\": {\"model_type\": \"gpt2\", \"config\": {");
    for (size_t i = 0; !rc && i < sizeof keys / sizeof *keys; i++) {
        const json_value *v = json_member(doc.root, keys[i].hf);
        if (!v && keys[i].hf_alt) v = json_member(doc.root, keys[i].hf_alt);
        uint64_t n;
        if (!json_as_u64(v, &n))
            rc = ckpt_fail(err, -EINVAL, "%s: \"%s\" is missing or not a whole number", s->path,
                           keys[i].hf);
        else
            sb_printf(&sb, "%s\"%s\": %llu", i ? ", " : "", keys[i].lwt, (unsigned long long)n);
    }
    sb_puts(&sb, "}}}");
    if (!rc)
        rc = sb.failed ? ckpt_fail(err, -ENOMEM, "out of memory")
                       : catalog_add_doc(out, "lightwatch-lwt", sb.data, sb.len, err);
    sb_free(&sb);
    json_doc_free(&doc);
    free(text);
    return rc;
}

static int add_tensor(ckpt_catalog *out, const ckpt_tensor *t, const char *rest, size_t rest_len,
                      ckpt_err *err) {
    if (t->dtype != CKPT_F32)
        return ckpt_fail(err, -EINVAL, "tensor \"%.*s\" is %s; .lwt holds float32 only",
                         SHOWN_NAME(t->name, t->name_len), ckpt_dtype_info_of(t->dtype)->name);
    char name[512];
    int n = snprintf(name, sizeof name, "transformer.%.*s", (int)rest_len, rest);
    if (n < 0 || (size_t)n >= sizeof name)
        return ckpt_fail(err, -ENAMETOOLONG, "tensor \"%.*s\": name too long",
                         SHOWN_NAME(t->name, t->name_len));
    size_t br;
    const char *b = block_rest(rest, rest_len, &br);
    bool transpose = b && is_conv1d_weight(b, br) && t->ndim == 2;
    size_t idx;
    if (!transpose) {
        int rc = catalog_add_tensor(out, name, (size_t)n, t->dtype, t->ndim, t->shape, &idx, err);
        for (uint32_t k = 0; !rc && k < t->npieces; k++) {
            const ckpt_piece *p = &t->pieces[k];
            rc = catalog_add_piece(out, idx, p->source, p->file_offset, p->offsets, p->sizes,
                                   p->strides, err);
        }
        return rc;
    }
    if (t->npieces != 1 || t->pieces[0].strides || t->pieces[0].sizes[0] != t->shape[0] ||
        t->pieces[0].sizes[1] != t->shape[1])
        return ckpt_fail(err, -EINVAL,
                         "tensor \"%.*s\": only a contiguous Conv1D weight can be "
                         "transposed",
                         SHOWN_NAME(t->name, t->name_len));
    /* [in, out] -> [out, in]: element (i, j) of the result is element (j, i) of the source. */
    uint64_t shape[2] = {t->shape[1], t->shape[0]}, strides[2] = {1, t->shape[1]};
    int rc = catalog_add_tensor(out, name, (size_t)n, t->dtype, 2, shape, &idx, err);
    if (!rc)
        rc = catalog_add_piece(out, idx, t->pieces[0].source, t->pieces[0].file_offset, NULL, NULL,
                               strides, err);
    if (!rc) rc = catalog_set_extra(out, idx, "\"transposed_from\": \"[in, out]\"", err);
    return rc;
}

int ckpt_profile_lightwatch_gpt2(const ckpt_catalog *in, ckpt_catalog **result, ckpt_err *err) {
    *result = NULL;
    ckpt_catalog *out = catalog_new(in->root, "lightwatch-gpt2");
    if (!out) return ckpt_fail(err, -ENOMEM, "out of memory");
    int rc = 0;
    /* The same files, in the same order, so piece source numbers carry over. */
    for (uint32_t i = 0; !rc && i < in->nsources; i++) {
        uint32_t idx;
        rc = catalog_add_source(out, in->sources[i].path, in->sources[i].relpath, &idx, err);
    }
    if (!rc) rc = header_doc(out, in, err);
    size_t kept = 0;
    for (size_t i = 0; !rc && i < in->ntensors; i++) {
        const ckpt_tensor *t = &in->tensors[i];
        if (t->aside) continue;
        const char *rest = t->name;
        size_t rest_len = t->name_len;
        if (starts_with(rest, rest_len, "transformer.")) rest += 12, rest_len -= 12;
        if (starts_with(t->name, t->name_len, "lm_head.")) continue; /* tied to wte */
        size_t br;
        const char *b = block_rest(rest, rest_len, &br);
        if (b &&
            (text_mem_ends_with(b, br, "attn.bias") ||
             text_mem_ends_with(b, br, "attn.masked_bias")) &&
            (br == 9 || br == 16))
            continue; /* causal-mask buffers, not parameters */
        rc = add_tensor(out, t, rest, rest_len, err);
        kept++;
    }
    if (!rc && kept == 0) rc = ckpt_fail(err, -EINVAL, "%s: no GPT-2 tensors to convert", in->root);
    if (!rc) rc = catalog_finish(out, err);
    if (rc) {
        ckpt_close(out);
        return rc;
    }
    *result = out;
    return 0;
}
