/*
 * cc_jit.c — the system C compiler as a JIT: resolve it, key and cache its
 * shared objects (the private, verified cache of core/cache.h), run it
 * with posix_spawn on an argument vector (no shell: $CC is split into
 * words at blanks, quotes are not interpreted), and dlopen the result
 * only after its record matched. See cc_jit.h.
 */
#include "cpu/cc_jit.h"
#include "core/cache.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

extern char **environ;

#define CC_FORMAT "flashinfer-c cc 2"
/* Words of the compiler command ($CC may carry arguments, e.g. "ccache gcc"). */
#define CC_MAX_WORDS 32

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------ identities */

typedef struct cc_tool {
    char cmd[512];                 /* as configured, arguments included */
    char words[512];               /* cmd split: the NUL-separated words */
    char *argv[CC_MAX_WORDS + 1];  /* into words */
    int argc;
    char exe[PATH_MAX];            /* the first word, resolved through PATH */
    uint8_t id[FI_SHA256_BYTES];   /* the command, the executable's real path,
                                      size, modification time and inode */
} cc_tool;

static _Thread_local char why_buf[700];

static bool find_exe(const char *word, char *out, size_t n) {
    struct stat st;
    if (strchr(word, '/')) {
        int len = snprintf(out, n, "%s", word);
        return len >= 0 && (size_t)len < n && stat(out, &st) == 0 && S_ISREG(st.st_mode) &&
               access(out, X_OK) == 0;
    }
    const char *path = getenv("PATH");
    if (!path || !path[0]) path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        const char *end = strchr(path, ':');
        size_t len = end ? (size_t)(end - path) : strlen(path);
        int w = snprintf(out, n, "%.*s/%s", (int)(len ? len : 1), len ? path : ".", word);
        if (w >= 0 && (size_t)w < n && stat(out, &st) == 0 && S_ISREG(st.st_mode) &&
            access(out, X_OK) == 0)
            return true;
        path += len + (end != NULL);
    }
    return false;
}

/* Split t->cmd at blanks into t->argv. */
static bool split_words(cc_tool *t) {
    snprintf(t->words, sizeof t->words, "%s", t->cmd);
    t->argc = 0;
    for (char *p = t->words; *p;) {
        while (*p == ' ' || *p == '\t') *p++ = 0;
        if (!*p) break;
        if (t->argc == CC_MAX_WORDS) return false;
        t->argv[t->argc++] = p;
        while (*p && *p != ' ' && *p != '\t') p++;
    }
    t->argv[t->argc] = NULL;
    return t->argc > 0;
}

