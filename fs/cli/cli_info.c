/* ckptfs info SOURCE [--json]: what .ckptfs/summary.json says, for people. The text is
 * rendered from that same document (ckpt_summary_json), so the two never disagree. */
#include "cli_internal.h"

#include "core/util/json.h"

#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "Summarize a checkpoint: format, source files and sizes, tensor count, parameter\n"
    "count, bytes by dtype, incomplete tensors, warnings.\n"
    "\n"
    "      --json    print .ckptfs/summary.json instead (the document a mount shows)\n"
    "  -o OPTIONS    decoding options as for the mount: tp_split=GLOB:DIM[;...]\n"
    "  -h, --help    this help\n"
    "\n"
    "Sizes are in powers of 1024 (1.5 GiB); parameter counts in powers of 1000\n"
    "(6.7B = 6.7 x 10^9), followed by the exact number.\n";

enum { LABEL = 15, MAX_NAMED_INCOMPLETE = 10 };

/* Text from a document or the catalog on one line: control bytes become '?'. */
static void put_text(strbuf *sb, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        sb_putc(sb, c < 0x20 || c == 0x7f ? '?' : (char)c);
    }
}

static void label(strbuf *sb, const char *l) {
    sb_printf(sb, "%-*s", LABEL, l);
}

static uint64_t u64_member(const json_value *obj, const char *key) {
    uint64_t v = 0;
    json_as_u64(json_member(obj, key), &v);
    return v;
}

static void put_str_member(strbuf *sb, const json_value *obj, const char *key) {
    const json_value *v = json_member(obj, key);
    if (v && v->type == JSON_STRING) put_text(sb, v->str, v->len);
}

static void render(strbuf *sb, const json_value *sum, const ckpt_catalog *cat) {
    char a[48], b[48];
    label(sb, "format");
    put_str_member(sb, sum, "format");
    sb_putc(sb, '\n');
    label(sb, "source");
    put_str_member(sb, sum, "source");
    sb_putc(sb, '\n');

    const json_value *files = json_member(sum, "files");
    uint64_t total_size = 0;
    size_t nfiles = 0, wpath = 0;
    for (const json_value *f = files ? files->head : NULL; f; f = f->next) {
        total_size += u64_member(f, "size");
        const json_value *p = json_member(f, "path");
        if (p && p->len > wpath) wpath = p->len;
        nfiles++;
    }
    if (wpath > 60) wpath = 60;
    human_size(total_size, a, sizeof a);
    label(sb, "files");
    sb_printf(sb, "%zu, %s\n", nfiles, a);
    for (const json_value *f = files ? files->head : NULL; f; f = f->next) {
        const json_value *p = json_member(f, "path");
        size_t plen = p && p->type == JSON_STRING ? p->len : 0;
        human_size(u64_member(f, "size"), a, sizeof a);
        sb_printf(sb, "%*s", LABEL + 2, "");
        if (plen) put_text(sb, p->str, plen);
        for (size_t k = plen; k < wpath; k++) sb_putc(sb, ' ');
        sb_printf(sb, "  %10s\n", a);
    }

    label(sb, "tensors");
    sb_printf(sb, "%llu\n", (unsigned long long)u64_member(sum, "tensor_count"));
    uint64_t params = u64_member(sum, "parameter_count");
    human_count(params, a, sizeof a);
    human_grouped(params, b, sizeof b);
    label(sb, "parameters");
    if (params >= 1000)
        sb_printf(sb, "%s (%s)\n", a, b);
    else
        sb_printf(sb, "%s\n", b);
    uint64_t aliases = u64_member(sum, "alias_count");
    if (aliases) {
        human_grouped(u64_member(sum, "alias_parameters"), b, sizeof b);
        label(sb, "aliases");
        sb_printf(sb,
                  "%llu tensor%s sharing another's storage (tied; %s parameters not counted "
                  "again)\n",
                  (unsigned long long)aliases, aliases == 1 ? "" : "s", b);
    }
    uint64_t bytes = u64_member(sum, "total_bytes");
    human_size(bytes, a, sizeof a);
    human_grouped(bytes, b, sizeof b);
    label(sb, "tensor bytes");
    sb_printf(sb, "%s (%s bytes)\n", a, b);

    const json_value *dtypes = json_member(sum, "dtypes");
    size_t wname = 0;
    uint64_t max_count = 0;
    for (const json_value *d = dtypes ? dtypes->head : NULL; d; d = d->next) {
        if (d->key_len > wname) wname = d->key_len;
        uint64_t n = u64_member(d, "tensors");
        if (n > max_count) max_count = n;
    }
    int wcount = snprintf(a, sizeof a, "%llu", (unsigned long long)max_count);
    label(sb, "by dtype");
    bool first = true;
    for (const json_value *d = dtypes ? dtypes->head : NULL; d; d = d->next) {
        uint64_t n = u64_member(d, "tensors");
        human_size(u64_member(d, "bytes"), a, sizeof a);
        if (!first) sb_printf(sb, "%*s", LABEL, "");
        put_text(sb, d->key, d->key_len);
        sb_printf(sb, "%*s  %*llu tensor%s  %10s\n", (int)(wname - d->key_len), "", wcount,
                  (unsigned long long)n, n == 1 ? " " : "s", a);
        first = false;
    }
    if (first) sb_puts(sb, "-\n");

    uint64_t incomplete = u64_member(sum, "incomplete_tensors");
    label(sb, "incomplete");
    if (!incomplete) {
        sb_puts(sb, "none\n");
    } else {
        sb_printf(sb, "%llu tensor%s with holes (reading the missing bytes fails with EIO):\n",
                  (unsigned long long)incomplete, incomplete == 1 ? "" : "s");
        size_t shown = 0;
        for (size_t i = 0; i < cat->ntensors; i++) {
            const ckpt_tensor *t = &cat->tensors[i];
            if (!t->incomplete || t->aside) continue;
            if (shown++ == MAX_NAMED_INCOMPLETE) {
                sb_printf(sb, "%*s... and %llu more (ckptfs ls --json lists them)\n", LABEL + 2, "",
                          (unsigned long long)(incomplete - MAX_NAMED_INCOMPLETE));
                break;
            }
            sb_printf(sb, "%*s", LABEL + 2, "");
            cli_put_display_name(sb, t);
            sb_putc(sb, '\n');
        }
    }

    /* Counted from the catalog: the summary's name for them is not this file's business. */
    size_t aside = 0;
    for (size_t i = 0; i < cat->ntensors; i++) aside += cat->tensors[i].aside;
    if (aside) {
        label(sb, "outside model");
        sb_printf(sb, "%zu tensor%s (optimizer state, per-rank copies): not in the totals\n", aside,
                  aside == 1 ? "" : "s");
    }

    const json_value *warnings = json_member(sum, "warnings");
    label(sb, "warnings");
    if (!warnings || !warnings->count) sb_puts(sb, "none\n");
    first = true;
    for (const json_value *w = warnings ? warnings->head : NULL; w; w = w->next) {
        if (!first) sb_printf(sb, "%*s", LABEL, "");
        put_text(sb, w->str, w->len);
        sb_putc(sb, '\n');
        first = false;
    }
}

