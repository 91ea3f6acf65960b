#include "cli.h"

#include <stdio.h>
#include <string.h>

bool cli_is_command(const char *word) {
    (void)word;
    return false;
}

int cli_main(int argc, char **argv) {
    (void)argc;
    fprintf(stderr, "ckptfs: unknown command %s\n", argv[0]);
    return 1;
}
