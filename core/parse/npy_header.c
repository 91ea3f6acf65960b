/* .npy headers (numpy's format: "\x93NUMPY", major and minor version, the
 * header length as little-endian u16 (version 1) or u32 (versions 2 and 3), then a Python dict
 * literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces and
 * ended by '\n'; the data follows). Only what numpy.save writes for plain arrays is accepted:
 * a dtype ckptfs knows, little-endian; C or Fortran order. Staged files and .npz members share
 * this parser. */
#include "npy_header.h"
#include "../util/le.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

typedef struct cursor {
    const char *p, *end;
    char *why;
    size_t why_cap;
} cursor;

static int fail(cursor *c, const char *msg) {
    snprintf(c->why, c->why_cap, "%s", msg);
    return -EINVAL;
}

static void skip_space(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static bool eat(cursor *c, char ch) {
    skip_space(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return true;
    }
    return false;
}

/* A Python string literal without escapes ('...' or "..."). */
static bool string_lit(cursor *c, const char **s, size_t *n) {
    skip_space(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return false;
    char q = *c->p++;
    const char *start = c->p;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\') return false;
        c->p++;
    }
    if (c->p >= c->end) return false;
    *s = start;
    *n = (size_t)(c->p - start);
    c->p++;
    return true;
}

static bool word(cursor *c, const char *w) {
    skip_space(c);
    size_t n = strlen(w);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0) return false;
    c->p += n;
    return true;
}

/* A tuple of non-negative integers: (), (3,), (2, 3). Python 2 numpy wrote 3L. */
static int shape_tuple(cursor *c, npy_header *out) {
    if (!eat(c, '(')) return fail(c, "header field 'shape' is not a tuple");
    out->ndim = 0;
    for (;;) {
        if (eat(c, ')')) return 0;
        skip_space(c);
        if (c->p >= c->end || *c->p < '0' || *c->p > '9')
            return fail(c, "header field 'shape' holds something other than a non-negative "
                           "integer");
        uint64_t v = 0;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            unsigned d = (unsigned)(*c->p++ - '0');
            if (v > (UINT64_MAX - d) / 10) return fail(c, "header field 'shape' overflows");
            v = v * 10 + d;
        }
        if (c->p < c->end && *c->p == 'L') c->p++;
        if (out->ndim == CKPT_MAX_DIMS)
            return fail(c, "header field 'shape' has more dimensions than ckptfs supports (32)");
        out->shape[out->ndim++] = v;
        if (eat(c, ',')) continue;
        if (eat(c, ')')) return 0;
        return fail(c, "header field 'shape' is not a tuple of integers");
    }
}

/* numpy's descr ('<f4', '|u1') to a ckptfs dtype: the byte order must be little (or not
 * matter: one-byte types), the kind and size must be one the dtype table lists. */
static int descr_dtype(cursor *c, const char *s, size_t n, ckpt_dtype *out) {
    if (n < 2 || !strchr("<>|=", s[0]))
        return fail(c, "header field 'descr' is not a plain numpy dtype such as '<f4'");
    for (int dt = 0; dt < CKPT_DTYPE_COUNT; dt++) {
        const ckpt_dtype_info *info = ckpt_dtype_info_of((ckpt_dtype)dt);
        const char *np = info->numpy;
        if (!np || strlen(np) - 1 != n - 1 || memcmp(np + 1, s + 1, n - 1) != 0) continue;
        if (s[0] == '>' && info->block_bytes > 1)
            return fail(c, "header field 'descr' is big-endian (ckptfs reads little-endian "
                           "bytes: save with arr.astype(arr.dtype.newbyteorder('<')))");
        *out = (ckpt_dtype)dt;
        return 0;
    }
    char msg[160];
    snprintf(msg, sizeof msg,
             "header field 'descr' '%.*s' is a numpy dtype ckptfs has no "
             "dtype for",
             (int)(n > 40 ? 40 : n), s);
    return fail(c, msg);
}

int npy_header_parse(const unsigned char *head, size_t n, npy_header *out, char *why,
                     size_t why_cap) {
    cursor c = {.why = why, .why_cap = why_cap};
    memset(out, 0, sizeof *out);
    if (n < 10 || memcmp(head, "\x93NUMPY", 6) != 0)
        return fail(&c, "not an .npy file (magic \\x93NUMPY missing)");
    unsigned major = head[6];
    if (major < 1 || major > 3) {
        snprintf(why, why_cap, "version %u.%u at offset 6 is not one numpy writes (1, 2, 3)", major,
                 head[7]);
        return -EINVAL;
    }
    uint64_t prefix = major == 1 ? 10 : 12, hlen;
    if (major == 1) {
        hlen = le16(head + 8);
    } else {
        if (n < 12) return fail(&c, "header length at offset 8 is cut short");
        hlen = le32(head + 8);
    }
    if (hlen > NPY_MAX_HEADER) {
        snprintf(why, why_cap, "header length %llu at offset 8 is larger than 1 MiB",
                 (unsigned long long)hlen);
        return -EINVAL;
    }
    if (prefix + hlen > n) {
        snprintf(why, why_cap, "header length %llu at offset 8 runs past the end of the file",
                 (unsigned long long)hlen);
        return -EINVAL;
    }
    c.p = (const char *)head + prefix;
    c.end = c.p + hlen;
    bool have_descr = false, have_order = false, have_shape = false;
    if (!eat(&c, '{')) return fail(&c, "header at offset 10 is not a Python dict literal");
    for (;;) {
        if (eat(&c, '}')) break;
        const char *key;
        size_t klen;
        if (!string_lit(&c, &key, &klen) || !eat(&c, ':'))
            return fail(&c, "header dict has a key that is not a quoted string");
        int rc = 0;
        if (klen == 5 && memcmp(key, "descr", 5) == 0) {
            const char *s;
            size_t sn;
            if (!string_lit(&c, &s, &sn))
                return fail(&c, "header field 'descr' is not a string (a structured dtype?)");
            rc = descr_dtype(&c, s, sn, &out->dtype);
            have_descr = true;
        } else if (klen == 13 && memcmp(key, "fortran_order", 13) == 0) {
            if (word(&c, "True"))
                out->fortran_order = true;
            else if (!word(&c, "False"))
                return fail(&c, "header field 'fortran_order' is not a bool");
            have_order = true;
        } else if (klen == 5 && memcmp(key, "shape", 5) == 0) {
            rc = shape_tuple(&c, out);
            have_shape = true;
        } else {
            return fail(&c, "header dict has a key other than descr, fortran_order, shape");
        }
        if (rc) return rc;
        if (eat(&c, ',')) continue;
        if (eat(&c, '}')) break;
        return fail(&c, "header dict is not closed by '}'");
    }
    skip_space(&c);
    if (c.p != c.end) return fail(&c, "header has bytes after its dict");
    if (!have_descr || !have_order || !have_shape)
        return fail(&c, !have_descr   ? "header has no 'descr'"
                        : !have_shape ? "header has no 'shape'"
                                      : "header has no 'fortran_order'");
    out->data_offset = prefix + hlen;
    return 0;
}
