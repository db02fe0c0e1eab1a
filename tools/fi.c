/*
 * fi.c — the `fi` command line.
 *   fi info    version, backends found, CPU features in use
 *   fi demo    a CPU serving step, checked against an fp64 reference
 *   fi warmup  compile variant kernels into the cache
 */
#include "tools.h"

#include <stdio.h>
#include <string.h>

static int cmd_info(void) {
    printf("flashinfer.c %s (version number %d)\n", fi_version_string(),
           (int)fi_version_number());
    printf("backends:\n");
    printf("  cpu   %s\n", fi_device_available(FI_DEVICE_CPU) ? "available" : "not available");
    printf("  cuda  %s\n", fi_device_available(FI_DEVICE_CUDA) ? "available" : "not available");
    fi_context *ctx = NULL;
    if (fi_context_create(NULL, &ctx)) {
        fprintf(stderr, "fi info: %s\n", fi_last_error());
        return 1;
    }
    printf("default CPU context: %s\n", fi_context_describe(ctx));
    fi_context_destroy(ctx);
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    printf("CPU features seen: avx512f=%d avx512bf16=%d avx2=%d fma=%d\n",
           !!__builtin_cpu_supports("avx512f"), !!__builtin_cpu_supports("avx512bf16"),
           !!__builtin_cpu_supports("avx2"), !!__builtin_cpu_supports("fma"));
#endif
    return 0;
}

static void usage(void) {
    printf("usage: fi <command>\n"
           "  info   version, backends found, CPU features used\n"
           "  demo   a serving step on the CPU: mixed prefill/decode batch in a paged\n"
           "         KV cache, planned once, run over several layers, checked\n"
           "         against attention computed in fp64\n"
           "  warmup compile variants x head dims x dtypes into the kernel cache\n"
           "         (fi warmup --help)\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage();
        return 2;
    }
    if (!strcmp(argv[1], "info")) return cmd_info();
    if (!strcmp(argv[1], "demo")) return fi_demo(argc - 1, argv + 1);
    if (!strcmp(argv[1], "warmup")) return fi_warmup(argc - 1, argv + 1);
    usage();
    return strcmp(argv[1], "help") && strcmp(argv[1], "--help") ? 2 : 0;
}
