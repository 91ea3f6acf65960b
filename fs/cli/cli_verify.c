/* ckptfs verify SOURCE [--manifest M] [--write-manifest M] [--json]: the SHA-256 of every
 * tensor's logical bytes, read through the planner exactly as a mount serves them, compared
 * with a manifest and/or written to one. */
#include "cli_internal.h"
#include "cli_manifest.h"
#include "core/parse/zip_crc.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "Hash every tensor's bytes (SHA-256, as the mounted file holds them) and compare\n"
    "them with a manifest, one line per tensor: OK, MISMATCH, NEW (not in the\n"
    "manifest), MISSING (not in the source), INCOMPLETE (holes: not hashed), ERROR.\n"
    "\n"
    "  --manifest M        compare with M: {\"tensors\": [{name, sha256, nbytes}]}\n"
    "  --write-manifest M  write the digests to M in that form\n"
    "  --json              print the result as JSON (its tensors form a manifest)\n"
    "  -q, --quiet         print only the tensors that are not OK (or, without a\n"
    "                      manifest, not hashed), and the totals\n"
    "  -a, --all           also the per-rank copies of a tensor-parallel checkpoint\n"
    "  -o OPTIONS          decoding options as for the mount: tp_split=RULES\n"
    "  -h, --help          this help\n"
    "\n"
    "Without --manifest each line is `SHA256  NAME`, as sha256sum prints. Checksums\n"
    "the format stores are checked too: lwt CRC-32 and gpt-rs base ids when the\n"
    "source is opened, the CRC-32 of every torch zip record here (a bad one makes\n"
    "its tensors MISMATCH). Progress goes to stderr when it is a terminal.\n"
    "Exit status: 0 all match, 2 unreadable source or manifest, 3 mismatches,\n"
    "4 output error.\n";

enum { BUFFER = 4 << 20 };

typedef enum { ST_HASHED, ST_OK, ST_MISMATCH, ST_NEW, ST_INCOMPLETE, ST_ERROR, ST_COUNT } status;
static const char *const status_word[ST_COUNT] = {"",    "OK",         "MISMATCH",
                                                  "NEW", "INCOMPLETE", "ERROR"};
static const char *const status_json[ST_COUNT] = {"hashed", "ok",         "mismatch",
                                                  "new",    "incomplete", "error"};

typedef struct result {
    status st;
    bool hashed;
    char sha256[SHA256_HEX_LEN + 1];
    const manifest_entry *expect;
    char *detail; /* why, for MISMATCH / ERROR / INCOMPLETE (malloc'd) */
} result;

typedef struct verify {
    const char *cmd, *source, *manifest_path, *write_path;
    bool json, quiet, all;
    const ckpt_catalog *cat;
    manifest man;
    bool have_manifest;
    result *res;       /* per catalog tensor */
    size_t *by_tensor; /* per catalog tensor: its manifest entry, SIZE_MAX = none */
    size_t counts[ST_COUNT], missing;
    uint64_t hashed_bytes;
    progress_line progress;
    ckpt_crc_fault *crc_faults; /* zip records whose CRC-32 does not match */
    size_t ncrc_faults, cap_crc_faults, crc_faults_unowned;
    long long crc_checked; /* records whose CRC-32 was checked */
} verify;

typedef struct hashing {
    sha256_ctx sha;
    progress_line *progress;
} hashing;

static int hash_sink(void *ctx, const void *data, size_t len) {
    hashing *h = ctx;
    sha256_update(&h->sha, data, len);
    progress_add(h->progress, len);
    return 0;
}

static bool selected(const verify *v, const ckpt_tensor *t) {
    return !cli_hidden(t) || v->all;
}

static char *dupf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *dupf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *out;
    if (vasprintf(&out, fmt, ap) < 0) out = NULL; /* the line then goes without its detail */
    va_end(ap);
    return out;
}

