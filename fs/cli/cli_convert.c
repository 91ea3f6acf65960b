/* ckptfs convert IN OUT: any readable checkpoint into a new archive, through core/write/writer.c
 * (temporary file next to OUT, fsync, rename: OUT is complete or untouched). */
#include "cli_convert.h"
#include "common/message.h"
#include "common/size.h"

#include "core/write/cast.h"
#include "core/write/profile.h"
#include "core/write/writer.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

/* %s: the writer table's suffixes */
static const char usage[] =
    "Write the tensors of SOURCE into a new archive whose format follows OUT's name:\n"
    "  %s\n"
    "                 (each also as NAME.EXT.zst: the seekable zstd form)\n"
    "  DIR/           Hugging Face shards + model.safetensors.index.json + config files\n"
    "  .safetensors   {\"format\":\"pt\"} metadata; tensors only\n"
    "  .gguf          with general.architecture, hyper-parameters, llama.cpp names and the\n"
    "                 tokenizer of llama, mistral, qwen2, gpt2 HF folders, Meta MP\n"
    "                 checkpoints; other models: a container llama.cpp will not run\n"
    "Tensors a format cannot hold are refused by name; nothing is dropped silently.\n"
    "\n"
    "  -f, --force         replace an existing OUT (never SOURCE or a file inside it)\n"
    "      --include GLOB  only tensors whose name matches (repeatable)\n"
    "      --exclude GLOB  leave out tensors whose name matches (repeatable)\n"
    "      --dtype bf16|f16|f32  cast float tensors (F64 F32 F16 BF16 F8), rounding to\n"
    "                    nearest even, NaN kept; integers are never cast\n"
    "      --dtype q8_0|q4_0  (.gguf) ggml's reference quantizers, as llama.cpp picks\n"
    "      --cast-quantized  --dtype also dequantizes the ggml types as_dtype=f32 reads\n"
    "      --max-shard-size SIZE  shard size of an HF directory (5GB, 500MB, 2GiB)\n"
    "      --profile lightwatch-gpt2  HF GPT-2 -> LightwatchAI2 names (OUT .lwt)\n"
    "      --profile container  GGUF of the tensors as named, also for llama/gpt2\n"
    "  -o OPTIONS    decoding options as for the mount: tp_split=GLOB:DIM[;...]\n"
    "  -h, --help    this help\n";

static void report(void *ctx, uint64_t done, uint64_t total) {
    progress_line *p = ctx;
    (void)total;
    if (done > p->done) progress_add(p, done - p->done);
}

enum { MAX_GLOBS = 64 };

typedef struct convert_opts {
    ckpt_write_opts wo;
    bool lightwatch, force, cast_quantized;
    bool for_llamacpp; /* a GGUF laid out for llama.cpp (config.json, tokenizer.json used) */
    bool container;    /* --profile container: a GGUF of the tensors as they are named */
    bool cast;
    ckpt_dtype dtype;
    char *include[MAX_GLOBS], *exclude[MAX_GLOBS];
    size_t ninclude, nexclude;
} convert_opts;

static int parse_dtype(const char *s, ckpt_dtype *out) {
    if (strcasecmp(s, "bf16") == 0)
        *out = CKPT_BF16;
    else if (strcasecmp(s, "f16") == 0)
        *out = CKPT_F16;
    else if (strcasecmp(s, "f32") == 0)
        *out = CKPT_F32;
    else if (strcasecmp(s, "q8_0") == 0)
        *out = CKPT_Q8_0;
    else if (strcasecmp(s, "q4_0") == 0)
        *out = CKPT_Q4_0;
    else
        return -1;
    return 0;
}

static int add_glob(const char *cmd, char **list, size_t *n, const char *glob, const char *opt) {
    if (*n == MAX_GLOBS) {
        cli_error(cmd, "%s: at most %d patterns", opt, MAX_GLOBS);
        return CLI_USAGE;
    }
    list[(*n)++] = (char *)glob;
    return CLI_OK;
}

