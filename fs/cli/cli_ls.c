/* ckptfs ls SOURCE [-l] [--json] [-a] [GLOB...]: the tensors of a checkpoint. */
#include "cli_internal.h"

#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "List the tensors of a checkpoint, one name per line, sorted by name.\n"
    "\n"
    "  -l, --long    also dtype, shape and size:  F32  [4096,4096]  64.0 MiB  NAME\n"
    "      --json    a JSON array of {name, dtype, shape, nbytes, path, incomplete}\n"
    "                (and prefix, aside for tensors under a directory)\n"
    "  -a, --all     also the tensors under hidden directories: the per-rank copies\n"
    "                of a tensor-parallel checkpoint (.ckptfs/ranks/N/NAME)\n"
    "  -o OPTIONS    decoding options as for the mount: tp_split=GLOB:DIM[;...]\n"
    "  -h, --help    this help\n"
    "\n"
    "Tensors a checkpoint shows under a directory are named DIR/NAME (optim/NAME).\n"
    "Each GLOB (a shell pattern: quote it) keeps the tensors whose name matches it;\n"
    "a GLOB that matches nothing is an error (exit status 2).\n"
    "Control bytes and '%' in names are printed as %XX, as in .ckptfs/tensors.tsv;\n"
    "`ckptfs cat` accepts names in that form.\n"
    "\n"
    "Example: ckptfs ls -l model.safetensors 'model.layers.0.*'\n";

typedef struct listing {
    bool json, long_form, all;
    char **globs;
    int nglobs;
} listing;

static void put_shape(strbuf *sb, const ckpt_tensor *t, const char *sep) {
    sb_putc(sb, '[');
    for (uint32_t d = 0; d < t->ndim; d++) {
        if (d) sb_puts(sb, sep);
        sb_u64(sb, t->shape[d]);
    }
    sb_putc(sb, ']');
}

static void put_json_entry(strbuf *sb, const ckpt_tensor *t, bool first) {
    sb_puts(sb, first ? "\n  {\"name\": " : ",\n  {\"name\": ");
    sb_json_str(sb, t->name, t->name_len);
    sb_printf(sb, ", \"dtype\": \"%s\", \"shape\": ", ckpt_dtype_info_of(t->dtype)->name);
    put_shape(sb, t, ", ");
    sb_puts(sb, ", \"nbytes\": ");
    sb_u64(sb, t->nbytes);
    sb_puts(sb, ", \"path\": ");
    sb_json_str(sb, t->path, strlen(t->path));
    sb_printf(sb, ", \"incomplete\": %s", t->incomplete ? "true" : "false");
    if (t->prefix) {
        sb_puts(sb, ", \"prefix\": ");
        sb_json_str(sb, t->prefix, strlen(t->prefix));
        sb_printf(sb, ", \"aside\": %s", t->aside ? "true" : "false");
    }
    sb_putc(sb, '}');
}

static int run(const listing *l, const ckpt_catalog *cat, const char *cmd) {
    /* Which tensors, and for -l the column widths. */
    size_t *chosen = malloc((cat->ntensors ? cat->ntensors : 1) * sizeof *chosen);
    bool *matched = calloc(l->nglobs ? (size_t)l->nglobs : 1, sizeof *matched);
    strbuf name;
    sb_init(&name);
    if (!chosen || !matched) {
        free(chosen);
        free(matched);
        cli_error(cmd, "out of memory");
        return CLI_SOURCE;
    }
    size_t n = 0, wdtype = 0, wshape = 0;
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (cli_hidden(t) && !l->all) continue;
        if (l->nglobs) {
            /* The printed form, or the bare name of a prefixed tensor ('lm_head*' finds
             * model/lm_head.weight too). */
            bool keep = false;
            for (int g = 0; g < l->nglobs; g++) {
                if (cli_glob_match(l->globs[g], t, &name)) {
                    matched[g] = true;
                    keep = true;
                }
            }
            if (!keep) continue;
        }
        chosen[n++] = i;
        size_t w = strlen(ckpt_dtype_info_of(t->dtype)->name);
        if (w > wdtype) wdtype = w;
        w = 2; /* the brackets */
        for (uint32_t d = 0; d < t->ndim; d++) {
            char digits[24];
            w += (size_t)snprintf(digits, sizeof digits, "%llu", (unsigned long long)t->shape[d]);
            w += d > 0;
        }
        if (w > wshape) wshape = w;
    }
    sb_free(&name);

    cli_out o;
    cli_out_init(&o, cmd);
    if (l->json) sb_putc(&o.sb, '[');
    for (size_t k = 0; k < n && o.status == 0; k++) {
        const ckpt_tensor *t = &cat->tensors[chosen[k]];
        if (l->json) {
            put_json_entry(&o.sb, t, k == 0);
        } else {
            if (l->long_form) {
                char size[32];
                human_size(t->nbytes, size, sizeof size);
                sb_printf(&o.sb, "%-*s  ", (int)wdtype, ckpt_dtype_info_of(t->dtype)->name);
                size_t shape_at = o.sb.len;
                put_shape(&o.sb, t, ",");
                size_t shown = o.sb.len - shape_at;
                for (; shown < wshape; shown++) sb_putc(&o.sb, ' ');
                sb_printf(&o.sb, "  %10s  ", size);
            }
            cli_put_display_name(&o.sb, t);
            if (l->long_form && t->incomplete) sb_puts(&o.sb, "  (incomplete: has holes)");
            sb_putc(&o.sb, '\n');
        }
        cli_out_maybe_flush(&o);
    }
    if (l->json) sb_puts(&o.sb, n ? "\n]\n" : "]\n");
    int rc = cli_out_finish(&o);
    if (rc == 0) {
        for (int g = 0; g < l->nglobs; g++) {
            if (!matched[g]) {
                cli_error(cmd, "no tensor matches %.200s (see: ckptfs ls SOURCE)", l->globs[g]);
                rc = CLI_SOURCE;
            }
        }
    }
    free(chosen);
    free(matched);
    return rc;
}

static int on_option(void *ctx, const char *cmd, int letter, const char *value) {
    (void)cmd, (void)value;
    listing *l = ctx;
    switch (letter) {
    case 'l':
        l->long_form = true;
        break;
    case 'j':
        l->json = true;
        break;
    case 'a':
        l->all = true;
        break;
    }
    return 0;
}

int cli_ls(int argc, char **argv) {
    static const struct option longopts[] = {
        {"long", no_argument, NULL, CLI_LONG + 'l'},
        {"json", no_argument, NULL, CLI_LONG + 'j'},
        {"all", no_argument, NULL, CLI_LONG + 'a'},
        {"help", no_argument, NULL, CLI_LONG + 'h'},
        {NULL, 0, NULL, 0},
    };
    cli_common c = {.cmd = "ls"};
    listing l = {0};
    const cli_args args = {":laho:", longopts, usage, 1, -1, "SOURCE", on_option, &l};
    bool help_shown;
    int rc = cli_parse_args(&c, &args, argc, argv, &help_shown);
    if (help_shown) goto done;
    if (rc == 0 && l.json && l.long_form) {
        cli_error(c.cmd, "--json and --long do not go together (JSON has every field)");
        rc = CLI_USAGE;
    }
    ckpt_catalog *cat = NULL;
    if (rc == 0) rc = cli_open(&c, argv[optind], &cat);
    if (rc == 0) {
        l.globs = argv + optind + 1;
        l.nglobs = argc - optind - 1;
        rc = run(&l, cat, c.cmd);
    }
    ckpt_close(cat);
done:
    cli_common_free(&c);
    return rc;
}
