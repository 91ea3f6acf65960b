/* ckptfs convert IN OUT: any readable checkpoint into a new archive, through core/writer.c
 * (temporary file next to OUT, fsync, rename: OUT is complete or untouched). */
#include "cli_internal.h"
#include "size.h"

#include "core/profile.h"
#include "core/writer.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "Usage: ckptfs convert SOURCE OUT [--max-shard-size SIZE] [--profile P] [-o OPTIONS]\n"
    "Write every tensor of SOURCE into a new archive whose format follows OUT's name:\n"
    "  .safetensors   one safetensors file ({\"format\":\"pt\"} metadata)\n"
    "  DIR/           Hugging Face shards + model.safetensors.index.json + config files\n"
    "                 (also with --max-shard-size; default shard size 5GB)\n"
    "  .gguf .bpk .lwt .gptrs .gptrsten\n"
    "Tensors a format cannot hold are refused by name; nothing is dropped silently.\n"
    "\n"
    "      --max-shard-size SIZE  shard size of an HF directory (5GB, 500MB, 2GiB)\n"
    "      --profile lightwatch-gpt2  HF GPT-2 -> LightwatchAI2 names, Conv1D weights\n"
    "                    transposed to [out, in], no tied lm_head (OUT should be .lwt)\n"
    "  -o OPTIONS    decoding options as for the mount: tp_split=GLOB:DIM[;...]\n"
    "  -h, --help    this help\n";

static void report(void *ctx, uint64_t done, uint64_t total) {
    cli_progress *p = ctx;
    (void)total;
    if (done > p->done) cli_progress_add(p, done - p->done);
}

int cli_convert(int argc, char **argv) {
    static const struct option longopts[] = {
        {"max-shard-size", required_argument, NULL, CLI_LONG + 's'},
        {"profile", required_argument, NULL, CLI_LONG + 'p'},
        {"help", no_argument, NULL, CLI_LONG + 'h'},
        {NULL, 0, NULL, 0},
    };
    cli_common c = {.cmd = "convert"};
    ckpt_write_opts wo = {0};
    bool lightwatch = false;
    int rc = 0, opt;
    opterr = 0;
    optind = 0;
    while (rc == 0 && (opt = getopt_long(argc, argv, ":ho:", longopts, NULL)) != -1) {
        int key = opt >= CLI_LONG ? opt - CLI_LONG : opt;
        switch (key) {
        case 's':
            if (parse_size_option(optarg, &wo.max_shard_size) != 0) {
                cli_error(c.cmd, "--max-shard-size %s: expected a size such as 5GB, 500MB, 2GiB",
                          optarg);
                rc = CLI_USAGE;
            }
            break;
        case 'p':
            if (strcmp(optarg, "lightwatch-gpt2") != 0) {
                cli_error(c.cmd, "--profile %s: the only profile is lightwatch-gpt2", optarg);
                rc = CLI_USAGE;
            }
            lightwatch = true;
            break;
        case 'o':
            rc = cli_parse_o(&c, optarg);
            break;
        case 'h':
            return cli_help(&c, usage);
        default:
            rc = cli_bad_option(c.cmd, optopt, argv[optind - 1], opt == ':');
        }
    }
    if (rc == 0 && argc - optind != 2) {
        cli_error(c.cmd, "expected SOURCE and OUT (see: ckptfs convert --help)");
        rc = CLI_USAGE;
    }
    ckpt_catalog *cat = NULL;
    if (rc == 0) rc = cli_open(&c, argv[optind], &cat);
    if (rc == 0 && lightwatch) {
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
    if (rc == 0) {
        uint64_t total = 0;
        for (size_t i = 0; i < cat->ntensors; i++)
            if (!cat->tensors[i].aside) total += cat->tensors[i].nbytes;
        cli_progress progress;
        cli_progress_start(&progress, "convert", total);
        wo.progress = (ckpt_progress){report, &progress};
        ckpt_err err;
        int wrc = ckpt_write(cat, argv[optind + 1], &wo, &err);
        cli_progress_end(&progress);
        if (wrc) {
            cli_error(c.cmd, "%s", err.msg);
            /* a tensor the format cannot hold is the source's fault; a failed write is ours */
            rc = wrc == -EINVAL || wrc == -EIO ? CLI_SOURCE : CLI_OUTPUT;
        }
    }
    ckpt_close(cat);
    cli_common_free(&c);
    return rc;
}
