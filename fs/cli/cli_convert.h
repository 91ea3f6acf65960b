/* convert's checks and tensor selection (cli_convert_guard.c). */
#ifndef CKPTFS_CLI_CONVERT_H
#define CKPTFS_CLI_CONVERT_H

#include "cli_internal.h"

/* Before opening anything: OUT is not SOURCE, not inside the directory SOURCE, and does not
 * exist yet unless force (then *replace_dir says an existing directory is swapped). Returns
 * CLI_OK or CLI_USAGE after printing why. */
int convert_guard_out(const char *cmd, const char *source, const char *out, bool force,
                      bool *replace_dir);
/* After opening: OUT is none of the catalog's files (shards reached through symlinks too). */
int convert_guard_sources(const char *cmd, const ckpt_catalog *cat, const char *out);
/* Leaves out (marks aside) every model tensor that matches no --include (when there are some)
 * or matches an --exclude, and takes in state set aside (optim/) that an --include names with
 * its directory; fnmatch(3) patterns on the name, the form ckptfs ls prints or the tree path
 * (cli_glob_match). Returns how many are kept. */
size_t convert_select(ckpt_catalog *cat, char *const *include, size_t ninclude,
                      char *const *exclude, size_t nexclude);

#endif
