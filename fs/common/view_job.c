#include "view_job.h"

static void *build(void *arg) {
    view_job *job = arg;
    job->rc = ckpt_hfview_build_spans(job->cat, job->max_shard_size, job->view, &job->err);
    return NULL;
}

void view_job_start(view_job *job, const ckpt_catalog *cat, uint64_t max_shard_size,
                    ckpt_hfview *view) {
    *job = (view_job){.cat = cat, .max_shard_size = max_shard_size, .view = view};
    ckpt_side_start(&job->side, build, job, cat->ntensors >= 4096);
}

void view_job_ready(view_job *job, ckpt_hfview *view) {
    *job = (view_job){.view = view};
}

int view_job_wait(void *ctx, const ckpt_hfview **view, ckpt_err *err) {
    view_job *job = ctx;
    if (job->cat) ckpt_side_join(&job->side); /* started, not handed in ready */
    *view = job->view;
    if (job->rc) *err = job->err;
    return job->rc;
}
