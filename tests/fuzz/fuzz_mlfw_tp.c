/* libFuzzer harness: MLFramework centralized tensor-parallel files (no magic: inputs its probe
 * refuses are rejected). The input is the file (named model.ckpt), or a pack of files whose first
 * one is opened (fuzz_common.h); everything the mount would show is then read and checked. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fz_file_harness(data, size, "model.ckpt", ckpt_format_named("mlframework-tp"));
}
