/* DeepSpeed ZeRO checkpoints (stages 1, 2 and 3), as engine.save_checkpoint writes them:
 *
 *   latest                                   the tag of the last save ("global_step100")
 *   global_step100/mp_rank_00_model_states.pt                 stage 1/2: the module's own
 *                                                              (bf16/fp16) state_dict, buffer
 *                                                              names, param_shapes, shared and
 *                                                              frozen parameters
 *   global_step100/zero_pp_rank_R_mp_rank_00_model_states.pt  stage 3: one per rank (its frozen
 *                                                              fragments; placeholders in module)
 *   global_step100/[bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt   one per data-parallel
 *                                                              rank: its flat fp32 partition of
 *                                                              every param group, and the
 *                                                              optimizer's moments for it
 *
 * The fp32 master weights are assembled on read exactly as deepspeed/utils/zero_to_fp32.py
 * assembles them, as pieces of the flat partitions inside the torch zip records (nothing is
 * loaded or copied):
 *   stage 1/2: per group, the ranks' single_partition_of_fp32_groups[g] concatenated are the
 *     group's parameters back to back in param_shapes[g] order; the last rank's partition has
 *     its alignment padding stripped, so what the parameters use and what the ranks hold must
 *     agree once both are rounded up to 2 * world_size elements;
 *   stage 3: every parameter (param_shapes of all groups, in order) is cut into world_size
 *     slices of ceil(numel / world_size) elements, slice r at the same offset of rank r's
 *     fp32_flat_groups (one run over its groups), the last slice padded;
 *   frozen parameters come from frozen_param_fragments (stage 3: the ranks' fragments joined),
 *   buffers from the module's state_dict, and each shared_params entry is its source again.
 * The module's own weights are shown under module/, the optimizer's per-parameter state
 * (exp_avg, exp_avg_sq) under optim/, both assembled like the weights and set aside.
 *
 * The pickles hold DeepSpeed's own classes and enums (the config, the loss scaler, ZeroStageEnum
 * through builtins.getattr): any deepspeed.* global and builtins.getattr are read as inert data,
 * never imported or called. */
#include "../io/place.h"
#include "../read/f32_source.h"
#include "formats.h"

#include "../util/hashmap.h"
#include "../util/json.h"
#include "../parse/pickle.h"
#include "../util/strbuf.h"
#include "torch_zip.h"

#include <errno.h>
#include <stdarg.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_RANKS = 65536, LATEST_LIMIT = 4096 };

static const pk_global ds_globals[] = {
    {"deepspeed", "*", PK_G_OPAQUE, -1, 0, NULL},
    {"builtins", "getattr", PK_G_OPAQUE, -1, 0, NULL},
};
static const pk_table ds_table = {ds_globals, sizeof ds_globals / sizeof *ds_globals};

typedef struct ds_file {
    uint32_t source;
    const char *name; /* relpath, for messages */
    torch_embedded e;
    char *text; /* e.values in braces */
    json_doc vals;
    bool parsed;
    hashmap tensors; /* name -> index in e.tensors */
} ds_file;

typedef struct param {
    const char *name; /* points into a values document */
    size_t name_len;
    uint32_t ndim;
    uint64_t shape[CKPT_MAX_DIMS];
    uint64_t numel;
    size_t group;
} param;

typedef struct ds {
    ckpt_catalog *cat;
    ckpt_err *err;
    char step_dir[PATH_MAX];
    char tag[256];  /* "" when the root is the step directory */
    char rel[300];  /* tag + "/" or "" */
    ds_file *optim; /* by rank */
    ds_file *model; /* rank 0 only for stage 1/2 */
    size_t world, nmodel;
    int stage;
    const char *optim_prefix; /* "zero_pp_rank_", "bf16_zero_pp_rank_" */
    size_t ngroups;
    param *params;
    size_t nparams;
    hashmap shown; /* names of the fp32 state dict -> catalog index */
    size_t ntrainable, nfrozen, nbuffers, nshared, nmodule, noptim;
} ds;

/* ---- files ---- */

static bool is_file(const char *path) {
    return place_kind(path) == PLACE_FILE; /* a local path or a URL */
}

/* Parses "<prefix>zero_pp_rank_R_mp_rank_MM_<kind>_states.pt": R, MM; false otherwise. */
static bool zero_name(const char *name, const char *kind, long *rank, long *mp, size_t *prefix) {
    const char *z = strstr(name, "zero_pp_rank_");
    if (!z) return false;
    *prefix = (size_t)(z - name);
    char tail[64];
    int used = 0;
    if (sscanf(z, "zero_pp_rank_%ld_mp_rank_%ld_%63[a-z_.]%n", rank, mp, tail, &used) != 3)
        return false;
    char want[64];
    snprintf(want, sizeof want, "%s_states.pt", kind);
    return z[used] == '\0' && strcmp(tail, want) == 0 && *rank >= 0 && *mp >= 0;
}

static bool has_optim_files(const char *dir) {
    char **names;
    size_t n;
    if (dirlist_files(dir, "_optim_states.pt", &names, &n)) return false;
    dirlist_free(names, n);
    return n > 0;
}

/* A step directory: the files engine.save_checkpoint writes, mp_rank_MM_model_states.pt or
 * [bf16_]zero_pp_rank_R_mp_rank_MM_{model,optim}_states.pt. */
static bool is_step_dir(const char *dir) {
    char **names;
    size_t n;
    if (dirlist_files(dir, "_states.pt", &names, &n)) return false;
    bool found = false;
    for (size_t i = 0; i < n && !found; i++) {
        long r, mp;
        size_t pl;
        found = strncmp(names[i], "mp_rank_", 8) == 0 ||
                zero_name(names[i], "optim", &r, &mp, &pl) ||
                zero_name(names[i], "model", &r, &mp, &pl);
    }
    dirlist_free(names, n);
    return found;
}

static bool keep_dir(const struct place_entry *e, void *ctx) {
    (void)ctx;
    return e->kind == PLACE_DIR;
}

