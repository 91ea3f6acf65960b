/* A test tool, not a test: the tree paths core gives tensors of any names and prefixes, for a
 * test to hold against its own model of the rules (tests/t/840-tree-paths.t). Reads lines
 * "PREFIX NAME" (hex; "-" for no prefix), writes one line "PATH SIDECAR" (hex) per input line
 * in input order. Exit 0, or 2 with one line on stderr. */
#include "model/catalog.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int unhex(const char *s, char *out, size_t *len) {
    size_t n = strlen(s);
    if (n % 2) return -1;
    for (size_t i = 0; i < n; i += 2) {
        unsigned v;
        if (sscanf(s + i, "%2x", &v) != 1) return -1;
        out[i / 2] = (char)v;
    }
    *len = n / 2;
    return 0;
}

static void put_hex(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) printf("%02x", (unsigned char)s[i]);
}

int main(void) {
    char src_path[] = "/tmp/ckpt-treepath-XXXXXX";
    int fd = mkstemp(src_path);
    if (fd < 0 || ftruncate(fd, 1) != 0) return 2;
    close(fd);
    ckpt_catalog *cat = catalog_new("/treepath_tool", "unit");
    ckpt_err err;
    uint32_t src;
    if (!cat || catalog_add_source(cat, src_path, "f", &src, &err)) return 2;
    unlink(src_path);
    static char line[1 << 16], prefix[1 << 15], name[1 << 15];
    size_t n = 0;
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = '\0';
        char *space = strchr(line, ' ');
        size_t plen = 0, nlen, index;
        if (!space) break;
        *space = '\0';
        bool has_prefix = strcmp(line, "-") != 0;
        if ((has_prefix && unhex(line, prefix, &plen)) || unhex(space + 1, name, &nlen)) {
            fprintf(stderr, "treepath_tool: line %zu: not hex\n", n + 1);
            return 2;
        }
        prefix[plen] = '\0';
        uint64_t shape[] = {1};
        if (catalog_add_tensor(cat, name, nlen, CKPT_U8, 1, shape, &index, &err) ||
            catalog_add_piece(cat, index, src, 0, NULL, NULL, NULL, &err) ||
            (has_prefix && catalog_set_prefix(cat, index, prefix, false, &err))) {
            fprintf(stderr, "treepath_tool: %s\n", err.msg);
            return 2;
        }
        n++;
    }
    /* The tensors are sorted by name at the finish: remember which input line each was. */
    ckpt_tensor *by_input = malloc((n ? n : 1) * sizeof *by_input);
    if (!by_input) return 2;
    for (size_t i = 0; i < n; i++) by_input[i] = cat->tensors[i];
    if (catalog_finish(cat, &err)) {
        fprintf(stderr, "treepath_tool: %s\n", err.msg);
        return 2;
    }
    for (size_t i = 0; i < n; i++) {
        const ckpt_tensor *t = NULL;
        for (size_t k = 0; k < n && !t; k++) /* names are unique within a prefix */
            if (cat->tensors[k].name == by_input[i].name) t = &cat->tensors[k];
        if (!t) return 2;
        char *side = ckpt_sidecar_path(t);
        if (!side) return 2;
        put_hex(t->path, strlen(t->path));
        putchar(' ');
        put_hex(side, strlen(side));
        putchar('\n');
        free(side);
    }
    free(by_input);
    ckpt_close(cat);
    return 0;
}
