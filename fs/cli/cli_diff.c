/* ckptfs diff A B: two checkpoints of any formats and layouts compared tensor by tensor, matched
 * by name (through --map renames), values compared after conversion to double (core/views/stats.c).
 * Exit status as diff(1): 0 equal within tolerance, 1 different, 2 trouble. */
#include "cli_internal.h"
#include "common/plot.h"

#include "core/views/stats.h"
#include "core/write/profile.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "Compare two checkpoints (any formats and layouts) tensor by tensor, matched by\n"
    "name: tensors only in A (removed) or B (added), dtype and shape changes, then\n"
    "per tensor: same bytes, or max abs/rel difference, RMS difference, cosine\n"
    "similarity and the count of elements with |a-b| > atol + rtol*|b|.\n"
    "\n"
    "  --map MAP        rename A's tensors first: a file of `A-PATTERN B-PATTERN`\n"
    "                   lines (* carried over); meta-to-hf, hf-to-meta (Llama, the\n"
    "                   Meta side read through its HF view); hf-to-gguf (A laid out\n"
    "                   as convert writes a GGUF; quantized: close within its error)\n"
    "  --atol X         absolute tolerance (default 0: values must be equal)\n"
    "  --rtol X         relative tolerance (default 0)\n"
    "  --ignore-dtype   a dtype change alone is no difference: judge the values\n"
    "  --json           the result as JSON\n"
    "  --plot SVG       draw the relative change ||a-b||/||b|| per layer\n"
    "  -q, --quiet      print only what differs, and the totals\n"
    "  -j, --threads N  worker threads (default: one per CPU)\n"
    "  -a, --all        also the per-rank copies under .ckptfs/ranks/\n"
    "  -o OPTIONS       decoding options for both: tp_split=RULES\n"
    "  -h, --help       this help\n"
    "\n"
    "Tensors naming the same bytes of the same file are not read. Exit status:\n"
    "0 equal within tolerance, 1 different, 2 trouble (usage, unreadable input).\n";

enum { EXIT_SAME = 0, EXIT_DIFFERENT = 1, EXIT_TROUBLE = 2, MAX_STARS = 4 };

/* Llama checkpoints as Meta's consolidated.*.pth name them (A) and as Hugging Face does (B).
 * Hugging Face also permutes the rows of wq and wk for its rotary layout: a Meta catalog's HF
 * view undoes it (meta_mp.c), so the maps compare that view (hf_view_side) and these names are
 * for a Meta side that has none. */
static const char meta_to_hf[] =
    "tok_embeddings.weight model.embed_tokens.weight\n"
    "norm.weight model.norm.weight\n"
    "output.weight lm_head.weight\n"
    "layers.*.attention.wq.weight model.layers.*.self_attn.q_proj.weight\n"
    "layers.*.attention.wk.weight model.layers.*.self_attn.k_proj.weight\n"
    "layers.*.attention.wv.weight model.layers.*.self_attn.v_proj.weight\n"
    "layers.*.attention.wo.weight model.layers.*.self_attn.o_proj.weight\n"
    "layers.*.feed_forward.w1.weight model.layers.*.mlp.gate_proj.weight\n"
    "layers.*.feed_forward.w2.weight model.layers.*.mlp.down_proj.weight\n"
    "layers.*.feed_forward.w3.weight model.layers.*.mlp.up_proj.weight\n"
    "layers.*.attention_norm.weight model.layers.*.input_layernorm.weight\n"
    "layers.*.ffn_norm.weight model.layers.*.post_attention_layernorm.weight\n";

typedef struct rule {
    char *from, *to;
} rule;

typedef struct differ {
    const char *cmd;
    bool json, quiet, all, ignore_dtype;
    double atol, rtol;
    uint64_t threads;
    const char *plot, *map;
    int hf_view_side; /* 1 (A) or 2 (B): that side's HF view tensors, by their own names */
    bool gguf;        /* --map hf-to-gguf: A was laid out for llama.cpp (ckpt_profile_llamacpp) */
    rule *rules;
    size_t nrules;
    const ckpt_catalog *ca, *cb;
} differ;

