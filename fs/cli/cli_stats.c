/* ckptfs stats SOURCE [GLOB...]: what the values of each tensor sum up to (core/views/stats.c), as
 * a table, JSON, or pictures (per-layer panels, a histogram). */
#include "cli_internal.h"
#include "common/plot.h"

#include "core/views/stats.h"

#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "Per tensor: min, max, mean, std, absmax, L2 norm (over finite values) and the\n"
    "counts of NaN, +Inf, -Inf and zeros. Every float dtype (F16, BF16, F8, ggml\n"
    "Q4_0/Q8_0/Q4_K/Q6_K dequantized) and integers; sums are pairwise in double.\n"
    "\n"
    "  --json           a JSON document {\"tensors\": [{name, dtype, shape, ...}]}\n"
    "  --plot SVG       also draw per-layer L2 norm, absmax and NaN/Inf counts of\n"
    "                   each tensor family (layers on x) into the SVG file\n"
    "  --hist TENSOR    with --plot: draw a histogram of TENSOR's values instead\n"
    "  --bins N         histogram bins (default 100)\n"
    "  -j, --threads N  worker threads (default: one per CPU)\n"
    "  -a, --all        also the per-rank copies under .ckptfs/ranks/\n"
    "  -q, --quiet      table rows only for tensors holding NaN/Inf or unreadable\n"
    "  -o OPTIONS       decoding options as for the mount: tp_split=RULES\n"
    "  -h, --help       this help\n"
    "\n"
    "Each GLOB keeps the tensors whose name matches it. Progress goes to stderr\n"
    "when it is a terminal. Exit status: 0, 1 usage, 2 unreadable source or tensor\n"
    "or a GLOB matching nothing, 4 output error. See ckptfs(1) for the formulas.\n";

typedef struct opts {
    bool json, all, quiet;
    const char *plot, *hist;
    uint64_t bins, threads;
    char **globs;
    int nglobs;
} opts;

static void progress_cb(void *ctx, uint64_t bytes) {
    progress_add(ctx, bytes);
}

/* The tensors to look at, in catalog order. */
static int select_tensors(const opts *o, const ckpt_catalog *cat, const char *cmd,
                          const ckpt_tensor ***out, size_t *n) {
    const ckpt_tensor **sel = malloc((cat->ntensors ? cat->ntensors : 1) * sizeof *sel);
    bool *matched = calloc(o->nglobs ? (size_t)o->nglobs : 1, 1);
    strbuf name;
    sb_init(&name);
    if (!sel || !matched) {
        free(sel);
        free(matched);
        cli_error(cmd, "out of memory");
        return CLI_SOURCE;
    }
    size_t k = 0;
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (cli_hidden(t) && !o->all) continue;
        bool keep = o->nglobs == 0;
        if (!keep) {
            for (int g = 0; g < o->nglobs; g++)
                if (cli_glob_match(o->globs[g], t, &name)) keep = matched[g] = true;
        }
        if (keep) sel[k++] = t;
    }
    sb_free(&name);
    int rc = 0;
    for (int g = 0; g < o->nglobs; g++)
        if (!matched[g]) {
            cli_error(cmd, "no tensor matches %.200s (see: ckptfs ls SOURCE)", o->globs[g]);
            rc = CLI_SOURCE;
        }
    free(matched);
    if (rc) {
        free(sel);
        return rc;
    }
    *out = sel;
    *n = k;
    return 0;
}

static void put_g(strbuf *sb, double v, bool defined) {
    if (!defined)
        sb_printf(sb, "  %11s", "-");
    else
        sb_printf(sb, "  %11.4g", v);
}

/* -q: the rows worth a look in a check (a CI job after training): values that are not finite,
 * or a tensor that could not be read. A dtype without statistics is neither. */
static bool alarming(const ckpt_stats *x, int status) {
    if (status) return status != -ENOTSUP;
    return x->nan || x->posinf || x->neginf;
}

