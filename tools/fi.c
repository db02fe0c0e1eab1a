/*
 * fi.c — the `fi` command line, on the public API alone.
 *   fi info    version, backends, SIMD levels, devices, the kernel cache
 *   fi demo    a CPU serving step, checked against an fp64 reference
 *   fi warmup  compile the kernels serving will use into the cache
 * Every command takes --help; `fi --version` prints the library's version.
 * Exit codes: 0 done, 1 the work failed, 2 a command line it cannot use.
 */
#include "tools.h"

#include <ftw.h>
#include <getopt.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: fi [--version] [--help] <command> [options]\n"
            "commands:\n"
            "  info    version, backends, SIMD levels, devices, the kernel cache\n"
            "  demo    a serving step on the CPU (a mixed prefill/decode batch in a paged KV\n"
            "          cache, planned once, run over several layers), checked against\n"
            "          attention computed in fp64, timed against that naive reference, with\n"
            "          a picture of the schedule\n"
            "  warmup  compile the kernels serving will use into the kernel cache ahead of\n"
            "          time: by default the CUDA kernels of the built-in paths for the\n"
            "          visible GPU (or --arch); --variants for the variant kernels\n"
            "`fi <command> --help` gives a command's options.\n");
}

/* ------------------------------------------------------------------ info */

static int64_t cache_bytes, cache_files;

static int count_file(const char *path, const struct stat *st, int flag, struct FTW *f) {
    (void)path, (void)f;
    if (flag == FTW_F) cache_bytes += st->st_size, cache_files++;
    return 0;
}

static void print_cache(void) {
    char dir[1024];
    fi_cache_directory(dir, sizeof dir);
    const char *env = getenv("FLASHINFER_CACHE_DIR");
    printf("kernel cache: %s%s\n", dir, env && env[0] ? " ($FLASHINFER_CACHE_DIR)" : "");
    struct stat st;
    if (stat(dir, &st)) {
        printf("  not created yet (the first compiled kernel or `fi warmup` makes it)\n");
        return;
    }
    cache_bytes = cache_files = 0;
    nftw(dir, count_file, 16, FTW_PHYS);
    printf("  %lld file%s, %.1f MB (CPU variant objects, CUDA cubins)\n", (long long)cache_files,
           cache_files == 1 ? "" : "s", (double)cache_bytes / 1e6);
}

static int cmd_info(int argc, char **argv) {
    static const struct option options[] = {{"help", no_argument, NULL, 'h'}, {0, 0, 0, 0}};
    optind = 0;
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, ":h", options, NULL)) != -1;) {
        if (c == 'h') {
            printf("usage: fi info\n"
                   "The library's version, its backends and whether this machine can use\n"
                   "them, the SIMD level in use and the levels this CPU can run, the\n"
                   "CUDA devices, and the kernel cache's directory and size.\n");
            return 0;
        }
        fprintf(stderr, "fi info: unknown option %s (fi info --help)\n", argv[optind - 1]);
        return FI_EXIT_USAGE;
    }
    if (optind < argc) {
        fprintf(stderr, "fi info: unexpected argument %s (fi info --help)\n", argv[optind]);
        return FI_EXIT_USAGE;
    }
    printf("flashinfer.c %s (version number %d)\n", fi_version_string(),
           (int)fi_version_number());
    fi_context *ctx = NULL;
    if (fi_context_create(NULL, &ctx)) {
        fprintf(stderr, "fi info: %s\n", fi_last_error());
        return 1;
    }
    printf("backends:\n  cpu   available: %s\n", fi_context_describe(ctx));
    fi_context_destroy(ctx);
    /* the levels this CPU and build can run: a context of each, by name */
    static const char *const levels[] = {"avx512", "avx2", "neon", "generic"};
    printf("        SIMD levels here:");
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
        fi_context_options opt;
        fi_context_options_init(&opt);
        opt.num_threads = 1;
        opt.cpu_simd = levels[i];
        if (fi_context_create(&opt, &ctx) == FI_OK) {
            printf(" %s", levels[i]);
            fi_context_destroy(ctx);
        }
    }
    printf(" (fi_context_options.cpu_simd or FI_CPU_SIMD picks one)\n");
    int cuda = fi_device_available(FI_DEVICE_CUDA);
    printf("  cuda  %s\n", cuda ? "available" : "not available (no CUDA driver, or no GPU)");
    printf("devices:\n  cpu\n");
    for (int32_t id = 0; cuda && id < 64; id++) {
        fi_context_options opt;
        fi_context_options_init(&opt);
        opt.device = FI_DEVICE_CUDA;
        opt.device_id = id;
        if (fi_context_create(&opt, &ctx)) {
            if (id == 0) printf("  cuda: %s\n", fi_last_error());
            break;
        }
        printf("  %s\n", fi_context_describe(ctx));
        fi_context_destroy(ctx);
    }
    print_cache();
    return 0;
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return FI_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V")) {
        printf("fi (flashinfer.c) %s\n", fi_version_string());
        return 0;
    }
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        if (argc > 2 && strcmp(cmd, "help") == 0) { /* fi help CMD = fi CMD --help */
            char *sub[] = {argv[2], "--help", NULL};
            if (!strcmp(argv[2], "info")) return cmd_info(2, sub);
            if (!strcmp(argv[2], "demo")) return fi_demo(2, sub);
            if (!strcmp(argv[2], "warmup")) return fi_warmup(2, sub);
        }
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "info")) return cmd_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "demo")) return fi_demo(argc - 1, argv + 1);
    if (!strcmp(cmd, "warmup")) return fi_warmup(argc - 1, argv + 1);
    fprintf(stderr, "fi: unknown %s %s\n", cmd[0] == '-' ? "option" : "command", cmd);
    usage(stderr);
    return FI_EXIT_USAGE;
}
