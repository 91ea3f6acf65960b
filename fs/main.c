/* ckptfs: one table of commands, as git's commands[]. `ckptfs help`, the Usage line of every
 * --help, the lists of commands in messages and the bash completion's list (`ckptfs help
 * --commands`) are all printed from it, so none can forget a command. A first word that is
 * neither a command nor an existing path but one typo away from a command is answered with
 * "did you mean"; anything else is the read-only mount's SOURCE. */
#include "cli/cli.h"
#include "common/argv_secrets.h"
#include "common/command.h"
#include "common/file_limit.h"
#include "common/message.h"
#include "mount/mount_main.h"
#include "serve/serve.h"
#include "stage/stage.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static int help_main(int argc, char **argv);

static const command commands[] = {
    {"", mount_main, "SOURCE MOUNTPOINT [-f] [-d] [-s] [-o OPTION[,OPTION...]]",
     "mount a checkpoint read-only (ckptfs --help)"},
    {"ls", cli_ls, "SOURCE [-l] [--json] [-a] [-o OPTIONS] [GLOB...]",
     "list tensors (names; -l dtype, shape, size; --json)"},
    {"info", cli_info, "SOURCE [--json] [-o OPTIONS]",
     "summary: format, files, tensor and parameter counts, dtypes"},
    {"cat", cli_cat, "SOURCE NAME [--offset N] [--length N] [--force] [-o OPTIONS]",
     "write one tensor's raw bytes to standard output"},
    {"verify", cli_verify, "SOURCE [--manifest M] [--write-manifest M] [--json] [-qa]",
     "hash every tensor; compare with or write a manifest"},
    {"convert", cli_convert, "SOURCE OUT [OPTIONS]",
     "write the tensors into a new archive (format from OUT's name)"},
    {"stats", cli_stats, "SOURCE [--json] [--plot SVG] [--hist TENSOR] [-q] [GLOB...]",
     "min, max, mean, std, norm, NaN/Inf counts per tensor; --plot SVG"},
    {"diff", cli_diff, "A B [--map MAP] [--atol X] [--rtol X] [--json] [--plot SVG]",
     "compare two checkpoints tensor by tensor (exit 0 same, 1 different)"},
    {"serve", serve_main, "[OPTIONS] [[ORG/]NAME=]SOURCE...",
     "serve checkpoints over HTTP as Hugging Face Hub repositories"},
    {"stage", stage_main, "OUT MOUNTPOINT [--from SOURCE] [-f] [-d] [-s] [-o OPTION,...]",
     "mount a writable tree that a commit packs into the archive OUT"},
    {"commit", commit_main, "MOUNTPOINT", "write a staging mount's archive now"},
    {"umount", umount_main, "MOUNTPOINT", "unmount; for a staging mount, wait for its commit"},
    {"help", help_main, "[COMMAND]", "this overview; ckptfs help COMMAND for one command"},
};
enum { NCOMMANDS = sizeof commands / sizeof *commands };

static void overview(FILE *out) {
    fprintf(out, "Usage: ckptfs %s\n       ckptfs COMMAND [ARGS...]  (ckptfs COMMAND --help)\n\n",
            commands[0].usage);
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(out, "  %-8s %s\n", commands[i].name[0] ? commands[i].name : "SOURCE",
                commands[i].summary);
    fputs("\nSOURCE: a checkpoint file, a model directory, an HF cache repo folder, or an\n"
          "http(s)://, s3://, hf:// URL. Exit status of ls, info, cat, verify, convert,\n"
          "stats, diff: 0 success, 1 usage error, 2 the source cannot be read, is invalid\n"
          "or no such tensor, 3 verify found mismatches, 4 output error. See ckptfs(1).\n",
          out);
}

static void no_such_command(const char *word) {
    const command *s = command_suggest(word);
    if (s) {
        msg_error("help", "no command named %.100s; did you mean %s?", word, s->name);
        return;
    }
    char names[256];
    command_names(", ", names, sizeof names);
    msg_error("help", "no command named %.100s (commands: %s)", word, names);
}

static int help_main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN); /* `ckptfs help | head`: a closed pipe ends it quietly, status 4 */
    if (argc == 2 && strcmp(argv[1], "--commands") == 0) { /* for the bash completion */
        for (size_t i = 0; i < NCOMMANDS; i++)
            if (commands[i].name[0]) printf("%s\n", commands[i].name);
        return fflush(stdout) == 0 ? 0 : 4;
    }
    if (argc > 2) {
        msg_error("help", "expected at most one COMMAND");
        return 1;
    }
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        overview(stdout);
        return fflush(stdout) == 0 ? 0 : 4;
    }
    const command *c = argv[1][0] ? command_named(argv[1]) : NULL;
    if (!c) {
        no_such_command(argv[1]);
        return 1;
    }
    if (c->main == help_main) return help_main(1, argv); /* help help: the overview */
    char *args[] = {argv[1], "--help", NULL};
    return c->main(2, args);
}

int main(int argc, char **argv) {
    /* Before anything else: a URL's password or signature must not sit in /proc/PID/cmdline
     * for the life of a mount, a stage or a server. */
    char **own_argv = argv_hide_secrets(argc, argv);
    if (own_argv) argv = own_argv;
    /* Every command may hold a descriptor per shard (a stage one per open file). */
    raise_file_limit();
    /* Under `ulimit -f` a write past the limit kills the writer with SIGXFSZ: the staging
     * daemon (a pack passing the limit), convert or a commit would die mid-write, and a mount
     * with them. Ignored, the write fails with EFBIG, which every writer reports as it reports
     * a full disk (and cp on a stage sees "File too large", as on a local file system). */
    signal(SIGXFSZ, SIG_IGN);
    commands_register(commands, NCOMMANDS);
    if (argc > 1 && argv[1][0] && argv[1][0] != '-') {
        const command *c = command_named(argv[1]);
        if (c) return c->main(argc - 1, argv + 1);
        /* `ckptfs stat X`: a typo, unless a file of that name exists (or it is a URL). */
        struct stat st;
        const command *s = NULL;
        if (!strstr(argv[1], "://") && lstat(argv[1], &st) != 0 && (s = command_suggest(argv[1]))) {
            msg_error(NULL, "%.100s is neither a command nor a file; did you mean %s?", argv[1],
                      s->name);
            return 2;
        }
    }
    return mount_main(argc, argv);
}