static void judge(verify *v, size_t i, result *r) {
    const ckpt_tensor *t = &v->cat->tensors[i];
    if (!v->have_manifest || r->st == ST_ERROR) return;
    const manifest_entry *e = v->by_tensor[i] == SIZE_MAX ? NULL : &v->man.entries[v->by_tensor[i]];
    r->expect = e;
    if (!e) {
        r->st = ST_NEW;
        r->detail = dupf("not in the manifest");
        return;
    }
    if (t->incomplete) {
        if (e->has_sha256) {
            r->st = ST_MISMATCH;
            free(r->detail); /* replaces "not hashed" */
            r->detail = dupf("has holes in the source, but the manifest has its sha256");
        }
        return; /* INCOMPLETE, as the manifest says (sha256 null) */
    }
    if (!e->has_sha256) {
        r->st = ST_MISMATCH;
        r->detail = dupf("the manifest has no sha256 (it recorded the tensor as incomplete)");
    } else if (e->has_nbytes && e->nbytes != t->nbytes) {
        r->st = ST_MISMATCH;
        r->detail = dupf("nbytes %llu, manifest %llu", (unsigned long long)t->nbytes,
                         (unsigned long long)e->nbytes);
    } else if (strcmp(r->sha256, e->sha256) != 0) {
        r->st = ST_MISMATCH;
        r->detail = dupf("sha256 %s, manifest %s", r->sha256, e->sha256);
    } else {
        r->st = ST_OK;
    }
}

static void hash_one(verify *v, const ckpt_tensor *t, result *r, void *buf) {
    if (t->incomplete) {
        r->st = ST_INCOMPLETE;
        r->detail = dupf("has holes: not hashed");
        return;
    }
    hashing h = {.progress = &v->progress};
    sha256_init(&h.sha);
    ckpt_err err = {{0}};
    if (cli_stream_tensor(v->cat, t, 0, t->nbytes, buf, BUFFER, hash_sink, &h, &err) != 0) {
        r->st = ST_ERROR;
        r->detail = dupf("%s", err.msg);
        return;
    }
    uint8_t d[SHA256_DIGEST_LEN];
    sha256_final(&h.sha, d);
    sha256_hex(d, r->sha256);
    r->hashed = true;
    r->st = ST_HASHED;
    v->hashed_bytes += t->nbytes;
}

/* ---- text output ---- */

static void text_line(verify *v, cli_out *o, const ckpt_tensor *t, const result *r) {
    if (v->quiet && (r->st == ST_OK || r->st == ST_HASHED)) return;
    if (!v->have_manifest && r->st == ST_HASHED) {
        sb_printf(&o->sb, "%s  ", r->sha256);
        cli_put_display_name(&o->sb, t);
        sb_putc(&o->sb, '\n');
        return;
    }
    sb_printf(&o->sb, "%-11s ", status_word[r->st]);
    cli_put_display_name(&o->sb, t);
    if (r->detail) {
        sb_puts(&o->sb, ": ");
        sb_puts(&o->sb, r->detail);
    }
    sb_putc(&o->sb, '\n');
}

static void text_summary(verify *v, cli_out *o, size_t ntensors) {
    char size[32];
    human_size(v->hashed_bytes, size, sizeof size);
    sb_printf(&o->sb, "%zu tensor%s, %s hashed", ntensors, ntensors == 1 ? "" : "s", size);
    if (!v->have_manifest) {
        sb_puts(&o->sb, " (no --manifest: nothing compared)");
        if (v->counts[ST_INCOMPLETE])
            sb_printf(&o->sb, ", %zu incomplete", v->counts[ST_INCOMPLETE]);
        if (v->counts[ST_ERROR]) sb_printf(&o->sb, ", %zu unreadable", v->counts[ST_ERROR]);
        sb_putc(&o->sb, '\n');
    } else {
        sb_printf(&o->sb, ": %zu OK", v->counts[ST_OK]);
        static const status shown[] = {ST_MISMATCH, ST_NEW, ST_INCOMPLETE, ST_ERROR};
        for (size_t i = 0; i < sizeof shown / sizeof *shown; i++)
            if (v->counts[shown[i]])
                sb_printf(&o->sb, ", %zu %s", v->counts[shown[i]], status_word[shown[i]]);
        if (v->missing) sb_printf(&o->sb, ", %zu MISSING", v->missing);
        sb_putc(&o->sb, '\n');
    }
    sb_printf(&o->sb, "format checks: passed at open (%s: %s)\n", v->cat->format,
              ckpt_format_checks(v->cat));
    if (v->crc_checked)
        sb_printf(&o->sb, "zip records: %lld CRC-32 checked, %zu failed\n", v->crc_checked,
                  v->ncrc_faults);
}

