/* What the CPU can do beyond baseline x86-64, asked once (cpu.c). __builtin_cpu_supports
 * would do, but clang 14 knows no "f16c" there, and the fuzz build is clang's. */
#ifndef CKPT_CPU_H
#define CKPT_CPU_H

#include <stdbool.h>

/* AVX with F16C, and the OS saving the ymm registers: _mm256_cvtps_ph / _mm256_cvtph_ps. */
bool ckpt_cpu_f16c(void);
/* That and AVX2 (256-bit integer operations). */
bool ckpt_cpu_f16c_avx2(void);

#endif
