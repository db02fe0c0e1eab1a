/*
 * test_cache.c — the JIT cache's security model (src/core/cache.h,
 * docs/VARIANTS.md "The cache and its security"):
 *   sha256     SHA-256 against the FIPS 180-4 / NIST example vectors, in one
 *              piece and fed in odd pieces
 *   dir        where the cache is (absolute paths only, no /tmp fallback),
 *              created 0700, refused when others may write to it or to a
 *              directory above it (unless sticky), or when owned by another
 *              user (as root: chown), paths that would truncate refused
 *   entry      a file is loaded only with its record: the key asked for,
 *              the digest of its bytes; a changed byte, a missing or foreign
 *              record, a symbolic link, a file others may write are misses
 *   cpu_jit    a variant's object through the public warmup API: its files
 *              private, a corrupted object compiled afresh rather than
 *              loaded, a compiler command with shell syntax is not run
 *              through a shell, a cache path with a quote works
 * Every case works in its own temporary directory under /tmp.
 */
#include "core/cache.h"
#include "core/sha256.h"
#include "util.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ scaffolding */

static char scratch[64]; /* the current case's directory */

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *f) {
    (void)st, (void)flag, (void)f;
    chmod(path, 0700); /* directories a case made unwritable */
    return remove(path);
}

static void scratch_free(void) {
    if (scratch[0]) nftw(scratch, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    scratch[0] = 0;
}

static int scratch_new(void) {
    scratch_free();
    snprintf(scratch, sizeof scratch, "/tmp/fi-test-cache-sec-XXXXXX");
    if (!mkdtemp(scratch)) {
        tu_note("mkdtemp: %s", strerror(errno));
        scratch[0] = 0;
        return -1;
    }
    return 0;
}

/* A path in the case's directory (one of 8 rotating buffers: keep a copy
 * of one needed across more calls). */
static const char *path_in(const char *rel) {
    static char buf[8][512];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 512, "%s/%s", scratch, rel);
    return p;
}

static int expect_status(fi_status got, fi_status want, const char *needle, const char *what) {
    return tu_expect_status(got, want, needle, what);
}

static void record(const char *cat, const char *name, int fail) {
    char full[160];
    snprintf(full, sizeof full, "cache/%s/%s", cat, name);
    tu_record(cat, full, fail ? TU_FAIL : TU_PASS);
}

static int begin(const char *cat, const char *name) {
    char full[160];
    snprintf(full, sizeof full, "cache/%s/%s", cat, name);
    if (!tu_begin_case(full)) return 0;
    tu_crash_context(full, 0);
    return scratch_new() == 0;
}

/* ------------------------------------------------------------------ sha256 */

static int hex_is(const uint8_t *d, const char *want) {
    char hex[65];
    fi_sha256_hex(d, 32, hex);
    if (strcmp(hex, want)) {
        tu_note("sha256 %s, expected %s", hex, want);
        return 0;
    }
    return 1;
}

static void test_sha256(void) {
    static const struct { const char *msg, *digest; } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklm"
         "nopqrlmnopqrsmnopqrstnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    if (tu_begin_case("cache/sha256/vectors")) {
        int ok = 1;
        uint8_t d[32];
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
            fi_sha256_of(v[i].msg, strlen(v[i].msg), d);
            ok &= hex_is(d, v[i].digest);
        }
        record("sha256", "vectors", !ok);
    }
    if (tu_begin_case("cache/sha256/million_a_in_pieces")) {
        /* one million 'a', fed in pieces of 1..127 bytes: every split of a
         * block and of the padding */
        char chunk[128];
        memset(chunk, 'a', sizeof chunk);
        fi_sha256 s;
        fi_sha256_init(&s);
        size_t left = 1000000, step = 1;
        while (left) {
            size_t n = step < left ? step : left;
            fi_sha256_update(&s, chunk, n);
            left -= n;
            step = step % 127 + 1;
        }
        uint8_t d[32];
        fi_sha256_final(&s, d);
        int ok = hex_is(d, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
        /* every length 0..200 the same in one piece and in bytes */
        char msg[201];
        for (int i = 0; i < 201; i++) msg[i] = (char)(i * 37 + 11);
        for (size_t n = 0; n <= 200 && ok; n++) {
            uint8_t a[32], b[32];
            fi_sha256_of(msg, n, a);
            fi_sha256_init(&s);
            for (size_t i = 0; i < n; i++) fi_sha256_update(&s, msg + i, 1);
            fi_sha256_final(&s, b);
            if (memcmp(a, b, 32)) tu_note("length %zu: bytewise digest differs", n), ok = 0;
        }
        record("sha256", "million_a_in_pieces", !ok);
    }
}

/* --------------------------------------------------------------- directory */