/* ---- JSON: the result, whose "tensors" doubles as a manifest ---- */

/* A MISSING entry in JSON: prefix + name, as text lines show tensors. */
static void put_entry_name(strbuf *sb, const manifest_entry *e) {
    strbuf qualified;
    sb_init(&qualified);
    if (e->prefix) sb_put(&qualified, e->prefix, e->prefix_len);
    sb_put(&qualified, e->name, e->name_len);
    sb_json_str(sb, qualified.failed ? "" : qualified.data, qualified.failed ? 0 : qualified.len);
    sb_free(&qualified);
}

static void put_manifest_entry(strbuf *sb, const ckpt_tensor *t, const result *r) {
    sb_puts(sb, "{\"name\": ");
    sb_json_str(sb, t->name, t->name_len);
    if (t->prefix) {
        sb_puts(sb, ", \"prefix\": ");
        sb_json_str(sb, t->prefix, strlen(t->prefix));
    }
    sb_printf(sb, ", \"dtype\": \"%s\", \"shape\": [", ckpt_dtype_info_of(t->dtype)->name);
    for (uint32_t d = 0; d < t->ndim; d++) {
        if (d) sb_puts(sb, ", ");
        sb_u64(sb, t->shape[d]);
    }
    sb_puts(sb, "], \"nbytes\": ");
    sb_u64(sb, t->nbytes);
    if (r->hashed)
        sb_printf(sb, ", \"sha256\": \"%s\"", r->sha256);
    else
        sb_puts(sb, ", \"sha256\": null");
    sb_puts(sb, ", \"path\": ");
    sb_json_str(sb, t->path, strlen(t->path));
    if (t->incomplete) sb_puts(sb, ", \"incomplete\": true");
}

static void json_report(verify *v, cli_out *o) {
    strbuf *sb = &o->sb;
    sb_puts(sb, "{\n  \"source\": ");
    sb_json_str(sb, v->cat->root, strlen(v->cat->root));
    sb_printf(sb,
              ",\n  \"format\": \"%s\",\n  \"format_checks\": \"passed at open\",\n"
              "  \"format_checks_cover\": ",
              v->cat->format);
    const char *cover = ckpt_format_checks(v->cat);
    sb_json_str(sb, cover, strlen(cover));
    sb_puts(sb, ",\n  \"manifest\": ");
    if (v->manifest_path)
        sb_json_str(sb, v->manifest_path, strlen(v->manifest_path));
    else
        sb_puts(sb, "null");
    sb_puts(sb, ",\n  \"tensors\": [");
    bool first = true;
    for (size_t i = 0; i < v->cat->ntensors && o->status == 0; i++) {
        const ckpt_tensor *t = &v->cat->tensors[i];
        if (!selected(v, t)) continue;
        const result *r = &v->res[i];
        sb_puts(sb, first ? "\n    " : ",\n    ");
        first = false;
        put_manifest_entry(sb, t, r);
        sb_printf(sb, ", \"status\": \"%s\"", status_json[r->st]);
        if (r->expect && r->expect->has_sha256 && r->st == ST_MISMATCH)
            sb_printf(sb, ", \"expected_sha256\": \"%s\"", r->expect->sha256);
        if (r->expect && r->expect->has_nbytes && r->st == ST_MISMATCH) {
            sb_puts(sb, ", \"expected_nbytes\": ");
            sb_u64(sb, r->expect->nbytes);
        }
        if (r->detail) {
            sb_puts(sb, ", \"detail\": ");
            sb_json_str(sb, r->detail, strlen(r->detail));
        }
        sb_putc(sb, '}');
        cli_out_maybe_flush(o);
    }
    sb_puts(sb, first ? "],\n  \"missing\": [" : "\n  ],\n  \"missing\": [");
    first = true;
    for (size_t i = 0; v->have_manifest && i < v->man.n; i++) {
        const manifest_entry *e = &v->man.entries[i];
        if (e->tensor != SIZE_MAX) continue;
        sb_puts(sb, first ? "\n    " : ",\n    ");
        first = false;
        put_entry_name(sb, e);
    }
    sb_puts(sb, first ? "],\n  \"counts\": {" : "\n  ],\n  \"counts\": {");
    for (int s = 0; s < ST_COUNT; s++) sb_printf(sb, "\"%s\": %zu, ", status_json[s], v->counts[s]);
    sb_printf(sb, "\"missing\": %zu},\n  \"zip_crc32_checked\": %lld, \"zip_crc32_failed\": [",
              v->missing, v->crc_checked);
    for (size_t k = 0; k < v->ncrc_faults; k++) {
        const ckpt_crc_fault *f = &v->crc_faults[k];
        sb_puts(sb, k ? ", {\"file\": " : "{\"file\": ");
        const char *rel = v->cat->sources[f->source].relpath;
        sb_json_str(sb, rel, strlen(rel));
        sb_puts(sb, ", \"record\": ");
        sb_json_str(sb, f->record ? f->record : "", f->record_len);
        sb_printf(sb, ", \"stored\": \"%08x\", \"computed\": \"%08x\"}", f->stored, f->computed);
    }
    sb_puts(sb, "],\n  \"hashed_bytes\": ");
    sb_u64(sb, v->hashed_bytes);
    const char *verdict = v->counts[ST_ERROR]                               ? "error"
                          : v->counts[ST_MISMATCH] || v->crc_faults_unowned ? "mismatch"
                          : !v->have_manifest                               ? "hashed"
                          : v->counts[ST_NEW] || v->missing                 ? "mismatch"
                                                                            : "ok";
    sb_printf(sb, ",\n  \"result\": \"%s\"\n}\n", verdict);
}

