/*
 * serving_generic.c — the serving ops' vector kernels (serving_kern.h) for
 * the baseline target (SSE2 on x86-64, NEON on AArch64).
 */
#define FI_SK_NAME generic
#define FI_SK_LEVEL "generic"
#include "cpu/serving_kern.h"
