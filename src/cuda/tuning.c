/* tuning.c — read the CUDA backend's settings from the environment
 * (tuning.h lists them). */
#include "cuda/tuning.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

static bool off(const char *name) {
    const char *v = env(name);
    return v && !strcmp(v, "0");
}

static fi_cuda_kernel_mode kernel_mode(void) {
    static const char *const names[] = {"auto", "separate", "full-form", "cuda-cores"};
    const char *v = env("FLASHINFER_CUDA_KERNELS");
    if (!v) return FI_CUDA_KERNELS_AUTO;
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
        if (!strcmp(v, names[i])) return (fi_cuda_kernel_mode)i;
    static int warned;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "flashinfer-c: FLASHINFER_CUDA_KERNELS=%.32s is not auto, separate, "
                        "full-form or cuda-cores: ignored\n", v);
    return FI_CUDA_KERNELS_AUTO;
}

void fi_cuda_tuning_read(fi_cuda_tuning *t) {
    memset(t, 0, sizeof *t);
    const char *arch = env("FLASHINFER_CUDA_ARCH");
    if (arch) snprintf(t->arch, sizeof t->arch, "%s", arch);
    t->use_aot = !off("FLASHINFER_AOT");
    t->pdl = !off("FLASHINFER_CUDA_PDL");
    t->kernels = kernel_mode();
    t->jit_log = env("FLASHINFER_JIT_LOG") && !off("FLASHINFER_JIT_LOG");
}

const char *fi_cuda_env_nvrtc(void) { return env("FLASHINFER_NVRTC"); }

const char *fi_cuda_env_cuda_home(void) { return env("CUDA_HOME"); }
