/* The HTML pages of `ckptfs serve`: plain HTML and inline SVG, no script. The tensor tree folds
 * with <details>, which browsers open and close without JavaScript. */
#include "serve.h"

#include "core/util/json.h"
#include "core/util/strbuf.h"
#include "core/write/profile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void html(strbuf *sb, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch == '&')
            sb_puts(sb, "&amp;");
        else if (ch == '<')
            sb_puts(sb, "&lt;");
        else if (ch == '>')
            sb_puts(sb, "&gt;");
        else if (ch == '"')
            sb_puts(sb, "&quot;");
        else if (ch == '\'')
            sb_puts(sb, "&#39;");
        else if ((unsigned char)ch < 0x20 && ch != '\n' && ch != '\t')
            sb_printf(sb, "\\x%02x", (unsigned char)ch);
        else
            sb_putc(sb, ch);
    }
}

static void html_z(strbuf *sb, const char *s) {
    html(sb, s, strlen(s));
}

/* Percent-encodes everything but unreserved characters and '/'. */
static void url(strbuf *sb, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
            strchr("-._~/", ch))
            sb_putc(sb, (char)ch);
        else
            sb_printf(sb, "%%%02X", ch);
    }
}

static void human(strbuf *sb, uint64_t n) {
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 5) v /= 1024, u++;
    if (u == 0)
        sb_printf(sb, "%llu B", (unsigned long long)n);
    else
        sb_printf(sb, "%.1f %s", v, unit[u]);
}

static const char style[] =
    "<style>body{font:14px/1.4 sans-serif;margin:2em;max-width:75em;color:#222}"
    "h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc;margin-top:1.5em}"
    "code,.mono{font-family:monospace}table{border-collapse:collapse}"
    "td,th{padding:2px 8px;text-align:left;vertical-align:top;border-bottom:1px solid #eee}"
    "td.n{text-align:right}ul{list-style:none;padding-left:1.2em;margin:0}"
    "summary{cursor:pointer}.dt{color:#555}.warn{background:#fff4e0;border:1px solid #e0a040;"
    "padding:4px 8px;margin:4px 0}.muted{color:#777}</style>";

