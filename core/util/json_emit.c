/* A parsed JSON value written back out, members in their order and numbers as written, so a
 * document read from one checkpoint can be carried into another unchanged. */
#include "json_emit.h"

#include <string.h>

void json_emit(strbuf *sb, const json_value *v, bool spaced, const char *skip_member) {
    switch (v->type) {
    case JSON_NULL:
        sb_puts(sb, "null");
        break;
    case JSON_FALSE:
        sb_puts(sb, "false");
        break;
    case JSON_TRUE:
        sb_puts(sb, "true");
        break;
    case JSON_NUMBER:
        sb_put(sb, v->str, v->len);
        break;
    case JSON_STRING:
        sb_json_str(sb, v->str, v->len);
        break;
    case JSON_ARRAY:
    case JSON_OBJECT: {
        bool object = v->type == JSON_OBJECT, first = true;
        sb_putc(sb, object ? '{' : '[');
        for (const json_value *m = v->head; m; m = m->next) {
            if (object && skip_member && strlen(skip_member) == m->key_len &&
                memcmp(m->key, skip_member, m->key_len) == 0)
                continue;
            if (!first) sb_puts(sb, spaced ? ", " : ",");
            first = false;
            if (object) {
                sb_json_str(sb, m->key, m->key_len);
                sb_puts(sb, spaced ? ": " : ":");
            }
            json_emit(sb, m, spaced, NULL);
        }
        sb_putc(sb, object ? '}' : ']');
        break;
    }
    }
}