/* ---- renaming ---- */

/* Matches s against pattern p ('*' = any non-empty text); the texts of the stars go to cap. */
static bool match(const char *p, const char *s, const char **cap, size_t *caplen, int k) {
    if (!*p) return !*s;
    if (*p == '*') {
        if (k >= MAX_STARS) return false;
        for (size_t n = strlen(s); n >= 1; n--) {
            cap[k] = s;
            caplen[k] = n;
            if (match(p + 1, s + n, cap, caplen, k + 1)) return true;
        }
        return false;
    }
    return *p == *s && match(p + 1, s + 1, cap, caplen, k);
}

/* The B name of A's name: by the first rule that matches, else the name itself. */
static char *rename_a(const differ *d, const char *name) {
    for (size_t r = 0; r < d->nrules; r++) {
        const char *cap[MAX_STARS];
        size_t caplen[MAX_STARS];
        if (!match(d->rules[r].from, name, cap, caplen, 0)) continue;
        strbuf sb;
        sb_init(&sb);
        int k = 0;
        for (const char *q = d->rules[r].to; *q; q++) {
            if (*q == '*' && k < MAX_STARS)
                sb_put(&sb, cap[k], caplen[k]), k++;
            else
                sb_putc(&sb, *q);
        }
        size_t len;
        return sb_take(&sb, &len);
    }
    return strdup(name);
}

static int add_rules(differ *d, const char *text, bool swap) {
    const char *line = text;
    while (*line) {
        size_t n = strcspn(line, "\n");
        char a[512], b[512];
        char buf[1100];
        snprintf(buf, sizeof buf, "%.*s", (int)(n < 1099 ? n : 1099), line);
        line += n + (line[n] == '\n');
        char *hash = strchr(buf, '#');
        if (hash) *hash = '\0';
        int got = sscanf(buf, "%511s %511s", a, b);
        if (got <= 0) continue;
        if (got != 2) {
            cli_error(d->cmd, "--map: expected `A-PATTERN B-PATTERN`, not %.100s", buf);
            return EXIT_TROUBLE;
        }
        size_t stars_a = 0, stars_b = 0;
        for (const char *q = a; *q; q++) stars_a += *q == '*';
        for (const char *q = b; *q; q++) stars_b += *q == '*';
        if (stars_a > MAX_STARS || stars_a != stars_b) {
            cli_error(d->cmd, "--map: %.100s: both patterns need the same number of * (at most %d)",
                      buf, MAX_STARS);
            return EXIT_TROUBLE;
        }
        rule *r = realloc(d->rules, (d->nrules + 1) * sizeof *r);
        if (!r) return EXIT_TROUBLE;
        d->rules = r;
        r[d->nrules].from = strdup(swap ? b : a);
        r[d->nrules].to = strdup(swap ? a : b);
        if (!r[d->nrules++].from || !r[d->nrules - 1].to) return EXIT_TROUBLE;
    }
    return 0;
}

static bool has_hf_view(const ckpt_catalog *cat) {
    for (size_t i = 0; i < cat->ntensors; i++)
        if (cat->tensors[i].hf_view) return true;
    return false;
}

/* The built-in maps (the rest: a file of rules); A and B are open. */
static int load_map(differ *d, ckpt_catalog **ca) {
    if (strcmp(d->map, "hf-to-gguf") == 0) {
        ckpt_catalog *mapped = NULL;
        char *note = NULL;
        ckpt_err err;
        if (ckpt_profile_llamacpp(*ca, &mapped, &note, &err)) {
            cli_error(d->cmd, "--map hf-to-gguf: %s", err.msg);
            return EXIT_TROUBLE;
        }
        free(note); /* a vocabulary matters to llama.cpp, not to the tensors compared */
        if (!mapped) {
            cli_error(d->cmd, "--map hf-to-gguf: A is not a llama, mistral, qwen2 or gpt2 folder "
                              "(config.json) that convert lays out for llama.cpp");
            return EXIT_TROUBLE;
        }
        ckpt_close(*ca);
        *ca = mapped;
        d->gguf = true;
        return 0;
    }
    bool meta = strcmp(d->map, "meta-to-hf") == 0, back = strcmp(d->map, "hf-to-meta") == 0;
    if (meta || back) {
        /* the Meta side's HF view holds the HF names and rows; without one, rename only */
        if (has_hf_view(meta ? d->ca : d->cb)) {
            d->hf_view_side = meta ? 1 : 2;
            return 0;
        }
        return add_rules(d, meta_to_hf, back);
    }
    FILE *f = fopen(d->map, "r");
    if (!f) {
        cli_error(d->cmd, "--map %.200s: %s (or: meta-to-hf, hf-to-meta, hf-to-gguf)", d->map,
                  strerror(errno));
        return EXIT_TROUBLE;
    }
    strbuf sb;
    sb_init(&sb);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) sb_put(&sb, chunk, n);
    fclose(f);
    int rc = sb.failed ? EXIT_TROUBLE : add_rules(d, sb.data ? sb.data : "", false);
    sb_free(&sb);
    return rc;
}