static void head(strbuf *sb, const char *title) {
    sb_puts(sb, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>");
    html_z(sb, title);
    sb_puts(sb, "</title>");
    sb_puts(sb, style);
    sb_puts(sb, "</head><body>\n");
}

char *serve_html_index(serve_repo *repos, size_t n, size_t *len) {
    strbuf sb;
    sb_init(&sb);
    head(&sb, "ckptfs serve");
    sb_puts(&sb, "<h1>ckptfs serve</h1>\n<p>Checkpoints as Hugging Face repositories: point "
                 "<code>HF_ENDPOINT</code> at this server.</p>\n<table><tr><th>repo</th>"
                 "<th>format</th><th>commit</th></tr>\n");
    for (size_t i = 0; i < n; i++) {
        char why[800];
        serve_snapshot *s = serve_repo_get(&repos[i], why, sizeof why);
        sb_printf(&sb, "<tr><td><a href=\"/%s\">%s</a></td><td><code>", repos[i].name,
                  repos[i].name);
        html_z(&sb, s ? s->cat->format : "");
        sb_puts(&sb, "</code></td><td><code>");
        html_z(&sb, s ? s->sha : why);
        sb_puts(&sb, "</code></td></tr>\n");
        serve_snapshot_put(s);
    }
    sb_puts(&sb, "</table>\n</body></html>\n");
    return sb_take(&sb, len);
}

/* summary.json as nested tables: objects as key/value rows, arrays of scalars inline. */
static void render_json(strbuf *sb, const json_value *v, int depth) {
    if (depth > 32) {
        sb_puts(sb, "&hellip;");
        return;
    }
    switch (v->type) {
    case JSON_OBJECT:
        sb_puts(sb, "<table>");
        for (const json_value *m = v->head; m; m = m->next) {
            sb_puts(sb, "<tr><th>");
            html(sb, m->key, m->key_len);
            sb_puts(sb, "</th><td>");
            render_json(sb, m, depth + 1);
            sb_puts(sb, "</td></tr>");
        }
        sb_puts(sb, "</table>");
        break;
    case JSON_ARRAY: {
        bool scalars = true;
        for (const json_value *m = v->head; m; m = m->next)
            scalars &= m->type != JSON_OBJECT && m->type != JSON_ARRAY;
        if (scalars) {
            for (const json_value *m = v->head; m; m = m->next) {
                if (m != v->head) sb_puts(sb, ", ");
                render_json(sb, m, depth + 1);
            }
        } else {
            sb_puts(sb, "<ol>");
            for (const json_value *m = v->head; m; m = m->next) {
                sb_puts(sb, "<li>");
                render_json(sb, m, depth + 1);
                sb_puts(sb, "</li>");
            }
            sb_puts(sb, "</ol>");
        }
        break;
    }
    case JSON_STRING:
        sb_puts(sb, "<code>");
        html(sb, v->str, v->len);
        sb_puts(sb, "</code>");
        break;
    case JSON_NUMBER:
        html(sb, v->str, v->len);
        break;
    default:
        html_z(sb, json_type_name(v->type));
    }
}

static void summary_section(strbuf *sb, const serve_snapshot *s) {
    sb_puts(sb, "<h2>Summary</h2>\n");
    json_doc doc;
    json_error jerr;
    if (json_parse(&doc, s->docs[DOC_SUMMARY], s->doc_len[DOC_SUMMARY], &jerr) != 0) {
        sb_puts(sb, "<pre>");
        html(sb, s->docs[DOC_SUMMARY], s->doc_len[DOC_SUMMARY]);
        sb_puts(sb, "</pre>\n");
        return;
    }
    /* summary.json names the source's path on the server: not the page's business */
    for (json_value **m = doc.root->type == JSON_OBJECT ? &doc.root->head : NULL; m && *m;
         m = &(*m)->next)
        if ((*m)->key_len == 6 && memcmp((*m)->key, "source", 6) == 0) {
            *m = (*m)->next;
            doc.root->count--;
            break;
        }
    render_json(sb, doc.root, 0);
    json_doc_free(&doc);
    sb_putc(sb, '\n');
}

/* Bytes by dtype as one stacked bar. */
static void dtype_bar(strbuf *sb, const ckpt_catalog *cat) {
    uint64_t by[CKPT_DTYPE_COUNT] = {0}, total = 0;
    for (size_t i = 0; i < cat->ntensors; i++)
        if (!cat->tensors[i].aside) {
            by[cat->tensors[i].dtype] += cat->tensors[i].nbytes;
            total += cat->tensors[i].nbytes;
        }
    if (!total) return;
    static const char *const colors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                         "#59a14f", "#edc948", "#b07aa1", "#ff9da7"};
    sb_puts(sb, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"600\" height=\"46\" "
                "role=\"img\" aria-label=\"bytes by dtype\">");
    double x = 0;
    int k = 0;
    for (int d = 0; d < CKPT_DTYPE_COUNT; d++) {
        if (!by[d]) continue;
        double w = 600.0 * (double)by[d] / (double)total;
        const char *name = ckpt_dtype_info_of((ckpt_dtype)d)->name;
        sb_printf(sb, "<rect x=\"%.1f\" y=\"0\" width=\"%.1f\" height=\"22\" fill=\"%s\"><title>",
                  x, w, colors[k % 8]);
        html_z(sb, name);
        sb_puts(sb, "</title></rect>");
        sb_printf(sb,
                  "<rect x=\"%d\" y=\"30\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                  "<text x=\"%d\" y=\"40\" font-size=\"11\">",
                  k * 100, colors[k % 8], k * 100 + 14);
        html_z(sb, name);
        sb_printf(sb, " %.0f%%</text>", 100.0 * (double)by[d] / (double)total);
        x += w;
        k++;
    }
    sb_puts(sb, "</svg>\n");
}