/* Some directory beside `latest` is a step directory. */
static bool has_step_dir(const char *dir) {
    char **names, path[PATH_MAX];
    size_t n;
    if (dirlist_names(dir, keep_dir, NULL, &names, &n)) return false;
    bool found = false;
    for (size_t i = 0; i < n && !found; i++) {
        int w = snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        found = w > 0 && (size_t)w < sizeof path && is_step_dir(path);
    }
    dirlist_free(names, n);
    return found;
}

/* `latest` alone is a common name (a folder of safetensors may hold an unrelated one): the
 * directory is DeepSpeed's only if a step directory is there too, the one `latest` names or,
 * when that tag is unusable, another one (the load then refuses the tag by name). Without
 * `latest`, a step directory itself is probed by its optimizer files. */
bool deepspeed_probe(const char *dir) {
    char path[PATH_MAX];
    int w = snprintf(path, sizeof path, "%s/latest", dir);
    if (w <= 0 || (size_t)w >= sizeof path || !is_file(path)) return has_optim_files(dir);
    char tag[LATEST_LIMIT + 1];
    size_t n = 0;
    if (place_read_head(path, tag, LATEST_LIMIT, &n, NULL)) return false;
    while (n > 0 && (tag[n - 1] == '\n' || tag[n - 1] == '\r' || tag[n - 1] == ' ')) n--;
    tag[n] = '\0';
    bool one_name = n > 0 && strlen(tag) == n && !strchr(tag, '/') && strcmp(tag, ".") != 0 &&
                    strcmp(tag, "..") != 0;
    one_name = one_name && n < sizeof((ds *)0)->tag; /* what the load accepts */
    w = snprintf(path, sizeof path, "%s/%.255s", dir, tag);
    if (one_name && w > 0 && (size_t)w < sizeof path && is_step_dir(path)) return true;
    return has_step_dir(dir) || has_optim_files(dir);
}

static int read_file(ds *d, ds_file *f, const char *name) {
    char path[PATH_MAX], rel[PATH_MAX];
    int w = snprintf(path, sizeof path, "%s/%s", d->step_dir, name);
    int w2 = snprintf(rel, sizeof rel, "%s%s", d->rel, name);
    if (w < 0 || (size_t)w >= sizeof path || w2 < 0 || (size_t)w2 >= sizeof rel)
        return ckpt_fail(d->err, -ENAMETOOLONG, "%s/%s: path too long", d->step_dir, name);
    int rc = catalog_add_source(d->cat, path, rel, &f->source, d->err);
    if (rc) return rc;
    f->name = d->cat->sources[f->source].relpath;
    uint64_t size = d->cat->sources[f->source].size;
    if ((rc = torch_zip_read_with(d->cat, f->source, 0, size, f->name, "", 0, &ds_table, &f->e,
                                  d->err)))
        return rc;
    strbuf sb;
    sb_init(&sb);
    sb_putc(&sb, '{');
    sb_put(&sb, f->e.values, f->e.values_len);
    sb_putc(&sb, '}');
    size_t len = 0;
    if (!(f->text = sb_take(&sb, &len))) return ckpt_fail(d->err, -ENOMEM, "out of memory");
    json_error jerr;
    if ((rc = json_parse(&f->vals, f->text, len, &jerr)))
        return ckpt_fail(d->err, rc, "%s: the pickle's values: %s", f->name, jerr.msg);
    f->parsed = true;
    if (!hm_init(&f->tensors, f->e.ntensors + 1))
        return ckpt_fail(d->err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < f->e.ntensors; i++) {
        bool added;
        if (!hm_put(&f->tensors, f->e.tensors[i].name, f->e.tensors[i].name_len, i, &added))
            return ckpt_fail(d->err, -ENOMEM, "out of memory");
    }
    return 0;
}

static void free_file(ds_file *f) {
    torch_embedded_free(&f->e);
    if (f->parsed) json_doc_free(&f->vals);
    free(f->text);
    hm_free(&f->tensors);
}

static const torch_embedded_tensor *tensor(const ds_file *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static const torch_embedded_tensor *tensor(const ds_file *f, const char *fmt, ...) {
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof name) return NULL;
    const hm_entry *he = hm_get(&f->tensors, name, (size_t)n);
    return he ? &f->e.tensors[he->value] : NULL;
}

static const json_value *value(const ds_file *f, const char *key) {
    return json_member(f->vals.root, key);
}

/* ---- the step directory ---- */

static int resolve_step(ds *d) {
    const char *root = d->cat->root;
    char path[PATH_MAX];
    int w = snprintf(path, sizeof path, "%s/latest", root);
    if (w < 0 || (size_t)w >= sizeof path)
        return ckpt_fail(d->err, -ENAMETOOLONG, "%s: path too long", root);
    if (!is_file(path)) {
        snprintf(d->step_dir, sizeof d->step_dir, "%s", root);
        return 0;
    }
    char buf[LATEST_LIMIT + 1];
    size_t got;
    int rc = place_read_head(path, buf, LATEST_LIMIT + 1, &got, NULL);
    if (rc) return ckpt_fail(d->err, rc, "%s: %s", path, strerror(-rc));
    ssize_t n = (ssize_t)got;
    if (n > LATEST_LIMIT)
        return ckpt_fail(d->err, -EINVAL, "%s: over %d bytes, not a checkpoint tag", path,
                         LATEST_LIMIT);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) n--;
    buf[n] = '\0';
    /* The tag is a directory beside `latest`: one name, never a path that leads elsewhere. */
    bool bad = n == 0 || (size_t)n >= sizeof d->tag || memchr(buf, '/', (size_t)n) ||
               memchr(buf, '\0', (size_t)n) || strcmp(buf, ".") == 0 || strcmp(buf, "..") == 0;
    if (bad)
        return ckpt_fail(d->err, -EINVAL,
                         "%s: names \"%.*s\", which is not a directory beside it (a tag is one "
                         "name: no '/', not \".\" or \"..\")",
                         path, SHOWN_NAME(buf, (size_t)n));
    memcpy(d->tag, buf, (size_t)n + 1);
    snprintf(d->rel, sizeof d->rel, "%s/", d->tag);
    w = snprintf(d->step_dir, sizeof d->step_dir, "%s/%s", root, d->tag);
    if (w < 0 || (size_t)w >= sizeof d->step_dir || place_kind(d->step_dir) != PLACE_DIR)
        return ckpt_fail(d->err, -ENOENT, "%s: names \"%s\", but %s is not a directory", path,
                         d->tag, d->step_dir);
    return 0;
}

