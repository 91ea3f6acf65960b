/* Tar headers (POSIX.1-2001 pax, ustar, GNU): 512-byte blocks; a member is a header block
 * followed by its data padded to 512. Numbers are octal text, or GNU base-256 when the first
 * byte has its high bit set (sizes of 8 GiB and more). A pax 'x' header (records
 * "LEN key=value\n") or a GNU 'L' header (the name as data) changes the name or size of the
 * member after it; a 'g' header is global and ignored. */
#include "tar.h"

#include "../model/catalog.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum { BLOCK = 512, MAX_META = 1 << 20, MAX_MEMBERS = 1 << 20 };

static bool all_zero(const unsigned char *b) {
    for (size_t i = 0; i < BLOCK; i++)
        if (b[i]) return false;
    return true;
}

static bool checksum_ok(const unsigned char *b) {
    uint64_t want = 0;
    size_t i = 148;
    while (i < 156 && b[i] == ' ') i++;
    size_t digits = 0;
    for (; i < 156 && b[i] >= '0' && b[i] <= '7'; i++, digits++) want = want * 8 + (b[i] - '0');
    if (!digits || (i < 156 && b[i] != ' ' && b[i] != '\0')) return false;
    uint64_t sum = 0;
    for (size_t k = 0; k < BLOCK; k++) sum += (k >= 148 && k < 156) ? ' ' : b[k];
    return sum == want;
}

bool tar_probe(const unsigned char *head, size_t n) {
    return n >= BLOCK && memcmp(head + 257, "ustar", 5) == 0 && checksum_ok(head);
}

/* An octal or base-256 number field; false if it is neither. */
static bool number(const unsigned char *f, size_t len, uint64_t *out) {
    uint64_t v = 0;
    if (f[0] & 0x80) {
        if (f[0] == 0xff) return false; /* negative */
        v = f[0] & 0x7f;
        for (size_t i = 1; i < len; i++) {
            if (v >> 56) return false;
            v = v << 8 | f[i];
        }
        *out = v;
        return true;
    }
    size_t i = 0;
    while (i < len && f[i] == ' ') i++;
    size_t digits = 0;
    for (; i < len && f[i] >= '0' && f[i] <= '7'; i++, digits++) {
        if (v >> 60) return false;
        v = v * 8 + (uint64_t)(f[i] - '0');
    }
    for (; i < len; i++)
        if (f[i] != ' ' && f[i] != '\0') return false;
    *out = v;
    return digits > 0;
}

/* "./a/b" -> "a/b"; NULL-free names only; false for absolute names and ".." components. An
 * empty result (the "./" entry) is allowed and means "skip". */
static bool normalize(char *name, size_t len) {
    if (memchr(name, '\0', len)) return false;
    if (len && name[0] == '/') return false;
    size_t r = 0;
    while (len - r >= 2 && name[r] == '.' && name[r + 1] == '/') {
        r += 2;
        while (r < len && name[r] == '/') r++;
    }
    memmove(name, name + r, len - r);
    len -= r;
    name[len] = '\0';
    while (len && name[len - 1] == '/') name[--len] = '\0'; /* "dir/" */
    for (size_t s = 0, i = 0; i <= len; i++) {
        if (i == len || name[i] == '/') {
            if (i - s == 2 && name[s] == '.' && name[s + 1] == '.') return false;
            s = i + 1;
        }
    }
    return true;
}

/* The path= and size= records of a pax header's data. */
static int parse_pax(const char *d, size_t n, char **path, size_t *path_len, bool *has_size,
                     uint64_t *size, const char *archive, uint64_t at, ckpt_err *err) {
    size_t i = 0;
    while (i < n) {
        size_t rec = 0, j = i;
        while (j < n && d[j] >= '0' && d[j] <= '9' && rec < MAX_META)
            rec = rec * 10 + (size_t)(d[j++] - '0');
        if (j == i || j >= n || d[j] != ' ' || rec > n - i || rec < 4 || d[i + rec - 1] != '\n')
            return ckpt_fail(err, -EINVAL,
                             "%s: pax extended header at offset %llu: malformed record at byte "
                             "%zu of its data",
                             archive, (unsigned long long)at, i);
        const char *kv = d + j + 1, *end = d + i + rec - 1;
        const char *eq = memchr(kv, '=', (size_t)(end - kv));
        if (!eq)
            return ckpt_fail(err, -EINVAL,
                             "%s: pax extended header at offset %llu: record without '=' at byte "
                             "%zu of its data",
                             archive, (unsigned long long)at, i);
        size_t klen = (size_t)(eq - kv), vlen = (size_t)(end - eq - 1);
        if (klen == 4 && memcmp(kv, "path", 4) == 0) {
            char *p = malloc(vlen + 1);
            if (!p) return ckpt_fail(err, -ENOMEM, "out of memory");
            memcpy(p, eq + 1, vlen);
            p[vlen] = '\0';
            free(*path);
            *path = p;
            *path_len = vlen;
        } else if (klen == 4 && memcmp(kv, "size", 4) == 0) {
            uint64_t v = 0;
            bool ok = vlen > 0 && vlen <= 19;
            for (size_t k = 0; ok && k < vlen; k++) {
                ok = eq[1 + k] >= '0' && eq[1 + k] <= '9';
                v = v * 10 + (uint64_t)(eq[1 + k] - '0');
            }
            if (!ok)
                return ckpt_fail(err, -EINVAL,
                                 "%s: pax extended header at offset %llu: size=%.*s is not a "
                                 "number",
                                 archive, (unsigned long long)at, (int)(vlen > 40 ? 40 : vlen),
                                 eq + 1);
            *has_size = true;
            *size = v;
        }
        i += rec;
    }
    return 0;
}

