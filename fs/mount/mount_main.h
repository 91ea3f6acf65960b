/* `ckptfs SOURCE MOUNTPOINT [-o OPTIONS]`: the read-only mount (and, with -o stage=OUT, the
 * mount(8) form of a staging mount). */
#ifndef CKPTFS_MOUNT_MAIN_H
#define CKPTFS_MOUNT_MAIN_H

/* argv[0] is the program; returns the exit status (0 mounted, 1 usage, 2 source, 3 mount). */
int mount_main(int argc, char **argv);

#endif
