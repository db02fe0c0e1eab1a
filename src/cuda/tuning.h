/*
 * tuning.h — the CUDA backend's user settings: the only place in src/cuda
 * that reads the environment (tuning.c). A context reads them once, at
 * creation; the context-free entry points (fi warmup, the kernel lists of
 * the tests and of `make aot`) read them when called.
 *
 *   FLASHINFER_CUDA_ARCH=sm_90     NVRTC target instead of the device's
 *   FLASHINFER_AOT=0               bypass the library's AOT table (JIT only)
 *   FLASHINFER_CUDA_PDL=0          no programmatic dependent launch
 *   FLASHINFER_CUDA_KERNELS=...    kernel forms, for debugging and tests:
 *       separate    the separate attention, tensor-core and merge kernels
 *                   instead of the persistent kernel
 *       full-form   the persistent kernel without its decode and mixed forms
 *       cuda-cores  no tensor-core kernel
 *   FLASHINFER_JIT_LOG=1           one line on stderr per kernel loaded
 *   FLASHINFER_NVRTC=path          libnvrtc to load ($CUDA_HOME/lib64 is
 *                                  also searched)
 * (FLASHINFER_CACHE_DIR, the disk cache, is read by src/core/cache.c.)
 */
#ifndef FI_CUDA_TUNING_H
#define FI_CUDA_TUNING_H

#include <stdbool.h>

typedef enum fi_cuda_kernel_mode {
    FI_CUDA_KERNELS_AUTO = 0,
    FI_CUDA_KERNELS_SEPARATE,
    FI_CUDA_KERNELS_FULL_FORM,
    FI_CUDA_KERNELS_CUDA_CORES,
} fi_cuda_kernel_mode;

typedef struct fi_cuda_tuning {
    char arch[16];               /* FLASHINFER_CUDA_ARCH; "" = the device's */
    bool use_aot;                /* FLASHINFER_AOT is not "0" */
    bool pdl;                    /* FLASHINFER_CUDA_PDL is not "0" */
    fi_cuda_kernel_mode kernels; /* FLASHINFER_CUDA_KERNELS */
    bool jit_log;                /* FLASHINFER_JIT_LOG set, not "0" */
    /* Not from the environment: the target has sm_90a's warpgroup MMA
     * (fi_cuda_arch_wgmma of the context's or the caller's target; the
     * AOT table, sm_90a, selects with it set) */
    bool wgmma;
} fi_cuda_tuning;

/* The settings as the environment has them now (unknown values: the
 * default, with a line on stderr once). */
void fi_cuda_tuning_read(fi_cuda_tuning *t);

/* The NVRTC library to load: $FLASHINFER_NVRTC (NULL when unset), and the
 * toolkit root $CUDA_HOME (NULL when unset); read once by the loader. */
const char *fi_cuda_env_nvrtc(void);
const char *fi_cuda_env_cuda_home(void);

#endif /* FI_CUDA_TUNING_H */