/* 8030261248 -> "8.03B": the parameter count as model cards give it. */
static void human_count(strbuf *sb, uint64_t n) {
    static const struct {
        double at;
        const char *suffix;
    } scale[] = {{1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "K"}};
    for (size_t i = 0; i < sizeof scale / sizeof *scale; i++)
        if ((double)n >= scale[i].at) {
            double v = (double)n / scale[i].at;
            sb_printf(sb, v < 10 ? "%.2f%s" : v < 100 ? "%.1f%s" : "%.0f%s", v, scale[i].suffix);
            return;
        }
    sb_printf(sb, "%llu", (unsigned long long)n);
}

/* What a person looks for first: the architecture and its sizes from config.json, the
 * parameters (in all, and by dtype), and the command that downloads the repo. */
static void card_section(strbuf *sb, const serve_repo *r, const serve_snapshot *s,
                         const char *host) {
    char *text = NULL;
    json_doc cfg;
    ckpt_err err;
    bool have = ckpt_read_aux_json(s->cat, "config.json", &text, &cfg, &err) == 0;
    sb_puts(sb, "<table>");
    if (have && cfg.root->type == JSON_OBJECT) {
        const json_value *arch = json_member(cfg.root, "architectures");
        const json_value *mt = json_member(cfg.root, "model_type");
        sb_puts(sb, "<tr><th>architecture</th><td>");
        if (arch && arch->type == JSON_ARRAY && arch->head && arch->head->type == JSON_STRING)
            html(sb, arch->head->str, arch->head->len);
        else if (mt && mt->type == JSON_STRING)
            html(sb, mt->str, mt->len);
        else
            sb_puts(sb, "<span class=\"muted\">not named</span>");
        sb_puts(sb, "</td></tr>\n");
        static const char *const keys[][2] = {
            {"hidden_size", "hidden size"},      {"n_embd", "hidden size"},
            {"num_hidden_layers", "layers"},     {"n_layer", "layers"},
            {"num_attention_heads", "heads"},    {"n_head", "heads"},
            {"num_key_value_heads", "KV heads"}, {"intermediate_size", "MLP size"},
            {"vocab_size", "vocabulary"},        {"max_position_embeddings", "context"},
            {"n_positions", "context"},          {"torch_dtype", "dtype (config)"}};
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
            const json_value *v = json_member(cfg.root, keys[i][0]);
            if (!v || (v->type != JSON_NUMBER && v->type != JSON_STRING)) continue;
            sb_printf(sb, "<tr><th>%s</th><td>", keys[i][1]);
            html(sb, v->str, v->len);
            sb_puts(sb, "</td></tr>\n");
        }
    }
    if (have) json_doc_free(&cfg);
    free(text);
    uint64_t by[CKPT_DTYPE_COUNT] = {0}, total = 0;
    for (size_t i = 0; i < s->cat->ntensors; i++)
        if (!s->cat->tensors[i].aside) {
            by[s->cat->tensors[i].dtype] += s->cat->tensors[i].numel;
            total += s->cat->tensors[i].numel;
        }
    sb_puts(sb, "<tr><th>parameters</th><td>");
    human_count(sb, total);
    sb_printf(sb, " <span class=\"muted\">(%llu)</span></td></tr>\n", (unsigned long long)total);
    for (int d = 0; d < CKPT_DTYPE_COUNT; d++) {
        if (!by[d]) continue;
        sb_puts(sb, "<tr><th>&nbsp;&nbsp;");
        html_z(sb, ckpt_dtype_info_of((ckpt_dtype)d)->name);
        sb_puts(sb, "</th><td>");
        human_count(sb, by[d]);
        sb_printf(sb, " (%.1f%%)</td></tr>\n", total ? 100.0 * (double)by[d] / (double)total : 0);
    }
    sb_puts(sb, "<tr><th>format</th><td>");
    html_z(sb, s->cat->format);
    sb_printf(sb, "</td></tr><tr><th>commit</th><td><code>%s</code></td></tr></table>\n", s->sha);
    sb_puts(sb, "<h2>Download</h2>\n<pre>HF_ENDPOINT=http://");
    html_z(sb, host && *host ? host : "HOST:PORT");
    sb_puts(sb, " huggingface-cli download ");
    html_z(sb, r->name);
    sb_puts(sb, "</pre>\n<p>or <code>from_pretrained(\"");
    html_z(sb, r->name);
    sb_puts(sb, "\")</code> with the same <code>HF_ENDPOINT</code>.</p>\n");
}

