/* libFuzzer harness: torch.save files (zip archives with data.pkl, and the legacy format).
 * The input is the file (named model.pt), or a pack of files whose first one is opened
 * (fuzz_common.h); everything the mount would show is then read and checked. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fz_file_harness(data, size, "model.pt", ckpt_format_named("torch-zip"));
}
