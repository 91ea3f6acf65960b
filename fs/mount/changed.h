/* A source found changed under the mount (every read of it then gives EIO): said once per
 * source, with its path and what changed, to the mount's log (fs/common/mount_log.h), so a
 * detached mount's EIO has a reason somewhere. */
#ifndef CKPTFS_CHANGED_H
#define CKPTFS_CHANGED_H

#include "core/ckpt.h"

/* Before serving: one flag per source of cat (false when out of memory: then nothing is said). */
bool changed_init(const ckpt_catalog *cat);
/* s (a source of that catalog) answered a read or open with EIO because it changed: the first
 * time, the reason goes to the log. */
void changed_note(const ckpt_source *s);
void changed_free(void);

#endif