static int write_manifest(verify *v) {
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\n  \"format\": ");
    sb_json_str(&sb, v->cat->format, strlen(v->cat->format));
    sb_puts(&sb, ",\n  \"source\": ");
    sb_json_str(&sb, v->cat->root, strlen(v->cat->root));
    sb_puts(&sb, ",\n  \"tensors\": [");
    bool first = true;
    for (size_t i = 0; i < v->cat->ntensors; i++) {
        const ckpt_tensor *t = &v->cat->tensors[i];
        if (!selected(v, t)) continue;
        sb_puts(&sb, first ? "\n    " : ",\n    ");
        first = false;
        put_manifest_entry(&sb, t, &v->res[i]);
        sb_putc(&sb, '}');
    }
    sb_puts(&sb, first ? "]\n}\n" : "\n  ]\n}\n");
    size_t len;
    char *text = sb_take(&sb, &len);
    if (!text) {
        cli_error(v->cmd, "out of memory");
        return CLI_OUTPUT;
    }
    int rc = manifest_write_file(v->write_path, text, len, v->cmd);
    free(text);
    return rc;
}

/* ---- the CRC-32 of zip records ---- */

static void crc_fault(void *ctx, const ckpt_crc_fault *f) {
    verify *v = ctx;
    if (v->ncrc_faults == v->cap_crc_faults) {
        size_t cap = v->cap_crc_faults ? 2 * v->cap_crc_faults : 8;
        ckpt_crc_fault *p = realloc(v->crc_faults, cap * sizeof *p);
        if (!p) return; /* the tensors then go unflagged, but the totals still count it */
        v->crc_faults = p;
        v->cap_crc_faults = cap;
    }
    ckpt_crc_fault *copy = &v->crc_faults[v->ncrc_faults];
    *copy = *f;
    copy->record = strndup(f->record, f->record_len); /* the zip's directory goes away */
    if (!copy->record) copy->record_len = 0;
    v->ncrc_faults++;
}

