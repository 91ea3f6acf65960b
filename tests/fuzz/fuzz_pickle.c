/* libFuzzer harness: the restricted unpickler (core/parse/pickle.h) on raw bytes.
 *
 * Each input is parsed three times — with the default limits, with tight ones, so the limit
 * paths run too, and with a hook that swaps dict keys and values for records, so that the
 * recycling of what they held runs (ASan sees a node used after it was recycled) — and a
 * parsed tree is walked (shared and cyclic values included, under a visit budget) checking the
 * shapes its users rely on, then turned into JSON, which must parse. */
#include "fuzz_common.h"
#include "parse/pickle.h"

static size_t visits;
static bool hooked; /* records may stand in the tree */

static void walk(const pk_value *v, int depth) {
    FZ_CHECK(v != NULL, "NULL value in the tree");
    if (depth > 200 || visits == 0) return;
    visits--;
    char name[256];
    switch ((pk_kind)v->kind) {
    case PK_NONE:
    case PK_BOOL:
    case PK_INT:
    case PK_FLOAT:
        return;
    case PK_BIGINT:
    case PK_STR:
    case PK_BYTES:
        FZ_CHECK(v->u.s.p != NULL || v->u.s.len == 0, "%s without bytes", pk_kind_name(v->kind));
        return;
    case PK_TUPLE:
    case PK_LIST:
    case PK_SET:
        FZ_CHECK(v->n == 0 || v->u.c.items, "%s of %u items without items", pk_kind_name(v->kind),
                 v->n);
        FZ_CHECK(v->kind == PK_TUPLE || v->n <= v->u.c.cap, "%s: %u items, room for %u",
                 pk_kind_name(v->kind), v->n, v->u.c.cap);
        for (uint32_t i = 0; i < v->n; i++) walk(v->u.c.items[i], depth + 1);
        return;
    case PK_DICT:
        FZ_CHECK(v->n == 0 || v->u.c.items, "dict of %u pairs without items", v->n);
        FZ_CHECK(2ull * v->n <= v->u.c.cap, "dict: %u pairs, room for %u items", v->n, v->u.c.cap);
        for (uint32_t i = 0; i < 2 * v->n; i++) walk(v->u.c.items[i], depth + 1);
        (void)pk_dict_get(v, "state_dict");
        if (v->u.c.cls) pk_global_name(v->u.c.cls, name, sizeof name);
        if (v->u.c.state) walk(v->u.c.state, depth + 1);
        return;
    case PK_GLOBAL:
        FZ_CHECK(v->u.global && v->u.global->module && v->u.global->name, "global without name");
        pk_global_name(v->u.global, name, sizeof name);
        return;
    case PK_CALL:
        FZ_CHECK(v->u.call.fn && v->u.call.fn->kind == PK_GLOBAL, "call of a non-global");
        FZ_CHECK(v->u.call.args && v->u.call.args->kind == PK_TUPLE, "call without args tuple");
        FZ_CHECK(pk_call_global(v) == v->u.call.fn->u.global, "pk_call_global");
        walk(v->u.call.args, depth + 1);
        if (v->u.call.kwargs) walk(v->u.call.kwargs, depth + 1);
        if (v->u.call.state) walk(v->u.call.state, depth + 1);
        return;
    case PK_PERSID:
        walk(v->u.persid, depth + 1);
        return;
    case PK_RECORD:
        if (hooked) return;
        break;
    case PK_MARK:
        break;
    }
    fz_die("value of kind %u (%s) in a finished tree", v->kind, pk_kind_name(v->kind));
}

/* Swaps about a third of the values, some keys, and some pairs for one shared record (as the
 * DCP reader does), by the offsets of what they replace. */
static int swap_pair(void *ctx, pk_doc *doc, const pk_pair_site *site, pk_value **key,
                     pk_value **value, ckpt_err *err) {
    (void)ctx;
    FZ_CHECK(site->dict && site->dict->kind == PK_DICT, "a pair offered outside a dict");
    FZ_CHECK(!pk_shared(*value), "a shared value offered");
    for (size_t i = 0; i < site->nbelow; i++) FZ_CHECK(site->below[i], "NULL under the dict");
    uint64_t pos = (*value)->pos;
    pk_value *rec = NULL;
    if (pos % 3 == 0 || (pos % 7 == 0 && !pk_shared(*key)) || (pos % 5 == 0 && !pk_shared(*key)))
        if (!(rec = pk_new_record(doc, 1, NULL, pos))) return ckpt_fail(err, -ENOMEM, "oom");
    if (pos % 3 == 0) {
        *value = rec;
    } else if (pos % 7 == 0 && !pk_shared(*key)) {
        rec->flags |= PK_SHARED;
        *key = *value = rec;
    } else if (pos % 5 == 0 && !pk_shared(*key)) {
        *key = rec;
    }
    return 0;
}

static void parse_once(const uint8_t *data, size_t size, pk_limits lim, bool hook) {
    pk_doc doc;
    ckpt_err err;
    err.msg[0] = '\0';
    pk_hooks hooks = {NULL, swap_pair};
    pk_options opt = {"fuzz.pkl", 1000, &pk_torch_globals, 1, lim, hook ? &hooks : NULL};
    hooked = hook;
    int rc = pk_parse(&doc, (const char *)data, size, &opt, &err);
    if (rc) {
        FZ_CHECK(rc < 0 && err.msg[0], "pk_parse failed (%d) without a message", rc);
        FZ_CHECK(doc.root == NULL, "failed parse left a root");
        return;
    }
    FZ_CHECK(doc.root && doc.end > 0 && doc.end <= size, "parsed %zu of %zu bytes", doc.end, size);
    visits = 200000;
    walk(doc.root, 0);
    strbuf sb;
    sb_init(&sb);
    size_t budget = 100000;
    if (pk_to_json(&sb, doc.root, &budget) && !sb.failed)
        fz_check_json("pk_to_json", sb.data ? sb.data : "", sb.len);
    sb_free(&sb);
    pk_free(&doc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_json_lenient = true; /* dict keys may repeat in a pickle; Python keeps the last */
    parse_once(data, size, (pk_limits){0, 0, 0}, false);
    parse_once(data, size, (pk_limits){8, 4, 64}, false);
    parse_once(data, size, (pk_limits){0, 0, 0}, true);
    return 0;
}
