/*
 * cc_jit.c — the system C compiler as a JIT: resolve it, key and cache its
 * shared objects, run it (through /bin/sh, so $CC may carry arguments), and
 * dlopen the result. See cc_jit.h.
 */
#include "cpu/cc_jit.h"
#include "core/cache.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define CC_FORMAT "flashinfer-c cc 1"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------ identities */

typedef struct cc_tool {
    char cmd[512];   /* as configured, arguments included */
    char exe[1024];  /* its first word, resolved through PATH */
    uint64_t id;     /* hash of cmd, exe and the executable's size and mtime */
} cc_tool;

static _Thread_local char why_buf[700];

static bool find_exe(const char *word, char *out, size_t n) {
    struct stat st;
    if (strchr(word, '/')) {
        snprintf(out, n, "%s", word);
        return stat(out, &st) == 0 && S_ISREG(st.st_mode) && access(out, X_OK) == 0;
    }
    const char *path = getenv("PATH");
    if (!path || !path[0]) path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        const char *end = strchr(path, ':');
        size_t len = end ? (size_t)(end - path) : strlen(path);
        snprintf(out, n, "%.*s/%s", (int)(len ? len : 1), len ? path : ".", word);
        if (stat(out, &st) == 0 && S_ISREG(st.st_mode) && access(out, X_OK) == 0) return true;
        path += len + (end != NULL);
    }
    return false;
}

static bool resolve(cc_tool *t, const char **why) {
    const char *c = getenv("FLASHINFER_CC");
    if (!c || !c[0]) c = getenv("CC");
    if (!c || !c[0]) c = "cc";
    snprintf(t->cmd, sizeof t->cmd, "%s", c);
    char word[512];
    size_t k = 0;
    while (t->cmd[k] == ' ') k++;
    size_t w = 0;
    while (t->cmd[k] && t->cmd[k] != ' ' && w + 1 < sizeof word) word[w++] = t->cmd[k++];
    word[w] = 0;
    struct stat st;
    if (!w || !find_exe(word, t->exe, sizeof t->exe) || stat(t->exe, &st) != 0) {
        snprintf(why_buf, sizeof why_buf,
                 "no C compiler: \"%.200s\" (from $FLASHINFER_CC, else $CC, else cc) is not an "
                 "executable in PATH; user-defined variants on the CPU are compiled by it "
                 "(built-in variants chosen by fi_attention_params' fields need none)",
                 word);
        if (why) *why = why_buf;
        return false;
    }
    uint64_t h = fi_fnv_str(FI_FNV_SEED, t->cmd);
    h = fi_fnv_str(h, t->exe);
    int64_t facts[2] = {(int64_t)st.st_size, (int64_t)st.st_mtime};
    t->id = fi_fnv(h, facts, sizeof facts);
    return true;
}

bool fi_cc_available(const char **why) {
    cc_tool t;
    return resolve(&t, why);
}

/* The CPU model and feature flags (-march=native code runs on its CPU only). */
static uint64_t cpu_id_value;
static pthread_once_t cpu_id_once = PTHREAD_ONCE_INIT;

static void cpu_id_init(void) {
    static const char *const keys[] = {"vendor_id", "cpu family", "model", "flags",
                                       "Features", "CPU implementer", "CPU part"};
    uint64_t h = FI_FNV_SEED;
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    while (f && fgets(line, sizeof line, f)) {
        if (line[0] == '\n') break; /* the first processor's block is enough */
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            if (strncmp(line, keys[i], strlen(keys[i])) == 0) h = fi_fnv_str(h, line);
    }
    if (f) fclose(f);
    cpu_id_value = h;
}

/* ------------------------------------------------------------- compiling */

/* Run `cmd` through /bin/sh; returns its exit status (-1: could not run). */
static int run_shell(const char *cmd) {
    char *argv[] = {"sh", "-c", (char *)cmd, NULL};
    pid_t pid;
    if (posix_spawn(&pid, "/bin/sh", NULL, NULL, argv, environ) != 0) return -1;
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) return -2; /* SIGCHLD ignored: judge by the output file */
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static fi_status compile_error(const char *name, const char *cmd, const char *log_path) {
    size_t n = 0;
    char *log = fi_cache_read(log_path, &n);
    if (log) log[n - 1] = log[n - 1] == '\n' ? 0 : log[n - 1];
    char *nul = log ? memchr(log, 0, n) : NULL;
    fi_status st = fi_error(FI_STATUS_COMPILE_ERROR, "%s: the C compiler failed (%s):\n%.*s",
                            name, cmd, (int)(nul ? (size_t)(nul - log) : n),
                            log ? log : "(no output)");
    free(log);
    return st;
}