/* A tensor whose bytes lie in a record that fails its CRC-32 is a MISMATCH, whatever its hash. */
static void judge_crc(verify *v, const ckpt_tensor *t, result *r) {
    if (r->st == ST_ERROR) return;
    for (size_t k = 0; k < v->ncrc_faults; k++) {
        const ckpt_crc_fault *f = &v->crc_faults[k];
        for (uint32_t p = 0; p < t->npieces; p++) {
            const ckpt_piece *pc = &t->pieces[p];
            if (pc->source != f->source || pc->file_offset < f->offset ||
                pc->file_offset >= f->offset + f->length)
                continue;
            r->st = ST_MISMATCH;
            free(r->detail);
            r->detail = dupf("zip record %.*s fails its CRC-32 (stored %08x, computed %08x)",
                             (int)f->record_len, f->record, f->stored, f->computed);
            return;
        }
    }
}

static int check_crcs(verify *v, void *buf) {
    ckpt_err err = {{0}};
    v->crc_checked = ckpt_zip_check_crcs(v->cat, crc_fault, v, buf, BUFFER, &err);
    if (v->crc_checked < 0) {
        cli_error(v->cmd, "%s", err.msg);
        return CLI_SOURCE;
    }
    return 0;
}

/* Records no tensor reads (data.pkl, version ...) that fail their CRC-32. */
static void crc_lines(verify *v, cli_out *o) {
    for (size_t k = 0; k < v->ncrc_faults; k++) {
        const ckpt_crc_fault *f = &v->crc_faults[k];
        bool owned = false;
        for (size_t i = 0; i < v->cat->ntensors && !owned; i++) {
            const ckpt_tensor *t = &v->cat->tensors[i];
            for (uint32_t p = 0; p < t->npieces && !owned; p++)
                owned = t->pieces[p].source == f->source && t->pieces[p].file_offset >= f->offset &&
                        t->pieces[p].file_offset < f->offset + f->length;
        }
        if (owned) continue;
        v->crc_faults_unowned++;
        if (v->json) continue;
        sb_printf(&o->sb, "%-11s ", "MISMATCH");
        text_pct_escape(&o->sb, f->record, f->record_len, false);
        sb_printf(&o->sb, ": zip record of %s fails its CRC-32 (stored %08x, computed %08x)\n",
                  v->cat->sources[f->source].relpath, f->stored, f->computed);
    }
}