static int find_optim_files(ds *d) {
    char **names;
    size_t n;
    int rc = dirlist_files(d->step_dir, "_optim_states.pt", &names, &n);
    if (rc) return ckpt_fail(d->err, rc, "%s: cannot list: %s", d->step_dir, strerror(-rc));
    const char **by_rank = calloc(n ? n : 1, sizeof *by_rank);
    size_t count = 0, prefix_len = 0;
    if (!by_rank) rc = ckpt_fail(d->err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < n && !rc; i++) {
        long r, mp;
        size_t pl;
        if (!zero_name(names[i], "optim", &r, &mp, &pl)) continue;
        if (mp != 0)
            rc = ckpt_fail(d->err, -ENOTSUP,
                           "%s/%s: model-parallel rank %ld: ZeRO checkpoints of several model "
                           "parallel ranks are not supported",
                           d->step_dir, names[i], mp);
        else if ((size_t)r >= n)
            rc = ckpt_fail(d->err, -ENOENT,
                           "%s/%s: rank %ld, but there are only %zu optimizer state files: the "
                           "files of the ranks before it are missing",
                           d->step_dir, names[i], r, n);
        else if (by_rank[r])
            rc = ckpt_fail(d->err, -EINVAL, "%s: %s and %s are both rank %ld", d->step_dir,
                           by_rank[r], names[i], r);
        else {
            by_rank[r] = names[i];
            prefix_len = pl;
            count++;
        }
    }
    if (!rc && count == 0)
        rc = ckpt_fail(d->err, -ENOENT,
                       "%s: no *zero_pp_rank_R_mp_rank_00_optim_states.pt files: not a DeepSpeed "
                       "ZeRO checkpoint directory",
                       d->step_dir);
    for (size_t r = 0; r < count && !rc; r++)
        if (!by_rank[r])
            rc = ckpt_fail(d->err, -ENOENT,
                           "%s/%.*szero_pp_rank_%zu_mp_rank_00_optim_states.pt is "
                           "missing (%zu ranks' files found)",
                           d->step_dir, (int)prefix_len,
                           by_rank[count - 1] ? by_rank[count - 1] : "", r, count);
    if (!rc && !(d->optim = calloc(count, sizeof *d->optim)))
        rc = ckpt_fail(d->err, -ENOMEM, "out of memory");
    for (size_t r = 0; r < count && !rc; r++) {
        d->world = r + 1;
        rc = read_file(d, &d->optim[r], by_rank[r]);
    }
    if (!rc && prefix_len) d->optim_prefix = "bf16_";
    free(by_rank);
    dirlist_free(names, n);
    return rc;
}

/* ---- what the optimizer files say ---- */

/* ZeroStageEnum as pickled: an int, ZeroStageEnum(2) (REDUCE of the class), or, from Python
 * 3.11 on, getattr(ZeroStageEnum, "gradients"). */
static int stage_of(const json_value *v) {
    static const char *const names[] = {"disabled", "optimizer_states", "gradients", "weights"};
    uint64_t u;
    if (!v) return -1;
    if (json_as_u64(v, &u)) return u <= 3 ? (int)u : -1;
    const json_value *args = json_member(v, "args");
    if (!args || args->type != JSON_ARRAY) return -1;
    const json_value *call = json_member(v, "call");
    if (json_str_eq(call, "builtins.getattr") && args->count == 2) {
        const json_value *name = args->head->next;
        for (int i = 0; i < 4; i++)
            if (json_str_eq(name, names[i])) return i;
        if (json_str_eq(name, "max_stage")) return 3;
        return -1;
    }
    if (call && call->type == JSON_STRING && args->count == 1 && json_as_u64(args->head, &u))
        return u <= 3 ? (int)u : -1;
    return -1;
}

static int read_optim_header(ds *d) {
    const ds_file *f = &d->optim[0];
    if (!value(f, "optimizer_state_dict.zero_stage"))
        return ckpt_fail(d->err, -EINVAL,
                         "%s: no optimizer_state_dict.zero_stage: not a ZeRO "
                         "checkpoint",
                         f->name);
    d->stage = stage_of(value(f, "optimizer_state_dict.zero_stage"));
    if (d->stage < 1)
        return ckpt_fail(d->err, -EINVAL,
                         "%s: optimizer_state_dict.zero_stage is not ZeRO stage 1, 2 or 3",
                         f->name);
    const json_value *pc = value(f, "optimizer_state_dict.partition_count");
    uint64_t world = 0, u;
    if (pc && pc->type == JSON_ARRAY) {
        for (const json_value *x = pc->head; x; x = x->next)
            if (json_as_u64(x, &u) && u > world) world = u;
    } else if (pc) {
        json_as_u64(pc, &world);
    }
    if (world == 0 || world > MAX_RANKS)
        return ckpt_fail(d->err, -EINVAL,
                         "%s: optimizer_state_dict.partition_count is not a rank count", f->name);
    if (world != d->world) {
        if (world > d->world)
            return ckpt_fail(d->err, -ENOENT,
                             "%s/%szero_pp_rank_%zu_mp_rank_00_optim_states.pt is missing: "
                             "partition_count says %llu ranks, %zu files are there",
                             d->step_dir, d->optim_prefix ? d->optim_prefix : "", d->world,
                             (unsigned long long)world, d->world);
        return ckpt_fail(d->err, -EINVAL,
                         "%s: partition_count says %llu ranks but %zu optimizer state files are "
                         "there (an old checkpoint's files left beside this one?)",
                         d->step_dir, (unsigned long long)world, d->world);
    }
    const char *key = d->stage <= 2 ? "single_partition_of_fp32_groups" : "fp32_flat_groups";
    while (tensor(f, "optimizer_state_dict.%s.%zu", key, d->ngroups)) d->ngroups++;
    if (d->ngroups == 0)
        return ckpt_fail(d->err, -EINVAL, "%s: no optimizer_state_dict.%s tensors", f->name, key);
    for (size_t r = 0; r < d->world; r++)
        for (size_t g = 0; g < d->ngroups; g++) {
            const torch_embedded_tensor *t =
                tensor(&d->optim[r], "optimizer_state_dict.%s.%zu", key, g);
            const torch_embedded_tensor *t0 = tensor(f, "optimizer_state_dict.%s.%zu", key, g);
            if (!t)
                return ckpt_fail(d->err, -EINVAL,
                                 "%s: no optimizer_state_dict.%s.%zu, which %s has",
                                 d->optim[r].name, key, g, f->name);
            if (t->ndim != 1 || !t->row_major || t->dtype != t0->dtype)
                return ckpt_fail(d->err, -EINVAL,
                                 "%s: optimizer_state_dict.%s.%zu is not a flat tensor of %s's "
                                 "dtype",
                                 d->optim[r].name, key, g, f->name);
        }
    return 0;
}

