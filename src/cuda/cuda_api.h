/*
 * cuda_api.h — the few CUDA driver and NVRTC entry points the CUDA backend
 * uses, declared by hand from their documented signatures and loaded at run
 * time with dlopen, so the library builds and runs (CPU only) on machines
 * without CUDA. No CUDA header is needed to build.
 */
#ifndef FI_CUDA_API_H
#define FI_CUDA_API_H

#include "core/internal.h"

#include <stddef.h>

typedef int CUresult; /* CUDA_SUCCESS == 0 */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

enum {
    FI_CU_ATTR_SM_COUNT = 16,            /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */
    FI_CU_ATTR_L2_BYTES = 38,            /* CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE */
    FI_CU_ATTR_CC_MAJOR = 75,            /* ..._COMPUTE_CAPABILITY_MAJOR */
    FI_CU_ATTR_CC_MINOR = 76,            /* ..._COMPUTE_CAPABILITY_MINOR */
    FI_CU_ATTR_SMEM_OPTIN = 97,          /* ..._MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    FI_CU_EVENT_DISABLE_TIMING = 2,      /* CU_EVENT_DISABLE_TIMING */
    FI_CU_CAPTURE_NONE = 0,              /* CU_STREAM_CAPTURE_STATUS_NONE */
    FI_CU_CAPTURE_MODE_RELAXED = 2,      /* CU_STREAM_CAPTURE_MODE_RELAXED */
    FI_CU_ERROR_NOT_READY = 600,         /* CUDA_ERROR_NOT_READY */
    FI_CU_FUNC_MAX_DYN_SMEM = 8,         /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES */
    FI_CU_LAUNCH_CLUSTER_DIM = 4, /* CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: {x, y, z} */
    FI_CU_LAUNCH_PDL = 6, /* CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION */
};

/* cuLaunchKernelEx's CUlaunchAttribute and CUlaunchConfig (cuda.h layout:
 * the id, padding to 8 bytes, a 64-byte value union). */
typedef struct fi_cu_launch_attr {
    int id;
    char pad[4];
    union {
        char bytes[64];
        int value;               /* programmaticStreamSerializationAllowed, ... */
        unsigned long long align;
    } v;
} fi_cu_launch_attr;
typedef struct fi_cu_launch_config {
    unsigned gx, gy, gz, bx, by, bz, smem;
    CUstream stream;
    fi_cu_launch_attr *attrs;
    unsigned num_attrs;
} fi_cu_launch_config;

