/* Reading and writing verify manifests. A manifest comes from outside, so it is checked like
 * any input: every entry's shape, every digest's spelling, no tensor named twice. */
#include "cli_manifest.h"
#include "cli_internal.h"

#include "core/util/hashmap.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A manifest of a few million tensors is a few hundred MiB; anything beyond is not one. */
#define MANIFEST_MAX_BYTES (1ull << 30)

static int read_whole(const char *path, char **text, size_t *len, const char *cmd) {
    /* O_NONBLOCK: a FIFO given as the manifest must be refused, not waited on. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        cli_error(cmd, "%s: %s", path, strerror(errno));
        return CLI_SOURCE;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        cli_error(cmd, "%s: not a regular file", path);
        close(fd);
        return CLI_SOURCE;
    }
    if ((unsigned long long)st.st_size > MANIFEST_MAX_BYTES) {
        cli_error(cmd, "%s: %lld bytes is too large for a manifest (at most %llu)", path,
                  (long long)st.st_size, MANIFEST_MAX_BYTES);
        close(fd);
        return CLI_SOURCE;
    }
    size_t size = (size_t)st.st_size, got = 0;
    char *buf = malloc(size + 1);
    if (!buf) {
        cli_error(cmd, "%s: out of memory", path);
        close(fd);
        return CLI_SOURCE;
    }
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            cli_error(cmd, "%s: reading at offset %zu: %s", path, got,
                      r < 0 ? strerror(errno) : "the file shrank");
            free(buf);
            close(fd);
            return CLI_SOURCE;
        }
        got += (size_t)r;
    }
    close(fd);
    buf[size] = '\0';
    *text = buf;
    *len = size;
    return 0;
}

static bool hex_digest(const json_value *v, char out[SHA256_HEX_LEN + 1]) {
    if (v->type != JSON_STRING || v->len != SHA256_HEX_LEN) return false;
    for (size_t i = 0; i < SHA256_HEX_LEN; i++) {
        char c = v->str[i];
        if (c >= 'A' && c <= 'F') c = (char)(c - 'A' + 'a');
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
        out[i] = c;
    }
    out[SHA256_HEX_LEN] = '\0';
    return true;
}

static int bad(const char *cmd, const char *path, size_t index, size_t pos, const char *problem) {
    cli_error(cmd, "%s: tensors[%zu] at offset %zu: %s", path, index, pos, problem);
    return CLI_SOURCE;
}

/* An optional string member: absent or null leaves *s NULL; anything else but a string is an
 * error. */
static bool optional_string(const json_value *obj, const char *key, const char **s, size_t *len) {
    const json_value *v = json_member(obj, key);
    *s = NULL;
    *len = 0;
    if (!v || v->type == JSON_NULL) return true;
    if (v->type != JSON_STRING) return false;
    *s = v->str;
    *len = v->len;
    return true;
}

static int load_entry(manifest_entry *e, const json_value *v, size_t i, const char *path,
                      const char *cmd) {
    e->pos = v->pos;
    e->tensor = SIZE_MAX;
    if (v->type != JSON_OBJECT) return bad(cmd, path, i, v->pos, "expected an object");
    const json_value *name = json_member(v, "name");
    if (!name || name->type != JSON_STRING || name->len == 0)
        return bad(cmd, path, i, v->pos, "\"name\" must be a non-empty string");
    e->name = name->str;
    e->name_len = name->len;
    if (!optional_string(v, "prefix", &e->prefix, &e->prefix_len))
        return bad(cmd, path, i, v->pos, "\"prefix\" must be a string or null");
    if (!optional_string(v, "path", &e->path, &e->path_len))
        return bad(cmd, path, i, v->pos, "\"path\" must be a string or null");
    const json_value *sha = json_member(v, "sha256");
    if (!sha) return bad(cmd, path, i, v->pos, "no \"sha256\" member");
    if (sha->type != JSON_NULL) {
        if (!hex_digest(sha, e->sha256))
            return bad(cmd, path, i, sha->pos, "\"sha256\" must be 64 hex digits or null");
        e->has_sha256 = true;
    }
    const json_value *nb = json_member(v, "nbytes");
    if (nb) {
        if (!json_as_u64(nb, &e->nbytes))
            return bad(cmd, path, i, nb->pos, "\"nbytes\" must be a non-negative integer");
        e->has_nbytes = true;
    }
    return 0;
}

int manifest_load(manifest *m, const char *path, const char *cmd) {
    memset(m, 0, sizeof *m);
    m->path = path;
    size_t len;
    int rc = read_whole(path, &m->text, &len, cmd);
    if (rc) return rc;
    json_error jerr;
    if (json_parse(&m->doc, m->text, len, &jerr) != 0) {
        cli_error(cmd, "%s: not a JSON manifest: %s at offset %zu", path, jerr.msg, jerr.pos);
        return CLI_SOURCE;
    }
    m->parsed = true;
    const json_value *root = m->doc.root, *list = root;
    if (root->type == JSON_OBJECT) list = json_member(root, "tensors");
    if (!list || list->type != JSON_ARRAY) {
        cli_error(cmd, "%s: at offset %zu: expected {\"tensors\": [...]} or an array of entries",
                  path, list ? list->pos : root->pos);
        return CLI_SOURCE;
    }
    m->entries = calloc(list->count ? list->count : 1, sizeof *m->entries);
    if (!m->entries) {
        cli_error(cmd, "%s: out of memory", path);
        return CLI_SOURCE;
    }
    for (const json_value *v = list->head; v; v = v->next, m->n++) {
        rc = load_entry(&m->entries[m->n], v, m->n, path, cmd);
        if (rc) return rc;
    }
    return 0;
}

static bool prefix_is(const ckpt_tensor *t, const char *p, size_t len) {
    if (!t->prefix) return len == 0;
    return strlen(t->prefix) == len && memcmp(t->prefix, p, len) == 0;
}

/* Among tensors of one name: the unprefixed one, then one in the model, then the first. */
static int preference(const ckpt_tensor *t) {
    return t->prefix ? (t->aside ? 2 : 1) : 0;
}

int manifest_match(manifest *m, const ckpt_catalog *cat, size_t *by_tensor, const char *cmd) {
    for (size_t i = 0; i < cat->ntensors; i++) by_tensor[i] = SIZE_MAX;
    /* Tensors by name: the first of each name in the map, the others chained behind it. */
    size_t *next = malloc((cat->ntensors ? cat->ntensors : 1) * sizeof *next);
    hashmap names;
    if (!next || !hm_init(&names, cat->ntensors)) {
        free(next);
        cli_error(cmd, "out of memory");
        return CLI_SOURCE;
    }
    int rc = 0;
    for (size_t i = cat->ntensors; i-- > 0 && !rc;) {
        const ckpt_tensor *t = &cat->tensors[i];
        bool added;
        hm_entry *h = hm_put(&names, t->name, t->name_len, i, &added);
        if (!h) {
            cli_error(cmd, "out of memory");
            rc = CLI_SOURCE;
            break;
        }
        next[i] = added ? SIZE_MAX : h->value;
        h->value = i;
    }
    for (size_t k = 0; k < m->n && !rc; k++) {
        manifest_entry *e = &m->entries[k];
        const hm_entry *h = hm_get(&names, e->name, e->name_len);
        size_t best = SIZE_MAX, by_path = SIZE_MAX;
        for (size_t i = h ? h->value : SIZE_MAX; i != SIZE_MAX; i = next[i]) {
            const ckpt_tensor *t = &cat->tensors[i];
            if (e->prefix && !prefix_is(t, e->prefix, e->prefix_len)) continue;
            if (e->path && strlen(t->path) == e->path_len &&
                memcmp(t->path, e->path, e->path_len) == 0)
                by_path = i;
            if (best == SIZE_MAX || preference(t) < preference(&cat->tensors[best])) best = i;
        }
        if (by_path != SIZE_MAX) best = by_path;
        if (best == SIZE_MAX) continue; /* MISSING */
        if (by_tensor[best] != SIZE_MAX) {
            cli_error(cmd, "%s: tensors[%zu] at offset %zu names the same tensor as tensors[%zu]",
                      m->path, k, e->pos, by_tensor[best]);
            rc = CLI_SOURCE;
            break;
        }
        by_tensor[best] = k;
        e->tensor = best;
    }
    hm_free(&names);
    free(next);
    return rc;
}

void manifest_free(manifest *m) {
    if (m->parsed) json_doc_free(&m->doc);
    free(m->entries);
    free(m->text);
    memset(m, 0, sizeof *m);
}

int manifest_write_file(const char *path, const char *text, size_t len, const char *cmd) {
    size_t n = strlen(path) + 32;
    char *tmp = malloc(n);
    if (!tmp) {
        cli_error(cmd, "out of memory");
        return CLI_OUTPUT;
    }
    snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        cli_error(cmd, "%s: %s", tmp, strerror(errno));
        free(tmp);
        return CLI_OUTPUT;
    }
    int rc = cli_write_all(cmd, fd, text, len);
    if (rc == 0 && fsync(fd) != 0) {
        cli_error(cmd, "%s: fsync: %s", tmp, strerror(errno));
        rc = CLI_OUTPUT;
    }
    if (close(fd) != 0 && rc == 0) {
        cli_error(cmd, "%s: %s", tmp, strerror(errno));
        rc = CLI_OUTPUT;
    }
    if (rc == 0 && rename(tmp, path) != 0) {
        cli_error(cmd, "%s: %s", path, strerror(errno));
        rc = CLI_OUTPUT;
    }
    if (rc) unlink(tmp);
    free(tmp);
    return rc;
}
