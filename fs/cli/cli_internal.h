/* What the subcommands (fs/cli_*.c) share: exit codes, option parsing for opening a source,
 * tensor lookup and display names, streaming a tensor through the planner, output checks. */
#ifndef CKPTFS_CLI_INTERNAL_H
#define CKPTFS_CLI_INTERNAL_H

#include "cli.h"
#include "core/ckpt.h"
#include "core/util/strbuf.h"
#include "core/util/text.h"
#include "common/human.h"
#include "common/message.h"
#include "common/progress.h"
#include "common/remote_opts.h"

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Exit statuses, documented in ckptfs(1) SUBCOMMANDS. */
enum cli_exit {
    CLI_OK = 0,
    CLI_USAGE = 1,    /* bad arguments or options */
    CLI_SOURCE = 2,   /* the source (or a manifest) cannot be read or is invalid; no such tensor */
    CLI_MISMATCH = 3, /* verify: the checkpoint does not match the manifest */
    CLI_OUTPUT = 4,   /* writing the output failed (a closed pipe, a full disk) */
};

/* Options every subcommand takes. */
typedef struct cli_common {
    const char *cmd;    /* "ls", "info", ... for messages */
    char *tp_split;     /* -o tp_split=RULES */
    char *revision;     /* -o revision=REV (HF cache repo folders) */
    remote_opts remote; /* -o cache_dir=, s3_endpoint=, ... for URL sources */
} cli_common;

/* Handles one -o argument (comma-separated, "\," for a literal comma). Returns 0 or CLI_USAGE
 * after printing why. */
int cli_parse_o(cli_common *c, const char *arg);
void cli_common_free(cli_common *c);
/* Opens the source with the -o options; prints the one-line error and returns CLI_SOURCE. */
int cli_open(const cli_common *c, const char *source, ckpt_catalog **cat);

/* "ckptfs CMD: " + message on stderr, one line. */
void cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* getopt_long values of long options: CLI_LONG + a letter, so an error about a long option
 * (optopt 0 or >= CLI_LONG) can be told from one about a short option. */
enum { CLI_LONG = 256 };
/* For getopt's '?' / ':' answers: names the option and points at --help. Returns CLI_USAGE. */
int cli_bad_option(const char *cmd, int optopt_value, const char *word, bool missing_arg);
/* A subcommand's command line: its getopt_long options (shortopts starts with ':' and holds
 * "ho:"; long options are CLI_LONG + a letter, or a letter), its --help text and how many
 * operands it takes (max_operands -1: no limit; `operands` names them in the message). */
typedef struct cli_args {
    const char *shortopts;
    const struct option *longopts;
    const char *usage; /* the --help text after the Usage line, which fs/main.c's table holds */
    int min_operands, max_operands;
    const char *operands; /* "SOURCE", "one SOURCE", "SOURCE and NAME" */
    /* Each of the subcommand's own options, by letter: 0, or CLI_USAGE after a message. */
    int (*on_option)(void *ctx, const char *cmd, int letter, const char *value);
    void *ctx;
} cli_args;
/* The process setup every command shares, then parses argv: -o goes to cli_parse_o, --help prints
 * the usage (*help_shown: the caller stops and returns the result), any other option to on_option;
 * then checks the operand count. Returns 0 with optind at the first operand, CLI_USAGE after a
 * one-line message, or CLI_OUTPUT when the usage could not be written. */
/* cli_start is its first step (exported for commands that take no arguments). */
void cli_start(void);
int cli_parse_args(cli_common *c, const cli_args *a, int argc, char **argv, bool *help_shown);
/* --threads N: 1 to 256. 0, or CLI_USAGE after a message. */
int cli_parse_threads(const char *cmd, const char *value, uint64_t *threads);
/* Strict decimal u64 (no sign, no spaces); false on anything else or overflow. */
bool cli_parse_u64(const char *s, uint64_t *out);

/* How a tensor is named on a line of text: its prefix (the directory a catalog shows it under:
 * "optim/", ".ckptfs/ranks/0/"; names are unique only within one) and its name, with bytes
 * 0x00-0x1F, 0x7F and '%' as %XX as in .ckptfs/tensors.tsv, so every name is one line and the
 * form can be looked up again. */
void cli_put_display_name(strbuf *sb, const ckpt_tensor *t);
/* Under a directory whose name starts with '.' (per-rank copies in .ckptfs/ranks/): listed
 * only on request, as ls -a shows dot files. */
bool cli_hidden(const ckpt_tensor *t);
/* Whether the fnmatch(3) pattern glob names t in one of the spellings a user meets: the name
 * (model.norm.weight), the form `ckptfs ls` prints (prefix + name: model/model.norm.weight,
 * optim/...), or the tree path of the mount (model/model/norm/weight, with or without its
 * ".raw"). CLI_GLOB_PREFIXED when only a spelling with the prefix matched. name is scratch. */
enum { CLI_GLOB_NO = 0, CLI_GLOB_NAME = 1, CLI_GLOB_PREFIXED = 2 };
int cli_glob_match(const char *glob, const ckpt_tensor *t, strbuf *name);
/* The tensor a user named: its exact name (the unprefixed tensor first, then one in the
 * model), its prefix + name, its tree path, or the %XX form printed by `ckptfs ls`. NULL when
 * none matches. */
const ckpt_tensor *cli_find_tensor(const ckpt_catalog *cat, const char *name);

/* Streams bytes [off, off+len) of a tensor, in logical row-major order, to `sink` in pieces of
 * at most bufsize bytes (buf is the caller's). A hole (bytes no file holds) or a read error
 * stops it with CLI_SOURCE and a message in err; a non-zero sink result stops it and is
 * returned as is. */
typedef int (*cli_sink)(void *ctx, const void *data, size_t len);
int cli_stream_tensor(const ckpt_catalog *cat, const ckpt_tensor *t, uint64_t off, uint64_t len,
                      void *buf, size_t bufsize, cli_sink sink, void *ctx, ckpt_err *err);
/* The first byte range of [off, off+len) that no piece holds; false when there is none. */
bool cli_find_hole(const ckpt_tensor *t, uint64_t off, uint64_t len, uint64_t *hole_off,
                   uint64_t *hole_len);

/* Writes all of buf to fd. 0, or CLI_OUTPUT: a closed pipe silently (the reader has what it
 * wanted, as with `| head`), any other failure with a message. */
int cli_write_all(const char *cmd, int fd, const void *buf, size_t len);

/* Text output on stdout, built in a buffer and written in large pieces by cli_write_all, so a
 * closed pipe is seen at once and ends the command quietly. */
typedef struct cli_out {
    strbuf sb;
    const char *cmd;
    int status; /* 0, or CLI_OUTPUT once a write failed (the buffer is then dropped) */
} cli_out;
void cli_out_init(cli_out *o, const char *cmd);
/* Writes the buffer now; returns o->status. */
int cli_out_flush(cli_out *o);
/* Writes the buffer once it holds 64 KiB; returns o->status. */
int cli_out_maybe_flush(cli_out *o);
/* Writes what is left and frees the buffer; returns o->status (CLI_OUTPUT also when the
 * buffer could not grow). */
int cli_out_finish(cli_out *o);

#endif
