/* libFuzzer harness: the GGUF decoder (packs reach split files: model-00001-of-0000N.gguf +
 * siblings). The input is the file (named model.gguf), or a pack of files whose first one is opened
 * (fuzz_common.h); everything the mount would show is then read and checked. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fz_file_harness(data, size, "model.gguf", ckpt_format_named("gguf"));
}
