/* cache.c — the on-disk JIT cache: its private directory, verified entries,
 * atomic writes (the model is at the top of core/cache.h). */
#include "core/cache.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

#define INVALID(...) fi_error(FI_STATUS_INVALID_ARGUMENT, __VA_ARGS__)

uint64_t fi_fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

uint64_t fi_fnv_str(uint64_t h, const char *s) { return fi_fnv(h, s, strlen(s) + 1); }

fi_status fi_cache_format(char *buf, size_t n, const char *what, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    if (len < 0 || (size_t)len >= n) {
        if (n) buf[0] = 0;
        return INVALID("%s: the path needs %d bytes, more than the %zu it may have (set "
                       "FLASHINFER_CACHE_DIR to a shorter directory)", what, len, n ? n - 1 : 0);
    }
    return FI_OK;
}

/* --------------------------------------------------------------- directory */

/* Who may own what the cache trusts: this user, or root (a read-only cache
 * an administrator installed). */
static bool trusted_owner(uid_t uid) { return uid == geteuid() || uid == 0; }

/* `path` (a directory of the cache itself): a directory owned by this user
 * or root that no one else can write to. */
static fi_status check_private_dir(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0)
        return fi_error(FI_STATUS_UNSUPPORTED, "JIT cache directory %s: %s", path,
                        strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return fi_error(FI_STATUS_UNSUPPORTED, "JIT cache directory %s is not a directory",
                        path);
    if (!trusted_owner(st.st_uid))
        return fi_error(FI_STATUS_UNSUPPORTED,
                        "JIT cache directory %s is owned by uid %d, not by this user (uid %d) "
                        "or root: its files are not loaded (set FLASHINFER_CACHE_DIR to a "
                        "directory of yours)", path, (int)st.st_uid, (int)geteuid());
    if (st.st_mode & (S_IWGRP | S_IWOTH))
        return fi_error(FI_STATUS_UNSUPPORTED,
                        "JIT cache directory %s has mode %04o: others may write to it, so its "
                        "files are not loaded (chmod 700 it, or set FLASHINFER_CACHE_DIR to a "
                        "private directory)", path, (unsigned)(st.st_mode & 07777));
    return FI_OK;
}

/* Every directory above the cache, of its real path: owned by this user
 * or root, and writable by others only when sticky (so that no one else
 * can rename the cache away and put another in its place). */
static fi_status check_ancestors(const char *real) {
    char prefix[PATH_MAX];
    size_t len = strlen(real);
    if (len >= sizeof prefix) return INVALID("JIT cache directory %s: path too long", real);
    for (size_t i = 1; i <= len; i++) {
        if (real[i] != '/' && real[i] != 0) continue;
        if (real[i] == 0) break; /* the directory itself: check_private_dir */
        memcpy(prefix, real, i);
        prefix[i] = 0;
        struct stat st;
        if (stat(prefix, &st) != 0)
            return fi_error(FI_STATUS_UNSUPPORTED, "JIT cache: %s: %s", prefix, strerror(errno));
        if (!trusted_owner(st.st_uid) ||
            ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)))
            return fi_error(FI_STATUS_UNSUPPORTED,
                            "JIT cache directory %s lies under %s (uid %d, mode %04o), which "
                            "others may change: its files are not loaded (set "
                            "FLASHINFER_CACHE_DIR to a directory under ones only you and root "
                            "control)", real, prefix, (int)st.st_uid,
                            (unsigned)(st.st_mode & 07777));
    }
    struct stat root;
    if (stat("/", &root) == 0 && (!trusted_owner(root.st_uid) || (root.st_mode & S_IWOTH)))
        return fi_error(FI_STATUS_UNSUPPORTED, "JIT cache: / is writable by others");
    return FI_OK;
}

/* mkdir -p with mode 0700 for every directory made. */
static fi_status make_dirs(const char *path) {
    char tmp[PATH_MAX];
    fi_status st = fi_cache_format(tmp, sizeof tmp, "JIT cache directory", "%s", path);
    if (st) return st;
    for (char *p = tmp + 1;; p++) {
        if (*p != '/' && *p != 0) continue;
        char c = *p;
        *p = 0;
        if (mkdir(tmp, 0700) != 0 && errno != EEXIST)
            return fi_error(FI_STATUS_UNSUPPORTED, "JIT cache: cannot create %s: %s", tmp,
                            strerror(errno));
        *p = c;
        if (c == 0) break;
    }
    return FI_OK;
}

