/* Staging mount: not written yet. */
#include "stage.h"

#include <stdio.h>

int stage_main(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "ckptfs stage: not available yet\n");
    return 1;
}

int commit_main(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "ckptfs commit: not available yet\n");
    return 1;
}
