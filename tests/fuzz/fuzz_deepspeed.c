/* libFuzzer harness: DeepSpeed ZeRO checkpoints (latest + global_stepN/ with the model and
 * optimizer states files). The input is a pack of files (fuzz_common.h) written as a directory,
 * which is opened like `ckptfs DIR MNT`; everything the mount would show is then read and
 * checked. Packs the directory probe refuses are rejected. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fz_dir_harness(data, size, deepspeed_probe);
}