/* ---- param_shapes ---- */

static bool parse_shape(const json_value *v, param *p) {
    if (!v || v->type != JSON_ARRAY || v->count > CKPT_MAX_DIMS) return false;
    p->ndim = 0;
    p->numel = 1;
    for (const json_value *x = v->head; x; x = x->next) {
        if (!json_as_u64(x, &p->shape[p->ndim]) ||
            __builtin_mul_overflow(p->numel, p->shape[p->ndim], &p->numel))
            return false;
        p->ndim++;
    }
    return true;
}

static int read_param_shapes(ds *d) {
    const ds_file *f = &d->model[0];
    const json_value *root = f->vals.root;
    if (!root || root->type != JSON_OBJECT) return ckpt_fail(d->err, -EINVAL, "%s: empty", f->name);
    const json_value *none = json_member(root, "param_shapes");
    if (none && none->type == JSON_NULL)
        return ckpt_fail(d->err, -EINVAL, "%s: param_shapes is None: not a ZeRO checkpoint",
                         f->name);
    if (!(d->params = calloc(root->count + 1, sizeof *d->params)))
        return ckpt_fail(d->err, -ENOMEM, "out of memory");
    static const char key[] = "param_shapes.";
    const size_t kl = sizeof key - 1;
    size_t last_group = 0;
    for (const json_value *m = root->head; m; m = m->next) {
        if (m->key_len <= kl || memcmp(m->key, key, kl) != 0) continue;
        size_t i = kl, g = 0;
        while (i < m->key_len && m->key[i] >= '0' && m->key[i] <= '9' && g < (1u << 20))
            g = g * 10 + (size_t)(m->key[i++] - '0');
        param *p = &d->params[d->nparams];
        if (i == kl || i >= m->key_len || m->key[i] != '.' || g < last_group || !parse_shape(m, p))
            return ckpt_fail(d->err, -EINVAL,
                             "%s: \"%.*s\" is not a group's parameter shape (byte offset %zu of "
                             "the values)",
                             f->name, SHOWN_NAME(m->key, m->key_len), m->pos);
        if (g >= d->ngroups)
            return ckpt_fail(d->err, -EINVAL,
                             "%s: param_shapes names group %zu, but the optimizer holds %zu "
                             "flat groups",
                             f->name, g, d->ngroups);
        last_group = g;
        p->name = m->key + i + 1;
        p->name_len = m->key_len - i - 1;
        p->group = g;
        d->nparams++;
    }
    return 0;
}

/* ---- pieces ---- */

/* Adds the row-major elements [a, b) of tensor `index` (shape `shape`) as boxes, each a
 * contiguous run of the source from file_offset (element a). */
static int add_flat(ds *d, size_t index, const uint64_t *shape, uint32_t ndim, uint64_t a,
                    uint64_t b, uint32_t source, uint64_t file_offset, uint64_t esz) {
    if (a >= b) return 0;
    if (ndim == 0)
        return catalog_add_piece(d->cat, index, source, file_offset, NULL, NULL, NULL, d->err);
    uint64_t off[CKPT_MAX_DIMS], size[CKPT_MAX_DIMS], inner[CKPT_MAX_DIMS + 1];
    inner[ndim] = 1;
    for (uint32_t k = ndim; k-- > 0;) inner[k] = inner[k + 1] * shape[k];
    while (a < b) {
        /* The outermost dim along which whole blocks of the dims inside it start at a and fit
         * before b: the box is a run of those blocks, up to the end of that dim. */
        uint32_t dim = ndim - 1;
        while (dim > 0 && a % inner[dim] == 0 && b - a >= inner[dim]) dim--;
        uint64_t unit = inner[dim + 1];
        for (uint32_t j = 0; j < ndim; j++) {
            off[j] = j > dim ? 0 : (a / inner[j + 1]) % shape[j];
            size[j] = j < dim ? 1 : shape[j];
        }
        uint64_t room = shape[dim] - off[dim], want = (b - a) / unit;
        size[dim] = want < room ? want : room;
        int rc = catalog_add_piece(d->cat, index, source, file_offset, off, size, NULL, d->err);
        if (rc) return rc;
        a += size[dim] * unit;
        file_offset += size[dim] * unit * esz;
    }
    return 0;
}

static int add_tensor_named(ds *d, const char *prefix, const char *name, size_t len,
                            const char *suffix, ckpt_dtype dt, uint32_t ndim, const uint64_t *shape,
                            size_t *index) {
    strbuf sb;
    sb_init(&sb);
    sb_put(&sb, name, len);
    if (suffix) sb_puts(&sb, suffix);
    int rc = sb.failed
                 ? ckpt_fail(d->err, -ENOMEM, "out of memory")
                 : catalog_add_tensor(d->cat, sb.data, sb.len, dt, ndim, shape, index, d->err);
    sb_free(&sb);
    if (!rc && prefix) rc = catalog_set_prefix(d->cat, *index, prefix, true, d->err);
    return rc;
}

/* The flat tensors one rank holds for a param group: fp32 partitions or optimizer moments. */
typedef const torch_embedded_tensor *(*flat_of)(ds *d, size_t rank, size_t group, const char *key);

