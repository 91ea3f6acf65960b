/* The HF view built on a second thread while the tree's tensor part is built (tree_build asks
 * for it through view_job_wait once the tensors are in). */
#ifndef CKPTFS_VIEW_JOB_H
#define CKPTFS_VIEW_JOB_H

#include "core/views/hfview.h"
#include "core/util/pipeline.h"

typedef struct view_job {
    const ckpt_catalog *cat;
    uint64_t max_shard_size;
    ckpt_hfview *view;
    ckpt_err err;
    int rc;
    ckpt_side_job side;
} view_job;

/* Starts building into view (on this thread if no thread can be made). */
void view_job_start(view_job *job, const ckpt_catalog *cat, uint64_t max_shard_size,
                    ckpt_hfview *view);
/* A view already built (view=gguf's): view_job_wait hands it over. */
void view_job_ready(view_job *job, ckpt_hfview *view);
/* tree_view_fn: joins the job and hands over the view (ctx is the job). */
int view_job_wait(void *ctx, const ckpt_hfview **view, ckpt_err *err);

#endif
