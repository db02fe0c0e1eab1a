/*
 * serving_avx2.c — the serving ops' vector kernels (serving_kern.h) for
 * AVX2 + FMA + F16C (8-wide f32; FMA only where serving_kern.h calls fmaf).
 */
#define FI_SK_NAME avx2
#define FI_SK_LEVEL "avx2"
#include "cpu/serving_kern.h"
