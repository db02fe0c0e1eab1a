/*
 * serving_avx512.c — the serving ops' vector kernels (serving_kern.h) for
 * AVX-512 (16-wide f32).
 */
#define FI_SK_NAME avx512
#define FI_SK_LEVEL "avx512"
#include "cpu/serving_kern.h"