static int run(const ckpt_catalog *cat, bool json, const char *cmd) {
    size_t len;
    char *summary = ckpt_summary_json(cat, &len);
    if (!summary) {
        cli_error(cmd, "out of memory");
        return CLI_SOURCE;
    }
    cli_out o;
    cli_out_init(&o, cmd);
    int rc = 0;
    if (json) {
        sb_put(&o.sb, summary, len);
    } else {
        json_doc doc;
        json_error jerr;
        if (json_parse(&doc, summary, len, &jerr) != 0) {
            /* Our own document: failing here is a bug, said plainly. */
            cli_error(cmd, "summary.json does not parse at offset %zu: %s", jerr.pos, jerr.msg);
            rc = CLI_SOURCE;
        } else {
            render(&o.sb, doc.root, cat);
            json_doc_free(&doc);
        }
    }
    int out = cli_out_finish(&o);
    free(summary);
    return rc ? rc : out;
}

static int on_option(void *ctx, const char *cmd, int letter, const char *value) {
    (void)cmd, (void)value, (void)letter; /* --json is the only one */
    *(bool *)ctx = true;
    return 0;
}

int cli_info(int argc, char **argv) {
    static const struct option longopts[] = {
        {"json", no_argument, NULL, CLI_LONG + 'j'},
        {"help", no_argument, NULL, CLI_LONG + 'h'},
        {NULL, 0, NULL, 0},
    };
    cli_common c = {.cmd = "info"};
    bool json = false;
    const cli_args args = {":ho:", longopts, usage, 1, 1, "one SOURCE", on_option, &json};
    bool help_shown;
    int rc = cli_parse_args(&c, &args, argc, argv, &help_shown);
    ckpt_catalog *cat = NULL;
    if (rc == 0 && !help_shown) rc = cli_open(&c, argv[optind], &cat);
    if (rc == 0 && !help_shown) rc = run(cat, json, c.cmd);
    ckpt_close(cat);
    cli_common_free(&c);
    return rc;
}
