/* A stage over its own OUT (`ckptfs stage OUT MNT --from OUT`) replaces its source with every
 * commit. The tree then refers to files that are gone once the daemon ends, and the spool's
 * state describes a source that no longer exists, so a stage taken up again (after kill -9,
 * or a nocommit unmount) would be refused as "the source changed".
 *
 * After such a commit the stage moves onto what it wrote: OUT is opened again, every node
 * that referred to a source tensor refers to the tensor of the new OUT that the commit made
 * of it (by name, from core/write/staged.c's report), and state and journal are rewritten for the
 * new source. A node the new OUT has no tensor for (a hidden file of the source) is copied
 * into the spool. The old catalog stays open until the stage ends: handles opened before
 * keep reading it. */
#include "stage_fs.h"

#include "core/util/hashmap.h"
#include "core/write/staged.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t trimmed_len(const char *p) {
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') n--;
    return n;
}

bool stage_replaces_source(const stage *st) {
    if (!st->from || !st->lower) return false;
    size_t a = trimmed_len(st->from), b = trimmed_len(st->out);
    return a == b && memcmp(st->from, st->out, a) == 0;
}

/* Points n at tensor i of now; false when that tensor is not the same bytes' home. */
static bool move_node(snode *n, const ckpt_catalog *now, size_t i) {
    const ckpt_tensor *t = &now->tensors[i];
    if (n->src == SRC_LOWER_RAW) {
        if (t->nbytes != n->lower_size) return false;
        n->lower = i;
        return true;
    }
    size_t len;
    char *doc = ckpt_sidecar_json(now, t, &len);
    if (!doc) return false;
    free(doc);
    n->lower = i;
    n->lower_size = len;
    return true;
}

int stage_rebase(stage *st, snode *const *nodes, size_t n, const staged_report *rep,
                 strbuf *report) {
    ckpt_catalog *now = NULL;
    ckpt_err err = {{0}};
    if (ckpt_open(st->from, NULL, &now, &err) != 0) {
        sb_printf(report,
                  "note: %s cannot be opened again (%s): the stage reads the replaced files "
                  "until it ends, and cannot be taken up after it\n",
                  st->out, err.msg);
        return -EIO;
    }
    ckpt_catalog **retired = realloc(st->retired, (st->nretired + 1) * sizeof *retired);
    hashmap names;
    if (!retired || !hm_init(&names, now->ntensors)) {
        if (retired) st->retired = retired;
        ckpt_close(now);
        sb_puts(report, "note: out of memory moving the stage onto the new OUT\n");
        return -ENOMEM;
    }
    st->retired = retired;
    bool added, ok = true;
    for (size_t i = 0; ok && i < now->ntensors; i++)
        if (!now->tensors[i].aside)
            ok = hm_put(&names, now->tensors[i].name, now->tensors[i].name_len, i, &added);
    size_t copied = 0;
    int rc = ok ? 0 : -ENOMEM;
    for (size_t k = 0; !rc && k < n; k++) {
        snode *node = nodes[k];
        if (node->src == SRC_SPOOL || node->src == SRC_PACK) continue;
        const hm_entry *e = rep->file_tensor[k]
                                ? hm_get(&names, rep->file_tensor[k], rep->file_tensor_len[k])
                                : NULL;
        if (e && move_node(node, now, e->value)) continue;
        int ce = stage_copy_up(st, node); /* reads the old source, still st->lower */
        if (ce) rc = -ce;
        copied++;
    }
    hm_free(&names);
    if (rc) {
        /* Nodes moved so far refer to `now`: it must stay open and become the source. */
        sb_printf(report, "note: moving the stage onto the new %s: %s\n", st->out, strerror(-rc));
    }
    st->retired[st->nretired++] = st->lower;
    st->lower = now;
    if (copied)
        sb_printf(report, "note: %zu file%s of the old source copied into the spool\n", copied,
                  copied == 1 ? "" : "s");
    /* Journal first: a crash between the two leaves the old state, which refuses the
     * stage as over a changed source rather than replaying it over the wrong one. */
    int wr = journal_snapshot(st);
    if (!wr) wr = spool_write_state(st);
    if (wr && !rc) {
        sb_printf(report, "note: the spool cannot record the new source (%s)\n", strerror(-wr));
        rc = wr;
    }
    return rc;
}
