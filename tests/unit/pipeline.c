/* Items prepared ahead on a second thread: every item is prepared once, used once and in order,
 * with what its own prepare produced; after a stop, what was prepared and not used is handed
 * to discard (the ASan build sees a leak otherwise). */
#include "util/pipeline.h"
#include "tap.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct slot {
    size_t item;
    char *payload; /* allocated by prepare: freed by use or discard */
} slot;

typedef struct trial {
    size_t n, fail_prepare_at, stop_use_at; /* SIZE_MAX = never */
    atomic_size_t prepared, discarded;
    size_t used, next_expected;
    bool out_of_order, wrong_payload;
} trial;

static int prepare(void *ctx, size_t i, void *p) {
    trial *t = ctx;
    slot *s = p;
    atomic_fetch_add(&t->prepared, 1);
    if (i == t->fail_prepare_at) return -EIO;
    s->item = i;
    s->payload = malloc(32);
    if (!s->payload) return -ENOMEM;
    for (volatile int spin = 0; spin < (int)(i % 7) * 2000; spin++) {
    } /* uneven work, so the threads overtake each other */
    return 0;
}

static int use(void *ctx, size_t i, void *p, int prepared) {
    trial *t = ctx;
    slot *s = p;
    if (i != t->next_expected) t->out_of_order = true;
    t->next_expected = i + 1;
    t->used++;
    if (prepared) return prepared;
    if (s->item != i) t->wrong_payload = true;
    free(s->payload);
    return i == t->stop_use_at ? -ECANCELED : 0;
}

static void discard(void *ctx, size_t i, void *p, int prepared) {
    trial *t = ctx;
    slot *s = p;
    (void)i;
    atomic_fetch_add(&t->discarded, 1);
    if (!prepared) free(s->payload);
}

static void run(size_t n, size_t ahead, size_t fail_at, size_t stop_at, int want_rc,
                const char *what) {
    trial t = {.n = n, .fail_prepare_at = fail_at, .stop_use_at = stop_at};
    static const ckpt_pipeline_ops ops = {prepare, use, discard};
    int rc = ckpt_pipeline_run(n, sizeof(slot), ahead, &ops, &t);
    size_t end = fail_at < stop_at ? fail_at : stop_at;
    size_t want_used = end < n ? end + 1 : n;
    ok(rc == want_rc && t.used == want_used && !t.out_of_order && !t.wrong_payload &&
           atomic_load(&t.prepared) == t.used + atomic_load(&t.discarded) &&
           atomic_load(&t.discarded) < (ahead > 1 ? ahead : 1),
       "%s: rc %d, used %zu of %zu in order, prepared %zu, discarded %zu", what, rc, t.used, n,
       atomic_load(&t.prepared), atomic_load(&t.discarded));
}

static void *bump(void *arg) {
    atomic_fetch_add((atomic_int *)arg, 1);
    return NULL;
}

int main(void) {
    run(0, 4, SIZE_MAX, SIZE_MAX, 0, "no items");
    run(1, 4, SIZE_MAX, SIZE_MAX, 0, "one item (no thread)");
    run(2, 4, SIZE_MAX, SIZE_MAX, 0, "two items (no thread)");
    for (int round = 0; round < 20; round++) {
        run(200, 4, SIZE_MAX, SIZE_MAX, 0, "200 items, 4 ahead");
        run(200, 2, SIZE_MAX, SIZE_MAX, 0, "200 items, 2 ahead");
        run(200, 4, 57, SIZE_MAX, -EIO, "prepare of item 57 fails: use sees it and stops");
        run(200, 4, SIZE_MAX, 120, -ECANCELED, "use stops at item 120: the rest is discarded");
        run(200, 8, SIZE_MAX, 0, -ECANCELED, "use stops at the first item");
    }
    run(200, 1, SIZE_MAX, SIZE_MAX, 0, "ahead 1 runs one item at a time");

    atomic_int hits = 0;
    ckpt_side_job job;
    ckpt_side_start(&job, bump, &hits, true);
    ckpt_side_join(&job);
    ckpt_side_join(&job);
    ok(atomic_load(&hits) == 1, "a side job runs once, joining twice is harmless");
    ckpt_side_start(&job, bump, &hits, false);
    ok(atomic_load(&hits) == 2, "a side job not worth a thread has run when start returns");
    ckpt_side_join(&job);
    return tap_done();
}