static int add_member(tar_index *ix, size_t *cap, char *name, uint64_t header, uint64_t data,
                      uint64_t size) {
    if (ix->count == *cap) {
        size_t n = *cap ? 2 * *cap : 16;
        tar_member *m = realloc(ix->members, n * sizeof *m);
        if (!m) return -ENOMEM;
        ix->members = m;
        *cap = n;
    }
    ix->members[ix->count++] = (tar_member){name, header, data, size};
    return 0;
}

static int name_cmp(const void *a, const void *b) {
    const tar_member *x = *(tar_member *const *)a, *y = *(tar_member *const *)b;
    return strcmp(x->name, y->name);
}

static int check_unique(const tar_index *ix, const char *archive, ckpt_err *err) {
    const tar_member **sorted = malloc((ix->count ? ix->count : 1) * sizeof *sorted);
    if (!sorted) return ckpt_fail(err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < ix->count; i++) sorted[i] = &ix->members[i];
    qsort(sorted, ix->count, sizeof *sorted, name_cmp);
    int rc = 0;
    for (size_t i = 1; i < ix->count && !rc; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0)
            rc = ckpt_fail(err, -EINVAL,
                           "%s: member \"%.120s\" is in the archive twice (headers at offsets "
                           "%llu and %llu)",
                           archive, sorted[i]->name, (unsigned long long)sorted[i - 1]->header,
                           (unsigned long long)sorted[i]->header);
    free(sorted);
    return rc;
}

/* The name a header gives its member (the pax or GNU long name before it, else ustar's prefix
 * and name fields), into out; NULL when out of memory. */
static char *header_name(const unsigned char *b, const char *long_name, size_t long_len,
                         size_t *len) {
    if (long_name) {
        char *name = malloc(long_len + 1);
        if (name) memcpy(name, long_name, long_len + 1);
        *len = long_len;
        return name;
    }
    /* POSIX ustar puts the start of long paths in the prefix field; GNU does not. */
    bool posix = memcmp(b + 257, "ustar\0", 6) == 0;
    size_t pl = posix ? strnlen((const char *)b + 345, 155) : 0;
    size_t nl = strnlen((const char *)b, 100);
    char *name = malloc(pl + nl + 2);
    if (!name) return NULL;
    memcpy(name, b + 345, pl);
    if (pl) name[pl] = '/';
    memcpy(name + pl + (pl ? 1 : 0), b, nl);
    *len = pl + (pl ? 1 : 0) + nl;
    name[*len] = '\0';
    return name;
}

