/* libFuzzer harness: NumPy .npz archives.
 * The input is the file (named arrays.npz), or a pack of files whose first one is opened
 * (fuzz_common.h); everything the mount would show is then read and checked. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fz_file_harness(data, size, "arrays.npz", ckpt_format_named("npz"));
}