/* A single file holds tensors only: say which of SOURCE's own files do not travel. */
static void note_left_behind(const ckpt_catalog *cat, const char *out) {
    if (!cat->naux) return;
    strbuf sb;
    sb_init(&sb);
    for (size_t i = 0; i < cat->naux && i < 6; i++) {
        if (i) sb_puts(&sb, ", ");
        sb_puts(&sb, cat->aux[i].name);
    }
    if (cat->naux > 6) sb_printf(&sb, " and %zu more", cat->naux - 6);
    msg_error("convert",
              "note: %s holds tensors only; %s of the source %s not in it "
              "(convert to a directory, OUT/, to keep them)",
              out, sb.data ? sb.data : "", cat->naux == 1 ? "is" : "are");
    sb_free(&sb);
}

static bool writes_directory(const char *out, const ckpt_write_opts *wo) {
    struct stat st;
    size_t n = strlen(out);
    return wo->max_shard_size || (n && out[n - 1] == '/') ||
           (stat(out, &st) == 0 && S_ISDIR(st.st_mode));
}

static bool is_gguf(const char *out) {
    return text_ends_with(out, ".gguf") || text_ends_with(out, ".gguf.zst");
}

/* A Hugging Face llama or gpt2 folder into GGUF: laid out so that llama.cpp runs it. */
static int for_llamacpp(const cli_common *c, ckpt_catalog **cat, convert_opts *o) {
    ckpt_catalog *mapped = NULL;
    char *note = NULL;
    ckpt_err err;
    if (ckpt_profile_llamacpp(*cat, &mapped, &note, &err)) {
        cli_error(c->cmd, "%s", err.msg);
        return CLI_SOURCE;
    }
    if (note) msg_error("convert", "note: %s", note);
    free(note);
    if (!mapped) return CLI_OK; /* another family: a tensor container */
    ckpt_close(*cat);
    *cat = mapped;
    o->for_llamacpp = true;
    return CLI_OK;
}

/* The tensors to write, cast as asked; then the archive. */
static int convert(const cli_common *c, ckpt_catalog *cat, const char *out, convert_opts *o) {
    ckpt_err err;
    bool quantize = o->dtype == CKPT_Q8_0 || o->dtype == CKPT_Q4_0;
    if (o->cast && quantize && !is_gguf(out)) {
        cli_error(c->cmd, "--dtype %s: only a GGUF file (OUT.gguf) holds ggml's block types",
                  ckpt_dtype_info_of(o->dtype)->name);
        return CLI_USAGE;
    }
    if (o->cast) {
        size_t cast;
        /* quantized as llama.cpp's converter chooses: vectors kept, odd rows F16 */
        int rc = quantize ? ckpt_quantize_tensors(cat, o->dtype, &cast, &err)
                          : ckpt_cast_tensors(cat, o->dtype, o->cast_quantized, o->for_llamacpp,
                                              &cast, &err);
        if (rc) {
            cli_error(c->cmd, "%s", err.msg);
            return rc == -EIO ? CLI_SOURCE : CLI_OUTPUT; /* an incomplete tensor; else memory */
        }
    }
    if (!writes_directory(out, &o->wo) && !o->for_llamacpp) note_left_behind(cat, out);
    if (is_gguf(out) && !o->for_llamacpp && !strstr(cat->format ? cat->format : "", "gguf"))
        msg_error(
            "convert",
            "note: %s is a tensor container: llama.cpp runs GGUF "
            "files made from Hugging Face llama, mistral, qwen2 and gpt2 folders (config.json)",
            out);
    uint64_t total = 0;
    for (size_t i = 0; i < cat->ntensors; i++)
        if (!cat->tensors[i].aside) total += cat->tensors[i].nbytes;
    progress_line progress;
    progress_start(&progress, "convert", total);
    o->wo.progress = (ckpt_progress){report, &progress};
    int wrc = ckpt_write(cat, out, &o->wo, &err);
    progress_end(&progress);
    if (wrc) {
        cli_error(c->cmd, "%s", err.msg);
        /* a tensor the format cannot hold is the source's fault; a failed write is ours */
        return wrc == -EINVAL || wrc == -EIO ? CLI_SOURCE : CLI_OUTPUT;
    }
    return CLI_OK;
}

