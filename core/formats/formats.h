/* The decoder interface: one file per format in core/formats/. A decoder is chosen by content
 * (probe on the first bytes), never by file name alone. */
#ifndef CKPT_FORMATS_H
#define CKPT_FORMATS_H

#include "../model/catalog.h"
#include "../model/st_names.h"

enum { PROBE_BYTES = 512 };

/* One descriptor per format file, defined at the end of that file with designated initializers;
 * a format reads files (probe + load), directories (probe_dir + load_dir), or both. */
typedef struct ckpt_format {
    const char *name;  /* what the catalog records as its format (a directory loader may refine
                          it: "safetensors-sharded", "peft-adapter") */
    const char *label; /* how messages name it */
    /* True when head (the first n bytes of a file of file_size bytes) looks like this format. */
    bool (*probe)(const unsigned char *head, size_t n, uint64_t file_size);
    /* Adds the tensors of an already registered source file to the catalog. */
    int (*load)(ckpt_catalog *cat, uint32_t source, ckpt_err *err);
    /* File names (NULL-terminated) that make a file this format's even when no probe matched:
     * a damaged file gets its own decoder's precise complaint. */
    const char *const *suffixes;
    /* True when the directory holds a checkpoint of this layout. */
    bool (*probe_dir)(const char *dir);
    /* Adds the tensors of the directory cat->root to the catalog. */
    int (*load_dir)(ckpt_catalog *cat, ckpt_err *err);
    const char *dir_looks_for; /* what probe_dir looks for, in "no checkpoint" messages */
    /* What the checks at open cover (ckptfs verify reports it); NULL: structure only, the
     * format stores no checksums of tensor data. */
    const char *integrity;
    bool no_magic; /* probe is a plausibility check, not a magic number (ckpt_format_probe_bytes
                      skips it) */
} ckpt_format;

/* Every format, in probe order, NULL-terminated (formats.c; the order is explained there).
 * A decoder's load() may register more sources (the other parts of a split file) with
 * catalog_add_source. It must check every length, offset and count against the file before use
 * and name the file, the field and the byte offset in its error messages. Format-level metadata
 * goes to catalog_add_doc (one JSON value per key of .ckptfs/metadata.json); per-tensor format
 * fields go to catalog_set_extra. */
extern const ckpt_format *const ckpt_formats[];

/* The row of that name, or NULL (the fuzz harnesses drive one decoder each). */
const ckpt_format *ckpt_format_named(const char *name);

/* Descriptors other decoders build on (a directory of safetensors or .bin files, a NeMo step
 * holding DCP or HF directories, the members of a tar archive). */
extern const ckpt_format format_safetensors;
extern const ckpt_format format_torch_zip;
extern const ckpt_format format_tar; /* a container: its members are checkpoints */

/* Directory probes and loaders that other decoders call on subdirectories (nemo_step.c) and
 * that the fuzz harnesses drive directly. */
bool hf_dir_probe(const char *dir);
int hf_dir_load(ckpt_catalog *cat, ckpt_err *err);
bool dcp_hf_probe(const char *dir);
int dcp_hf_load(ckpt_catalog *cat, ckpt_err *err);
bool mlfw_tp_dir_probe(const char *dir);
int mlfw_tp_dir_load(ckpt_catalog *cat, ckpt_err *err);

/* Native PyTorch DCP: .metadata + __R_N.distcp (dcp.c). dcp_load_dir reads the checkpoint in
 * `dir` into a catalog rooted elsewhere (a NeMo step directory): sources are shown as
 * rel_prefix + name, the format document goes under doc_key, `how` says where tensors go (NULL:
 * model tensors at the root, optimizer state under optim/). */
typedef struct dcp_layout {
    const char *model_prefix; /* NULL = the root, or e.g. "model/" (still the model's) */
    bool all_optim;           /* every key is optimizer state (a NeMo optim/ directory) */
} dcp_layout;
bool dcp_probe(const char *dir);
int dcp_load(ckpt_catalog *cat, ckpt_err *err);
int dcp_load_dir(ckpt_catalog *cat, const char *dir, const char *rel_prefix, const char *doc_key,
                 const dcp_layout *how, ckpt_err *err);

/* NeMo Automodel step directories (model/, optim/, model/consolidated/, model/.hf_metadata/,
 * PEFT adapters) and bare PEFT adapter directories (nemo_step.c). */
bool nemo_step_probe(const char *dir);
int nemo_step_load(ckpt_catalog *cat, ckpt_err *err);

/* A Hugging Face hub cache repo folder (refs/ + snapshots/, hf_cache.c): the snapshot directory
 * `revision` (NULL: main) names goes to snapshot, and a JSON object saying which to doc. */
bool hf_cache_probe(const char *dir);
int hf_cache_resolve(const char *repo, const char *revision, char *snapshot, size_t cap,
                     strbuf *doc, ckpt_err *err);
/* A folder holding HF cache repo folders (~/.cache/huggingface/hub itself): how many models--*
 * repos it holds (0: none), their names into out (", " between, cut with "..."). */
int hf_cache_root_repos(const char *dir, char *out, size_t cap);

/* Meta's model-parallel consolidated.NN.pth + params.json (meta_mp.c): consolidated on read,
 * with a Llama-named HF view. */
bool meta_mp_probe(const char *dir);
int meta_mp_load(ckpt_catalog *cat, ckpt_err *err);

/* DeepSpeed ZeRO 1/2/3 checkpoints (deepspeed.c): `latest` + global_stepN/, or the step
 * directory itself; fp32 master weights assembled from the ranks' flat partitions. */
bool deepspeed_probe(const char *dir);
int deepspeed_load(ckpt_catalog *cat, ckpt_err *err);

/* A folder of single-file checkpoints (folder.c): one is mounted as the model, several each
 * as a subtree named after its file. */
bool folder_probe(const char *dir);
int folder_load(ckpt_catalog *cat, ckpt_err *err);
/* Loads the registered sources as checkpoints of the given formats: one is the model, several
 * are subtrees named after their relpaths, set aside, listed in summary.json; set_format names
 * the whole in that case. */
int folder_load_set(ckpt_catalog *cat, const uint32_t *sources, const ckpt_format *const *formats,
                    size_t n, const char *set_format, ckpt_err *err);
/* The decoder first bytes call for (by magic; open.c), or NULL. */
const ckpt_format *ckpt_format_probe_bytes(const unsigned char *head, size_t n, uint64_t size);
/* The decoder a file's first bytes call for (by magic; open.c), or NULL. */
const ckpt_format *ckpt_format_probe_path(const char *path);

/* The names in dir (local or remote, place.h) that keep accepts (NULL: all), sorted bytewise,
 * or a negative errno (dirlist.c). */
struct place_entry;
int dirlist_names(const char *dir, bool (*keep)(const struct place_entry *e, void *ctx), void *ctx,
                  char ***names, size_t *count);
/* The regular files of dir whose names end in suffix, sorted. */
int dirlist_files(const char *dir, const char *suffix, char ***names, size_t *count);
void dirlist_free(char **names, size_t count);

#endif