static void test_dir(void) {
    char buf[4096];
    if (begin("dir", "created_private")) {
        /* missing directories are made 0700 whatever the umask */
        mode_t old = umask(0);
        setenv("FLASHINFER_CACHE_DIR", path_in("a/b/cache"), 1);
        int fail = expect_status(fi_cache_dir(buf, sizeof buf), FI_OK, NULL, "fi_cache_dir");
        umask(old);
        struct stat st;
        const char *made[] = {"a", "a/b", "a/b/cache"};
        for (int i = 0; i < 3 && !fail; i++)
            if (stat(path_in(made[i]), &st) || (st.st_mode & 0777) != 0700)
                tu_note("%s: mode %o, expected 0700", made[i], (unsigned)(st.st_mode & 0777)), fail = 1;
        fail |= expect_status(fi_cache_subdir("cpu", buf, sizeof buf), FI_OK, NULL, "subdir");
        if (!fail && (stat(buf, &st) || (st.st_mode & 0777) != 0700))
            tu_note("cpu/: mode %o", (unsigned)(st.st_mode & 0777)), fail = 1;
        record("dir", "created_private", fail);
    }
    if (begin("dir", "relative_refused")) {
        setenv("FLASHINFER_CACHE_DIR", "relative/dir", 1);
        record("dir", "relative_refused",
               expect_status(fi_cache_dir(buf, sizeof buf), FI_STATUS_INVALID_ARGUMENT,
                             "absolute", "relative FLASHINFER_CACHE_DIR"));
    }
    if (begin("dir", "no_tmp_fallback")) {
        /* HOME, XDG_CACHE_HOME and FLASHINFER_CACHE_DIR unset: the passwd
         * entry's home, or an error; never a shared directory */
        char *home = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
        unsetenv("FLASHINFER_CACHE_DIR");
        unsetenv("XDG_CACHE_HOME");
        unsetenv("HOME");
        fi_status st = fi_cache_location(buf, sizeof buf);
        int fail = 0;
        if (st == FI_OK && (strncmp(buf, "/tmp", 4) == 0 || !strstr(buf, "/.cache/flashinfer-c")))
            tu_note("without HOME the cache is %s", buf), fail = 1;
        if (st != FI_OK && !strstr(fi_last_error(), "FLASHINFER_CACHE_DIR"))
            tu_note("the error does not say what to set: %s", fi_last_error()), fail = 1;
        if (home) setenv("HOME", home, 1);
        free(home);
        record("dir", "no_tmp_fallback", fail);
    }
    if (begin("dir", "writable_by_others")) {
        mkdir(path_in("open"), 0700);
        chmod(path_in("open"), 0777);
        setenv("FLASHINFER_CACHE_DIR", path_in("open"), 1);
        int fail = expect_status(fi_cache_dir(buf, sizeof buf), FI_STATUS_UNSUPPORTED, "0777",
                                 "a 0777 cache directory");
        chmod(path_in("open"), 0720); /* group-writable */
        fail |= expect_status(fi_cache_dir(buf, sizeof buf), FI_STATUS_UNSUPPORTED, "0720",
                              "a group-writable cache directory");
        chmod(path_in("open"), 0755); /* readable is fine: nothing can be planted */
        fail |= expect_status(fi_cache_dir(buf, sizeof buf), FI_OK, NULL, "a 0755 directory");
        record("dir", "writable_by_others", fail);
    }
    if (begin("dir", "ancestor_writable")) {
        /* a directory above the cache that others may change: refused,
         * unless sticky as /tmp is */
        mkdir(path_in("shared"), 0700);
        chmod(path_in("shared"), 0777);
        setenv("FLASHINFER_CACHE_DIR", path_in("shared/mine"), 1);
        int fail = expect_status(fi_cache_dir(buf, sizeof buf), FI_STATUS_UNSUPPORTED, "shared",
                                 "under a 0777 directory");
        chmod(path_in("shared"), 01777);
        fail |= expect_status(fi_cache_dir(buf, sizeof buf), FI_OK, NULL, "under a sticky one");
        record("dir", "ancestor_writable", fail);
    }
    if (begin("dir", "symlink_to_open_dir")) {
        /* the checks follow the real path: a link to an open directory */
        mkdir(path_in("target"), 0700);
        chmod(path_in("target"), 0777);
        int fail = symlink(path_in("target"), path_in("link")) != 0;
        setenv("FLASHINFER_CACHE_DIR", path_in("link"), 1);
        fail |= expect_status(fi_cache_dir(buf, sizeof buf), FI_STATUS_UNSUPPORTED, "0777",
                              "a link to a 0777 directory");
        record("dir", "symlink_to_open_dir", fail);
    }
    if (begin("dir", "other_owner")) {
        if (geteuid() != 0) {
            tu_note("needs root (chown to another user)");
            tu_record("dir", "cache/dir/other_owner", TU_SKIP);
        } else {
            mkdir(path_in("theirs"), 0700);
            int fail = chown(path_in("theirs"), 65534, 65534) != 0;
            setenv("FLASHINFER_CACHE_DIR", path_in("theirs"), 1);
            fail |= expect_status(fi_cache_dir(buf, sizeof buf), FI_STATUS_UNSUPPORTED,
                                  "owned by uid 65534", "another user's directory");
            record("dir", "other_owner", fail);
        }
    }
    if (begin("dir", "no_truncation")) {
        char longdir[5000];
        int n = snprintf(longdir, sizeof longdir, "%s/", scratch);
        while (n < 4200) n += snprintf(longdir + n, sizeof longdir - (size_t)n, "d123456789/");
        setenv("FLASHINFER_CACHE_DIR", longdir, 1);
        int fail = expect_status(fi_cache_dir(buf, sizeof buf), FI_STATUS_INVALID_ARGUMENT,
                                 "bytes", "a 4200-byte cache path");
        char small[64];
        setenv("FLASHINFER_CACHE_DIR", path_in("ok"), 1);
        fail |= expect_status(fi_cache_dir(small, 16), FI_STATUS_INVALID_ARGUMENT, "bytes",
                              "a 16-byte buffer");
        record("dir", "no_truncation", fail);
    }
    unsetenv("FLASHINFER_CACHE_DIR");
}