static bool resolve(cc_tool *t, const char **why) {
    const char *c = getenv("FLASHINFER_CC");
    if (!c || !c[0]) c = getenv("CC");
    if (!c || !c[0]) c = "cc";
    struct stat st;
    int len = snprintf(t->cmd, sizeof t->cmd, "%s", c);
    bool ok = len >= 0 && (size_t)len < sizeof t->cmd && split_words(t) &&
              find_exe(t->argv[0], t->exe, sizeof t->exe) && stat(t->exe, &st) == 0;
    if (!ok) {
        snprintf(why_buf, sizeof why_buf,
                 "no C compiler: \"%.200s\" (from $FLASHINFER_CC, else $CC, else cc; split into "
                 "words at blanks, at most %d) is not an executable in PATH; user-defined "
                 "variants on the CPU are compiled by it (built-in variants chosen by "
                 "fi_attention_params' fields need none)", c, CC_MAX_WORDS);
        if (why) *why = why_buf;
        return false;
    }
    char real[PATH_MAX];
    fi_sha256 h;
    fi_sha256_init(&h);
    fi_sha256_str(&h, t->cmd);
    fi_sha256_str(&h, realpath(t->exe, real) ? real : t->exe);
    int64_t facts[5] = {(int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec,
                        (int64_t)st.st_mtim.tv_nsec, (int64_t)st.st_ino, (int64_t)st.st_dev};
    fi_sha256_field(&h, facts, sizeof facts);
    fi_sha256_final(&h, t->id);
    return true;
}

bool fi_cc_available(const char **why) {
    cc_tool t;
    return resolve(&t, why);
}

/* The CPU model and feature flags (-march=native code runs on its CPU only). */
static uint8_t cpu_id_value[FI_SHA256_BYTES];
static pthread_once_t cpu_id_once = PTHREAD_ONCE_INIT;

static void cpu_id_init(void) {
    static const char *const keys[] = {"vendor_id", "cpu family", "model", "flags",
                                       "Features", "CPU implementer", "CPU part"};
    fi_sha256 h;
    fi_sha256_init(&h);
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    while (f && fgets(line, sizeof line, f)) {
        if (line[0] == '\n') break; /* the first processor's block is enough */
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            if (strncmp(line, keys[i], strlen(keys[i])) == 0) fi_sha256_str(&h, line);
    }
    if (f) fclose(f);
    fi_sha256_final(&h, cpu_id_value);
}

/* ------------------------------------------------------------- compiling */

/* Run the compiler on argv, its output and errors into `log`; its exit
 * status, -1 when it could not run, -2 when its status was lost (SIGCHLD
 * ignored: the output file decides). */
static int run_compiler(const cc_tool *t, char *const *argv, const char *log) {
    posix_spawn_file_actions_t fa;
    if (posix_spawn_file_actions_init(&fa) != 0) return -1;
    int rc = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (!rc) rc = posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (!rc) rc = posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    if (!rc) rc = posix_spawn(&pid, t->exe, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc) return -1;
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -2;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static fi_status compile_error(const char *name, const char *cmd, const char *log_path) {
    size_t n = 0;
    char *log = fi_cache_read(log_path, &n);
    if (log && n && log[n - 1] == '\n') log[--n] = 0;
    fi_status st = fi_error(FI_STATUS_COMPILE_ERROR, "%s: the C compiler failed (%s):\n%.*s",
                            name, cmd, (int)(log ? strlen(log) : 11), log ? log : "(no output)");
    free(log);
    return st;
}

/* The object of `source` compiled by t into entry `so` for `key`, through
 * a temporary file sealed into the cache once the compiler succeeded. */
static fi_status compile(const cc_tool *t, const char *name, const char *base,
                         const char *source, const char *so, const uint8_t *key) {
    static atomic_int counter;
    int k = atomic_fetch_add(&counter, 1);
    char src[PATH_MAX], tmp[PATH_MAX], log[PATH_MAX];
    fi_status st = fi_cache_format(src, sizeof src, name, "%s.c", base);
    if (!st) st = fi_cache_format(tmp, sizeof tmp, name, "%s.so.tmp.%ld.%d", base, (long)getpid(), k);
    if (!st) st = fi_cache_format(log, sizeof log, name, "%s.log.%ld.%d", base, (long)getpid(), k);
    if (st) return st;
    if (fi_cache_write(src, source, strlen(source)) != 0)
        return fi_error(FI_STATUS_BACKEND_ERROR,
                        "%s: cannot write %s (set FLASHINFER_CACHE_DIR to a writable directory)",
                        name, src);
    char flags[] = FI_CC_FLAGS, *argv[CC_MAX_WORDS + 16];
    int argc = 0;
    for (int i = 0; i < t->argc; i++) argv[argc++] = t->argv[i];
    char *save = NULL;
    for (char *w = strtok_r(flags, " ", &save); w && argc < CC_MAX_WORDS + 10;
         w = strtok_r(NULL, " ", &save))
        argv[argc++] = w;
    argv[argc++] = "-o";
    argv[argc++] = tmp;
    argv[argc++] = src;
    argv[argc++] = "-lm";
    argv[argc] = NULL;
    int rc = run_compiler(t, argv, log);
    struct stat sb;
    bool made = stat(tmp, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0;
    if ((rc != 0 && rc != -2) || !made) st = compile_error(name, t->cmd, log);
    else st = fi_cache_seal(tmp, so, key, 0700);
    if (st) unlink(tmp);
    unlink(log);
    return st;
}

/* The compiler, the key of name's object for `source`, and its cache path
 * without ".so": <dir>/cpu/<name>-<32 hex digits of the key>. `make`: the
 * directory is created and verified (loads, compiles); else only named. */
static fi_status cache_base(const char *name, const char *source, cc_tool *t,
                            uint8_t key[FI_SHA256_BYTES], char *base, size_t n, bool make) {
    pthread_once(&cpu_id_once, cpu_id_init);
    const char *why = NULL;
    if (!resolve(t, &why)) return fi_error(FI_STATUS_UNSUPPORTED, "%s: %s", name, why);
    fi_sha256 h;
    fi_sha256_init(&h);
    fi_sha256_str(&h, CC_FORMAT);
    fi_sha256_str(&h, source);
    fi_sha256_str(&h, FI_CC_FLAGS);
    fi_sha256_field(&h, t->id, sizeof t->id);
    fi_sha256_field(&h, cpu_id_value, sizeof cpu_id_value);
    fi_sha256_final(&h, key);
    char dir[PATH_MAX], hex[FI_CACHE_NAME_HEX + 1];
    fi_status st;
    if (make) {
        st = fi_cache_subdir("cpu", dir, sizeof dir);
    } else {
        st = fi_cache_location(dir, sizeof dir);
        size_t len = strlen(dir);
        if (!st) st = fi_cache_format(dir + len, sizeof dir - len, name, "/cpu");
    }
    if (st) return st;
    fi_sha256_hex(key, FI_CACHE_NAME_HEX / 2, hex);
    return fi_cache_format(base, n, name, "%s/%s-%s", dir, name, hex);
}

fi_status fi_cc_path(const char *name, const char *source, char *path, size_t n) {
    cc_tool t;
    char base[PATH_MAX];
    uint8_t key[FI_SHA256_BYTES];
    fi_status st = cache_base(name, source, &t, key, base, sizeof base, false);
    if (!st) st = fi_cache_format(path, n, name, "%s.so", base);
    return st;
}

fi_status fi_cc_load(const char *name, const char *source, fi_cc_result *out) {
    memset(out, 0, sizeof *out);
    double t0 = now_seconds();
    cc_tool t;
    char base[PATH_MAX];
    uint8_t key[FI_SHA256_BYTES];
    fi_status st = cache_base(name, source, &t, key, base, sizeof base, true);
    if (!st) st = fi_cache_format(out->path, sizeof out->path, name, "%s.so", base);
    if (st) return st;
    out->was_cached = fi_cache_check(out->path, key);
    if (out->was_cached) {
        out->handle = dlopen(out->path, RTLD_NOW | RTLD_LOCAL);
        out->was_cached = out->handle != NULL; /* one the loader refuses: compile afresh */
    }
    if (!out->handle) {
        if ((st = compile(&t, name, base, source, out->path, key))) return st;
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
