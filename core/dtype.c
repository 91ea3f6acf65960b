#include "ckpt.h"

#include <string.h>

static const ckpt_dtype_info table[CKPT_DTYPE_COUNT] = {
    [CKPT_BOOL] = {"BOOL", 8, "|b1"},
    [CKPT_U8] = {"U8", 8, "|u1"},
    [CKPT_I8] = {"I8", 8, "|i1"},
    [CKPT_U16] = {"U16", 16, "<u2"},
    [CKPT_I16] = {"I16", 16, "<i2"},
    [CKPT_F16] = {"F16", 16, "<f2"},
    [CKPT_BF16] = {"BF16", 16, NULL},
    [CKPT_U32] = {"U32", 32, "<u4"},
    [CKPT_I32] = {"I32", 32, "<i4"},
    [CKPT_F32] = {"F32", 32, "<f4"},
    [CKPT_U64] = {"U64", 64, "<u8"},
    [CKPT_I64] = {"I64", 64, "<i8"},
    [CKPT_F64] = {"F64", 64, "<f8"},
    [CKPT_C64] = {"C64", 64, "<c8"},
    [CKPT_F8_E4M3] = {"F8_E4M3", 8, NULL},
    [CKPT_F8_E5M2] = {"F8_E5M2", 8, NULL},
    [CKPT_F8_E8M0] = {"F8_E8M0", 8, NULL},
    [CKPT_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8, NULL},
    [CKPT_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8, NULL},
    [CKPT_F4] = {"F4", 4, NULL},
    [CKPT_F6_E2M3] = {"F6_E2M3", 6, NULL},
    [CKPT_F6_E3M2] = {"F6_E3M2", 6, NULL},
};

const ckpt_dtype_info *ckpt_dtype_info_of(ckpt_dtype dt) {
    return (unsigned)dt < CKPT_DTYPE_COUNT ? &table[dt] : NULL;
}

bool ckpt_dtype_parse(const char *s, size_t len, ckpt_dtype *out) {
    for (int i = 0; i < CKPT_DTYPE_COUNT; i++) {
        if (strlen(table[i].name) == len && memcmp(table[i].name, s, len) == 0) {
            *out = (ckpt_dtype)i;
            return true;
        }
    }
    return false;
}
