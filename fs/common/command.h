/* The commands of ckptfs, as fs/main.c's table lists them: each front end prints its usage line
 * and the list of commands from that one table, through these functions, so that `ckptfs help`,
 * every --help and the bash completion cannot disagree about what exists. main.c registers the
 * table before dispatching; the front ends never call main.c (no cycle through it). */
#ifndef CKPTFS_COMMAND_H
#define CKPTFS_COMMAND_H

#include <stddef.h>
#include <stdio.h>

typedef struct command {
    const char *name;                   /* "ls"; "" for the mount: ckptfs SOURCE MOUNTPOINT */
    int (*main)(int argc, char **argv); /* argv[0] is the command's name */
    const char *usage;                  /* what follows "ckptfs NAME " on the Usage line */
    const char *summary;                /* its line in `ckptfs help` */
} command;

void commands_register(const command *table, size_t n);
/* The row of name (exact), or NULL. */
const command *command_named(const char *name);
/* "Usage: ckptfs NAME USAGE\n" into out (cut to cap); "" when name has no row. */
void command_usage_line(const char *name, char *out, size_t cap);
/* The same line on out. */
void command_print_usage(FILE *out, const char *name);
/* The names of every command but the mount, separated by sep ("ls, info, ..."), into out. */
void command_names(const char *sep, char *out, size_t cap);
/* The command whose name word most likely misspells (one edit: a letter added, dropped,
 * changed or two swapped; or word a prefix of it), or NULL when none or several are. */
const command *command_suggest(const char *word);

#endif