static void text_table(strbuf *sb, const ckpt_tensor *const *t, const ckpt_stats *s,
                       const int *status, const ckpt_err *msgs, size_t n, bool quiet) {
    size_t shown = 0;
    for (size_t i = 0; i < n; i++) shown += !quiet || alarming(&s[i], status[i]);
    if (!shown) return;
    sb_printf(sb, "%-6s  %11s  %11s  %11s  %11s  %11s  %11s  %6s  %6s  %6s  %8s  %s\n", "DTYPE",
              "MIN", "MAX", "MEAN", "STD", "ABSMAX", "L2NORM", "NAN", "+INF", "-INF", "ZEROS",
              "NAME");
    for (size_t i = 0; i < n; i++) {
        if (quiet && !alarming(&s[i], status[i])) continue;
        sb_printf(sb, "%-6s", ckpt_dtype_info_of(t[i]->dtype)->name);
        if (status[i]) {
            sb_printf(sb, "  (%s)  ", status[i] == -ENOTSUP ? "dtype not supported" : msgs[i].msg);
            cli_put_display_name(sb, t[i]);
            sb_putc(sb, '\n');
            continue;
        }
        const ckpt_stats *x = &s[i];
        bool any = x->finite > 0;
        put_g(sb, x->min, any);
        put_g(sb, x->max, any);
        put_g(sb, ckpt_stats_mean(x), any);
        put_g(sb, ckpt_stats_std(x), any);
        put_g(sb, x->absmax, any);
        put_g(sb, ckpt_stats_l2(x), true);
        sb_printf(sb, "  %6llu  %6llu  %6llu  %8llu  ", (unsigned long long)x->nan,
                  (unsigned long long)x->posinf, (unsigned long long)x->neginf,
                  (unsigned long long)x->zeros);
        cli_put_display_name(sb, t[i]);
        sb_putc(sb, '\n');
    }
}

static int draw_layers(const char *cmd, const char *path, const char *source,
                       const ckpt_tensor *const *t, const ckpt_stats *s, const int *status,
                       size_t n) {
    const char **names = calloc(n ? n : 1, sizeof *names);
    size_t *lens = calloc(n ? n : 1, sizeof *lens);
    double(*vals)[2] = calloc(n ? n : 1, sizeof *vals);
    const double **rows = calloc(n ? n : 1, sizeof *rows);
    uint64_t *alarm = calloc(n ? n : 1, sizeof *alarm);
    int rc = names && lens && vals && rows && alarm ? 0 : ENOMEM;
    size_t k = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        if (status[i]) continue;
        names[k] = t[i]->name;
        lens[k] = t[i]->name_len;
        vals[k][0] = ckpt_stats_l2(&s[i]);
        vals[k][1] = s[i].finite ? s[i].absmax : NAN;
        rows[k] = vals[k];
        alarm[k++] = s[i].nan + s[i].posinf + s[i].neginf;
    }
    static const plot_series proto[] = {{"L2 norm", "#1f77b4", NULL}, {"absmax", "#ff7f0e", NULL}};
    plot_panel *panels = NULL;
    size_t np = 0;
    if (!rc && plot_group(names, lens, rows, alarm, k, proto, 2, &panels, &np) != 0) rc = ENOMEM;
    if (!rc) {
        strbuf sb;
        sb_init(&sb);
        char title[300];
        snprintf(title, sizeof title, "ckptfs stats %.200s: per layer", source);
        plot_panels_svg(&sb, title, "norm / absmax", panels, np);
        rc = plot_write(cmd, path, &sb);
        sb_free(&sb);
    } else {
        cli_error(cmd, "out of memory");
    }
    plot_panels_free(panels, np);
    free(names);
    free(lens);
    free(vals);
    free(rows);
    free(alarm);
    return rc ? CLI_OUTPUT : 0;
}

static int draw_histogram(const opts *o, const char *cmd, const ckpt_catalog *cat,
                          const ckpt_tensor *t, const ckpt_stats *s) {
    uint64_t *bins = calloc(o->bins, sizeof *bins);
    if (!bins) {
        cli_error(cmd, "out of memory");
        return CLI_OUTPUT;
    }
    double lo = s->finite ? s->min : 0, hi = s->finite ? s->max : 1;
    if (hi <= lo) hi = lo + 1;
    ckpt_err err = {{0}};
    if (ckpt_stats_histogram(cat, t, lo, hi, o->bins, bins, &err) != 0) {
        cli_error(cmd, "%s", err.msg);
        free(bins);
        return CLI_SOURCE;
    }
    strbuf name, sb;
    sb_init(&name);
    sb_init(&sb);
    sb_puts(&name, "histogram of ");
    cli_put_display_name(&name, t);
    char note[300];
    snprintf(note, sizeof note,
             "%s, %llu values: %llu finite, %llu NaN, %llu +Inf, %llu -Inf (not drawn); "
             "mean %.4g, std %.4g",
             ckpt_dtype_info_of(t->dtype)->name, (unsigned long long)s->count,
             (unsigned long long)s->finite, (unsigned long long)s->nan,
             (unsigned long long)s->posinf, (unsigned long long)s->neginf, ckpt_stats_mean(s),
             ckpt_stats_std(s));
    plot_histogram_svg(&sb, name.data ? name.data : "histogram", lo, hi, bins, o->bins, note);
    int rc = plot_write(cmd, o->plot, &sb) ? CLI_OUTPUT : 0;
    sb_free(&sb);
    sb_free(&name);
    free(bins);
    return rc;
}