fi_status fi_cache_location(char *buf, size_t n) {
    const char *d = getenv("FLASHINFER_CACHE_DIR");
    if (d && d[0]) {
        if (d[0] != '/')
            return INVALID("FLASHINFER_CACHE_DIR=%.200s: the JIT cache directory must be an "
                           "absolute path", d);
        return fi_cache_format(buf, n, "FLASHINFER_CACHE_DIR", "%s", d);
    }
    d = getenv("XDG_CACHE_HOME");
    if (d && d[0] == '/') /* a relative value is to be ignored (XDG base directories) */
        return fi_cache_format(buf, n, "$XDG_CACHE_HOME/flashinfer-c", "%s/flashinfer-c", d);
    d = getenv("HOME");
    if (d && d[0] == '/')
        return fi_cache_format(buf, n, "$HOME/.cache/flashinfer-c", "%s/.cache/flashinfer-c", d);
    struct passwd pw, *found = NULL;
    char pwbuf[4096];
    if (getpwuid_r(geteuid(), &pw, pwbuf, sizeof pwbuf, &found) == 0 && found &&
        found->pw_dir && found->pw_dir[0] == '/')
        return fi_cache_format(buf, n, "the home directory's .cache/flashinfer-c",
                               "%s/.cache/flashinfer-c", found->pw_dir);
    return fi_error(FI_STATUS_UNSUPPORTED,
                    "no private JIT cache directory: FLASHINFER_CACHE_DIR, XDG_CACHE_HOME and "
                    "HOME are unset and uid %d has no home directory; set "
                    "FLASHINFER_CACHE_DIR to a directory of yours", (int)geteuid());
}

/* The public view of the location: nothing created or checked (fi info
 * reports whether it exists); "" and 0 when there is none, with the reason
 * in fi_last_error(). */
size_t fi_cache_directory(char *buf, size_t capacity) {
    char dir[PATH_MAX];
    if (fi_cache_location(dir, sizeof dir) != FI_OK) {
        if (buf && capacity) buf[0] = 0;
        return 0;
    }
    size_t len = strlen(dir);
    if (buf && capacity) snprintf(buf, capacity, "%s", dir);
    return len;
}

/* path created where missing, then it and everything above it checked. */
static fi_status prepare_dir(const char *path) {
    fi_status st = make_dirs(path);
    if (st) return st;
    char real[PATH_MAX];
    if (!realpath(path, real))
        return fi_error(FI_STATUS_UNSUPPORTED, "JIT cache directory %s: %s", path,
                        strerror(errno));
    if ((st = check_ancestors(real))) return st;
    return check_private_dir(real);
}

fi_status fi_cache_dir(char *buf, size_t n) {
    fi_status st = fi_cache_location(buf, n);
    if (!st) st = prepare_dir(buf);
    if (st && n) buf[0] = 0;
    return st;
}

fi_status fi_cache_subdir(const char *sub, char *buf, size_t n) {
    char dir[PATH_MAX];
    fi_status st = fi_cache_dir(dir, sizeof dir);
    if (!st) st = fi_cache_format(buf, n, "JIT cache directory", "%s/%s", dir, sub);
    if (!st) st = prepare_dir(buf);
    if (st && n) buf[0] = 0;
    return st;
}

/* ------------------------------------------------------------------- files */

/* A file of the cache opened for reading: regular, owned by this user or
 * root, writable by no one else; a symbolic link is not followed. -1 when
 * any of that fails. */
static int open_trusted(const char *path, struct stat *st) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -1;
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode) || !trusted_owner(st->st_uid) ||
        (st->st_mode & (S_IWGRP | S_IWOTH))) {
        close(fd);
        return -1;
    }
    return fd;
}

/* All of an open file, malloc'd (one extra NUL byte), NULL on error. */
static char *read_fd(int fd, const struct stat *st, size_t *size) {
    if (st->st_size < 0 || (uint64_t)st->st_size >= (uint64_t)SIZE_MAX) return NULL;
    size_t n = (size_t)st->st_size, got = 0;
    char *buf = malloc(n + 1);
    while (buf && got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r <= 0) {
            if (r < 0 && errno == EINTR) continue;
            free(buf);
            return NULL;
        }
        got += (size_t)r;
    }
    if (buf) buf[n] = 0, *size = n;
    return buf;
}

char *fi_cache_read(const char *path, size_t *size) {
    struct stat st;
    int fd = open_trusted(path, &st);
    if (fd < 0) return NULL;
    char *buf = read_fd(fd, &st, size);
    close(fd);
    if (buf && *size == 0) {
        free(buf);
        buf = NULL;
    }
    return buf;
}

/* path + suffix into buf, or false when it does not fit. */
static bool with_suffix(char *buf, size_t n, const char *path, const char *suffix) {
    int len = snprintf(buf, n, "%s%s", path, suffix);
    return len >= 0 && (size_t)len < n;
}

