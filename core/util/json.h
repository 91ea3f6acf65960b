/* Strict JSON reader (RFC 8259) for checkpoint headers and indexes.
 *
 * cJSON is not enough here: sizes must stay exact u64 (cJSON goes through double), names may
 * hold U+0000 (cJSON strings are NUL-terminated), duplicate keys must be detected and every
 * error must carry a byte offset. Strings without escapes point into the input buffer, so the
 * input must outlive the document. */
#ifndef CKPT_JSON_H
#define CKPT_JSON_H

#include "arena.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    JSON_NULL,
    JSON_FALSE,
    JSON_TRUE,
    JSON_NUMBER,
    JSON_STRING,
    JSON_ARRAY,
    JSON_OBJECT
} json_type;

typedef struct json_value json_value;
/* 48 bytes a value (it was 64): a header is mostly small values, and a document of N bytes may
 * hold N/2 of them. Containers use head/count, strings and numbers str/len; lengths are 32-bit
 * because json_parse refuses input of 4 GiB or more. */
struct json_value {
    union {
        const char *str;  /* decoded string, or the number's source text */
        json_value *head; /* first member of an array or object */
    };
    const char *key;  /* member name inside an object (decoded) */
    json_value *next; /* next sibling */
    union {
        uint32_t len;   /* length of str */
        uint32_t count; /* members of an array or object */
    };
    uint32_t key_len; /* length of key */
    size_t pos;       /* byte offset of the value in the input */
    uint8_t type;     /* json_type */
};

typedef struct json_doc {
    arena mem;
    json_value *root;
} json_doc;

typedef struct json_error {
    size_t pos;
    char msg[160];
} json_error;

enum { JSON_MAX_DEPTH = 128 };
/* Values may take at most JSON_DENSITY times the input's size plus JSON_SLACK bytes: a
 * document denser than that ([0,0,0,...] is a 48-byte value every 2 bytes, 24x) is refused as
 * soon as it passes the limit, so parsing N bytes never holds more than 8N + 1 MiB besides the
 * input (escaped strings are decoded into at most N more). Real headers stay below: a
 * safetensors tensor entry is about 10 input bytes a value, 5x. */
enum { JSON_DENSITY = 8, JSON_SLACK = 1 << 20 };

/* Parses buf[0..len) as one JSON value surrounded by optional whitespace. Duplicate keys in an
 * object are an error; so is input of 4 GiB or more, and a document denser than JSON_DENSITY.
 * Returns 0, or -EINVAL/-E2BIG/-ENOMEM with err filled. */
int json_parse(json_doc *doc, const char *buf, size_t len, json_error *err);
void json_doc_free(json_doc *doc);

/* Called with each member of the root object (m->key, m->key_len; m->pos is the key's
 * offset). Non-zero stops the parse, and json_stream_members returns it. */
typedef int (*json_member_fn)(void *ctx, const json_value *m);
/* Parses like json_parse, but a root object one member at a time: each member's value is
 * parsed into a scratch DOM, handed to `each`, and forgotten when it returns, so a header of a
 * million tensor entries never holds more than one entry's values (besides 16 bytes a key for
 * the duplicate check at the end). The member named `keep` (NULL: none) is kept: doc->root is
 * then an object of the kept members only, their text copied (the input may go). A root that is not
 * an object is parsed whole into doc->root, with no call. Errors are json_parse's, found in the
 * same order (syntax and nested duplicates where they occur, the root's duplicates at the end): a
 * reader that defers its own complaints to the end reports what it would have reported after
 * json_parse. */
int json_stream_members(json_doc *doc, const char *buf, size_t len, const char *keep,
                        json_member_fn each, void *ctx, json_error *err);

const char *json_type_name(json_type t);
/* "an object", "a string", "null": for messages. */
const char *json_type_desc(json_type t);
/* Member of an object by name, NULL if absent or v is not an object. */
const json_value *json_member(const json_value *obj, const char *key);
/* True if v is a JSON integer written without sign, fraction or exponent that fits in u64. */
bool json_as_u64(const json_value *v, uint64_t *out);
/* True if v is a string equal to s. */
bool json_str_eq(const json_value *v, const char *s);

#endif
