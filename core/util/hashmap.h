/* Open-addressing map from byte strings (not copied) to indexes; grows at half load. */
#ifndef CKPT_HASHMAP_H
#define CKPT_HASHMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct hm_entry {
    const char *key; /* NULL = empty slot */
    size_t len;
    size_t value;
    uint64_t hash; /* compared before the bytes */
} hm_entry;

typedef struct hashmap {
    hm_entry *slots;
    size_t mask;
    size_t count;
} hashmap;

/* Not stable across versions: never show it to users. */
uint64_t hm_hash(const char *p, size_t n);
/* Sized for `expected` keys (a hint); returns false when out of memory. */
bool hm_init(hashmap *m, size_t expected);
void hm_free(hashmap *m);
/* The entry for key: the existing one, or a new one holding `value`. *added says which.
 * NULL when out of memory. The pointer is valid until the next hm_put. */
hm_entry *hm_put(hashmap *m, const char *key, size_t len, size_t value, bool *added);
const hm_entry *hm_get(const hashmap *m, const char *key, size_t len);

#endif