/* ---- matching names ---- */

typedef struct named {
    char *name; /* prefix + name, as lines show it (escaped) */
    const ckpt_tensor *t;
    bool used;
} named;

static int by_name(const void *a, const void *b) {
    return strcmp(((const named *)a)->name, ((const named *)b)->name);
}

static char *display(const ckpt_tensor *t) {
    strbuf sb;
    sb_init(&sb);
    cli_put_display_name(&sb, t);
    size_t len;
    return sb_take(&sb, &len);
}

/* side: 1 for A, 2 for B. */
static int list_names(const differ *d, const ckpt_catalog *cat, int side, named **out, size_t *n) {
    named *v = calloc(cat->ntensors ? cat->ntensors : 1, sizeof *v);
    if (!v) return -ENOMEM;
    size_t k = 0;
    bool view = d->hf_view_side == side;
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (view ? !t->hf_view : cli_hidden(t) && !d->all) continue;
        v[k].t = t;
        v[k].name = view ? strndup(t->name, t->name_len) : display(t);
        if (!v[k++].name) return -ENOMEM;
    }
    qsort(v, k, sizeof *v, by_name);
    *out = v;
    *n = k;
    return 0;
}

static void free_names(named *v, size_t n) {
    for (size_t i = 0; v && i < n; i++) free(v[i].name);
    free(v);
}

/* ---- the comparison ---- */

typedef enum { R_SAME, R_CLOSE, R_DIFFERS, R_SHAPE, R_DTYPE, R_ERROR } verdict;
static const char *const verdict_word[] = {"same", "close", "differs", "shape", "dtype", "error"};

typedef struct pair {
    named *a;
    const ckpt_tensor *b;
    char *b_name;
    bool compared; /* values compared: diff is valid */
    bool dtype_changed;
    verdict v;
    ckpt_diff diff;
    int status;
    ckpt_err msg;
} pair;

static void put_shape(strbuf *sb, const ckpt_tensor *t) {
    sb_putc(sb, '[');
    for (uint32_t k = 0; k < t->ndim; k++)
        sb_printf(sb, "%s%llu", k ? "," : "", (unsigned long long)t->shape[k]);
    sb_putc(sb, ']');
}

static bool same_shape(const ckpt_tensor *a, const ckpt_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (uint32_t k = 0; k < a->ndim; k++)
        if (a->shape[k] != b->shape[k]) return false;
    return true;
}

/* The relative change ||a - b|| / ||b|| a GGUF type's rounding of A's values stays within,
 * whatever they are. F16 and BF16 round each value within 2^-11, 2^-8 of it. Q8_0's reference
 * quantizer errs by at most half a step (1/254 of its block's largest magnitude) plus its F16
 * scale's rounding (1/1024 of it), and a block's largest magnitude is at most sqrt(32) times its
 * RMS: r of ||a||, so r / (1 - r) of ||b||. The 4- and 5-bit types' worst case (a step of 1/8 or
 * 1/16 at the clipped end) gives no useful bound this way: they are judged by --atol/--rtol. */
