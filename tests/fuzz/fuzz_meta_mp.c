/* libFuzzer harness: Meta model-parallel directories (params.json + consolidated.NN.pth). The
 * input is a pack of files (fuzz_common.h) written as a directory, which is opened like
 * `ckptfs DIR MNT`; everything the mount would show, the Llama HF view included, is then read
 * and checked. Packs the directory probe refuses are rejected. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fz_dir_harness(data, size, meta_mp_probe);
}
