/* cuda_api.c — dlopen the CUDA driver and NVRTC; errors in words. */
#include "cuda/cuda_api.h"
#include "cuda/tuning.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static fi_cu_api cu_api;
static const fi_cu_api *cu_ok;
static char cu_why[256];
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static fi_nvrtc_api nvrtc_api;
static const fi_nvrtc_api *nvrtc_ok;
static char nvrtc_why[512];
static pthread_once_t nvrtc_once = PTHREAD_ONCE_INIT;

/* dlsym into a function pointer without the object/function cast warning. */
static int sym(void *lib, const char *name, void *slot) {
    void *p = dlsym(lib, name);
    memcpy(slot, &p, sizeof p);
    return p != NULL;
}

static void cu_load_once(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(cu_why, sizeof cu_why, "no CUDA driver: libcuda.so.1 not found (%s)",
                 dlerror());
        return;
    }
    fi_cu_api *a = &cu_api;
    const char *missing = NULL;
#define LOAD(field, name) \
    if (!missing && !sym(lib, name, &a->field)) missing = name
    LOAD(Init, "cuInit");
    LOAD(DriverGetVersion, "cuDriverGetVersion");
    LOAD(GetErrorName, "cuGetErrorName");
    LOAD(GetErrorString, "cuGetErrorString");
    LOAD(DeviceGetCount, "cuDeviceGetCount");
    LOAD(DeviceGet, "cuDeviceGet");
    LOAD(DeviceGetName, "cuDeviceGetName");
    LOAD(DeviceGetAttribute, "cuDeviceGetAttribute");
    LOAD(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    LOAD(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    LOAD(CtxPushCurrent, "cuCtxPushCurrent_v2");
    LOAD(CtxPopCurrent, "cuCtxPopCurrent_v2");
    LOAD(CtxGetCurrent, "cuCtxGetCurrent");
    LOAD(MemAlloc, "cuMemAlloc_v2");
    LOAD(MemFree, "cuMemFree_v2");
    LOAD(MemAllocHost, "cuMemAllocHost_v2");
    LOAD(MemFreeHost, "cuMemFreeHost");
    LOAD(MemsetD8, "cuMemsetD8_v2");
    LOAD(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    LOAD(MemGetAddressRange, "cuMemGetAddressRange_v2");
    LOAD(ModuleLoadData, "cuModuleLoadData");
    LOAD(ModuleUnload, "cuModuleUnload");
    LOAD(ModuleGetFunction, "cuModuleGetFunction");
    LOAD(LaunchKernel, "cuLaunchKernel");
    LOAD(EventCreate, "cuEventCreate");
    LOAD(EventDestroy, "cuEventDestroy_v2");
    LOAD(EventRecord, "cuEventRecord");
    LOAD(EventQuery, "cuEventQuery");
    LOAD(EventSynchronize, "cuEventSynchronize");
    LOAD(StreamWaitEvent, "cuStreamWaitEvent");
    LOAD(StreamIsCapturing, "cuStreamIsCapturing");
    LOAD(ThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode");
    LOAD(OccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    LOAD(FuncSetAttribute, "cuFuncSetAttribute");
#undef LOAD
    sym(lib, "cuLaunchKernelEx", &a->LaunchKernelEx); /* optional: NULL where missing */
    sym(lib, "cuMemHostGetDevicePointer_v2", &a->MemHostGetDevicePointer);
    if (missing) {
        snprintf(cu_why, sizeof cu_why, "CUDA driver too old: libcuda lacks %s", missing);
        return;
    }
    CUresult r = a->Init(0);
    if (r != 0) {
        const char *name = NULL;
        if (a->GetErrorName(r, &name) != 0 || !name) name = "?";
        snprintf(cu_why, sizeof cu_why, "cuInit failed: %s (%d): no usable GPU or driver", name,
                 (int)r);
        return;
    }
    cu_ok = a;
}

const fi_cu_api *fi_cu_load(const char **why) {
    pthread_once(&cu_once, cu_load_once);
    if (why) *why = cu_ok ? "" : cu_why;
    return cu_ok;
}

static void *open_nvrtc(void) {
    const char *env = fi_cuda_env_nvrtc();
    if (env) return dlopen(env, RTLD_NOW | RTLD_LOCAL);
    static const char *names[] = {
        "libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12",
        "/usr/local/cuda/lib64/libnvrtc.so", "/usr/local/cuda/lib64/libnvrtc.so.13",
        "/usr/local/cuda/lib64/libnvrtc.so.12",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) return lib;
    }
    const char *home = fi_cuda_env_cuda_home();
    if (home) {
        char path[1024];
        snprintf(path, sizeof path, "%s/lib64/libnvrtc.so", home);
        return dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    return NULL;
}

static void nvrtc_load_once(void) {
    void *lib = open_nvrtc();
    if (!lib) {
        snprintf(nvrtc_why, sizeof nvrtc_why,
                 "NVRTC not found (tried libnvrtc.so, .so.13, .so.12, /usr/local/cuda/lib64, "
                 "$CUDA_HOME/lib64; set FLASHINFER_NVRTC=/path/to/libnvrtc.so)");
        return;
    }
    fi_nvrtc_api *a = &nvrtc_api;
    const char *missing = NULL;
#define LOAD(field, name) \
    if (!missing && !sym(lib, name, &a->field)) missing = name
    LOAD(Version, "nvrtcVersion");
    LOAD(GetErrorString, "nvrtcGetErrorString");
    LOAD(CreateProgram, "nvrtcCreateProgram");
    LOAD(DestroyProgram, "nvrtcDestroyProgram");
    LOAD(CompileProgram, "nvrtcCompileProgram");
    LOAD(GetProgramLogSize, "nvrtcGetProgramLogSize");
    LOAD(GetProgramLog, "nvrtcGetProgramLog");
    LOAD(GetPTXSize, "nvrtcGetPTXSize");
    LOAD(GetPTX, "nvrtcGetPTX");
    LOAD(GetCUBINSize, "nvrtcGetCUBINSize");
    LOAD(GetCUBIN, "nvrtcGetCUBIN");
#undef LOAD
    if (missing) {
        snprintf(nvrtc_why, sizeof nvrtc_why, "NVRTC too old: it lacks %s", missing);
        return;
    }
    if (a->Version(&a->major, &a->minor) != 0) {
        snprintf(nvrtc_why, sizeof nvrtc_why, "nvrtcVersion failed");
        return;
    }
    nvrtc_ok = a;
}

const fi_nvrtc_api *fi_nvrtc_load(const char **why) {
    pthread_once(&nvrtc_once, nvrtc_load_once);
    if (why) *why = nvrtc_ok ? "" : nvrtc_why;
    return nvrtc_ok;
}

fi_status fi_cu_error(const fi_cu_api *cu, const char *call, CUresult r) {
    const char *name = NULL, *text = NULL;
    if (!cu || cu->GetErrorName(r, &name) != 0 || !name) name = "CUDA_ERROR_UNKNOWN";
    if (!cu || cu->GetErrorString(r, &text) != 0 || !text) text = "no description";
    return fi_error(FI_STATUS_BACKEND_ERROR, "%s failed: %s (%d): %s", call, name, (int)r, text);
}
