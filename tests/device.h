/*
 * device.h — test data on the backend under test: a test-owned host buffer
 * (tests/util.h: guarded, poisonable) and, on CUDA, its device twin, moved
 * through the driver loaded with dlopen (no CUDA headers). Lets a test that
 * runs on the CPU SIMD levels run the same cases on the CUDA backend:
 *
 *   tu_cuda_backend_open   the "cuda" entry of a test's backends
 *   tu_mirror_up           the library's view of a host buffer (the buffer
 *                          itself on the CPU; a device copy of the whole
 *                          allocation on CUDA, padding and poison included)
 *   tu_mirror_down         the device copy back into the host buffer
 */
#ifndef FI_TESTS_DEVICE_H
#define FI_TESTS_DEVICE_H

#include "util.h"

/* The index tests give the CUDA backend (after the CPU SIMD levels). */
#define TU_CUDA_INDEX TU_NUM_CPU_BACKENDS

/* Fill *be as the "cuda" backend and create its context. Returns 0 if it is
 * ready; otherwise ctx is NULL, "skip cuda: why" is printed (not selected,
 * no GPU, no driver) and -1 is returned. */
int tu_cuda_backend_open(tu_cpu_backend *be);
static inline int tu_is_cuda(const tu_cpu_backend *be) { return be->index == TU_CUDA_INDEX; }

typedef struct tu_mirror {
    void *dev;     /* the device allocation (NULL on the CPU) */
    size_t bytes;
    fi_tensor t;   /* the view the library gets */
} tu_mirror;

/* Upload h (the whole allocation) and set m->t to the matching view.
 * Returns 0 on success. m must be zeroed or freed before. */
int tu_mirror_up(const tu_cpu_backend *be, const tu_buf *h, tu_mirror *m);
/* The device copy back into h (a no-op on the CPU). Returns 0 on success. */
int tu_mirror_down(const tu_cpu_backend *be, const tu_mirror *m, tu_buf *h);
void tu_mirror_free(tu_mirror *m);

#endif /* FI_TESTS_DEVICE_H */
