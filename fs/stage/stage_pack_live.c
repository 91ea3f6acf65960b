/* The pack while files are written (stage_pack.c says what a pack is): which new file owns its
 * tail, where the pack ends, when a full shard is left for a new one. Under st->lock. */
#include "stage_pack.h"

#include "core/views/hfview.h"
#include "core/util/text.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Files that cannot be a tensor's raw bytes would leave holes between tensors. */
bool stage_pack_name_ok(const char *name) {
    if (name[0] == '.' || text_ends_with(name, ".json") || text_ends_with(name, ".npy"))
        return false;
    for (size_t i = 0; i < ckpt_hf_aux_count; i++)
        if (strcmp(name, ckpt_hf_aux_names[i]) == 0) return false;
    return true;
}

/* A safetensors OUT, or an HF directory OUT, on the file system of the spool (a link cannot
 * cross). */
int stage_pack_mode(stage *st) {
    if (st->pack_usable) return st->pack_usable;
    st->pack_usable = PACK_NONE;
    char copy[PATH_MAX];
    snprintf(copy, sizeof copy, "%s", st->out);
    size_t n = strlen(copy);
    bool slash = n > 1 && copy[n - 1] == '/';
    while (n > 1 && copy[n - 1] == '/') copy[--n] = '\0';
    struct stat out, dir, data;
    bool is_dir = slash || st->max_shard_size || (stat(copy, &out) == 0 && S_ISDIR(out.st_mode));
    int mode = is_dir ? PACK_DIR : text_ends_with(copy, ".safetensors") ? PACK_FILE : PACK_NONE;
    if (mode == PACK_NONE) return st->pack_usable;
    if (stat(dirname(copy), &dir) == 0 && fstat(st->data_fd, &data) == 0 &&
        dir.st_dev == data.st_dev)
        st->pack_usable = mode;
    return st->pack_usable;
}

static uint64_t max_shard(const stage *st) {
    return st->max_shard_size ? st->max_shard_size : CKPT_HF_MAX_SHARD_DEFAULT;
}

int pack_open_new(stage *st) {
    uint64_t id;
    int fd = spool_data_create(st, &id);
    if (fd < 0) return -fd;
    if (ftruncate(fd, PACK_DATA_START) != 0) {
        int e = errno;
        close(fd);
        spool_data_unlink(st, id);
        return e;
    }
    st->pack_fd = fd;
    st->pack_id = id;
    st->pack_end = PACK_DATA_START;
    return 0;
}

int stage_pack_claim(stage *st, snode *n, const char *name) {
    int mode = stage_pack_mode(st);
    if (mode == PACK_NONE || st->pack_tail || !stage_pack_name_ok(name)) return ENOTSUP;
    /* a directory OUT: a pack is a shard; a full one is left for the next */
    if (mode == PACK_DIR && st->pack_fd >= 0 && st->pack_end - PACK_DATA_START >= max_shard(st)) {
        close(st->pack_fd);
        st->pack_fd = -1;
    }
    if (st->pack_fd < 0 && pack_open_new(st) != 0) return ENOTSUP;
    int fd = dup(st->pack_fd);
    if (fd < 0) return ENOTSUP;
    sn_src was = n->src;
    n->src = SRC_PACK;
    n->data_id = st->pack_id;
    n->pack_off = st->pack_end;
    n->pack_size = 0;
    n->late_error = 0;
    int e = -journal_pack(st, n);
    if (e) {
        n->src = was;
        close(fd);
        return e;
    }
    if (n->fd >= 0) close(n->fd);
    n->fd = fd;
    st->pack_tail = n;
    return 0;
}

void stage_pack_seal(stage *st) {
    snode *n = st->pack_tail;
    if (!n) return;
    st->pack_tail = NULL;
    if (!n->removed) journal_pack_size(st, n); /* a failure leaves "ends where the pack ends" */
}

void stage_pack_drop_tail(stage *st, snode *n) {
    bool last =
        n == st->pack_tail || (!st->pack_tail && n->src == SRC_PACK && n->data_id == st->pack_id &&
                               n->pack_off + n->pack_size == st->pack_end);
    if (!last || st->pack_fd < 0) return;
    if (ftruncate(st->pack_fd, (off_t)n->pack_off) == 0) st->pack_end = n->pack_off;
    st->pack_tail = NULL;
}

bool stage_pack_writable(const stage *st, const snode *n) {
    return n->src == SRC_PACK && n == st->pack_tail;
}

void stage_pack_grew(stage *st, snode *n, uint64_t end) {
    if (n->src != SRC_PACK || end <= n->pack_size) return;
    n->pack_size = end;
    if (n == st->pack_tail) st->pack_end = n->pack_off + end;
}
