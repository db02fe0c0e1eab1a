/* context.c — contexts: find the backend, resolve threads, describe. */
#include "core/internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void fi_context_options_init(fi_context_options *options) {
    if (!options) return;
    memset(options, 0, sizeof *options);
    options->struct_size = sizeof *options;
    options->device = FI_DEVICE_CPU;
}

int32_t fi_device_available(fi_device_type device) {
    const fi_backend *be = fi_backend_for(device);
    return be ? be->device_available() : 0;
}

static fi_status check_simd_name(const char *name) {
    static const char *known[] = {"auto", "avx512", "avx2", "neon", "generic"};
    if (!name || !name[0]) return FI_OK;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(name, known[i]) == 0) return FI_OK;
    return fi_error(FI_STATUS_INVALID_ARGUMENT,
                    "cpu_simd=\"%.32s\": expected auto, avx512, avx2, neon or generic", name);
}

fi_status fi_context_create(const fi_context_options *options, fi_context **out) {
    if (!out) return fi_error(FI_STATUS_INVALID_ARGUMENT, "fi_context_create: out is NULL");
    *out = NULL;
    fi_context_options opt;
    fi_context_options_init(&opt);
    if (options) {
        if (options->struct_size != sizeof *options)
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "fi_context_options.struct_size=%u, expected %zu: "
                            "call fi_context_options_init first",
                            (unsigned)options->struct_size, sizeof *options);
        opt = *options;
    }
    const fi_backend *backend = fi_backend_for(opt.device);
    if (!backend)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "device=%d is not a fi_device_type",
                        (int)opt.device);
    if (opt.num_threads < 0 || opt.num_threads > 1024)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "num_threads=%d: expected 0 (all cores) to 1024", (int)opt.num_threads);
    fi_status st = check_simd_name(opt.cpu_simd);
    if (st) return st;

    fi_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return fi_error(FI_STATUS_OUT_OF_MEMORY, "fi_context_create: out of memory");
    atomic_init(&ctx->refs, 1);
    atomic_init(&ctx->destroyed, 0);
    ctx->device = opt.device;
    ctx->device_id = opt.device_id;
    ctx->num_threads = opt.num_threads;
    if (ctx->num_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        ctx->num_threads = n > 0 ? (int32_t)(n < 1024 ? n : 1024) : 1;
    }
    if (opt.cpu_simd && strcmp(opt.cpu_simd, "auto") != 0)
        strncpy(ctx->simd_request, opt.cpu_simd, sizeof ctx->simd_request - 1);
    ctx->backend = backend;
    st = ctx->backend->context_init(ctx);
    if (st) {
        free(ctx);
        return st;
    }
    ctx->magic = FI_MAGIC_CONTEXT;
    *out = ctx;
    return FI_OK;
}

static void context_free(fi_context *ctx) {
    if (ctx->backend && ctx->backend->context_fini) ctx->backend->context_fini(ctx);
    fi_handle_retire(&ctx->magic);
    free(ctx);
}

void fi_context_retain(fi_context *ctx) {
    atomic_fetch_add_explicit(&ctx->refs, 1, memory_order_relaxed);
}

void fi_context_release(fi_context *ctx) {
    if (atomic_fetch_sub_explicit(&ctx->refs, 1, memory_order_acq_rel) == 1) context_free(ctx);
}

fi_status fi_context_check(const fi_context *ctx, const char *fn) {
    fi_status st = fi_handle_check(ctx, FI_MAGIC_CONTEXT, fn, "ctx");
    if (st) return st;
    if (atomic_load_explicit(&ctx->destroyed, memory_order_acquire))
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: context %p was destroyed (fi_context_destroy) while plans, "
                        "cascades or block-sparse objects made on it were alive; destroy "
                        "those first (their destroy functions still work)", fn, (void *)ctx);
    return FI_OK;
}

/* With objects on it still alive the context stays allocated, refusing every
 * call, until the last of them is destroyed (fi_context_release). */
void fi_context_destroy(fi_context *ctx) {
    if (!ctx) return;
    if (fi_handle_check(ctx, FI_MAGIC_CONTEXT, "fi_context_destroy", "context")) return;
    if (atomic_exchange_explicit(&ctx->destroyed, 1, memory_order_acq_rel)) {
        fi_error(FI_STATUS_INVALID_ARGUMENT,
                 "fi_context_destroy: context %p was destroyed already", (void *)ctx);
        return;
    }
    if (atomic_load_explicit(&ctx->refs, memory_order_acquire) > 1)
        fi_error(FI_STATUS_INVALID_ARGUMENT,
                 "fi_context_destroy: context %p still has plans, cascades or block-sparse "
                 "objects made on it; it is freed when the last of them is destroyed, and "
                 "refuses every call until then", (void *)ctx);
    fi_context_release(ctx);
}

const char *fi_context_describe(const fi_context *ctx) {
    if (fi_handle_check(ctx, FI_MAGIC_CONTEXT, "fi_context_describe", "context")) return "";
    return ctx->description;
}
