/* ckptfs cat SOURCE NAME [--offset N] [--length N]: one tensor's raw bytes on stdout, exactly
 * what the mounted file holds (logical row-major, little-endian, stored dtype). */
#include "cli_internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "Write one tensor's raw bytes to standard output: row-major, little-endian, in\n"
    "the stored dtype (what the mounted file holds; dtype and shape: ckptfs ls -l).\n"
    "\n"
    "  --offset N    start N bytes into the tensor (default 0)\n"
    "  --length N    write at most N bytes (default: to the end)\n"
    "  --force       write even when standard output is a terminal\n"
    "  -o OPTIONS    decoding options as for the mount: tp_split=GLOB:DIM[;...]\n"
    "  -h, --help    this help\n"
    "\n"
    "NAME is the tensor's exact name (model.layers.0.mlp.up_proj.weight), its tree\n"
    "path (model/layers/0/mlp/up_proj/weight) or the %XX form ckptfs ls prints.\n"
    "Bytes that no file of the checkpoint holds (an incomplete tensor) are an error,\n"
    "reported before anything is written.\n"
    "\n"
    "Example: ckptfs cat model.safetensors lm_head.weight | sha256sum\n";

enum { BUFFER = 1 << 20 };

static int to_stdout(void *ctx, const void *data, size_t len) {
    return cli_write_all(ctx, 1, data, len);
}

static void put_name(strbuf *sb, const char *s) {
    text_pct_escape(sb, s, strlen(s) > 200 ? 200 : strlen(s), false);
}

static int run(const ckpt_catalog *cat, const char *source, const char *name, uint64_t off,
               uint64_t len, const char *cmd) {
    const ckpt_tensor *t = cli_find_tensor(cat, name);
    strbuf shown;
    sb_init(&shown);
    if (!t) {
        put_name(&shown, name);
        cli_error(cmd, "no tensor named %s (see: ckptfs ls %s)", shown.failed ? "?" : shown.data,
                  source);
        sb_free(&shown);
        return CLI_SOURCE;
    }
    cli_put_display_name(&shown, t);
    const char *tname = shown.failed || !shown.data ? "?" : shown.data;
    int rc = 0;
    uint64_t hole_off, hole_len;
    if (off > t->nbytes) {
        cli_error(cmd, "--offset %llu is past the end of %s (%llu bytes)", (unsigned long long)off,
                  tname, (unsigned long long)t->nbytes);
        rc = CLI_USAGE;
    } else if (cli_find_hole(t, off, len, &hole_off, &hole_len)) {
        cli_error(cmd,
                  "%s: bytes %llu..%llu are in no file of the checkpoint (the tensor is "
                  "incomplete): Input/output error",
                  tname, (unsigned long long)hole_off,
                  (unsigned long long)(hole_off + hole_len - 1));
        rc = CLI_SOURCE;
    } else {
        void *buf = malloc(BUFFER);
        ckpt_err err = {{0}};
        if (!buf) {
            cli_error(cmd, "out of memory");
            rc = CLI_SOURCE;
        } else {
            rc = cli_stream_tensor(cat, t, off, len, buf, BUFFER, to_stdout, (void *)cmd, &err);
            if (rc == CLI_SOURCE) cli_error(cmd, "%s", err.msg);
        }
        free(buf);
    }
    sb_free(&shown);
    return rc;
}

typedef struct cat_opts {
    uint64_t off, len;
    bool force;
} cat_opts;

static int on_option(void *ctx, const char *cmd, int letter, const char *value) {
    cat_opts *o = ctx;
    if (letter == 'f') {
        o->force = true;
    } else if (!cli_parse_u64(value, letter == 'O' ? &o->off : &o->len)) {
        cli_error(cmd, "--%s=%.40s: expected a number of bytes (decimal digits)",
                  letter == 'O' ? "offset" : "length", value);
        return CLI_USAGE;
    }
    return 0;
}

int cli_cat(int argc, char **argv) {
    static const struct option longopts[] = {
        {"offset", required_argument, NULL, CLI_LONG + 'O'},
        {"length", required_argument, NULL, CLI_LONG + 'L'},
        {"force", no_argument, NULL, CLI_LONG + 'f'},
        {"help", no_argument, NULL, CLI_LONG + 'h'},
        {NULL, 0, NULL, 0},
    };
    cli_common c = {.cmd = "cat"};
    cat_opts o = {.len = UINT64_MAX};
    const cli_args args = {":ho:", longopts, usage, 2, 2, "SOURCE and NAME", on_option, &o};
    bool help_shown;
    int rc = cli_parse_args(&c, &args, argc, argv, &help_shown);
    if (help_shown) {
        cli_common_free(&c);
        return rc;
    }
    if (rc == 0 && !o.force && isatty(1)) {
        cli_error(c.cmd, "standard output is a terminal: redirect it, pipe it (| xxd), or use "
                         "--force to write binary bytes there");
        rc = CLI_USAGE;
    }
    ckpt_catalog *cat = NULL;
    if (rc == 0) rc = cli_open(&c, argv[optind], &cat);
    if (rc == 0) rc = run(cat, argv[optind], argv[optind + 1], o.off, o.len, c.cmd);
    ckpt_close(cat);
    cli_common_free(&c);
    return rc;
}
