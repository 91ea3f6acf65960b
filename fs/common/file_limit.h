/* Descriptors: a checkpoint of thousands of shards holds one per shard (info, ls, a mount, a
 * server), a stage one per open file, so every command runs with as many as the system allows. */
#ifndef CKPTFS_FILE_LIMIT_H
#define CKPTFS_FILE_LIMIT_H

/* Raises the soft RLIMIT_NOFILE to the hard limit (users' default soft limit is 1024). */
void raise_file_limit(void);

#endif