static const torch_embedded_tensor *fp32_flat(ds *d, size_t rank, size_t group, const char *key) {
    (void)key;
    return tensor(&d->optim[rank], "optimizer_state_dict.%s.%zu",
                  d->stage <= 2 ? "single_partition_of_fp32_groups" : "fp32_flat_groups", group);
}

static const torch_embedded_tensor *moment_flat(ds *d, size_t rank, size_t group, const char *key) {
    const ds_file *f = &d->optim[rank];
    const torch_embedded_tensor *t =
        d->stage <= 2
            ? tensor(f, "optimizer_state_dict.base_optimizer_state.state.%zu.%s", group, key)
            : tensor(f, "optimizer_state_dict.optimizer_state_dict.state.%zu.%s", group, key);
    if (!t && d->stage <= 2) /* elastic_checkpoint: a list of per-group states */
        t = tensor(f, "optimizer_state_dict.base_optimizer_state.%zu.%s", group, key);
    return t && t->ndim == 1 && t->row_major ? t : NULL;
}

/* The partition length rank r holds of group g (the fp32 partition's, which the moments
 * follow: theirs may keep the padding the fp32 partition strips). */
static uint64_t part_len(ds *d, size_t r, size_t g) {
    return fp32_flat(d, r, g, NULL)->shape[0];
}

/* True when every rank holds the flat tensor of every group (an optimizer without such a
 * state, or a checkpoint saved without it, shows none). */
static bool have_all(ds *d, flat_of get, const char *key) {
    for (size_t g = 0; g < d->ngroups; g++)
        for (size_t r = 0; r < d->world; r++)
            if (!get(d, r, g, key)) return false;
    return true;
}

/* Stage 1/2: every parameter as pieces of the ranks' partitions of its group. */
static int stage2_params(ds *d, flat_of get, const char *key, const char *prefix,
                         const char *suffix) {
    size_t p = 0;
    for (size_t g = 0; g < d->ngroups; g++) {
        uint64_t total = 0;
        for (size_t r = 0; r < d->world; r++) {
            const torch_embedded_tensor *t = get(d, r, g, key);
            if (t->shape[0] < part_len(d, r, g))
                return ckpt_fail(d->err, -EINVAL,
                                 "%s: %s of group %zu has %llu elements, fewer than the %llu of "
                                 "the rank's fp32 partition",
                                 d->optim[r].name, key ? key : "fp32", g,
                                 (unsigned long long)t->shape[0],
                                 (unsigned long long)part_len(d, r, g));
            total += part_len(d, r, g);
        }
        uint64_t offset = 0;
        for (; p < d->nparams && d->params[p].group == g; p++) {
            const param *q = &d->params[p];
            if (q->numel > total || offset > total - q->numel)
                return ckpt_fail(d->err, -EINVAL,
                                 "%s: param_shapes puts \"%.*s\" at elements [%llu, %llu) of "
                                 "group %zu, past the %llu elements the %zu ranks' partitions "
                                 "hold (%s holds the last)",
                                 d->model[0].name, SHOWN_NAME(q->name, q->name_len),
                                 (unsigned long long)offset,
                                 (unsigned long long)(offset + q->numel), g,
                                 (unsigned long long)total, d->world, d->optim[d->world - 1].name);
            const torch_embedded_tensor *t0 = get(d, 0, g, key);
            size_t index;
            int rc = add_tensor_named(d, prefix, q->name, q->name_len, suffix, t0->dtype, q->ndim,
                                      q->shape, &index);
            if (rc) return rc;
            if (!prefix) {
                bool added;
                if (!hm_put(&d->shown, q->name, q->name_len, index, &added))
                    return ckpt_fail(d->err, -ENOMEM, "out of memory");
            }
            uint64_t start = 0;
            for (size_t r = 0; r < d->world && !rc; r++) {
                const torch_embedded_tensor *t = get(d, r, g, key);
                uint64_t len = part_len(d, r, g);
                uint64_t a = offset > start ? offset : start;
                uint64_t b = offset + q->numel < start + len ? offset + q->numel : start + len;
                uint64_t esz = ckpt_dtype_elem_size(t->dtype);
                if (a < b)
                    rc = add_flat(d, index, q->shape, q->ndim, a - offset, b - offset,
                                  d->optim[r].source, t->file_offset + (a - start) * esz, esz);
                start += len;
            }
            if (rc) return rc;
            offset += q->numel;
        }
        /* zero_to_fp32's check: both rounded up to 2 * world_size (the padding stripped from
         * the last rank's partition and NCCL's alignment differ by less than that). */
        uint64_t align = 2 * d->world;
        uint64_t used = (offset + align - 1) / align * align,
                 held = (total + align - 1) / align * align;
        if (used != held)
            return ckpt_fail(d->err, -EINVAL,
                             "%s: param_shapes uses %llu elements of group %zu, but the ranks' "
                             "partitions hold %llu (aligned to %llu: %llu vs %llu): the "
                             "partitions do not belong to these shapes",
                             d->model[0].name, (unsigned long long)offset, g,
                             (unsigned long long)total, (unsigned long long)align,
                             (unsigned long long)used, (unsigned long long)held);
    }
    return 0;
}

/* Stage 3: parameter p's slice r is ceil(numel / world) elements at the same offset of every
 * rank's run of flat groups. */