static double type_error_bound(ckpt_dtype dt) {
    const double spread = 5.6569; /* sqrt(32), rounded up */
    double r;
    switch (dt) {
    case CKPT_F16:
        return 1.0 / 2048 / (1 - 1.0 / 2048);
    case CKPT_BF16:
        return 1.0 / 256 / (1 - 1.0 / 256);
    case CKPT_Q8_0:
        r = spread * (1.0 / 254 + 1.0 / 1024);
        break;
    default:
        return 0;
    }
    return r / (1 - r);
}

static void judge(const differ *d, pair *p) {
    if (p->status) {
        p->v = R_ERROR;
        return;
    }
    if (!p->compared) {
        p->v = R_SHAPE;
        return;
    }
    const ckpt_diff *x = &p->diff;
    double bound = d->gguf && !d->atol && !d->rtol && p->a->t->dtype != p->b->dtype
                       ? type_error_bound(p->b->dtype)
                       : 0;
    if (bound && !x->bytes_only && !x->nonfinite_mismatch) {
        /* a cast or quantized GGUF tensor against its source: within its type's error */
        p->v = ckpt_diff_relative(x) <= bound ? R_CLOSE : R_DIFFERS;
        return;
    }
    if (x->beyond)
        p->v = R_DIFFERS;
    else if (p->dtype_changed && !d->ignore_dtype && !d->gguf)
        p->v = R_DTYPE;
    else if (x->bytes_identical && !p->dtype_changed)
        p->v = R_SAME;
    else
        p->v = R_CLOSE;
}

static void put_figures(strbuf *sb, const ckpt_diff *x) {
    if (x->bytes_only) {
        sb_printf(sb, "%llu bytes differ (values of this dtype are not decoded)",
                  (unsigned long long)x->beyond);
        return;
    }
    sb_printf(sb, "max abs %.6g, max rel %.6g, rms %.6g, cosine %.9g, %llu of %llu beyond",
              x->max_abs, x->max_rel, ckpt_diff_rms(x), ckpt_diff_cosine(x),
              (unsigned long long)x->beyond, (unsigned long long)x->count);
    if (x->nonfinite_mismatch)
        sb_printf(sb, " (%llu NaN/Inf mismatches)", (unsigned long long)x->nonfinite_mismatch);
}

static void text_line(strbuf *sb, const pair *p) {
    sb_printf(sb, "%-8s %s", verdict_word[p->v], p->a->name);
    if (strcmp(p->b_name, p->a->name) != 0) sb_printf(sb, " -> %s", p->b_name);
    sb_puts(sb, ": ");
    const ckpt_tensor *ta = p->a->t, *tb = p->b;
    if (p->dtype_changed)
        sb_printf(sb, "dtype %s -> %s; ", ckpt_dtype_info_of(ta->dtype)->name,
                  ckpt_dtype_info_of(tb->dtype)->name);
    switch (p->v) {
    case R_ERROR:
        sb_puts(sb, p->msg.msg);
        break;
    case R_SHAPE:
        sb_puts(sb, "shape ");
        put_shape(sb, ta);
        sb_puts(sb, " -> ");
        put_shape(sb, tb);
        break;
    case R_SAME:
        sb_puts(sb,
                p->diff.not_read ? "same bytes of the same file (not read)" : "identical bytes");
        break;
    default:
        put_figures(sb, &p->diff);
    }
    sb_putc(sb, '\n');
}

static void json_num(strbuf *sb, const char *key, double v) {
    if (isfinite(v))
        sb_printf(sb, ", \"%s\": %.17g", key, v);
    else
        sb_printf(sb, ", \"%s\": null", key);
}

