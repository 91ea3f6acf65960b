/* The table of formats ckpt_open tries, in order. A new format is one file in this folder that
 * defines its descriptor, and one row here. */
#include "formats.h"

#include <string.h>

extern const ckpt_format format_hf_dir, format_meta_mp, format_deepspeed, format_nemo_step,
    format_dcp, format_dcp_hf, format_gguf, format_gptrs, format_burnpack, format_lwt,
    format_mlfw_tp, format_folder, format_npz, format_onnx, format_keras, format_keras_h5;

/* Files are probed by content, directories by the names they hold; each kind in the order of
 * the rows that have a probe (resp. probe_dir) for it.
 *
 * Directories: an HF directory first (what transformers would load); Meta's consolidated.NN.pth
 * + params.json and DeepSpeed's latest + global_stepN/ next (marker files no layout below has);
 * a NeMo step directory before plain DCP because its model/ may itself be DCP and it has no
 * .metadata of its own; native DCP (its .metadata names every file) before DCP-HF, which takes
 * whatever shard files it finds; MLFramework's metadata.bin + shard_rank0.pt; last any folder
 * that holds checkpoint files (each probed by content), since every layout above is one too.
 *
 * Files: the formats with a magic number first (GGUF, a zip or pickle for torch, GPTRSCHK/
 * GPTRSTEN, Burnpack, LWT, a tar's ustar header), then safetensors, whose probe is a plausibility
 * check of a length and a JSON header (a file of a magic-number format whose first bytes happen
 * to parse as a header length must not be taken for safetensors); MLFramework's rank files have
 * no magic at all and are probed last. */
const ckpt_format *const ckpt_formats[] = {
    &format_hf_dir,      /* directory */
    &format_meta_mp,     /* directory */
    &format_deepspeed,   /* directory */
    &format_nemo_step,   /* directory */
    &format_dcp,         /* directory */
    &format_dcp_hf,      /* directory */
    &format_gguf,        /* file */
    &format_keras_h5,    /* file: HDF5 (Keras .weights.h5) */
    &format_keras,       /* file: a zip of Keras's members, before torch's zips */
    &format_npz,         /* file: a zip of .npy members, before torch's zips */
    &format_torch_zip,   /* file */
    &format_gptrs,       /* file */
    &format_burnpack,    /* file */
    &format_lwt,         /* file */
    &format_tar,         /* file: a container whose members are checkpoints */
    &format_safetensors, /* file */
    &format_onnx,        /* file, no magic: a ModelProto's first fields */
    &format_mlfw_tp,     /* file and directory, no magic */
    &format_folder,      /* directory of checkpoint files, the last resort */
    NULL,
};

const ckpt_format *ckpt_format_named(const char *name) {
    for (const ckpt_format *const *t = ckpt_formats; *t; t++)
        if (strcmp((*t)->name, name) == 0) return *t;
    return NULL;
}