static void file_link(strbuf *sb, const char *repo, const strbuf *path) {
    sb_printf(sb, "<a href=\"/%s/resolve/main/", repo);
    url(sb, path->data ? path->data : "", path->len);
    sb_puts(sb, "\">");
}

static void files_section(strbuf *sb, const serve_repo *r, const serve_snapshot *s) {
    sb_puts(sb, "<h2>Files (the Hugging Face view)</h2>\n<table><tr><th>file</th><th>size</th>"
                "</tr>\n");
    uint32_t *files;
    size_t n = serve_view_files(s, &files);
    strbuf p;
    sb_init(&p);
    for (size_t i = 0; i < n; i++) {
        sb_clear(&p);
        serve_node_path(s, files[i], &p);
        sb_puts(sb, "<tr><td>");
        file_link(sb, r->name, &p);
        html(sb, p.data ? p.data : "", p.len);
        sb_puts(sb, "</a></td><td class=\"n\">");
        human(sb, serve_node_size(s, files[i]));
        sb_puts(sb, "</td></tr>\n");
    }
    if (!n) sb_puts(sb, "<tr><td colspan=\"2\" class=\"muted\">none</td></tr>\n");
    sb_puts(sb, "</table>\n");
    free(files);
    sb_free(&p);
}

static void tensor_line(strbuf *sb, const serve_repo *r, const serve_snapshot *s, uint32_t i,
                        strbuf *path) {
    const node *n = &s->tr.nodes[i];
    sb_clear(path);
    serve_node_path(s, i, path);
    sb_puts(sb, "<li>");
    file_link(sb, r->name, path);
    html(sb, n->name, n->name_len);
    sb_puts(sb, "</a>");
    if (n->kind == NODE_TENSOR) {
        const ckpt_tensor *t = &s->cat->tensors[n->ref];
        sb_puts(sb, " <span class=\"dt\">");
        html_z(sb, ckpt_dtype_info_of(t->dtype)->name);
        sb_puts(sb, " [");
        for (uint32_t d = 0; d < t->ndim; d++)
            sb_printf(sb, "%s%llu", d ? ", " : "", (unsigned long long)t->shape[d]);
        sb_puts(sb, "] ");
        human(sb, t->nbytes);
        if (t->incomplete) sb_puts(sb, " (incomplete)");
        sb_puts(sb, "</span>");
    }
    sb_puts(sb, "</li>\n");
}

/* The tree under tensors/, folded per directory. Nodes come parent first (tree_build makes a
 * directory before what it holds), so one backward pass sums each directory's tensors. */
