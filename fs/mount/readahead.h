/* Kernel readahead of one mount (its BDI). */
#ifndef CKPTFS_READAHEAD_H
#define CKPTFS_READAHEAD_H

#include <sys/types.h>

/* Writes kb to /sys/class/bdi/MAJ:MIN/read_ahead_kb; 0 or a negative errno (best effort:
 * only root may, and some containers mount /sys read-only). */
int set_mount_readahead(dev_t dev, unsigned kb);

#endif