int fi_cache_write(const char *path, const void *data, size_t size) {
    static _Atomic unsigned counter;
    char tmp[PATH_MAX + 64];
    int len = snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(),
                       atomic_fetch_add(&counter, 1));
    if (len < 0 || (size_t)len >= sizeof tmp) return -1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return -1;
    const char *p = data;
    size_t done = 0;
    bool ok = true;
    while (ok && done < size) {
        ssize_t w = write(fd, p + done, size - done);
        if (w < 0 && errno == EINTR) continue;
        ok = w > 0;
        if (ok) done += (size_t)w;
    }
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* The record of an entry: what it was built from and what its bytes are. */
static int record_text(char *buf, size_t n, const uint8_t key[FI_SHA256_BYTES],
                       const uint8_t digest[FI_SHA256_BYTES], size_t size) {
    char k[2 * FI_SHA256_BYTES + 1], d[2 * FI_SHA256_BYTES + 1];
    fi_sha256_hex(key, FI_SHA256_BYTES, k);
    fi_sha256_hex(digest, FI_SHA256_BYTES, d);
    return snprintf(buf, n, "flashinfer-c cache entry 1\nkey %s\nsha256 %s\nbytes %zu\n", k, d,
                    size);
}

static fi_status write_record(const char *path, const uint8_t key[FI_SHA256_BYTES],
                              const void *data, size_t size) {
    char rec_path[PATH_MAX + 16], rec[256];
    uint8_t digest[FI_SHA256_BYTES];
    if (!with_suffix(rec_path, sizeof rec_path, path, ".sha256"))
        return INVALID("JIT cache: %s: path too long for its record", path);
    fi_sha256_of(data, size, digest);
    int len = record_text(rec, sizeof rec, key, digest, size);
    if (fi_cache_write(rec_path, rec, (size_t)len) != 0)
        return fi_error(FI_STATUS_BACKEND_ERROR, "JIT cache: cannot write %s: %s", rec_path,
                        strerror(errno));
    return FI_OK;
}

fi_status fi_cache_store(const char *path, const uint8_t key[FI_SHA256_BYTES], const void *data,
                         size_t size) {
    fi_status st = write_record(path, key, data, size);
    if (st) return st;
    if (fi_cache_write(path, data, size) != 0)
        return fi_error(FI_STATUS_BACKEND_ERROR, "JIT cache: cannot write %s: %s", path,
                        strerror(errno));
    return FI_OK;
}

fi_status fi_cache_seal(const char *tmp, const char *path, const uint8_t key[FI_SHA256_BYTES],
                        mode_t mode) {
    if (chmod(tmp, mode) != 0)
        return fi_error(FI_STATUS_BACKEND_ERROR, "JIT cache: chmod %s: %s", tmp, strerror(errno));
    size_t size = 0;
    char *data = fi_cache_read(tmp, &size);
    if (!data)
        return fi_error(FI_STATUS_BACKEND_ERROR, "JIT cache: cannot read back %s", tmp);
    fi_status st = write_record(path, key, data, size);
    free(data);
    if (!st && rename(tmp, path) != 0)
        st = fi_error(FI_STATUS_BACKEND_ERROR, "JIT cache: cannot rename %s to %s: %s", tmp, path,
                      strerror(errno));
    return st;
}

/* The entry's bytes when its record and its checks hold, else NULL. */
static char *load_verified(const char *path, const uint8_t key[FI_SHA256_BYTES], size_t *size) {
    char rec_path[PATH_MAX + 16], want[256];
    if (!with_suffix(rec_path, sizeof rec_path, path, ".sha256")) return NULL;
    size_t rec_size = 0;
    char *rec = fi_cache_read(rec_path, &rec_size);
    if (!rec) return NULL;
    struct stat st;
    int fd = open_trusted(path, &st);
    char *data = fd >= 0 ? read_fd(fd, &st, size) : NULL;
    if (fd >= 0) close(fd);
    bool ok = data != NULL;
    if (ok) {
        uint8_t digest[FI_SHA256_BYTES];
        fi_sha256_of(data, *size, digest);
        int len = record_text(want, sizeof want, key, digest, *size);
        ok = (size_t)len == rec_size && memcmp(want, rec, rec_size) == 0;
    }
    free(rec);
    if (!ok) {
        free(data);
        data = NULL;
    }
    return data;
}

char *fi_cache_load(const char *path, const uint8_t key[FI_SHA256_BYTES], size_t *size) {
    return load_verified(path, key, size);
}

bool fi_cache_check(const char *path, const uint8_t key[FI_SHA256_BYTES]) {
    size_t size = 0;
    char *data = load_verified(path, key, &size);
    free(data);
    return data != NULL;
}
