/* The staging mount: a writable tree whose tensors are packed into a new archive on commit. */
#ifndef CKPTFS_STAGE_H
#define CKPTFS_STAGE_H

/* argv[0] is "stage" / "commit". Return the process exit status. */
int stage_main(int argc, char **argv);
int commit_main(int argc, char **argv);

#endif