int tar_read_index(const ckpt_catalog *cat, uint32_t source, tar_index *out, ckpt_err *err) {
    memset(out, 0, sizeof *out);
    const ckpt_source *s = &cat->sources[source];
    const char *archive = s->path;
    size_t cap = 0;
    char *long_name = NULL; /* from a pax or GNU header, for the next member */
    size_t long_len = 0;
    bool has_size = false;
    uint64_t pax_size = 0;
    uint64_t at = 0;
    int rc = 0;
    unsigned char b[BLOCK];
    while (!rc) {
        if (at == s->size) break; /* no end-of-archive blocks: tolerated, like tar does */
        if (s->size - at < BLOCK) {
            rc = ckpt_fail(err, -EINVAL,
                           "%s: the archive ends inside a header block at offset %llu "
                           "(truncated)",
                           archive, (unsigned long long)at);
            break;
        }
        if ((rc = ckpt_source_read(cat, source, at, b, BLOCK, "tar header", err))) break;
        if (all_zero(b)) { /* end of archive: a second zero block is expected after it */
            out->end = at;
            out->end_blocks = 1;
            if (s->size - at >= 2 * BLOCK &&
                !(rc = ckpt_source_read(cat, source, at + BLOCK, b, BLOCK, "tar end block", err)) &&
                all_zero(b))
                out->end_blocks = 2;
            break;
        }
        if (!checksum_ok(b)) {
            rc = ckpt_fail(err, -EINVAL,
                           "%s: tar header at offset %llu has a bad checksum (a damaged archive, "
                           "or the size field of the member before it lies)",
                           archive, (unsigned long long)at);
            break;
        }
        uint64_t size;
        if (!number(b + 124, 12, &size)) {
            rc = ckpt_fail(err, -EINVAL,
                           "%s: tar header at offset %llu: size field (byte offset %llu) is not "
                           "a number",
                           archive, (unsigned long long)at, (unsigned long long)(at + 124));
            break;
        }
        char type = (char)b[156];
        bool meta = type == 'x' || type == 'g' || type == 'L' || type == 'K';
        if (has_size && !meta) size = pax_size;
        uint64_t data = at + BLOCK;
        if (size > s->size - data) {
            size_t len = 0;
            char *name = meta ? NULL : header_name(b, long_name, long_len, &len);
            rc = ckpt_fail(err, -EINVAL,
                           "%s: tar member \"%.*s\" (header at offset %llu, data at offset %llu) "
                           "says it has %llu bytes, but the archive ends %llu bytes after its "
                           "header (truncated at byte offset %llu, or its size field lies)",
                           archive,
                           SHOWN_NAME(name ? name : "(extended header)",
                                      name ? len : strlen("(extended header)")),
                           (unsigned long long)at, (unsigned long long)data,
                           (unsigned long long)size, (unsigned long long)(s->size - data),
                           (unsigned long long)s->size);
            free(name);
            break;
        }
        uint64_t next = data + ((size + BLOCK - 1) / BLOCK) * BLOCK;
        if (next > s->size) { /* a last member without padding */
            next = s->size;
            out->unpadded = true;
        }
        if (meta) {
            if (type == 'g' || type == 'K') { /* global headers and long link names: unused */
                at = next;
                continue;
            }
            if (size > MAX_META) {
                rc = ckpt_fail(err, -E2BIG, "%s: extended header at offset %llu is %llu bytes",
                               archive, (unsigned long long)at, (unsigned long long)size);
                break;
            }
            char *d = malloc(size + 1);
            if (!d) {
                rc = ckpt_fail(err, -ENOMEM, "out of memory");
                break;
            }
            if ((rc = ckpt_source_read(cat, source, data, d, size, "tar extended header", err))) {
                free(d);
                break;
            }
            d[size] = '\0';
            if (type == 'L') {
                free(long_name);
                long_name = d;
                long_len = strnlen(d, size);
                d[long_len] = '\0';
            } else {
                rc = parse_pax(d, size, &long_name, &long_len, &has_size, &pax_size, archive, at,
                               err);
                free(d);
            }
            at = next;
            continue;
        }
        size_t len;
        char *name = header_name(b, long_name, long_len, &len);
        free(long_name);
        long_name = NULL;
        if (!name) {
            rc = ckpt_fail(err, -ENOMEM, "out of memory");
            break;
        }
        has_size = false;
        if (!normalize(name, len)) {
            rc = ckpt_fail(err, -EINVAL,
                           "%s: tar member \"%.*s\" (header at offset %llu) is absolute or has a "
                           "\"..\" component: it would leave the archive",
                           archive, SHOWN_NAME(name, len), (unsigned long long)at);
            free(name);
            break;
        }
        if (type == 'S') {
            rc = ckpt_fail(err, -EOPNOTSUPP,
                           "%s: tar member \"%.120s\" (header at offset %llu) is a GNU sparse "
                           "file: its bytes are not stored in one piece",
                           archive, name, (unsigned long long)at);
            free(name);
            break;
        }
        bool regular = type == '0' || type == '\0' || type == '7';
        if (!regular || !name[0]) {
            free(name); /* directories, links, devices: nothing to read */
        } else if (out->count >= MAX_MEMBERS) {
            free(name);
            rc = ckpt_fail(err, -E2BIG, "%s: more than %d members", archive, MAX_MEMBERS);
        } else if (add_member(out, &cap, name, at, data, size)) {
            free(name);
            rc = ckpt_fail(err, -ENOMEM, "out of memory");
        }
        at = next;
    }
    free(long_name);
    if (!rc && !out->end_blocks) out->end = at;
    if (!rc) rc = check_unique(out, archive, err);
    if (rc) tar_index_free(out);
    return rc;
}

void tar_index_free(tar_index *ix) {
    for (size_t i = 0; i < ix->count; i++) free(ix->members[i].name);
    free(ix->members);
    memset(ix, 0, sizeof *ix);
}

const tar_member *tar_find(const tar_index *ix, const char *name) {
    for (size_t i = 0; i < ix->count; i++)
        if (strcmp(ix->members[i].name, name) == 0) return &ix->members[i];
    return NULL;
}
