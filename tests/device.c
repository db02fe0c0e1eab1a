/* device.c — test buffers mirrored on the CUDA backend (see device.h). */
#include "device.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef unsigned long long dev_ptr;

/* The driver calls the mirrors need; device 0's primary context, the one
 * the library uses, is made current. */
static struct {
    int tried, ok;
    int (*mem_alloc)(dev_ptr *, size_t);
    int (*mem_free)(dev_ptr);
    int (*htod)(dev_ptr, const void *, size_t);
    int (*dtoh)(void *, dev_ptr, size_t);
    int (*sync)(void);
} drv;

static int driver_load(void) {
    if (drv.tried) return drv.ok;
    drv.tried = 1;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return 0;
    int (*init)(unsigned), (*device_get)(int *, int), (*retain)(void **, int);
    int (*set_current)(void *);
    *(void **)&init = dlsym(h, "cuInit");
    *(void **)&device_get = dlsym(h, "cuDeviceGet");
    *(void **)&retain = dlsym(h, "cuDevicePrimaryCtxRetain");
    *(void **)&set_current = dlsym(h, "cuCtxSetCurrent");
    *(void **)&drv.mem_alloc = dlsym(h, "cuMemAlloc_v2");
    *(void **)&drv.mem_free = dlsym(h, "cuMemFree_v2");
    *(void **)&drv.htod = dlsym(h, "cuMemcpyHtoD_v2");
    *(void **)&drv.dtoh = dlsym(h, "cuMemcpyDtoH_v2");
    *(void **)&drv.sync = dlsym(h, "cuCtxSynchronize");
    if (!init || !device_get || !retain || !set_current || !drv.mem_alloc || !drv.mem_free ||
        !drv.htod || !drv.dtoh || !drv.sync)
        return 0;
    int dev = 0;
    void *ctx = NULL;
    if (init(0) || device_get(&dev, 0) || retain(&ctx, dev) || set_current(ctx)) return 0;
    drv.ok = 1;
    return 1;
}

int tu_cuda_backend_open(tu_cpu_backend *be) {
    memset(be, 0, sizeof *be);
    be->name = "cuda";
    be->index = TU_CUDA_INDEX;
    const char *why = NULL;
    fi_context_options opt;
    fi_context_options_init(&opt);
    opt.device = FI_DEVICE_CUDA;
    if (!tu_backend_selected("cuda")) why = "not selected";
    else if (!fi_device_available(FI_DEVICE_CUDA)) why = "no CUDA device";
    else if (!driver_load()) why = "the CUDA driver could not be loaded";
    else if (fi_context_create(&opt, &be->ctx) != FI_OK) why = fi_last_error();
    if (why) {
        printf("skip cuda: %s\n", why);
        be->ctx = NULL;
        return -1;
    }
    return 0;
}

int tu_mirror_up(const tu_cpu_backend *be, const tu_buf *h, tu_mirror *m) {
    memset(m, 0, sizeof *m);
    m->t = h->t;
    if (!tu_is_cuda(be)) return 0;
    dev_ptr p = 0;
    m->bytes = h->bytes ? h->bytes : 1;
    if (drv.mem_alloc(&p, m->bytes)) return -1;
    m->dev = (void *)(uintptr_t)p;
    if (h->t.data) m->t.data = (char *)m->dev + ((char *)h->t.data - (char *)h->base);
    /* synchronous: a pageable copy may still be in flight on return, and
     * the library's streams are not ordered after it */
    return (h->bytes && drv.htod(p, h->base, h->bytes)) || drv.sync();
}

int tu_mirror_down(const tu_cpu_backend *be, const tu_mirror *m, tu_buf *h) {
    if (!tu_is_cuda(be) || !m->dev) return 0;
    if (drv.sync()) return -1;
    return h->bytes && drv.dtoh(h->base, (dev_ptr)(uintptr_t)m->dev, h->bytes);
}

void tu_mirror_free(tu_mirror *m) {
    if (m->dev) drv.mem_free((dev_ptr)(uintptr_t)m->dev);
    memset(m, 0, sizeof *m);
}
