/* libFuzzer harness: seekable zstd sources (core/io/zstd_seekable.c) under the safetensors decoder.
 * The seek table, the frames and the cache are all reached: everything the mount would show is
 * read back, frame by frame. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fz_file_harness(data, size, "model.safetensors.zst", NULL);
}