static int run(const opts *o, const ckpt_catalog *cat, const char *cmd, const char *source) {
    const ckpt_tensor **sel = NULL;
    size_t n = 0;
    int rc;
    if (o->hist) {
        const ckpt_tensor *t = cli_find_tensor(cat, o->hist);
        if (!t) {
            cli_error(cmd, "no tensor named %.200s (see: ckptfs ls SOURCE)", o->hist);
            return CLI_SOURCE;
        }
        sel = malloc(sizeof *sel);
        if (!sel) return CLI_SOURCE;
        sel[0] = t;
        n = 1;
    } else if ((rc = select_tensors(o, cat, cmd, &sel, &n)) != 0) {
        return rc;
    }
    ckpt_stats *s = calloc(n ? n : 1, sizeof *s);
    int *status = calloc(n ? n : 1, sizeof *status);
    ckpt_err *msgs = calloc(n ? n : 1, sizeof *msgs);
    if (!s || !status || !msgs) {
        free(sel);
        free(s);
        free(status);
        free(msgs);
        cli_error(cmd, "out of memory");
        return CLI_SOURCE;
    }
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += sel[i]->nbytes;
    progress_line prog;
    progress_start(&prog, cmd, total);
    rc = ckpt_stats_run(cat, sel, n, (unsigned)o->threads, s, status, msgs, progress_cb, &prog);
    progress_end(&prog);
    if (rc) {
        cli_error(cmd, "out of memory");
        rc = CLI_SOURCE;
    }
    bool failed = false;
    for (size_t i = 0; !rc && i < n; i++) {
        if (status[i] && status[i] != -ENOTSUP) {
            cli_error(cmd, "%s", msgs[i].msg);
            failed = true;
        }
    }
    if (!rc) {
        cli_out out;
        cli_out_init(&out, cmd);
        if (o->json) {
            size_t len;
            char *doc = ckpt_stats_document(sel, s, status, msgs, n, &len);
            if (doc)
                sb_put(&out.sb, doc, len);
            else
                out.sb.failed = true;
            free(doc);
        } else {
            text_table(&out.sb, sel, s, status, msgs, n, o->quiet);
        }
        rc = cli_out_finish(&out);
    }
    if (!rc && o->plot) {
        if (o->hist)
            rc = status[0] ? CLI_SOURCE : draw_histogram(o, cmd, cat, sel[0], &s[0]);
        else
            rc = draw_layers(cmd, o->plot, source, sel, s, status, n);
    }
    if (!rc && failed) rc = CLI_SOURCE;
    free(sel);
    free(s);
    free(status);
    free(msgs);
    return rc;
}

static int on_option(void *ctx, const char *cmd, int letter, const char *value) {
    opts *o = ctx;
    switch (letter) {
    case 'J':
        o->json = true;
        break;
    case 'p':
        o->plot = value;
        break;
    case 'H':
        o->hist = value;
        break;
    case 'b':
        if (!cli_parse_u64(value, &o->bins) || o->bins == 0 || o->bins > 100000) {
            cli_error(cmd, "--bins: expected a number from 1 to 100000, not %.40s", value);
            return CLI_USAGE;
        }
        break;
    case 'j':
        return cli_parse_threads(cmd, value, &o->threads);
    case 'a':
        o->all = true;
        break;
    case 'q':
        o->quiet = true;
        break;
    }
    return 0;
}

int cli_stats(int argc, char **argv) {
    static const struct option longopts[] = {
        {"json", no_argument, NULL, CLI_LONG + 'J'},
        {"plot", required_argument, NULL, CLI_LONG + 'p'},
        {"hist", required_argument, NULL, CLI_LONG + 'H'},
        {"bins", required_argument, NULL, CLI_LONG + 'b'},
        {"threads", required_argument, NULL, 'j'},
        {"all", no_argument, NULL, 'a'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    cli_common c = {.cmd = "stats"};
    opts o = {.bins = 100};
    const cli_args args = {":j:aqho:", longopts, usage, 1, -1, "SOURCE", on_option, &o};
    bool help_shown;
    int rc = cli_parse_args(&c, &args, argc, argv, &help_shown);
    if (help_shown) {
        cli_common_free(&c);
        return rc;
    }
    if (rc == 0 && o.hist && (!o.plot || optind + 1 < argc)) {
        cli_error(c.cmd, "--hist TENSOR needs --plot SVG and takes no GLOB");
        rc = CLI_USAGE;
    }
    ckpt_catalog *cat = NULL;
    if (rc == 0) rc = cli_open(&c, argv[optind], &cat);
    if (rc == 0) {
        o.globs = argv + optind + 1;
        o.nglobs = argc - optind - 1;
        rc = run(&o, cat, c.cmd, argv[optind]);
    }
    ckpt_close(cat);
    cli_common_free(&c);
    return rc;
}