static int tree_section(strbuf *sb, const serve_repo *r, const serve_snapshot *s) {
    size_t nn = s->tr.nnodes;
    uint64_t *count = calloc(nn ? nn : 1, sizeof *count),
             *bytes = calloc(nn ? nn : 1, sizeof *bytes);
    struct frame {
        uint32_t dir, next;
    } *stack = malloc(64 * sizeof *stack);
    size_t cap = 64, depth = 0;
    strbuf path;
    sb_init(&path);
    if (!count || !bytes || !stack) {
        free(count);
        free(bytes);
        free(stack);
        return -1;
    }
    for (size_t i = 1; i < nn; i++)
        if (s->tr.nodes[i].kind == NODE_TENSOR) {
            count[i] = 1;
            bytes[i] = s->cat->tensors[s->tr.nodes[i].ref].nbytes;
        }
    for (size_t i = nn; i-- > 1;) {
        count[s->tr.nodes[i].parent] += count[i];
        bytes[s->tr.nodes[i].parent] += bytes[i];
    }
    sb_printf(sb, "<h2>Tensors (%llu, ", (unsigned long long)count[0]);
    human(sb, bytes[0]);
    sb_puts(sb, ")</h2>\n<ul>\n");
    stack[depth++] = (struct frame){0, 0};
    int rc = 0;
    while (depth && !rc) {
        struct frame *f = &stack[depth - 1];
        const node *d = &s->tr.nodes[f->dir];
        if (f->next >= d->nchildren) {
            if (--depth) sb_puts(sb, "</ul></details></li>\n");
            continue;
        }
        uint32_t c = s->tr.children[d->first_child + f->next++];
        const node *n = &s->tr.nodes[c];
        if (!serve_node_shown(s, c) || n->kind == NODE_SIDECAR) continue;
        if (n->kind != NODE_DIR) {
            tensor_line(sb, r, s, c, &path);
            continue;
        }
        sb_printf(sb, "<li><details%s><summary>", depth == 1 ? " open" : "");
        html(sb, n->name, n->name_len);
        sb_printf(sb, "/ <span class=\"muted\">%llu tensors, ", (unsigned long long)count[c]);
        human(sb, bytes[c]);
        sb_puts(sb, "</span></summary><ul>\n");
        if (depth == cap) {
            struct frame *more = realloc(stack, 2 * cap * sizeof *stack);
            if (!more) {
                rc = -1;
                break;
            }
            stack = more;
            cap *= 2;
        }
        stack[depth++] = (struct frame){c, 0};
    }
    sb_puts(sb, "</ul>\n");
    free(count);
    free(bytes);
    free(stack);
    sb_free(&path);
    return rc;
}

char *serve_html_repo(const serve_repo *r, serve_snapshot *s, const char *host, size_t *len) {
    strbuf sb;
    sb_init(&sb);
    char title[SERVE_ID_MAX + 40];
    snprintf(title, sizeof title, "%s", r->name);
    head(&sb, title);
    sb_puts(&sb, "<p><a href=\"/\">all repos</a></p>\n<h1>");
    html_z(&sb, title);
    sb_puts(&sb, "</h1>\n"); /* no server paths: where the files lie is the server's business */
    card_section(&sb, r, s, host);
    sb_puts(&sb, "<h2>Bytes by dtype</h2>\n");
    dtype_bar(&sb, s->cat);
    sb_printf(&sb,
              "<p>With <code>HF_ENDPOINT</code> set to this server, Hub clients load "
              "<code>%s</code> like any repository "
              "(<a href=\"/api/models/%s\">API</a>). "
              "<a href=\"/%s/layers.svg\">Per-layer norms and absmax</a> "
              "(drawn on first request: reads every tensor).</p>\n",
              r->name, r->name, r->name);
    sb_puts(&sb, "<h2>Warnings</h2>\n");
    for (size_t i = 0; i < s->cat->nwarnings; i++) {
        sb_puts(&sb, "<div class=\"warn\">");
        html_z(&sb, s->cat->warnings[i]);
        sb_puts(&sb, "</div>\n");
    }
    if (!s->cat->nwarnings) sb_puts(&sb, "<p class=\"muted\">none</p>\n");
    files_section(&sb, r, s);
    summary_section(&sb, s);
    if (tree_section(&sb, r, s) != 0) sb.failed = true;
    sb_puts(&sb, "</body></html>\n");
    return sb_take(&sb, len);
}