static int stage3_params(ds *d, flat_of get, const char *key, const char *prefix,
                         const char *suffix) {
    uint64_t *group_start = calloc(d->ngroups + 1, sizeof *group_start);
    if (!group_start) return ckpt_fail(d->err, -ENOMEM, "out of memory");
    int rc = 0;
    for (size_t g = 0; g < d->ngroups && !rc; g++) {
        for (size_t r = 0; r < d->world && !rc; r++) {
            const torch_embedded_tensor *t = get(d, r, g, key);
            if (t->shape[0] != part_len(d, 0, g))
                rc = ckpt_fail(d->err, -EINVAL,
                               "%s: %s group %zu has %llu elements, rank 0's %llu: stage 3 ranks "
                               "hold partitions of one size",
                               d->optim[r].name, key ? key : "fp32_flat_groups", g,
                               (unsigned long long)t->shape[0],
                               (unsigned long long)part_len(d, 0, g));
        }
        group_start[g + 1] = group_start[g] + part_len(d, 0, g);
    }
    uint64_t held = group_start[d->ngroups], offset = 0;
    for (size_t p = 0; p < d->nparams && !rc; p++) {
        const param *q = &d->params[p];
        uint64_t slice = (q->numel + d->world - 1) / d->world;
        if (offset > held || slice > held - offset) {
            rc = ckpt_fail(d->err, -EINVAL,
                           "%s: param_shapes puts \"%.*s\" at elements [%llu, %llu) of each "
                           "rank's partition, past the %llu elements %s holds",
                           d->model[0].name, SHOWN_NAME(q->name, q->name_len),
                           (unsigned long long)offset, (unsigned long long)(offset + slice),
                           (unsigned long long)held, d->optim[0].name);
            break;
        }
        const torch_embedded_tensor *t0 = get(d, 0, 0, key);
        size_t index;
        if ((rc = add_tensor_named(d, prefix, q->name, q->name_len, suffix, t0->dtype, q->ndim,
                                   q->shape, &index)))
            break;
        bool added;
        if (!prefix && !hm_put(&d->shown, q->name, q->name_len, index, &added)) {
            rc = ckpt_fail(d->err, -ENOMEM, "out of memory");
            break;
        }
        uint64_t esz = ckpt_dtype_elem_size(t0->dtype);
        for (size_t r = 0; r < d->world && !rc; r++) {
            if (r * slice >= q->numel) break;
            uint64_t n = q->numel - r * slice < slice ? q->numel - r * slice : slice;
            /* Rank-local [offset, offset + n) may run over several groups. */
            uint64_t a = offset, done = 0;
            for (size_t g = 0; g < d->ngroups && done < n && !rc; g++) {
                if (a >= group_start[g + 1]) continue;
                uint64_t take =
                    group_start[g + 1] - a < n - done ? group_start[g + 1] - a : n - done;
                const torch_embedded_tensor *t = get(d, r, g, key);
                rc =
                    add_flat(d, index, q->shape, q->ndim, r * slice + done, r * slice + done + take,
                             d->optim[r].source, t->file_offset + (a - group_start[g]) * esz, esz);
                a += take;
                done += take;
            }
        }
        offset += slice;
    }
    if (!rc && offset != held)
        rc = ckpt_fail(d->err, -EINVAL,
                       "%s: param_shapes uses %llu elements of each rank's partition, but %s "
                       "holds %llu: the partitions do not belong to these shapes",
                       d->model[0].name, (unsigned long long)offset, d->optim[0].name,
                       (unsigned long long)held);
    free(group_start);
    return rc;
}

static int add_params(ds *d, flat_of get, const char *key, const char *prefix, const char *suffix) {
    if (!have_all(d, get, key)) return 0;
    return d->stage <= 2 ? stage2_params(d, get, key, prefix, suffix)
                         : stage3_params(d, get, key, prefix, suffix);
}

/* ---- frozen parameters, buffers, shared parameters, the module ---- */

static int add_whole(ds *d, const ds_file *f, const torch_embedded_tensor *t, const char *prefix,
                     const char *name, size_t len, size_t *index) {
    int rc = add_tensor_named(d, prefix, name, len, NULL, t->dtype, t->ndim, t->shape, index);
    if (!rc)
        rc = catalog_add_piece(d->cat, *index, f->source, t->file_offset, NULL, NULL,
                               t->row_major ? NULL : t->stride, d->err);
    if (!rc && !prefix) {
        bool added;
        if (!hm_put(&d->shown, name, len, *index, &added))
            rc = ckpt_fail(d->err, -ENOMEM, "out of memory");
    }
    return rc;
}

static int add_frozen(ds *d) {
    const ds_file *f = &d->model[0];
    static const char key[] = "frozen_param_shapes.";
    const size_t kl = sizeof key - 1;
    for (const json_value *m = f->vals.root->head; m; m = m->next) {
        if (m->key_len <= kl || memcmp(m->key, key, kl) != 0) continue;
        param q;
        const char *name = m->key + kl;
        size_t len = m->key_len - kl;
        if (!parse_shape(m, &q))
            return ckpt_fail(d->err, -EINVAL, "%s: \"%.*s\" is not a shape", f->name,
                             SHOWN_NAME(m->key, m->key_len));
        size_t index;
        int rc;
        if (d->stage <= 2) {
            const torch_embedded_tensor *t =
                tensor(f, "frozen_param_fragments.%.*s", (int)len, name);
            uint64_t numel = 1;
            for (uint32_t k = 0; t && k < t->ndim; k++) numel *= t->shape[k];
            if (!t || numel != q.numel)
                return ckpt_fail(d->err, -EINVAL,
                                 "%s: frozen parameter \"%.*s\" has no fragment of its %llu "
                                 "elements",
                                 f->name, SHOWN_NAME(name, len), (unsigned long long)q.numel);
            rc = add_whole(d, f, t, NULL, name, len, &index);
        } else {
            uint64_t slice = (q.numel + d->world - 1) / d->world;
            const torch_embedded_tensor *t0 = NULL;
            for (size_t r = 0; r < d->nmodel; r++) {
                const torch_embedded_tensor *t =
                    tensor(&d->model[r], "frozen_param_fragments.%.*s", (int)len, name);
                if (!t || t->ndim != 1 || !t->row_major || t->shape[0] < slice ||
                    (t0 && t->dtype != t0->dtype))
                    return ckpt_fail(d->err, -EINVAL,
                                     "%s: frozen parameter \"%.*s\" has no flat fragment of %llu "
                                     "elements",
                                     d->model[r].name, SHOWN_NAME(name, len),
                                     (unsigned long long)slice);
                if (!t0) t0 = t;
            }
            rc = add_tensor_named(d, NULL, name, len, NULL, t0->dtype, q.ndim, q.shape, &index);
            uint64_t esz = ckpt_dtype_elem_size(t0->dtype);
            for (size_t r = 0; !rc && r < d->nmodel && r * slice < q.numel; r++) {
                const torch_embedded_tensor *t =
                    tensor(&d->model[r], "frozen_param_fragments.%.*s", (int)len, name);
                uint64_t end = (r + 1) * slice < q.numel ? (r + 1) * slice : q.numel;
                rc = add_flat(d, index, q.shape, q.ndim, r * slice, end, d->model[r].source,
                              t->file_offset, esz);
            }
            bool added;
            if (!rc && !hm_put(&d->shown, name, len, index, &added))
                rc = ckpt_fail(d->err, -ENOMEM, "out of memory");
        }
        if (rc) return rc;
        d->nfrozen++;
    }
    return 0;
}