static fi_status compile(const cc_tool *t, const char *name, const char *base,
                         const char *source, const char *so) {
    static atomic_int counter;
    int k = atomic_fetch_add(&counter, 1);
    char src[1100], tmp[1200], log[1200], cmd[4096];
    snprintf(src, sizeof src, "%s.c", base);
    snprintf(tmp, sizeof tmp, "%s.so.tmp.%ld.%d", base, (long)getpid(), k);
    snprintf(log, sizeof log, "%s.log.%ld.%d", base, (long)getpid(), k);
    if (strchr(base, '\''))
        return fi_error(FI_STATUS_UNSUPPORTED, "%s: the cache path %s contains a quote", name,
                        base);
    if (fi_cache_write(src, source, strlen(source)) != 0)
        return fi_error(FI_STATUS_BACKEND_ERROR,
                        "%s: cannot write %s (set FLASHINFER_CACHE_DIR to a writable directory)",
                        name, src);
    snprintf(cmd, sizeof cmd, "%s %s -o '%s' '%s' -lm > '%s' 2>&1", t->cmd, FI_CC_FLAGS, tmp, src,
             log);
    int rc = run_shell(cmd);
    struct stat st;
    bool made = stat(tmp, &st) == 0 && st.st_size > 0;
    fi_status s = FI_OK;
    if ((rc != 0 && rc != -2) || !made) {
        s = compile_error(name, t->cmd, log);
        remove(tmp);
    } else if (rename(tmp, so) != 0) {
        s = fi_error(FI_STATUS_BACKEND_ERROR, "%s: cannot rename %s to %s", name, tmp, so);
        remove(tmp);
    }
    remove(log);
    return s;
}

/* The compiler, and the cache path of name's object for `source` without
 * its ".so": <dir>/cpu/<name>-<key>. */
static fi_status cache_base(const char *name, const char *source, cc_tool *t, char *base,
                            size_t n) {
    pthread_once(&cpu_id_once, cpu_id_init);
    const char *why = NULL;
    if (!resolve(t, &why)) return fi_error(FI_STATUS_UNSUPPORTED, "%s: %s", name, why);
    uint64_t key = fi_fnv_str(FI_FNV_SEED, CC_FORMAT);
    key = fi_fnv_str(key, source);
    key = fi_fnv_str(key, FI_CC_FLAGS);
    uint64_t ids[2] = {t->id, cpu_id_value};
    key = fi_fnv(key, ids, sizeof ids);
    char dir[800];
    fi_cache_dir(dir, sizeof dir);
    snprintf(base, n, "%.800s/cpu/%.120s-%016llx", dir, name, (unsigned long long)key);
    return FI_OK;
}

fi_status fi_cc_path(const char *name, const char *source, char *path, size_t n) {
    cc_tool t;
    char base[1000];
    fi_status st = cache_base(name, source, &t, base, sizeof base);
    if (!st) snprintf(path, n, "%s.so", base);
    return st;
}

fi_status fi_cc_load(const char *name, const char *source, fi_cc_result *out) {
    memset(out, 0, sizeof *out);
    double t0 = now_seconds();
    cc_tool t;
    char base[1000];
    fi_status st = cache_base(name, source, &t, base, sizeof base);
    if (st) return st;
    snprintf(out->path, sizeof out->path, "%s.so", base);
    out->was_cached = access(out->path, R_OK) == 0;
    if (out->was_cached) {
        out->handle = dlopen(out->path, RTLD_NOW | RTLD_LOCAL);
        out->was_cached = out->handle != NULL; /* a broken file: compile afresh */
    }
    if (!out->handle) {
        if ((st = compile(&t, name, base, source, out->path))) return st;
        out->handle = dlopen(out->path, RTLD_NOW | RTLD_LOCAL);
        if (!out->handle) {
            const char *e = dlerror();
            return fi_error(FI_STATUS_BACKEND_ERROR, "%s: dlopen(%s) failed: %s", name,
                            out->path, e ? e : "?");
        }
    }
    out->seconds = now_seconds() - t0;
    return FI_OK;
}
