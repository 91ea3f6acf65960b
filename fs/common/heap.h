/* malloc settings for the two phases of a mount: loading a catalog, then serving it. */
#ifndef CKPTFS_HEAP_H
#define CKPTFS_HEAP_H

/* Keeps freed memory for reuse while headers are parsed. */
void heap_for_loading(void);
/* Returns what loading left free to the system and restores glibc's usual behaviour. */
void heap_for_serving(void);

#endif
