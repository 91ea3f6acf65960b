#include "../ckpt.h"

#include <string.h>

static const ckpt_dtype_info table[CKPT_DTYPE_COUNT] = {
    [CKPT_BOOL] = {"BOOL", 1, 1, "|b1", true},
    [CKPT_U8] = {"U8", 1, 1, "|u1", true},
    [CKPT_I8] = {"I8", 1, 1, "|i1", true},
    [CKPT_U16] = {"U16", 1, 2, "<u2", true},
    [CKPT_I16] = {"I16", 1, 2, "<i2", true},
    [CKPT_F16] = {"F16", 1, 2, "<f2", true},
    [CKPT_BF16] = {"BF16", 1, 2, NULL, true},
    [CKPT_U32] = {"U32", 1, 4, "<u4", true},
    [CKPT_I32] = {"I32", 1, 4, "<i4", true},
    [CKPT_F32] = {"F32", 1, 4, "<f4", true},
    [CKPT_U64] = {"U64", 1, 8, "<u8", true},
    [CKPT_I64] = {"I64", 1, 8, "<i8", true},
    [CKPT_F64] = {"F64", 1, 8, "<f8", true},
    [CKPT_C64] = {"C64", 1, 8, "<c8", true},
    [CKPT_F8_E4M3] = {"F8_E4M3", 1, 1, NULL, true},
    [CKPT_F8_E5M2] = {"F8_E5M2", 1, 1, NULL, true},
    [CKPT_F8_E8M0] = {"F8_E8M0", 1, 1, NULL, true},
    [CKPT_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 1, 1, NULL, true},
    [CKPT_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 1, 1, NULL, true},
    [CKPT_F4] = {"F4", 2, 1, NULL, true},
    [CKPT_F6_E2M3] = {"F6_E2M3", 4, 3, NULL, true},
    [CKPT_F6_E3M2] = {"F6_E3M2", 4, 3, NULL, true},
    [CKPT_C128] = {"C128", 1, 16, "<c16", false},
    /* ggml block sizes and bytes per block: ggml-common.h block structs */
    [CKPT_Q4_0] = {"Q4_0", 32, 18, NULL, false},
    [CKPT_Q4_1] = {"Q4_1", 32, 20, NULL, false},
    [CKPT_Q5_0] = {"Q5_0", 32, 22, NULL, false},
    [CKPT_Q5_1] = {"Q5_1", 32, 24, NULL, false},
    [CKPT_Q8_0] = {"Q8_0", 32, 34, NULL, false},
    [CKPT_Q8_1] = {"Q8_1", 32, 36, NULL, false},
    [CKPT_Q2_K] = {"Q2_K", 256, 84, NULL, false},
    [CKPT_Q3_K] = {"Q3_K", 256, 110, NULL, false},
    [CKPT_Q4_K] = {"Q4_K", 256, 144, NULL, false},
    [CKPT_Q5_K] = {"Q5_K", 256, 176, NULL, false},
    [CKPT_Q6_K] = {"Q6_K", 256, 210, NULL, false},
    [CKPT_Q8_K] = {"Q8_K", 256, 292, NULL, false},
    [CKPT_IQ2_XXS] = {"IQ2_XXS", 256, 66, NULL, false},
    [CKPT_IQ2_XS] = {"IQ2_XS", 256, 74, NULL, false},
    [CKPT_IQ3_XXS] = {"IQ3_XXS", 256, 98, NULL, false},
    [CKPT_IQ1_S] = {"IQ1_S", 256, 50, NULL, false},
    [CKPT_IQ4_NL] = {"IQ4_NL", 32, 18, NULL, false},
    [CKPT_IQ3_S] = {"IQ3_S", 256, 110, NULL, false},
    [CKPT_IQ2_S] = {"IQ2_S", 256, 82, NULL, false},
    [CKPT_IQ4_XS] = {"IQ4_XS", 256, 136, NULL, false},
    [CKPT_IQ1_M] = {"IQ1_M", 256, 56, NULL, false},
    [CKPT_TQ1_0] = {"TQ1_0", 256, 54, NULL, false},
    [CKPT_TQ2_0] = {"TQ2_0", 256, 66, NULL, false},
    [CKPT_MXFP4] = {"MXFP4", 32, 17, NULL, false},
    [CKPT_NVFP4] = {"NVFP4", 64, 36, NULL, false},
    [CKPT_Q1_0] = {"Q1_0", 128, 18, NULL, false},
    [CKPT_Q2_0] = {"Q2_0", 64, 18, NULL, false},
};

const ckpt_dtype_info *ckpt_dtype_info_of(ckpt_dtype dt) {
    return (unsigned)dt < CKPT_DTYPE_COUNT ? &table[dt] : NULL;
}

unsigned ckpt_dtype_elem_size(ckpt_dtype dt) {
    const ckpt_dtype_info *i = ckpt_dtype_info_of(dt);
    return i && i->block == 1 ? i->block_bytes : 0;
}

bool ckpt_dtype_parse(const char *s, size_t len, ckpt_dtype *out) {
    if (len == 0) return false;
    /* Called once per tensor entry of every header: the first byte rules out most names. */
    for (int i = 0; i < CKPT_DTYPE_COUNT; i++) {
        const char *name = table[i].name;
        if (name[0] == s[0] && strnlen(name, len + 1) == len && memcmp(name, s, len) == 0) {
            *out = (ckpt_dtype)i;
            return true;
        }
    }
    return false;
}
