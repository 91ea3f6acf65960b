/* Secrets in the command line: a source URL's password or signed query, given as an argument,
 * would stay readable by every local user in /proc/PID/cmdline for the life of a mount or a
 * server. */
#ifndef CKPTFS_ARGV_SECRETS_H
#define CKPTFS_ARGV_SECRETS_H

/* Returns a private copy of argv (NULL-terminated, freed at exit) for the program to use, and
 * rewrites the process's own argument strings in place to their shown form (ckpt_shown_name), so
 * /proc/PID/cmdline holds no secret. NULL when out of memory (argv is then left as it was). */
char **argv_hide_secrets(int argc, char **argv);

#endif
