/* Conversion profiles: a catalog rewritten for one consumer's conventions (convert --profile). */
#ifndef CKPT_PROFILE_H
#define CKPT_PROFILE_H

#include "../ckpt.h"
#include "../util/json.h"
#include "../util/strbuf.h"

/* HF GPT-2 -> LightwatchAI2 .lwt names, layout and header (see profile_lightwatch.c). */
int ckpt_profile_lightwatch_gpt2(const ckpt_catalog *in, ckpt_catalog **out, ckpt_err *err);

/* A Hugging Face llama or gpt2 folder laid out for llama.cpp (profile_llamacpp.c): llama.cpp
 * tensor names, q/k rows in llama.cpp's rope order, Conv1D weights transposed, and a
 * "gguf_kv" document of the hyper-parameters and tokenizer that the GGUF writer emits. *out
 * stays NULL (and 0 is returned) for a source without config.json or of another family: its
 * GGUF is a plain tensor container. *note (malloc'd or NULL) says what is missing. */
int ckpt_profile_llamacpp(const ckpt_catalog *in, ckpt_catalog **out, char **note, ckpt_err *err);
/* The tokenizer KVs (gguf_vocab.c), appended to kv as ",\n[key, type, value]" records; cfg is
 * config.json's root (special token ids). A folder without a BPE tokenizer.json is refused. */
int ckpt_gguf_vocab_kvs(const ckpt_catalog *in, const char *pre, uint64_t n_vocab,
                        const json_value *cfg, strbuf *kv, char **note, ckpt_err *err);
/* The catalog's aux file `name` parsed: 0, 1 when there is none, or -errno. *text backs doc
 * and is the caller's to free after json_doc_free. */
int ckpt_read_aux_json(const ckpt_catalog *cat, const char *name, char **text, json_doc *doc,
                       ckpt_err *err);

#endif
