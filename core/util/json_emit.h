/* Writing a parsed JSON value back out (see json_emit.c). */
#ifndef CKPT_JSON_EMIT_H
#define CKPT_JSON_EMIT_H

#include "json.h"
#include "strbuf.h"

/* spaced: ", " and ": " between items (else compact, as serde_json writes); skip_member: a
 * member of the top-level object to leave out, or NULL. */
void json_emit(strbuf *sb, const json_value *v, bool spaced, const char *skip_member);

#endif
