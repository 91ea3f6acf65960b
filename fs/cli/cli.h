/* Subcommands that read a checkpoint without mounting it: ls, info, cat, verify, convert. */
#ifndef CKPTFS_CLI_H
#define CKPTFS_CLI_H

#include <stdbool.h>

bool cli_is_command(const char *word);
/* argv[0] is the subcommand. Returns the process exit status. */
int cli_main(int argc, char **argv);

#endif
