/*
 * libcuda.c — a stand-in for the CUDA driver (libcuda.so.1) with no GPU:
 * every call the library and tests/gpu programs make succeeds at once and
 * does nothing (no copies, no kernels), device memory is host memory. For
 * profiling the CUDA backend's host path on a machine without a GPU
 * (`make stub`; LD_LIBRARY_PATH=build/stub perf record build/bench_overhead;
 * FI_STUB_CALLS=1 prints how many driver calls a program made).
 * Outputs are meaningless; only the host time is. NVRTC runs beside it
 * (cuGetExportTable answers that there are no tables).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* FI_STUB_CALLS=1: the number of driver calls made, printed at exit. The
 * stub is built with -finstrument-functions (Makefile), so every function
 * here counts itself on entry. */
#define NOI __attribute__((no_instrument_function, visibility("hidden"))) /* not libc's */
static unsigned long long calls;
NOI void __cyg_profile_func_enter(void *fn, void *site) { (void)fn, (void)site; calls++; }
NOI void __cyg_profile_func_exit(void *fn, void *site) { (void)fn, (void)site; }
__attribute__((no_instrument_function, destructor)) static void report_calls(void) {
    const char *e = getenv("FI_STUB_CALLS");
    if (e && *e && *e != '0') fprintf(stderr, "stub driver: %llu calls\n", calls);
}

typedef int CUresult;
typedef unsigned long long dptr;
#define API __attribute__((visibility("default")))

static int token; /* a non-NULL handle */

API CUresult cuInit(unsigned f) { (void)f; return 0; }
/* NVRTC asks the driver in the process for its export tables: none here
 * (CUDA_ERROR_NOT_SUPPORTED), so it compiles on its own */
API CUresult cuGetExportTable(const void **t, const void *id) {
    (void)id;
    *t = NULL;
    return 801;
}
API CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
API CUresult cuGetErrorName(CUresult r, const char **s) { (void)r; *s = "CUDA_STUB"; return 0; }
API CUresult cuGetErrorString(CUresult r, const char **s) { (void)r; *s = "stub driver"; return 0; }
API CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
API CUresult cuDeviceGet(int *d, int i) { *d = i; return 0; }
API CUresult cuDeviceGetName(char *s, int n, int d) {
    (void)d;
    strncpy(s, "stub (no GPU)", (size_t)n);
    return 0;
}
API CUresult cuDeviceGetAttribute(int *v, int attr, int d) {
    (void)d;
    *v = attr == 16 ? 132 : attr == 75 ? 9 : attr == 97 ? 232448 : attr == 38 ? 60 << 20 : 0;
    return 0;
}
API CUresult cuDevicePrimaryCtxRetain(void **c, int d) { (void)d; *c = &token; return 0; }
API CUresult cuDevicePrimaryCtxRelease_v2(int d) { (void)d; return 0; }
API CUresult cuCtxPushCurrent_v2(void *c) { (void)c; return 0; }
API CUresult cuCtxPopCurrent_v2(void **c) { if (c) *c = &token; return 0; }
API CUresult cuCtxSetCurrent(void *c) { (void)c; return 0; }
API CUresult cuCtxGetCurrent(void **c) { *c = &token; return 0; }
API CUresult cuCtxSynchronize(void) { return 0; }
API CUresult cuMemAlloc_v2(dptr *p, size_t n) {
    void *m = malloc(n ? n : 1);
    *p = (dptr)(uintptr_t)m;
    return m ? 0 : 2;
}
API CUresult cuMemFree_v2(dptr p) { free((void *)(uintptr_t)p); return 0; }
API CUresult cuMemAllocHost_v2(void **p, size_t n) { *p = malloc(n ? n : 1); return *p ? 0 : 2; }
API CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) {
    (void)flags;
    return cuMemAllocHost_v2(p, n);
}
API CUresult cuMemFreeHost(void *p) { free(p); return 0; }
API CUresult cuMemHostGetDevicePointer_v2(dptr *d, void *p, unsigned flags) {
    (void)flags;
    *d = (dptr)(uintptr_t)p;
    return 0;
}

