/*
 * list.c — build tool of `make aot`: prints the kernel configurations of
 * src/cuda/aot_set.c, one per line as "ENTRY_FILE NAME -D...", for
 * src/cuda/aot/build.sh. Linked with the library's objects and an empty
 * table (the library's own table is what this list builds).
 */
#include "cuda/cuda_backend.h"

#include <stdio.h>

int main(void) {
    /* the set is the default settings' (aot_set.c), whatever the environment */
    for (int i = 0; i < fi_cuda_aot_set_count(); i++) {
        fi_kernel_spec s;
        fi_cuda_aot_set_spec(i, &s);
        printf("%s %s", s.entry_file, s.name);
        for (int d = 0; d < s.num_defines; d++) printf(" %s", s.defines[d]);
        printf("\n");
    }
    return 0;
}
