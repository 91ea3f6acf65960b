#include "pipeline.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Item i lives in ring slot i % ahead; it may be claimed once item i - ahead has been used. */
typedef struct run {
    const ckpt_pipeline_ops *ops;
    void *ctx;
    size_t n, ahead, slot_size;
    unsigned char *slots;
    int *results;
    bool *ready;
    pthread_mutex_t mu;
    pthread_cond_t changed;
    size_t next; /* first item nobody has claimed */
    size_t used; /* items used so far */
    bool stop;
} run;

static void *slot_of(run *r, size_t i) {
    return r->slots + (i % r->ahead) * r->slot_size;
}

static bool claimable(const run *r) {
    return !r->stop && r->next < r->n && r->next < r->used + r->ahead;
}

/* Called and returns with mu held; prepares the next unclaimed item outside the lock. */
static void prepare_next(run *r) {
    size_t k = r->next++;
    void *slot = slot_of(r, k);
    pthread_mutex_unlock(&r->mu);
    memset(slot, 0, r->slot_size);
    int rc = r->ops->prepare(r->ctx, k, slot);
    pthread_mutex_lock(&r->mu);
    r->results[k % r->ahead] = rc;
    r->ready[k % r->ahead] = true;
    pthread_cond_broadcast(&r->changed);
}

static void *helper(void *arg) {
    run *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && r->next < r->n && !claimable(r)) pthread_cond_wait(&r->changed, &r->mu);
        if (!claimable(r)) break;
        prepare_next(r);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static bool second_cpu(void) {
    return sysconf(_SC_NPROCESSORS_ONLN) > 1;
}

void ckpt_side_start(ckpt_side_job *job, void *(*fn)(void *), void *arg, bool worth_a_thread) {
    job->joined = false;
    job->threaded =
        worth_a_thread && second_cpu() && pthread_create(&job->thread, NULL, fn, arg) == 0;
    if (!job->threaded) fn(arg);
}

void ckpt_side_join(ckpt_side_job *job) {
    if (job->threaded && !job->joined) pthread_join(job->thread, NULL);
    job->joined = true;
}

static int run_serially(size_t n, size_t slot_size, const ckpt_pipeline_ops *ops, void *ctx) {
    void *slot = malloc(slot_size ? slot_size : 1);
    if (!slot) return -ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        memset(slot, 0, slot_size);
        rc = ops->use(ctx, i, slot, ops->prepare(ctx, i, slot));
    }
    free(slot);
    return rc;
}

int ckpt_pipeline_run(size_t n, size_t slot_size, size_t ahead, const ckpt_pipeline_ops *ops,
                      void *ctx) {
    if (n < 3 || ahead < 2 || !second_cpu()) return run_serially(n, slot_size, ops, ctx);
    run r = {.ops = ops, .ctx = ctx, .n = n, .ahead = ahead, .slot_size = slot_size};
    r.slots = calloc(ahead, slot_size ? slot_size : 1);
    r.results = calloc(ahead, sizeof *r.results);
    r.ready = calloc(ahead, sizeof *r.ready);
    pthread_t thread;
    bool threaded = false;
    if (r.slots && r.results && r.ready) {
        pthread_mutex_init(&r.mu, NULL);
        pthread_cond_init(&r.changed, NULL);
        threaded = pthread_create(&thread, NULL, helper, &r) == 0;
        if (!threaded) {
            pthread_cond_destroy(&r.changed);
            pthread_mutex_destroy(&r.mu);
        }
    }
    if (!threaded) {
        free(r.slots);
        free(r.results);
        free(r.ready);
        return run_serially(n, slot_size, ops, ctx); /* no thread: same result, one core */
    }

    int rc = 0;
    pthread_mutex_lock(&r.mu);
    for (size_t i = 0; i < n && !rc; i++) {
        /* While the helper prepares item i, prepare a later one instead of waiting. */
        while (!r.ready[i % ahead]) {
            if (claimable(&r))
                prepare_next(&r);
            else
                pthread_cond_wait(&r.changed, &r.mu);
        }
        r.ready[i % ahead] = false;
        int prepared = r.results[i % ahead];
        pthread_mutex_unlock(&r.mu);
        rc = ops->use(ctx, i, slot_of(&r, i), prepared);
        pthread_mutex_lock(&r.mu);
        r.used++;
        if (rc) r.stop = true;
        pthread_cond_broadcast(&r.changed);
    }
    pthread_mutex_unlock(&r.mu);
    pthread_join(thread, NULL);
    /* After a stop, everything claimed but not used is prepared by now: release it. */
    for (size_t k = r.used; k < r.next; k++)
        if (ops->discard) ops->discard(ctx, k, slot_of(&r, k), r.results[k % ahead]);
    pthread_cond_destroy(&r.changed);
    pthread_mutex_destroy(&r.mu);
    free(r.slots);
    free(r.results);
    free(r.ready);
    return rc;
}