static int on_option(void *ctx, const char *cmd, int letter, const char *value) {
    convert_opts *o = ctx;
    switch (letter) {
    case 's':
        if (parse_size_option(value, &o->wo.max_shard_size) != 0) {
            cli_error(cmd, "--max-shard-size %s: expected a size such as 5GB, 500MB, 2GiB", value);
            return CLI_USAGE;
        }
        break;
    case 'p':
        if (strcmp(value, "lightwatch-gpt2") == 0) {
            o->lightwatch = true;
        } else if (strcmp(value, "container") == 0) {
            o->container = true;
        } else {
            cli_error(cmd, "--profile %s: the profiles are lightwatch-gpt2 and container", value);
            return CLI_USAGE;
        }
        break;
    case 'f':
        o->force = true;
        break;
    case 'i':
        return add_glob(cmd, o->include, &o->ninclude, value, "--include");
    case 'x':
        return add_glob(cmd, o->exclude, &o->nexclude, value, "--exclude");
    case 'd':
        o->cast = true;
        if (parse_dtype(value, &o->dtype) != 0) {
            cli_error(cmd, "--dtype %s: expected bf16, f16, f32, q8_0 or q4_0", value);
            return CLI_USAGE;
        }
        break;
    case 'q':
        o->cast_quantized = true;
        break;
    }
    return 0;
}

int cli_convert(int argc, char **argv) {
    static const struct option longopts[] = {
        {"max-shard-size", required_argument, NULL, CLI_LONG + 's'},
        {"profile", required_argument, NULL, CLI_LONG + 'p'},
        {"force", no_argument, NULL, 'f'},
        {"include", required_argument, NULL, CLI_LONG + 'i'},
        {"exclude", required_argument, NULL, CLI_LONG + 'x'},
        {"dtype", required_argument, NULL, CLI_LONG + 'd'},
        {"cast-quantized", no_argument, NULL, CLI_LONG + 'q'},
        {"help", no_argument, NULL, CLI_LONG + 'h'},
        {NULL, 0, NULL, 0},
    };
    cli_common c = {.cmd = "convert"};
    convert_opts o = {0};
    char text[sizeof usage + 128];
    snprintf(text, sizeof text, usage, ckpt_writer_suffixes());
    const cli_args args = {":fho:", longopts, text, 2, 2, "SOURCE and OUT", on_option, &o};
    bool help_shown;
    int rc = cli_parse_args(&c, &args, argc, argv, &help_shown);
    if (help_shown) {
        cli_common_free(&c);
        return rc;
    }
    if (rc == 0 && o.cast_quantized && !o.cast) {
        cli_error(c.cmd, "--cast-quantized goes with --dtype");
        rc = CLI_USAGE;
    }
    const char *source = rc == 0 ? argv[optind] : NULL, *out = rc == 0 ? argv[optind + 1] : NULL;
    ckpt_err name_err;
    if (rc == 0 && ckpt_write_check_name(out, &o.wo, &name_err) != 0) {
        /* before any work (a cast can take minutes), with the status ckpt_write gives it */
        cli_error(c.cmd, "%s", name_err.msg);
        rc = CLI_SOURCE;
    }
    if (rc == 0) rc = convert_guard_out(c.cmd, source, out, o.force, &o.wo.replace_dir);
    ckpt_catalog *cat = NULL;
    if (rc == 0) rc = cli_open(&c, source, &cat);
    if (rc == 0) rc = convert_guard_sources(c.cmd, cat, out);
    if (rc == 0 && (o.ninclude || o.nexclude) &&
        !convert_select(cat, o.include, o.ninclude, o.exclude, o.nexclude)) {
        cli_error(c.cmd, "no tensor is left after --include/--exclude (see: ckptfs ls SOURCE)");
        rc = CLI_USAGE;
    }
    if (rc == 0 && !o.lightwatch && !o.container && is_gguf(out)) rc = for_llamacpp(&c, &cat, &o);
    if (rc == 0 && o.lightwatch) {
        ckpt_catalog *mapped;
        ckpt_err err;
        if (ckpt_profile_lightwatch_gpt2(cat, &mapped, &err)) {
            cli_error(c.cmd, "%s", err.msg);
            rc = CLI_SOURCE;
        } else {
            ckpt_close(cat);
            cat = mapped;
        }
    }
    if (rc == 0) rc = convert(&c, cat, out, &o);
    ckpt_close(cat);
    cli_common_free(&c);
    return rc;
}