/* ------------------------------------------------------------------ entries */

static void test_entry(void) {
    uint8_t key[32], other[32];
    fi_sha256_of("key", 3, key);
    fi_sha256_of("other", 5, other);
    const char data[] = "\x7f" "ELF the bytes of a cached object";
    size_t size = sizeof data - 1, got = 0;
    if (begin("entry", "round_trip")) {
        char p[512];
        snprintf(p, sizeof p, "%s", path_in("k.bin"));
        int fail = expect_status(fi_cache_store(p, key, data, size), FI_OK, NULL, "store");
        char *back = fi_cache_load(p, key, &got);
        if (!back || got != size || memcmp(back, data, size)) tu_note("load gave other bytes"), fail = 1;
        free(back);
        struct stat st;
        if (stat(p, &st) || (st.st_mode & 0777) != 0600)
            tu_note("entry mode %o, expected 0600", (unsigned)(st.st_mode & 0777)), fail = 1;
        if (fi_cache_load(p, other, &got)) tu_note("loaded under another key"), fail = 1;
        record("entry", "round_trip", fail);
    }
    if (begin("entry", "changed_byte")) {
        char p[512];
        snprintf(p, sizeof p, "%s", path_in("k.bin"));
        int fail = expect_status(fi_cache_store(p, key, data, size), FI_OK, NULL, "store");
        FILE *f = fopen(p, "r+b");
        if (f) fseek(f, 7, SEEK_SET), fputc('X', f), fclose(f);
        if (fi_cache_check(p, key)) tu_note("a changed byte still verified"), fail = 1;
        record("entry", "changed_byte", fail);
    }
    if (begin("entry", "no_record")) {
        /* a file planted under an entry's name, without its record */
        char p[512];
        snprintf(p, sizeof p, "%s", path_in("k.bin"));
        int fail = fi_cache_write(p, data, size) != 0;
        if (fi_cache_check(p, key)) tu_note("a file without record verified"), fail = 1;
        /* and a record copied from another entry */
        fail |= expect_status(fi_cache_store(path_in("x.bin"), key, "other", 5), FI_OK, NULL, "store");
        rename(path_in("x.bin.sha256"), path_in("k.bin.sha256"));
        if (fi_cache_check(p, key)) tu_note("another entry's record verified"), fail = 1;
        record("entry", "no_record", fail);
    }
    if (begin("entry", "symlink")) {
        char p[512];
        snprintf(p, sizeof p, "%s", path_in("k.bin"));
        int fail = expect_status(fi_cache_store(path_in("real.bin"), key, data, size), FI_OK, NULL,
                                 "store");
        rename(path_in("real.bin.sha256"), path_in("k.bin.sha256"));
        fail |= symlink(path_in("real.bin"), p) != 0;
        if (fi_cache_check(p, key)) tu_note("an entry through a symbolic link verified"), fail = 1;
        record("entry", "symlink", fail);
    }
    if (begin("entry", "writable_by_others")) {
        char p[512];
        snprintf(p, sizeof p, "%s", path_in("k.bin"));
        int fail = expect_status(fi_cache_store(p, key, data, size), FI_OK, NULL, "store");
        chmod(p, 0666);
        if (fi_cache_check(p, key)) tu_note("a 0666 entry verified"), fail = 1;
        chmod(p, 0600);
        if (!fi_cache_check(p, key)) tu_note("the 0600 entry did not verify"), fail = 1;
        record("entry", "writable_by_others", fail);
    }
}

