#include "cpu/simd.h"
const fi_cpu_simd fi_cpu_simd_avx512 = {.name = "avx512-stub"};
