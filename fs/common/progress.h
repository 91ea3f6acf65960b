/* Progress on stderr for long jobs (verify, convert, a commit): only when stderr is a terminal
 * and the job has run for a second, at most ten updates a second, erased at the end. */
#ifndef CKPTFS_PROGRESS_H
#define CKPTFS_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct progress_line {
    bool enabled, shown;
    const char *label;
    uint64_t total, done;
    double start, last;
} progress_line;

void progress_start(progress_line *p, const char *label, uint64_t total);
void progress_add(progress_line *p, uint64_t bytes);
void progress_end(progress_line *p);

#endif
