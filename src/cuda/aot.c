/*
 * aot.c — the table of kernels compiled ahead of time by nvcc (`make aot`):
 * cubins embedded in the library by src/cuda/aot/table.sh, looked up by
 * kernel name, entry file and -D options before the disk cache and NVRTC
 * (src/cuda/jit.c). A library built without AOT has an empty table.
 */
#include "cuda/aot_table.h"
#include "cuda/cuda_backend.h"

#include <string.h>

int fi_cuda_aot_count(void) { return fi_aot_kernel_count; }

/* Whether the table's "-DA -DB ..." is exactly the spec's defines in order. */
static int same_options(const char *opts, const fi_kernel_spec *spec) {
    for (int i = 0; i < spec->num_defines; i++) {
        size_t n = strlen(spec->defines[i]);
        if (strncmp(opts, spec->defines[i], n) != 0) return 0;
        opts += n;
        if (*opts == ' ') opts++;
        else if (*opts || i + 1 < spec->num_defines) return 0;
    }
    return *opts == 0;
}

const void *fi_cuda_aot_find(const fi_kernel_spec *spec, const char *arch, size_t *size) {
    for (int i = 0; i < fi_aot_kernel_count; i++) {
        const fi_aot_kernel *k = &fi_aot_kernels[i];
        if (strcmp(k->name, spec->name) || strcmp(k->arch, arch) ||
            strcmp(k->entry_file, spec->entry_file) || !same_options(k->options, spec))
            continue;
        *size = k->size;
        return k->image;
    }
    *size = 0;
    return NULL;
}