/* ----------------------------------------------------------------- CPU JIT */

static int soft_cap_params(fi_attention_params *p) {
    const fi_variant *v = NULL;
    if (fi_variant_builtin("soft_cap", &v)) return -1;
    fi_attention_params_init(p);
    p->num_qo_heads = p->num_kv_heads = 2;
    p->head_dim_qk = p->head_dim_vo = 64;
    p->q_dtype = p->kv_dtype = p->o_dtype = FI_DTYPE_F32;
    p->variant = v;
    return 0;
}

static void test_cpu_jit(void) {
    fi_attention_params p;
    int have_cc = fi_warmup_check(FI_DEVICE_CPU) == FI_OK && soft_cap_params(&p) == 0;
    static const char *const names[] = {"object_private", "corrupt_object_recompiled",
                                        "shell_syntax_not_run", "quote_in_path"};
    for (int i = 0; i < 4; i++) {
        char full[160];
        snprintf(full, sizeof full, "cache/cpu_jit/%s", names[i]);
        if (!tu_begin_case(full)) continue;
        if (!have_cc) {
            tu_note("no C compiler");
            tu_record("cpu_jit", full, TU_SKIP);
            continue;
        }
        scratch_new();
        setenv("FLASHINFER_CACHE_DIR", path_in(i == 3 ? "it's here" : "c"), 1);
        fi_warmup_kernel k;
        int32_t n = 0, cached = -1;
        int fail = expect_status(fi_warmup_list(FI_DEVICE_CPU, &p, NULL, NULL, &k, 1, &n), FI_OK,
                                 NULL, "list");
        if (i == 2) {
            /* through a shell this would run touch; as words of an argv they
             * are arguments the compiler refuses */
            char cc[700], marker[600];
            snprintf(marker, sizeof marker, "%s", path_in("ran"));
            snprintf(cc, sizeof cc, "cc -DFI_X=1;touch %s;", marker);
            setenv("FLASHINFER_CC", cc, 1);
            fail |= expect_status(fi_warmup_compile(FI_DEVICE_CPU, &p, NULL, NULL, 0, &cached),
                                  FI_STATUS_COMPILE_ERROR, NULL, "a compiler command with ';'");
            unsetenv("FLASHINFER_CC");
            if (access(marker, F_OK) == 0) tu_note("the compiler command ran through a shell"), fail = 1;
            record("cpu_jit", names[i], fail);
            continue;
        }
        if (!fail)
            fail |= expect_status(fi_warmup_compile(FI_DEVICE_CPU, &p, NULL, NULL, 0, &cached),
                                  FI_OK, NULL, "compile");
        if (!fail && cached) tu_note("a fresh cache had the object"), fail = 1;
        if (!fail && i == 0) {
            char rec[1100];
            snprintf(rec, sizeof rec, "%s.sha256", k.cache_path);
            struct stat so, sr, sd;
            char dir[1100];
            snprintf(dir, sizeof dir, "%s", k.cache_path);
            *strrchr(dir, '/') = 0;
            if (stat(k.cache_path, &so) || stat(rec, &sr) || stat(dir, &sd) ||
                (so.st_mode & 077) || (sr.st_mode & 077) || (sd.st_mode & 0777) != 0700) {
                tu_note("object %o, record %o, cpu/ %o: expected private", (unsigned)(so.st_mode & 0777),
                        (unsigned)(sr.st_mode & 0777), (unsigned)(sd.st_mode & 0777));
                fail = 1;
            }
            fail |= expect_status(fi_warmup_compile(FI_DEVICE_CPU, &p, NULL, NULL, 0, &cached),
                                  FI_OK, NULL, "again");
            if (!fail && !cached) tu_note("the second compile did not find the object"), fail = 1;
        }
        if (!fail && i == 1) {
            /* one byte of the object changed: not loaded, compiled again */
            FILE *f = fopen(k.cache_path, "r+b");
            if (f) fseek(f, 100, SEEK_SET), fputc(0x5a, f), fclose(f);
            fail |= expect_status(fi_warmup_compile(FI_DEVICE_CPU, &p, NULL, NULL, 0, &cached),
                                  FI_OK, NULL, "after the change");
            if (!fail && cached) tu_note("a changed object was loaded"), fail = 1;
        }
        record("cpu_jit", names[i], fail);
    }
    unsetenv("FLASHINFER_CACHE_DIR");
}

int main(int argc, char **argv) {
    int rc = tu_parse_args(argc, argv,
                           "The JIT cache's security model: SHA-256, the private directory, "
                           "verified entries, the C compiler without a shell.");
    if (rc) return rc;
    test_sha256();
    test_dir();
    test_entry();
    test_cpu_jit();
    scratch_free();
    if (tu_opt.list) return 0;
    return tu_summary("test_cache");
}
