/* libFuzzer harness: tar archives as containers (model.tar, .nemo): the header walk (pax, GNU
 * long names, base-256 sizes, checksums) and the members read in place as checkpoints. The input
 * is the archive (named model.tar); everything the mount would show is then read and checked. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fz_file_harness(data, size, "model.tar", ckpt_format_named("tar"));
}