static bool is_buffer(const json_value *names, const char *name, size_t len) {
    for (const json_value *x = names ? names->head : NULL; x; x = x->next)
        if (x->type == JSON_STRING && x->len == len && memcmp(x->str, name, len) == 0) return true;
    return false;
}

/* A buffer zero_to_fp32 returns: one of the module's state_dict named in buffer_names, not
 * already shown (a frozen or trainable parameter of that name wins). */
static bool returned_buffer(ds *d, const json_value *buffers, const torch_embedded_tensor *t,
                            const char **name, size_t *len) {
    static const char key[] = "module.";
    const size_t kl = sizeof key - 1;
    if (t->name_len <= kl || memcmp(t->name, key, kl) != 0) return false;
    *name = t->name + kl;
    *len = t->name_len - kl;
    return is_buffer(buffers, *name, *len) && !hm_get(&d->shown, *name, *len);
}

/* zero_to_fp32 takes buffers from the module's state_dict as `v.float()`: F32 whatever they
 * were saved as (bf16 rotary inv_freq, int64 position_ids). Those stored otherwise are read
 * through a source that converts them; a strided one is shown as stored (none is saved so). */
static bool buffer_converts(const torch_embedded_tensor *t) {
    return t->dtype != CKPT_F32 && t->row_major && f32_source_converts(t->dtype);
}

static int add_buffer_as_f32(ds *d, const ds_file *f, const torch_embedded_tensor *t,
                             const char *name, size_t len, uint32_t vsrc, uint64_t at) {
    size_t index;
    int rc = add_tensor_named(d, NULL, name, len, NULL, CKPT_F32, t->ndim, t->shape, &index);
    if (!rc) rc = catalog_add_piece(d->cat, index, vsrc, at, NULL, NULL, NULL, d->err);
    if (!rc) {
        strbuf sb;
        sb_init(&sb);
        sb_printf(&sb, "\"deepspeed_stored\": {\"dtype\": \"%s\", \"file\": ",
                  ckpt_dtype_info_of(t->dtype)->name);
        sb_json_str(&sb, f->name, strlen(f->name));
        sb_printf(&sb, ", \"offset\": %llu}", (unsigned long long)t->file_offset);
        rc = sb.failed ? ckpt_fail(d->err, -ENOMEM, "out of memory")
                       : catalog_set_extra(d->cat, index, sb.data, d->err);
        sb_free(&sb);
    }
    bool added;
    if (!rc && !hm_put(&d->shown, name, len, index, &added))
        rc = ckpt_fail(d->err, -ENOMEM, "out of memory");
    return rc;
}

static int add_module(ds *d) {
    const ds_file *f = &d->model[0];
    const json_value *buffers = value(f, "buffer_names");
    static const char key[] = "module.";
    const size_t kl = sizeof key - 1;
    const char *name;
    size_t len, nconv = 0;
    for (size_t i = 0; i < f->e.ntensors; i++)
        if (returned_buffer(d, buffers, &f->e.tensors[i], &name, &len) &&
            buffer_converts(&f->e.tensors[i]))
            nconv++;
    uint32_t vsrc = 0;
    uint64_t *at = NULL;
    if (nconv) {
        f32_source *conv = f32_source_new(d->cat, nconv);
        at = calloc(nconv, sizeof *at);
        if (!conv || !at) {
            free(at);
            if (conv) f32_source_attach(d->cat, conv, &vsrc, d->err); /* frees it */
            return ckpt_fail(d->err, -ENOMEM, "out of memory");
        }
        int rc = 0;
        size_t k = 0;
        for (size_t i = 0; !rc && i < f->e.ntensors; i++) {
            const torch_embedded_tensor *t = &f->e.tensors[i];
            if (!returned_buffer(d, buffers, t, &name, &len) || !buffer_converts(t)) continue;
            uint64_t numel = 1;
            for (uint32_t j = 0; j < t->ndim; j++) numel *= t->shape[j];
            rc = f32_source_add(conv, f->source, t->file_offset, t->dtype, numel, &at[k++], d->err);
        }
        /* registered even after a failed add: the catalog frees it with the rest */
        int attached = f32_source_attach(d->cat, conv, &vsrc, d->err);
        if (!rc) rc = attached;
        if (rc) {
            free(at);
            return rc;
        }
    }
    size_t k = 0;
    int rc = 0;
    for (size_t i = 0; !rc && i < f->e.ntensors; i++) {
        const torch_embedded_tensor *t = &f->e.tensors[i];
        if (t->name_len <= kl || memcmp(t->name, key, kl) != 0) continue;
        name = t->name + kl;
        len = t->name_len - kl;
        size_t index;
        uint64_t numel = 1;
        for (uint32_t j = 0; j < t->ndim; j++) numel *= t->shape[j];
        if (is_buffer(buffers, name, len)) {
            if (hm_get(&d->shown, name, len)) continue;
            rc = buffer_converts(t) ? add_buffer_as_f32(d, f, t, name, len, vsrc, at[k++])
                                    : add_whole(d, f, t, NULL, name, len, &index);
            d->nbuffers++;
        } else if (numel || t->ndim == 0 || d->stage <= 2) {
            /* Stage 3 keeps empty placeholders of partitioned weights here: left out. */
            rc = add_whole(d, f, t, "module/", name, len, &index);
            d->nmodule++;
        }
    }
    free(at);
    return rc;
}

