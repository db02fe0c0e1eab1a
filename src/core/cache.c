/* cache.c — the on-disk JIT cache: directory, reads, atomic writes, hash. */
#include "core/cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

uint64_t fi_fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

uint64_t fi_fnv_str(uint64_t h, const char *s) { return fi_fnv(h, s, strlen(s) + 1); }

void fi_cache_dir(char *buf, size_t n) {
    const char *d = getenv("FLASHINFER_CACHE_DIR");
    if (d && d[0]) {
        snprintf(buf, n, "%s", d);
        return;
    }
    d = getenv("XDG_CACHE_HOME");
    if (d && d[0]) {
        snprintf(buf, n, "%s/flashinfer-c", d);
        return;
    }
    d = getenv("HOME");
    snprintf(buf, n, "%s/.cache/flashinfer-c", d && d[0] ? d : "/tmp");
}

void fi_cache_make_dirs(const char *path) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        mkdir(tmp, 0755);
        *p = '/';
    }
    mkdir(tmp, 0755);
}

char *fi_cache_read(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long len = ftell(f);
        if (len > 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)len))) {
            if (fread(buf, 1, (size_t)len, f) != (size_t)len) {
                free(buf);
                buf = NULL;
            } else {
                *size = (size_t)len;
            }
        }
    }
    fclose(f);
    return buf;
}

int fi_cache_write(const char *path, const void *data, size_t size) {
    char dir[1024], tmp[1100];
    snprintf(dir, sizeof dir, "%.1000s", path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = 0;
        fi_cache_make_dirs(dir);
    }
    snprintf(tmp, sizeof tmp, "%.1000s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return -1;
    int ok = fwrite(data, 1, size, f) == size;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return -1;
    }
    return 0;
}