static void json_pair(strbuf *sb, const pair *p, bool first) {
    sb_puts(sb, first ? "\n  {\"name\": " : ",\n  {\"name\": ");
    sb_json_str(sb, p->a->name, strlen(p->a->name));
    sb_puts(sb, ", \"b_name\": ");
    sb_json_str(sb, p->b_name, strlen(p->b_name));
    sb_printf(sb, ", \"status\": \"%s\", \"dtype_a\": \"%s\", \"dtype_b\": \"%s\", \"shape_a\": ",
              verdict_word[p->v], ckpt_dtype_info_of(p->a->t->dtype)->name,
              ckpt_dtype_info_of(p->b->dtype)->name);
    put_shape(sb, p->a->t);
    sb_puts(sb, ", \"shape_b\": ");
    put_shape(sb, p->b);
    if (p->v == R_ERROR) {
        sb_puts(sb, ", \"error\": ");
        sb_json_str(sb, p->msg.msg, strlen(p->msg.msg));
    } else if (p->compared) {
        const ckpt_diff *x = &p->diff;
        sb_printf(
            sb,
            ", \"bytes_identical\": %s, \"not_read\": %s, \"bytes_only\": %s, \"count\": %llu, "
            "\"beyond\": %llu, \"nonfinite_mismatch\": %llu",
            x->bytes_identical ? "true" : "false", x->not_read ? "true" : "false",
            x->bytes_only ? "true" : "false", (unsigned long long)x->count,
            (unsigned long long)x->beyond, (unsigned long long)x->nonfinite_mismatch);
        json_num(sb, "max_abs", x->max_abs);
        json_num(sb, "max_rel", x->max_rel);
        json_num(sb, "rms", ckpt_diff_rms(x));
        json_num(sb, "cosine", ckpt_diff_cosine(x));
        json_num(sb, "relative_change", ckpt_diff_relative(x));
    }
    sb_putc(sb, '}');
}

static void json_names(strbuf *sb, const char *key, named *v, size_t n, bool want_used) {
    sb_printf(sb, ",\n \"%s\": [", key);
    bool first = true;
    for (size_t i = 0; i < n; i++) {
        if (v[i].used != want_used) continue;
        if (!first) sb_puts(sb, ", ");
        sb_json_str(sb, v[i].name, strlen(v[i].name));
        first = false;
    }
    sb_putc(sb, ']');
}

static int draw(const differ *d, const char *a_path, const char *b_path, const pair *p, size_t n) {
    const char **names = calloc(n ? n : 1, sizeof *names);
    size_t *lens = calloc(n ? n : 1, sizeof *lens);
    double *vals = calloc(n ? n : 1, sizeof *vals);
    const double **rows = calloc(n ? n : 1, sizeof *rows);
    uint64_t *alarm = calloc(n ? n : 1, sizeof *alarm);
    int rc = names && lens && vals && rows && alarm ? 0 : ENOMEM;
    size_t k = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        if (!p[i].compared || p[i].status) continue;
        names[k] = p[i].a->name;
        lens[k] = strlen(p[i].a->name);
        vals[k] = ckpt_diff_relative(&p[i].diff);
        rows[k] = &vals[k];
        alarm[k++] = p[i].diff.nonfinite_mismatch;
    }
    static const plot_series proto[] = {{"||a-b|| / ||b||", "#2ca02c", NULL}};
    plot_panel *panels = NULL;
    size_t np = 0;
    if (!rc && plot_group(names, lens, rows, alarm, k, proto, 1, &panels, &np) != 0) rc = ENOMEM;
    if (!rc) {
        strbuf sb;
        sb_init(&sb);
        char title[400];
        snprintf(title, sizeof title, "ckptfs diff %.150s %.150s: relative change per layer",
                 a_path, b_path);
        plot_panels_svg(&sb, title, "relative change", panels, np);
        rc = plot_write(d->cmd, d->plot, &sb);
        sb_free(&sb);
    } else {
        cli_error(d->cmd, "out of memory");
    }
    plot_panels_free(panels, np);
    free(names);
    free(lens);
    free(vals);
    free(rows);
    free(alarm);
    return rc ? EXIT_TROUBLE : 0;
}

static void progress_cb(void *ctx, uint64_t bytes) {
    progress_add(ctx, bytes);
}

