/*
 * cc_jit.h — C source to a loaded shared object through the system C
 * compiler, cached on disk (the private directory of core/cache.h,
 * subdirectory cpu/; an object is loaded only after its record matched).
 * The compiler is $FLASHINFER_CC, else $CC, else cc, split into words at
 * blanks and run with posix_spawn (no shell); flags FI_CC_FLAGS. The key
 * is the SHA-256 of the source, the flags, the compiler's identity
 * (command, real path, size, modification time, inode) and the CPU's (its
 * model and feature flags: -march=native output is CPU-specific).
 */
#ifndef FI_CPU_CC_JIT_H
#define FI_CPU_CC_JIT_H

#include "core/internal.h"

/* -O3: GCC's -O2 vectorises no loop that needs an alias check (the logits
 * and P.V loops of the kernel). */
#define FI_CC_FLAGS "-O3 -march=native -fPIC -shared -fvisibility=hidden"

typedef struct fi_cc_result {
    void *handle;        /* dlopen handle; dlclose when done */
    int32_t was_cached;  /* 1: loaded from the cache, 0: compiled now */
    double seconds;      /* compile or load time */
    char path[1024];     /* the shared object (a longer path is an error) */
} fi_cc_result;

/* Whether a compiler is available; when not, *why says so (for messages). */
bool fi_cc_available(const char **why);

/* Load `name`'s object for `source` from the cache, or compile it.
 * FI_STATUS_UNSUPPORTED without a compiler, FI_STATUS_COMPILE_ERROR with the
 * compiler's log when the source does not compile. `name` is a file-name
 * friendly label (identifier characters). */
fi_status fi_cc_load(const char *name, const char *source, fi_cc_result *out);

/* The shared object fi_cc_load would load or write for the same arguments
 * (fi warmup's listing); FI_STATUS_UNSUPPORTED without a compiler, whose
 * identity is part of the key. */
fi_status fi_cc_path(const char *name, const char *source, char *path, size_t n);

#endif /* FI_CPU_CC_JIT_H */
