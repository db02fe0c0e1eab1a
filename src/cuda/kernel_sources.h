/* kernel_sources.h — the kernels/ sources embedded at build time (generated
 * by src/embed.sh into $(BUILD)/gen/kernel_sources.c). */
#ifndef FI_CUDA_KERNEL_SOURCES_H
#define FI_CUDA_KERNEL_SOURCES_H

#include <stddef.h>

typedef struct fi_kernel_file {
    const char *name; /* as #included: "attention.cuh" */
    const char *text; /* NUL-terminated */
    size_t size;      /* bytes, without the NUL */
} fi_kernel_file;

extern const fi_kernel_file fi_kernel_files[];
extern const int fi_kernel_file_count;

#endif
