/* A one-line progress report on stderr ("verify: 1.2 GiB / 12.5 GiB (9%), 850.0 MiB/s") for
 * jobs long enough to wonder about. Silent when stderr is not a terminal, so logs and pipes get
 * no control characters; silent for the first second, so quick jobs print nothing. */
#include "progress.h"
#include "human.h"

#include <stdio.h>

#include <time.h>
#include <unistd.h>

enum { DELAY_MS = 1000, INTERVAL_MS = 100 };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void progress_start(progress_line *p, const char *label, uint64_t total) {
    *p = (progress_line){.enabled = isatty(2) == 1, .label = label, .total = total};
    if (p->enabled) p->start = p->last = now();
}

void progress_add(progress_line *p, uint64_t bytes) {
    p->done += bytes;
    if (!p->enabled) return;
    double t = now();
    if (t - p->start < DELAY_MS / 1000.0 || t - p->last < INTERVAL_MS / 1000.0) return;
    p->last = t;
    char done[32], total[32], rate[32];
    human_size(p->done, done, sizeof done);
    human_size(p->total, total, sizeof total);
    human_size((uint64_t)((double)p->done / (t - p->start)), rate, sizeof rate);
    unsigned pct = p->total ? (unsigned)(p->done * 100.0 / (double)p->total) : 100;
    /* \r back to the line start, \033[K erases what a longer previous line left. */
    fprintf(stderr, "\r%s: %s / %s (%u%%), %s/s\033[K", p->label, done, total, pct, rate);
    fflush(stderr);
    p->shown = true;
}

void progress_end(progress_line *p) {
    if (p->shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
    p->shown = false;
}
