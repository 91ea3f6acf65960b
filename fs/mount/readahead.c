#include "readahead.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <unistd.h>

int set_mount_readahead(dev_t dev, unsigned kb) {
    char path[64], value[16];
    snprintf(path, sizeof path, "/sys/class/bdi/%u:%u/read_ahead_kb", major(dev), minor(dev));
    int n = snprintf(value, sizeof value, "%u", kb);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    ssize_t w = write(fd, value, (size_t)n);
    int rc = w == n ? 0 : -errno;
    close(fd);
    return rc;
}