static int run(verify *v) {
    const ckpt_catalog *cat = v->cat;
    if (v->manifest_path) {
        int rc = manifest_load(&v->man, v->manifest_path, v->cmd);
        if (rc) return rc;
        v->have_manifest = true;
    }
    v->res = calloc(cat->ntensors ? cat->ntensors : 1, sizeof *v->res);
    v->by_tensor = calloc(cat->ntensors ? cat->ntensors : 1, sizeof *v->by_tensor);
    if (!v->res || !v->by_tensor) {
        cli_error(v->cmd, "out of memory");
        return CLI_SOURCE;
    }
    if (v->have_manifest) {
        int rc = manifest_match(&v->man, cat, v->by_tensor, v->cmd);
        if (rc) return rc;
        /* A manifest that lists hidden tensors (per-rank copies) is checked against them. */
        for (size_t i = 0; i < cat->ntensors; i++)
            if (v->by_tensor[i] != SIZE_MAX && cli_hidden(&cat->tensors[i])) v->all = true;
    }
    void *buf = malloc(BUFFER);
    if (!buf) {
        cli_error(v->cmd, "out of memory");
        return CLI_SOURCE;
    }
    int crc_rc = check_crcs(v, buf);
    if (crc_rc) {
        free(buf);
        return crc_rc;
    }
    uint64_t total = 0;
    size_t ntensors = 0;
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (!selected(v, t)) continue;
        ntensors++;
        if (!t->incomplete) total += t->nbytes;
    }
    /* Every source is read front to back: let the kernel read ahead generously. */
    for (uint32_t s = 0; s < cat->nsources; s++)
        posix_fadvise(cat->sources[s].fd, 0, 0, POSIX_FADV_SEQUENTIAL);

    cli_out o;
    cli_out_init(&o, v->cmd);
    bool live = !v->json && isatty(1); /* a person watching: show each line as it comes */
    progress_start(&v->progress, "verify", total);
    for (size_t i = 0; i < cat->ntensors && o.status == 0; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (!selected(v, t)) continue;
        result *r = &v->res[i];
        hash_one(v, t, r, buf);
        judge(v, i, r);
        judge_crc(v, t, r);
        v->counts[r->st]++;
        if (v->json) continue;
        text_line(v, &o, t, r);
        if (live && o.sb.len) {
            progress_end(&v->progress); /* redrawn by the next update */
            cli_out_flush(&o);
        } else {
            cli_out_maybe_flush(&o);
        }
    }
    progress_end(&v->progress);
    free(buf);
    for (size_t i = 0; v->have_manifest && i < v->man.n; i++) {
        const manifest_entry *e = &v->man.entries[i];
        if (e->tensor != SIZE_MAX) continue;
        v->missing++;
        if (v->json) continue;
        sb_printf(&o.sb, "%-11s ", "MISSING");
        if (e->prefix) text_pct_escape(&o.sb, e->prefix, e->prefix_len, false);
        text_pct_escape(&o.sb, e->name, e->name_len, false);
        sb_puts(&o.sb, ": in the manifest, not in the source\n");
        cli_out_maybe_flush(&o);
    }
    crc_lines(v, &o);
    if (v->json)
        json_report(v, &o);
    else
        text_summary(v, &o, ntensors);
    int out = cli_out_finish(&o);

    int rc = 0;
    if (v->write_path) { /* written even when the reader of stdout went away */
        if (v->counts[ST_ERROR])
            cli_error(v->cmd, "%s not written: %zu tensor%s could not be read", v->write_path,
                      v->counts[ST_ERROR], v->counts[ST_ERROR] == 1 ? "" : "s");
        else
            rc = write_manifest(v);
    }
    if (out) return out;
    if (rc) return rc;
    if (v->counts[ST_ERROR]) return CLI_SOURCE;
    if (v->counts[ST_MISMATCH] || v->counts[ST_NEW] || v->missing || v->crc_faults_unowned)
        return CLI_MISMATCH;
    return CLI_OK;
}

static int on_option(void *ctx, const char *cmd, int letter, const char *value) {
    (void)cmd;
    verify *v = ctx;
    switch (letter) {
    case 'm':
        v->manifest_path = value;
        break;
    case 'w':
        v->write_path = value;
        break;
    case 'j':
        v->json = true;
        break;
    case 'q':
        v->quiet = true;
        break;
    case 'a':
        v->all = true;
        break;
    }
    return 0;
}

int cli_verify(int argc, char **argv) {
    static const struct option longopts[] = {
        {"manifest", required_argument, NULL, CLI_LONG + 'm'},
        {"write-manifest", required_argument, NULL, CLI_LONG + 'w'},
        {"json", no_argument, NULL, CLI_LONG + 'j'},
        {"quiet", no_argument, NULL, CLI_LONG + 'q'},
        {"all", no_argument, NULL, CLI_LONG + 'a'},
        {"help", no_argument, NULL, CLI_LONG + 'h'},
        {NULL, 0, NULL, 0},
    };
    cli_common c = {.cmd = "verify"};
    verify v = {.cmd = c.cmd};
    const cli_args args = {":qaho:", longopts, usage, 1, 1, "one SOURCE", on_option, &v};
    bool help_shown;
    int rc = cli_parse_args(&c, &args, argc, argv, &help_shown);
    if (help_shown) {
        cli_common_free(&c);
        return rc;
    }
    ckpt_catalog *cat = NULL;
    if (rc == 0) {
        v.source = argv[optind];
        rc = cli_open(&c, v.source, &cat);
    }
    if (rc == 0) {
        v.cat = cat;
        rc = run(&v);
    }
    if (v.res)
        for (size_t i = 0; i < cat->ntensors; i++) free(v.res[i].detail);
    free(v.res);
    free(v.by_tensor);
    for (size_t k = 0; k < v.ncrc_faults; k++) free((char *)v.crc_faults[k].record);
    free(v.crc_faults);
    manifest_free(&v.man);
    ckpt_close(cat);
    cli_common_free(&c);
    return rc;
}
