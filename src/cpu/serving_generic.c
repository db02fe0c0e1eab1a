/*
 * serving_generic.c — the serving ops' vector kernels (serving_kern.h) for
 * the baseline target (SSE2 on x86-64, NEON on AArch64). SSE2 has no FMA:
 * there fmaf is a libm call per value, right but slow; x86-64 machines
 * with FMA run the avx2 or avx512 table.
 */
#define FI_SK_NAME generic
#define FI_SK_LEVEL "generic"
#include "cpu/serving_kern.h"
