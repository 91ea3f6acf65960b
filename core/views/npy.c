/* The NPY header of a tensor (numpy's .npy format, version 1.0, or 2.0 when the header would
 * not fit in 64 KiB): magic, version, little-endian header length, then a Python dict literal
 * padded with spaces so the data starts on a 64-byte boundary. */
#include "../ckpt.h"
#include "../util/strbuf.h"

#include <stdlib.h>
#include <string.h>

char *ckpt_npy_header(const ckpt_tensor *t, size_t *len) {
    const char *descr = ckpt_dtype_info_of(t->dtype)->numpy;
    if (!descr) return NULL;
    strbuf dict;
    sb_init(&dict);
    sb_printf(&dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (uint32_t d = 0; d < t->ndim; d++) {
        if (d) sb_puts(&dict, ", ");
        sb_u64(&dict, t->shape[d]);
    }
    sb_puts(&dict, t->ndim == 1 ? ",), }" : "), }");
    if (dict.failed) {
        sb_free(&dict);
        return NULL;
    }
    bool v2 = 10 + dict.len + 1 + 63 > 65535;
    size_t prefix = v2 ? 12 : 10;
    size_t total = (prefix + dict.len + 1 + 63) / 64 * 64;
    size_t hlen = total - prefix;
    char *h = malloc(total);
    if (!h) {
        sb_free(&dict);
        return NULL;
    }
    memcpy(h, "\x93NUMPY", 6);
    h[6] = v2 ? 2 : 1;
    h[7] = 0;
    for (size_t i = 0; i < prefix - 8; i++) h[8 + i] = (char)((hlen >> (8 * i)) & 0xff);
    memcpy(h + prefix, dict.data, dict.len);
    memset(h + prefix + dict.len, ' ', hlen - dict.len - 1);
    h[total - 1] = '\n';
    sb_free(&dict);
    *len = total;
    return h;
}