/* The driver entry points (symbol names as exported by libcuda.so.1). */
typedef struct fi_cu_api {
    CUresult (*Init)(unsigned int flags);
    CUresult (*DriverGetVersion)(int *version);
    CUresult (*GetErrorName)(CUresult e, const char **s);
    CUresult (*GetErrorString)(CUresult e, const char **s);
    CUresult (*DeviceGetCount)(int *n);
    CUresult (*DeviceGet)(CUdevice *dev, int ordinal);
    CUresult (*DeviceGetName)(char *name, int len, CUdevice dev);
    CUresult (*DeviceGetAttribute)(int *v, int attr, CUdevice dev);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice dev);              /* _v2 */
    CUresult (*CtxPushCurrent)(CUcontext ctx);                      /* _v2 */
    CUresult (*CtxPopCurrent)(CUcontext *ctx);                      /* _v2 */
    CUresult (*CtxGetCurrent)(CUcontext *ctx);
    CUresult (*MemAlloc)(CUdeviceptr *p, size_t bytes);             /* _v2 */
    CUresult (*MemFree)(CUdeviceptr p);                             /* _v2 */
    CUresult (*MemAllocHost)(void **p, size_t bytes);               /* _v2 */
    CUresult (*MemFreeHost)(void *p);
    CUresult (*MemsetD8)(CUdeviceptr p, unsigned char value, size_t n); /* _v2 */
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t bytes,
                                CUstream s);                        /* _v2 */
    CUresult (*MemGetAddressRange)(CUdeviceptr *base, size_t *bytes, CUdeviceptr p); /* _v2 */
    CUresult (*ModuleLoadData)(CUmodule *m, const void *image);
    CUresult (*ModuleUnload)(CUmodule m);
    CUresult (*ModuleGetFunction)(CUfunction *f, CUmodule m, const char *name);
    CUresult (*LaunchKernel)(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                             unsigned bx, unsigned by, unsigned bz, unsigned smem,
                             CUstream s, void **params, void **extra);
    CUresult (*EventCreate)(CUevent *e, unsigned int flags);
    CUresult (*EventDestroy)(CUevent e);                            /* _v2 */
    CUresult (*EventRecord)(CUevent e, CUstream s);
    CUresult (*EventQuery)(CUevent e);
    CUresult (*EventSynchronize)(CUevent e);
    CUresult (*StreamWaitEvent)(CUstream s, CUevent e, unsigned int flags);
    CUresult (*StreamIsCapturing)(CUstream s, int *status);
    CUresult (*ThreadExchangeStreamCaptureMode)(int *mode);
    CUresult (*OccupancyMaxActiveBlocksPerMultiprocessor)(int *blocks, CUfunction f,
                                                          int block_size, size_t dyn_smem);
    CUresult (*FuncSetAttribute)(CUfunction f, int attr, int value);
    /* optional (CUDA 12.0 on; NULL where the driver lacks it) */
    CUresult (*LaunchKernelEx)(const fi_cu_launch_config *cfg, CUfunction f, void **params,
                               void **extra);
    /* optional (NULL where missing: a plan then waits for its last copy by
     * its event, plan.c) */
    CUresult (*MemHostGetDevicePointer)(CUdeviceptr *dp, void *p, unsigned flags); /* _v2 */
} fi_cu_api;

/* NVRTC (nvrtc.h), loaded from libnvrtc.so*. */
typedef struct _nvrtcProgram *nvrtcProgram;
typedef struct fi_nvrtc_api {
    int (*Version)(int *major, int *minor);
    const char *(*GetErrorString)(int result);
    int (*CreateProgram)(nvrtcProgram *p, const char *src, const char *name, int num_headers,
                         const char *const *headers, const char *const *include_names);
    int (*DestroyProgram)(nvrtcProgram *p);
    int (*CompileProgram)(nvrtcProgram p, int num_options, const char *const *options);
    int (*GetProgramLogSize)(nvrtcProgram p, size_t *n);
    int (*GetProgramLog)(nvrtcProgram p, char *log);
    int (*GetPTXSize)(nvrtcProgram p, size_t *n);
    int (*GetPTX)(nvrtcProgram p, char *ptx);
    int (*GetCUBINSize)(nvrtcProgram p, size_t *n);
    int (*GetCUBIN)(nvrtcProgram p, char *cubin);
    int major, minor;
} fi_nvrtc_api;

/* The driver table, loaded and cuInit'ed once per process; NULL with a
 * message in *why when there is no usable driver. Thread-safe. */
const fi_cu_api *fi_cu_load(const char **why);
/* NVRTC, loaded once per process ($FLASHINFER_NVRTC names a library file to
 * use); NULL with a message when it cannot be found. */
const fi_nvrtc_api *fi_nvrtc_load(const char **why);

/* FI_STATUS_BACKEND_ERROR "<call>: <CUDA_ERROR_NAME> (<description>)". */
fi_status fi_cu_error(const fi_cu_api *cu, const char *call, CUresult r);

/* Call driver function `fn` (a fi_cu_api field) with the arguments that
 * follow; on failure return a backend error naming cu<fn>. */
#define FI_CU(cu, fn, ...)                                               \
    do {                                                                 \
        CUresult fi_cu_r_ = (cu)->fn(__VA_ARGS__);                       \
        if (fi_cu_r_ != 0) return fi_cu_error((cu), "cu" #fn, fi_cu_r_); \
    } while (0)

#endif /* FI_CUDA_API_H */
