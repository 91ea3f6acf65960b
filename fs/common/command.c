#include "command.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static const command *table;
static size_t ntable;

void commands_register(const command *t, size_t n) {
    table = t;
    ntable = n;
}

const command *command_named(const char *name) {
    for (size_t i = 0; i < ntable; i++)
        if (strcmp(table[i].name, name) == 0) return &table[i];
    return NULL;
}

void command_usage_line(const char *name, char *out, size_t cap) {
    const command *c = command_named(name);
    if (!c) {
        if (cap) out[0] = '\0';
        return;
    }
    snprintf(out, cap, "Usage: ckptfs %s%s%s\n", c->name, c->name[0] ? " " : "", c->usage);
}

void command_print_usage(FILE *out, const char *name) {
    char line[512];
    command_usage_line(name, line, sizeof line);
    fputs(line, out);
}

void command_names(const char *sep, char *out, size_t cap) {
    size_t o = 0;
    if (cap) out[0] = '\0';
    for (size_t i = 0; i < ntable && o < cap; i++) {
        if (!table[i].name[0]) continue;
        int n = snprintf(out + o, cap - o, "%s%s", o ? sep : "", table[i].name);
        if (n < 0) break;
        o += (size_t)n;
    }
}

/* Whether a turns into b by one edit (insert, delete, substitute, or swap two neighbours). */
static bool one_edit(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > lb + 1 || lb > la + 1) return false;
    size_t i = 0;
    while (i < la && i < lb && a[i] == b[i]) i++;
    if (la == lb) {
        if (i == la) return false; /* equal: not a misspelling */
        if (strcmp(a + i + 1, b + i + 1) == 0) return true;
        return i + 1 < la && a[i] == b[i + 1] && a[i + 1] == b[i] &&
               strcmp(a + i + 2, b + i + 2) == 0;
    }
    return la < lb ? strcmp(a + i, b + i + 1) == 0 : strcmp(a + i + 1, b + i) == 0;
}

const command *command_suggest(const char *word) {
    size_t lw = strlen(word);
    if (lw < 2) return NULL; /* "l" or "c" could be anything */
    const command *found = NULL;
    for (size_t i = 0; i < ntable; i++) {
        const command *c = &table[i];
        if (!c->name[0]) continue;
        bool prefix = lw >= 3 && lw < strlen(c->name) && strncmp(c->name, word, lw) == 0;
        if (!prefix && !one_edit(word, c->name)) continue;
        if (found) return NULL; /* ambiguous: "stag" is one edit from stage and stats */
        found = c;
    }
    return found;
}
