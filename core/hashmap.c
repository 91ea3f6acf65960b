#include "hashmap.h"

#include <stdlib.h>
#include <string.h>

uint64_t hm_hash(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ull;
    }
    return h;
}

bool hm_init(hashmap *m, size_t expected) {
    size_t slots = 16;
    while (slots < 2 * expected + 2) {
        if (slots > SIZE_MAX / 4 / sizeof(hm_entry)) return false;
        slots *= 2;
    }
    m->slots = calloc(slots, sizeof *m->slots);
    m->mask = slots - 1;
    m->count = 0;
    return m->slots != NULL;
}

void hm_free(hashmap *m) {
    free(m->slots);
    m->slots = NULL;
}

static hm_entry *find(const hashmap *m, const char *key, size_t len) {
    for (size_t i = hm_hash(key, len) & m->mask;; i = (i + 1) & m->mask) {
        hm_entry *e = &m->slots[i];
        if (!e->key || (e->len == len && memcmp(e->key, key, len) == 0)) return e;
    }
}

static bool grow(hashmap *m) {
    size_t slots = (m->mask + 1) * 2;
    if (slots > SIZE_MAX / 4 / sizeof(hm_entry)) return false;
    hm_entry *fresh = calloc(slots, sizeof *fresh);
    if (!fresh) return false;
    hashmap bigger = {fresh, slots - 1, m->count};
    for (size_t i = 0; i <= m->mask; i++)
        if (m->slots[i].key) *find(&bigger, m->slots[i].key, m->slots[i].len) = m->slots[i];
    free(m->slots);
    *m = bigger;
    return true;
}

hm_entry *hm_put(hashmap *m, const char *key, size_t len, size_t value, bool *added) {
    *added = false;
    if (2 * (m->count + 1) > m->mask + 1 && !grow(m)) return NULL;
    hm_entry *e = find(m, key, len);
    *added = e->key == NULL;
    if (*added) {
        *e = (hm_entry){key, len, value};
        m->count++;
    }
    return e;
}

const hm_entry *hm_get(const hashmap *m, const char *key, size_t len) {
    const hm_entry *e = find(m, key, len);
    return e->key ? e : NULL;
}