static int add_shared(ds *d) {
    const ds_file *f = &d->model[0];
    static const char key[] = "shared_params.";
    const size_t kl = sizeof key - 1;
    ckpt_catalog *cat = d->cat;
    for (const json_value *m = f->vals.root->head; m; m = m->next) {
        if (m->key_len <= kl || memcmp(m->key, key, kl) != 0 || m->type != JSON_STRING) continue;
        const hm_entry *he = hm_get(&d->shown, m->str, m->len);
        if (!he) continue; /* zero_to_fp32 skips a pair whose source it has not */
        if (hm_get(&d->shown, m->key + kl, m->key_len - kl)) continue;
        size_t src = he->value, index;
        const ckpt_tensor *s = &cat->tensors[src];
        uint64_t shape[CKPT_MAX_DIMS];
        memcpy(shape, s->shape, s->ndim * sizeof *shape);
        int rc = catalog_add_tensor(cat, m->key + kl, m->key_len - kl, s->dtype, s->ndim, shape,
                                    &index, d->err);
        /* The same pieces: read as the source's bytes. */
        if (!rc) rc = catalog_copy_pieces(cat, src, index, d->err);
        if (!rc) {
            strbuf sb;
            sb_init(&sb);
            sb_puts(&sb, "\"deepspeed_shared_param_of\": ");
            sb_json_str(&sb, m->str, m->len);
            rc = sb.failed ? ckpt_fail(d->err, -ENOMEM, "out of memory")
                           : catalog_set_extra(cat, index, sb.data, d->err);
            sb_free(&sb);
        }
        if (rc) return rc;
        d->nshared++;
    }
    return 0;
}

static int add_docs(ds *d) {
    const ds_file *f = &d->model[0];
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\"tag\": ");
    if (d->tag[0])
        sb_json_str(&sb, d->tag, strlen(d->tag));
    else
        sb_puts(&sb, "null");
    sb_printf(&sb, ", \"zero_stage\": %d, \"world_size\": %zu, \"param_groups\": %zu", d->stage,
              d->world, d->ngroups);
    const json_value *v = value(f, "ds_version");
    sb_puts(&sb, ", \"ds_version\": ");
    if (v && v->type == JSON_STRING)
        sb_json_str(&sb, v->str, v->len);
    else
        sb_puts(&sb, "null");
    sb_printf(&sb,
              ", \"trainable\": %zu, \"frozen\": %zu, \"buffers\": %zu, \"shared\": %zu, "
              "\"module\": %zu, \"optim\": %zu}",
              d->nparams, d->nfrozen, d->nbuffers, d->nshared, d->nmodule, d->noptim);
    int rc = sb.failed ? ckpt_fail(d->err, -ENOMEM, "out of memory")
                       : catalog_add_doc(d->cat, "deepspeed", sb.data, sb.len, d->err);
    sb_free(&sb);
    if (!rc) rc = catalog_add_doc(d->cat, "model_states", f->text, strlen(f->text), d->err);
    if (!rc)
        rc = catalog_add_doc(d->cat, "optim_states", d->optim[0].text, strlen(d->optim[0].text),
                             d->err);
    return rc;
}

static int load_all(ds *d) {
    int rc = resolve_step(d);
    if (!rc) rc = find_optim_files(d);
    if (!rc) rc = read_optim_header(d);
    if (rc) return rc;
    d->nmodel = d->stage <= 2 ? 1 : d->world;
    if (!(d->model = calloc(d->nmodel, sizeof *d->model)))
        return ckpt_fail(d->err, -ENOMEM, "out of memory");
    for (size_t r = 0; r < d->nmodel && !rc; r++) {
        char name[128];
        if (d->stage <= 2)
            snprintf(name, sizeof name, "mp_rank_00_model_states.pt");
        else
            snprintf(name, sizeof name, "zero_pp_rank_%zu_mp_rank_00_model_states.pt", r);
        char path[PATH_MAX];
        int w = snprintf(path, sizeof path, "%s/%s", d->step_dir, name);
        if (w < 0 || (size_t)w >= sizeof path || !is_file(path))
            return ckpt_fail(d->err, -ENOENT, "%s/%s is missing (ZeRO stage %d keeps %s)",
                             d->step_dir, name, d->stage,
                             d->stage <= 2 ? "the model states in one file"
                                           : "one model states file per rank");
        rc = read_file(d, &d->model[r], name);
    }
    if (!rc && !hm_init(&d->shown, 256)) rc = ckpt_fail(d->err, -ENOMEM, "out of memory");
    if (!rc) rc = read_param_shapes(d);
    /* zero_to_fp32's order: buffers, frozen, trainable, shared. */
    if (!rc) rc = add_frozen(d);
    if (!rc) rc = add_params(d, fp32_flat, NULL, NULL, NULL);
    if (!rc) rc = add_module(d);
    static const char *const moments[] = {"exp_avg", "exp_avg_sq"};
    for (size_t k = 0; k < 2 && !rc; k++) {
        char suffix[32];
        snprintf(suffix, sizeof suffix, ".%s", moments[k]);
        size_t before = d->cat->ntensors;
        rc = add_params(d, moment_flat, moments[k], "optim/", suffix);
        d->noptim += d->cat->ntensors - before;
    }
    if (!rc) rc = add_shared(d);
    if (!rc) rc = add_docs(d);
    return rc;
}

int deepspeed_load(ckpt_catalog *cat, ckpt_err *err) {
    ds d;
    memset(&d, 0, sizeof d);
    d.cat = cat;
    d.err = err;
    int rc = load_all(&d);
    for (size_t r = 0; r < d.world; r++) free_file(&d.optim[r]);
    for (size_t r = 0; d.model && r < d.nmodel; r++) free_file(&d.model[r]);
    free(d.optim);
    free(d.model);
    free(d.params);
    hm_free(&d.shown);
    return rc;
}

const ckpt_format format_deepspeed = {
    .name = "deepspeed-zero",
    .label = "DeepSpeed ZeRO checkpoint",
    .probe_dir = deepspeed_probe,
    .load_dir = deepspeed_load,
    .dir_looks_for = "DeepSpeed latest + global_stepN/",
};
