/* Where a mount tells what went wrong once it serves: its stderr in the foreground; once it
 * has detached (stdio is /dev/null then) syslog, or the file of -o log=FILE when given. */
#ifndef CKPTFS_MOUNT_LOG_H
#define CKPTFS_MOUNT_LOG_H

#include <stdbool.h>

/* Opens -o log=FILE for appending (before detaching: the path is relative to the caller's
 * directory). 0, or a negative errno with nothing opened. */
int mount_log_file(const char *path);
/* From now on the mount is detached: without a log file, messages go to syslog. */
void mount_log_detached(void);
/* One message (a line, without "ckptfs: " and the newline). Safe from many threads. */
__attribute__((format(printf, 1, 2))) void mount_log(const char *fmt, ...);

#endif
