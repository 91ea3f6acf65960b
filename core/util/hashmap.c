#include "hashmap.h"

#include <stdlib.h>
#include <string.h>

uint64_t hm_hash(const char *p, size_t n) {
    /* Eight bytes per step, then murmur3's finalizer: hashing dominated mounts of 100k
     * tensors when it went byte by byte. */
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0x94d049bb133111ebull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
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

static hm_entry *find(const hashmap *m, const char *key, size_t len, uint64_t hash) {
    for (size_t i = hash & m->mask;; i = (i + 1) & m->mask) {
        hm_entry *e = &m->slots[i];
        if (!e->key || (e->hash == hash && e->len == len && memcmp(e->key, key, len) == 0))
            return e;
    }
}

static bool grow(hashmap *m) {
    size_t slots = (m->mask + 1) * 2;
    if (slots > SIZE_MAX / 4 / sizeof(hm_entry)) return false;
    hm_entry *fresh = calloc(slots, sizeof *fresh);
    if (!fresh) return false;
    hashmap bigger = {fresh, slots - 1, m->count};
    for (size_t i = 0; i <= m->mask; i++)
        if (m->slots[i].key)
            *find(&bigger, m->slots[i].key, m->slots[i].len, m->slots[i].hash) = m->slots[i];
    free(m->slots);
    *m = bigger;
    return true;
}

hm_entry *hm_put(hashmap *m, const char *key, size_t len, size_t value, bool *added) {
    *added = false;
    if (2 * (m->count + 1) > m->mask + 1 && !grow(m)) return NULL;
    uint64_t hash = hm_hash(key, len);
    hm_entry *e = find(m, key, len, hash);
    *added = e->key == NULL;
    if (*added) {
        *e = (hm_entry){key, len, value, hash};
        m->count++;
    }
    return e;
}

const hm_entry *hm_get(const hashmap *m, const char *key, size_t len) {
    const hm_entry *e = find(m, key, len, hm_hash(key, len));
    return e->key ? e : NULL;
}
