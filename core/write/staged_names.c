/* Tensor names of staged files: the tree-path rules of core/model/treepath.c, read backwards.
 *
 * A mount shows a name split on '.' and '/' into components, each escaped: '%' and bytes
 * 0x00-0x1F, 0x7F as %XX, an empty component as %_, a component longer than 255 bytes as its
 * first ~200 escaped bytes + %# + 16 hex digits of a hash of the component, and a second name
 * with the same path gets %~2 (a third %~3, ...) at the end. */
#include "../model/catalog.h"
#include "staged.h"
#include "../util/text.h"

#include <string.h>

enum { NAME_MAX_BYTES = 255, HASH_DIGITS = 16 };

/* Length of c without a "%~N" repeat marker at its end. */
static size_t without_repeat_marker(const char *c, size_t n) {
    size_t i = n;
    while (i > 0 && c[i - 1] >= '0' && c[i - 1] <= '9') i--;
    if (i < n && i >= 2 && c[i - 2] == '%' && c[i - 1] == '~') return i - 2;
    return n;
}

/* True when c ends with "%#" + 16 hex digits: an abbreviated long component. */
static bool abbreviated(const char *c, size_t n) {
    if (n < 2 + HASH_DIGITS || c[n - HASH_DIGITS - 2] != '%' || c[n - HASH_DIGITS - 1] != '#')
        return false;
    for (size_t i = n - HASH_DIGITS; i < n; i++)
        if (text_hex_digit(c[i]) < 0) return false;
    return true;
}

/* The byte of an escape a mount writes (%XX, uppercase, for 0x00-0x1F, 0x7F and '%'), or -1:
 * anything else is a '%' someone typed and stays as it is. */
static int escaped_byte(const char *c, size_t n, size_t i) {
    if (c[i] != '%' || i + 2 >= n) return -1;
    if (!((c[i + 1] >= '0' && c[i + 1] <= '9') || (c[i + 1] >= 'A' && c[i + 1] <= 'F'))) return -1;
    if (!((c[i + 2] >= '0' && c[i + 2] <= '9') || (c[i + 2] >= 'A' && c[i + 2] <= 'F'))) return -1;
    int v = text_hex_digit(c[i + 1]) << 4 | text_hex_digit(c[i + 2]);
    return v < 0x20 || v == 0x7f || v == '%' ? v : -1;
}

static void unescape_component(strbuf *out, const char *c, size_t n) {
    if (n == 2 && c[0] == '%' && c[1] == '_') return; /* the empty component */
    for (size_t i = 0; i < n; i++) {
        int v = escaped_byte(c, n, i);
        if (v >= 0) {
            sb_putc(out, (char)v);
            i += 2;
        } else {
            sb_putc(out, c[i]);
        }
    }
}

bool staged_name_from_path(const char *path, size_t len, strbuf *name) {
    sb_clear(name);
    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && path[i] != '/') continue;
        const char *c = path + start;
        size_t n = i - start;
        if (i == len) n = without_repeat_marker(c, n);
        if (abbreviated(c, n)) return false;
        if (start) sb_putc(name, '.');
        unescape_component(name, c, n);
        start = i + 1;
    }
    return !name->failed;
}

/* Does path component pc show name component nc? */
static bool component_shows(const char *pc, size_t pn, const char *nc, size_t nn, strbuf *tmp) {
    sb_clear(tmp);
    treepath_escape_component(tmp, nc, nn);
    if (tmp->failed) return false;
    if (tmp->len == pn && memcmp(tmp->data, pc, pn) == 0) return true;
    if (tmp->len <= NAME_MAX_BYTES || !abbreviated(pc, pn)) return false;
    /* Abbreviated: a prefix of the escaped form (cut short of a split escape), then the hash. */
    size_t keep = pn - HASH_DIGITS - 2;
    if (keep > tmp->len || keep + 2 < 200 || memcmp(tmp->data, pc, keep) != 0) return false;
    uint64_t h = 0;
    for (size_t i = pn - HASH_DIGITS; i < pn; i++) h = h << 4 | (uint64_t)text_hex_digit(pc[i]);
    return h == treepath_hash(nc, nn);
}

bool staged_path_shows_name(const char *path, size_t plen, const char *name, size_t len) {
    strbuf tmp;
    sb_init(&tmp);
    size_t ps = 0, ns = 0;
    bool same = true;
    for (;;) {
        size_t pe = ps, ne = ns;
        while (pe < plen && path[pe] != '/') pe++;
        while (ne < len && name[ne] != '.' && name[ne] != '/') ne++;
        bool last_p = pe == plen, last_n = ne == len;
        size_t pn = last_p ? without_repeat_marker(path + ps, pe - ps) : pe - ps;
        if (last_p != last_n || !component_shows(path + ps, pn, name + ns, ne - ns, &tmp)) {
            same = false;
            break;
        }
        if (last_p) break;
        ps = pe + 1;
        ns = ne + 1;
    }
    sb_free(&tmp);
    return same;
}
