/* Commands that read a checkpoint without mounting it (no /dev/fuse needed, for containers and
 * CI): ls, info, cat, verify, convert, stats, diff. fs/main.c's table dispatches to them. */
#ifndef CKPTFS_CLI_H
#define CKPTFS_CLI_H

/* argv[0] is the command's name. Each returns the process exit status (cli_internal.h). */
int cli_ls(int argc, char **argv);
int cli_info(int argc, char **argv);
int cli_cat(int argc, char **argv);
int cli_verify(int argc, char **argv);
int cli_convert(int argc, char **argv);
int cli_stats(int argc, char **argv);
int cli_diff(int argc, char **argv);

#endif
