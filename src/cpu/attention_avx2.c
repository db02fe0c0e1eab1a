#include "cpu/simd.h"
const fi_cpu_simd fi_cpu_simd_avx2 = {.name = "avx2-stub"};
