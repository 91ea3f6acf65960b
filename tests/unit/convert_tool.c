/* A test tool, not a test: convert IN OUT [max_shard_size] through the core writer, so writer
 * tests need neither FUSE nor the ckptfs command line. Exit 0 on success, 2 with one line. */
#include "ckpt.h"
#include "write/writer.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: convert_tool IN OUT [max_shard_size]\n");
        return 1;
    }
    ckpt_catalog *cat;
    ckpt_err err;
    if (ckpt_open(argv[1], NULL, &cat, &err)) {
        fprintf(stderr, "convert_tool: %s\n", err.msg);
        return 2;
    }
    ckpt_write_opts opts = {.max_shard_size = argc > 3 ? strtoull(argv[3], NULL, 10) : 0};
    int rc = ckpt_write(cat, argv[2], &opts, &err);
    if (rc) fprintf(stderr, "convert_tool: %s\n", err.msg);
    ckpt_close(cat);
    return rc ? 2 : 0;
}
