/* Work on a second core during a mount: items prepared ahead on a second thread and used in
 * order on the calling thread, and independent jobs run beside the caller.
 *
 * Opening a sharded checkpoint is mostly parsing one header per file (independent work) and
 * then adding what it says to the catalog (which must happen in file order). With a second
 * core, the helper parses file i+1.. while the caller adds file i; the caller also parses
 * whenever the next item it needs is not claimed yet, so one core loses nothing. */
#ifndef CKPT_PIPELINE_H
#define CKPT_PIPELINE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct ckpt_pipeline_ops {
    /* Fills slot for item i; runs on either thread, so it may only read shared state.
     * Returns 0 or a negative errno (its message goes in the slot). */
    int (*prepare)(void *ctx, size_t i, void *slot);
    /* Uses item i on the calling thread, in order, with prepare's result. Nonzero stops. */
    int (*use)(void *ctx, size_t i, void *slot, int prepared);
    /* Releases a slot that was prepared but will not be used (after a stop). May be NULL. */
    void (*discard)(void *ctx, size_t i, void *slot, int prepared);
} ckpt_pipeline_ops;

/* Runs items 0..n-1 with at most `ahead` prepared before the one in use (slots are
 * slot_size bytes, zeroed before prepare). One thread when n is small or there is one CPU.
 * Returns the first nonzero result of use, or -ENOMEM. */
int ckpt_pipeline_run(size_t n, size_t slot_size, size_t ahead, const ckpt_pipeline_ops *ops,
                      void *ctx);

/* fn(arg) beside the caller: on a second thread when `worth_a_thread` and there is a second
 * CPU, otherwise (or when no thread can be made) right here, before ckpt_side_start returns. */
typedef struct ckpt_side_job {
    pthread_t thread;
    bool threaded, joined;
} ckpt_side_job;

void ckpt_side_start(ckpt_side_job *job, void *(*fn)(void *), void *arg, bool worth_a_thread);
/* Waits for fn to finish; once is enough, later calls return at once. */
void ckpt_side_join(ckpt_side_job *job);

#endif