API CUresult cuMemcpyHtoDAsync_v2(dptr d, const void *s, size_t n, void *st) {
    (void)d, (void)s, (void)n, (void)st; /* a DMA: no host time */
    return 0;
}
API CUresult cuMemGetAddressRange_v2(dptr *base, size_t *n, dptr p) {
    /* the stand-in cannot know a malloc's size: any non-null address is the
     * start of a large allocation */
    if (!p) return 1; /* CUDA_ERROR_INVALID_VALUE */
    *base = p;
    *n = (size_t)1 << 40;
    return 0;
}
API CUresult cuMemcpyHtoD_v2(dptr d, const void *s, size_t n) { (void)d, (void)s, (void)n; return 0; }
API CUresult cuMemcpyDtoH_v2(void *d, dptr s, size_t n) { (void)s; memset(d, 0, n); return 0; }
API CUresult cuMemsetD8_v2(dptr d, unsigned char v, size_t n) { (void)d, (void)v, (void)n; return 0; }
API CUresult cuMemsetD8Async(dptr d, unsigned char v, size_t n, void *s) {
    (void)d, (void)v, (void)n, (void)s;
    return 0;
}
API CUresult cuModuleLoadData(void **m, const void *img) { (void)img; *m = &token; return 0; }
API CUresult cuModuleUnload(void *m) { (void)m; return 0; }
API CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
    (void)m, (void)name;
    *f = &token;
    return 0;
}
API CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned smem, void *st, void **params,
                            void **extra) {
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem, (void)st,
        (void)params, (void)extra;
    return 0;
}
/* the launch with attributes (programmatic dependent launch on sm_90) */
API CUresult cuLaunchKernelEx(const void *cfg, void *f, void **params, void **extra) {
    (void)cfg, (void)f, (void)params, (void)extra;
    return 0;
}
API CUresult cuModuleGetGlobal_v2(dptr *p, size_t *n, void *m, const char *name) {
    (void)m, (void)name;
    *p = 0;
    *n = 0;
    return 500; /* CUDA_ERROR_NOT_FOUND */
}
API CUresult cuEventCreate(void **e, unsigned f) { (void)f; *e = &token; return 0; }
API CUresult cuEventDestroy_v2(void *e) { (void)e; return 0; }
API CUresult cuEventRecord(void *e, void *s) { (void)e, (void)s; return 0; }
API CUresult cuEventQuery(void *e) { (void)e; return 0; }
API CUresult cuEventSynchronize(void *e) { (void)e; return 0; }
API CUresult cuEventElapsedTime(float *ms, void *a, void *b) { (void)a, (void)b; *ms = 1e-3f; return 0; }
API CUresult cuStreamCreate(void **s, unsigned f) { (void)f; *s = &token; return 0; }
API CUresult cuStreamDestroy_v2(void *s) { (void)s; return 0; }
API CUresult cuStreamSynchronize(void *s) { (void)s; return 0; }
API CUresult cuStreamQuery(void *s) { (void)s; return 0; }
API CUresult cuStreamWaitEvent(void *s, void *e, unsigned f) { (void)s, (void)e, (void)f; return 0; }
API CUresult cuStreamIsCapturing(void *s, int *c) { (void)s; *c = 0; return 0; }
API CUresult cuThreadExchangeStreamCaptureMode(int *m) { (void)m; return 0; }
API CUresult cuStreamBeginCapture_v2(void *s, int m) { (void)s, (void)m; return 0; }
API CUresult cuStreamEndCapture(void *s, void **g) { (void)s; *g = &token; return 0; }
API CUresult cuGraphInstantiateWithFlags(void **x, void *g, unsigned long long f) {
    (void)g, (void)f;
    *x = &token;
    return 0;
}
API CUresult cuGraphLaunch(void *x, void *s) { (void)x, (void)s; return 0; }
API CUresult cuGraphDestroy(void *g) { (void)g; return 0; }
API CUresult cuGraphExecDestroy(void *x) { (void)x; return 0; }
API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, void *f, int b, size_t s) {
    (void)f, (void)b, (void)s;
    *n = 2;
    return 0;
}
API CUresult cuFuncSetAttribute(void *f, int a, int v) { (void)f, (void)a, (void)v; return 0; }
