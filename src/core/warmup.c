/*
 * warmup.c — fi_warmup_*: the arguments checked as fi_plan_create checks
 * them (params, config), the target name, the output buffers; then the
 * device's backend lists or compiles the plan's kernels (no context).
 */
#include "core/params.h"

#include <string.h>

#define INVALID(...) fi_error(FI_STATUS_INVALID_ARGUMENT, __VA_ARGS__)

static fi_status find_backend(fi_device_type device, const char *fn, const fi_backend **out) {
    *out = fi_backend_for(device);
    if (!*out) return INVALID("%s: device=%d is not a fi_device_type", fn, (int)device);
    if (!(*out)->warmup_missing || !(*out)->warmup_list || !(*out)->warmup_compile)
        return fi_error(FI_STATUS_UNSUPPORTED, "%s: the %s backend compiles nothing ahead",
                        fn, (*out)->name);
    return FI_OK;
}

/* The target goes into file names and compiler options: a short name of
 * letters, digits and '_'. */
static fi_status check_arch(const char *arch, const char *fn) {
    if (!arch) return FI_OK;
    size_t n = strlen(arch);
    if (n >= sizeof ((fi_warmup_kernel *)0)->arch)
        return INVALID("%s: arch \"%.40s...\" is %zu characters, at most %zu", fn, arch, n,
                       sizeof ((fi_warmup_kernel *)0)->arch - 1);
    for (size_t i = 0; i < n; i++) {
        char c = arch[i];
        if (!(c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
              (c >= 'A' && c <= 'Z')))
            return INVALID("%s: arch \"%s\": only letters, digits and '_' (e.g. \"sm_90a\")",
                           fn, arch);
    }
    return FI_OK;
}

/* The checks every entry point shares; *cfg gets the config or its defaults. */
static fi_status check_plan(fi_device_type device, const fi_attention_params *params,
                            const fi_plan_config *config, const char *arch, const char *fn,
                            const fi_backend **be, fi_plan_config *cfg) {
    fi_status st = find_backend(device, fn, be);
    if (!st) st = fi_params_validate(params);
    if (st) return st;
    fi_plan_config_init(cfg);
    if (config) {
        if ((st = fi_plan_config_validate(config, params))) return st;
        *cfg = *config;
    }
    return check_arch(arch, fn);
}

fi_status fi_warmup_check(fi_device_type device) {
    const fi_backend *be;
    fi_status st = find_backend(device, "fi_warmup_check", &be);
    if (st) return st;
    const char *why = be->warmup_missing();
    return why ? fi_error(FI_STATUS_UNSUPPORTED, "%s kernels: %s", be->name, why) : FI_OK;
}

fi_status fi_warmup_list(fi_device_type device, const fi_attention_params *params,
                         const fi_plan_config *config, const char *arch,
                         fi_warmup_kernel *kernels, int32_t capacity, int32_t *count) {
    const char *fn = "fi_warmup_list";
    if (!count) return INVALID("%s: count is NULL", fn);
    *count = 0;
    if (capacity < 0) return INVALID("%s: capacity=%d must not be negative", fn, (int)capacity);
    if (capacity > 0 && !kernels)
        return INVALID("%s: kernels is NULL with capacity=%d", fn, (int)capacity);
    const fi_backend *be;
    fi_plan_config cfg;
    fi_status st = check_plan(device, params, config, arch, fn, &be, &cfg);
    if (st) return st;
    if (kernels) memset(kernels, 0, sizeof *kernels * (size_t)capacity);
    return be->warmup_list(params, &cfg, arch ? arch : "", kernels, capacity, count);
}

fi_status fi_warmup_compile(fi_device_type device, const fi_attention_params *params,
                            const fi_plan_config *config, const char *arch, int32_t index,
                            int32_t *was_cached) {
    const char *fn = "fi_warmup_compile";
    int32_t dummy, count = 0;
    if (!was_cached) was_cached = &dummy;
    *was_cached = 0;
    const fi_backend *be;
    fi_plan_config cfg;
    fi_status st = check_plan(device, params, config, arch, fn, &be, &cfg);
    if (!arch) arch = "";
    if (!st) st = be->warmup_list(params, &cfg, arch, NULL, 0, &count);
    if (st) return st;
    if (index < 0 || index >= count)
        return INVALID("%s: index=%d: that plan compiles %d kernel%s (fi_warmup_list)", fn,
                       (int)index, (int)count, count == 1 ? "" : "s");
    return be->warmup_compile(params, &cfg, arch, index, was_cached);
}