static int run(differ *d, const char *a_path, const char *b_path) {
    named *va = NULL, *vb = NULL;
    size_t na = 0, nb = 0;
    pair *pairs = NULL;
    int rc = EXIT_TROUBLE;
    if (list_names(d, d->ca, 1, &va, &na) || list_names(d, d->cb, 2, &vb, &nb)) goto oom;
    pairs = calloc(na ? na : 1, sizeof *pairs);
    if (!pairs) goto oom;
    size_t np = 0;
    for (size_t i = 0; i < na; i++) {
        char *bn = rename_a(d, va[i].name);
        if (!bn) goto oom;
        named key = {.name = bn};
        named *hit = bsearch(&key, vb, nb, sizeof *vb, by_name);
        if (!hit || hit->used) {
            free(bn);
            continue;
        }
        hit->used = va[i].used = true;
        pairs[np++] = (pair){.a = &va[i], .b = hit->t, .b_name = bn};
    }
    /* Values of pairs of one shape are compared; the rest are shape changes. */
    const ckpt_tensor **ta = calloc(np ? np : 1, sizeof *ta),
                      **tb = calloc(np ? np : 1, sizeof *tb);
    ckpt_diff *res = calloc(np ? np : 1, sizeof *res);
    int *status = calloc(np ? np : 1, sizeof *status);
    ckpt_err *msgs = calloc(np ? np : 1, sizeof *msgs);
    size_t *which = calloc(np ? np : 1, sizeof *which);
    size_t nc = 0;
    uint64_t total = 0;
    bool ok = ta && tb && res && status && msgs && which;
    for (size_t i = 0; ok && i < np; i++) {
        pairs[i].dtype_changed = pairs[i].a->t->dtype != pairs[i].b->dtype;
        if (!same_shape(pairs[i].a->t, pairs[i].b)) continue;
        ta[nc] = pairs[i].a->t;
        tb[nc] = pairs[i].b;
        total += ta[nc]->nbytes + tb[nc]->nbytes;
        which[nc++] = i;
    }
    if (ok) {
        progress_line prog;
        progress_start(&prog, d->cmd, total);
        ok = ckpt_diff_run(d->ca, ta, d->cb, tb, nc, d->atol, d->rtol, (unsigned)d->threads, res,
                           status, msgs, progress_cb, &prog) == 0;
        progress_end(&prog);
    }
    for (size_t k = 0; ok && k < nc; k++) {
        pair *p = &pairs[which[k]];
        p->compared = !status[k];
        p->diff = res[k];
        p->status = status[k];
        p->msg = msgs[k];
    }
    free(ta);
    free(tb);
    free(res);
    free(status);
    free(msgs);
    free(which);
    if (!ok) goto oom;

    size_t counts[R_ERROR + 1] = {0}, removed = 0, added = 0;
    for (size_t i = 0; i < np; i++) {
        judge(d, &pairs[i]);
        counts[pairs[i].v]++;
    }
    for (size_t i = 0; i < na; i++) removed += !va[i].used;
    for (size_t i = 0; i < nb; i++) added += !vb[i].used;
    bool different = removed || added || counts[R_DIFFERS] || counts[R_SHAPE] || counts[R_DTYPE];

    cli_out o;
    cli_out_init(&o, d->cmd);
    if (d->json) {
        sb_printf(&o.sb, "{\"equal\": %s, \"atol\": %.17g, \"rtol\": %.17g, \"tensors\": [",
                  different || counts[R_ERROR] ? "false" : "true", d->atol, d->rtol);
        for (size_t i = 0; i < np; i++) json_pair(&o.sb, &pairs[i], i == 0);
        sb_puts(&o.sb, np ? "\n ]" : "]");
        json_names(&o.sb, "removed", va, na, false);
        json_names(&o.sb, "added", vb, nb, false);
        sb_puts(&o.sb, "}\n");
    } else {
        for (size_t i = 0; i < np && o.status == 0; i++) {
            if (d->quiet && (pairs[i].v == R_SAME || pairs[i].v == R_CLOSE)) continue;
            text_line(&o.sb, &pairs[i]);
            cli_out_maybe_flush(&o);
        }
        for (size_t i = 0; i < na; i++)
            if (!va[i].used) sb_printf(&o.sb, "%-8s %s: only in A\n", "removed", va[i].name);
        for (size_t i = 0; i < nb; i++)
            if (!vb[i].used) sb_printf(&o.sb, "%-8s %s: only in B\n", "added", vb[i].name);
        sb_printf(&o.sb,
                  "%zu compared: %zu same, %zu close, %zu differ, %zu shape, %zu dtype, %zu "
                  "error; %zu removed, %zu added\n",
                  np, counts[R_SAME], counts[R_CLOSE], counts[R_DIFFERS], counts[R_SHAPE],
                  counts[R_DTYPE], counts[R_ERROR], removed, added);
    }
    rc = cli_out_finish(&o) ? EXIT_TROUBLE
         : counts[R_ERROR]  ? EXIT_TROUBLE
         : different        ? EXIT_DIFFERENT
                            : EXIT_SAME;
    for (size_t i = 0; i < np; i++)
        if (pairs[i].v == R_ERROR) cli_error(d->cmd, "%s", pairs[i].msg.msg);
    if (rc != EXIT_TROUBLE && d->plot && draw(d, a_path, b_path, pairs, np)) rc = EXIT_TROUBLE;
    goto done;
oom:
    cli_error(d->cmd, "out of memory");
done:
    for (size_t i = 0; pairs && i < na; i++) free(pairs[i].b_name);
    free(pairs);
    free_names(va, na);
    free_names(vb, nb);
    return rc;
}

