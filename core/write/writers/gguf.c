/* gguf writer: the layout of gguf_layout.c (version 3, little-endian, laid out the way ggml's
 * own reader insists on, so that llama.cpp, gguf-py and ckptfs all read the result), streamed
 * part by part; the mount's view=gguf serves the same layout.
 *
 *   "GGUF", u32 version 3, u64 tensor_count, u64 kv_count, the KVs, the tensor infos (name,
 *   u32 n_dims, n_dims x u64 ne with ne[0] the fastest dimension, u32 ggml type, u64 offset),
 *   zero padding to the alignment, then the tensors in info order, each padded with zeros to a
 *   multiple of the alignment (the last one too: ggml reads the padded total).
 *
 * Decisions:
 * - Alignment 32, written as general.alignment (UINT32) so no reader has to assume it.
 * - "ckptfs.source_format" (STRING) names the format the tensors came from.
 * - From a GGUF source the KVs of its first part are copied byte for byte, in their order and
 *   with their types (metadata.json shows them only as JSON, which loses the types), except
 *   general.alignment, the split.* keys and ckptfs.source_format, which this file restates.
 *   Other sources have no GGUF metadata: general.architecture and the like are not invented,
 *   except from a "gguf_kv" document (profile_llamacpp.c: a JSON array of [key, type, value],
 *   type str, u32, f32, arr_str or arr_i32), whose KVs are written after the copied ones.
 * - Refused, naming the tensor: dtypes ggml has no type for (BOOL, unsigned, complex, F8, F4,
 *   F6), more than 4 dims, names of 64 bytes or more (ggml's GGML_MAX_NAME counts the NUL),
 *   names that are not UTF-8 or hold a NUL, a block type whose last dim is not a whole number
 *   of blocks, incomplete tensors, and two model tensors with one name.
 * - A scalar is written with n_dims 0 (ggml and ckptfs read it back as a scalar; a [1] would
 *   change its shape). */
#include "writers.h"

#include "../gguf_layout.h"

static int write_gguf(out_file *f, const ckpt_catalog *cat, ckpt_err *err) {
    gguf_layout L;
    int rc = gguf_layout_build(cat, f->final_path, &L, err);
    if (rc) return rc;
    for (size_t p = 0; p < L.vf.nparts && !f->failed; p++) {
        const ckpt_vpart *part = &L.vf.parts[p];
        if (part->tensor) /* always a whole tensor: its name goes in a read error */
            out_tensor(f, cat, part->tensor);
        else
            out_bytes(f, part->mem, (size_t)part->length);
    }
    rc = f->failed;
    gguf_layout_free(&L);
    return rc;
}

const ckpt_writer writer_gguf = {.suffix = ".gguf", .write = write_gguf, .zst_ok = true};
