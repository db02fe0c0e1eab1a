/* aot_table.h — the kernels compiled ahead of time, as the build embeds them
 * ($(BUILD)/gen/aot_table.c, written by src/cuda/aot/table.sh; empty when
 * the library is built without AOT). */
#ifndef FI_CUDA_AOT_TABLE_H
#define FI_CUDA_AOT_TABLE_H

#include <stddef.h>

typedef struct fi_aot_kernel {
    const char *name;       /* entry point: "fi_attn_d128x128_q2k2o2_g4r4_paged_m0w0c0p0" */
    const char *entry_file; /* "attention.cuh" */
    const char *arch;       /* "sm_90a" */
    const char *options;    /* the -D options, space-separated, in spec order */
    const unsigned char *image;
    size_t size;
} fi_aot_kernel;

extern const fi_aot_kernel fi_aot_kernels[];
extern const int fi_aot_kernel_count;

#endif