static bool parse_tolerance(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v < 0) return false;
    *out = v;
    return true;
}

static int on_option(void *ctx, const char *cmd, int letter, const char *value) {
    differ *d = ctx;
    switch (letter) {
    case 'J':
        d->json = true;
        break;
    case 'p':
        d->plot = value;
        break;
    case 'm':
        d->map = value;
        break;
    case 'A':
    case 'R':
        if (!parse_tolerance(value, letter == 'A' ? &d->atol : &d->rtol)) {
            cli_error(cmd, "--%s: expected a number >= 0, not %.40s",
                      letter == 'A' ? "atol" : "rtol", value);
            return CLI_USAGE;
        }
        break;
    case 'I':
        d->ignore_dtype = true;
        break;
    case 'q':
        d->quiet = true;
        break;
    case 'j':
        return cli_parse_threads(cmd, value, &d->threads);
    case 'a':
        d->all = true;
        break;
    }
    return 0;
}

int cli_diff(int argc, char **argv) {
    static const struct option longopts[] = {
        {"json", no_argument, NULL, CLI_LONG + 'J'},
        {"plot", required_argument, NULL, CLI_LONG + 'p'},
        {"map", required_argument, NULL, CLI_LONG + 'm'},
        {"atol", required_argument, NULL, CLI_LONG + 'A'},
        {"rtol", required_argument, NULL, CLI_LONG + 'R'},
        {"ignore-dtype", no_argument, NULL, CLI_LONG + 'I'},
        {"quiet", no_argument, NULL, 'q'},
        {"threads", required_argument, NULL, 'j'},
        {"all", no_argument, NULL, 'a'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    cli_common c = {.cmd = "diff"};
    differ d = {.cmd = "diff"};
    const cli_args args = {":j:qaho:", longopts, usage, 2, 2, "A and B", on_option, &d};
    bool help_shown;
    int rc = cli_parse_args(&c, &args, argc, argv, &help_shown);
    if (help_shown) {
        cli_common_free(&c);
        return rc;
    }
    if (rc == CLI_USAGE) rc = EXIT_TROUBLE; /* diff(1)'s convention: 2 for any trouble */
    ckpt_catalog *ca = NULL, *cb = NULL;
    if (rc == 0 && (cli_open(&c, argv[optind], &ca) || cli_open(&c, argv[optind + 1], &cb)))
        rc = EXIT_TROUBLE;
    d.ca = ca;
    d.cb = cb;
    if (rc == 0 && d.map) rc = load_map(&d, &ca);
    if (rc == 0) {
        d.ca = ca;
        rc = run(&d, argv[optind], argv[optind + 1]);
    }
    ckpt_close(ca);
    ckpt_close(cb);
    for (size_t i = 0; i < d.nrules; i++) {
        free(d.rules[i].from);
        free(d.rules[i].to);
    }
    free(d.rules);
    cli_common_free(&c);
    return rc;
}
