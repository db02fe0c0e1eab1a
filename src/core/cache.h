/*
 * cache.h — the on-disk cache both JITs share (CUDA cubins, CPU variant
 * shared objects): where it is, how it is kept private, and how an entry
 * is verified before anything of it is loaded. docs/VARIANTS.md ("The
 * cache and its security") documents the model; in short:
 *
 *  - The directory is $FLASHINFER_CACHE_DIR (an absolute path), else
 *    $XDG_CACHE_HOME/flashinfer-c (absolute), else $HOME/.cache/flashinfer-c,
 *    else the same under the home directory of the user's passwd entry;
 *    with none of these, an error: there is no shared fallback.
 *  - Missing directories are created 0700. Before use, the directory (and
 *    its subdirectories) must be owned by this user or root and writable by
 *    no one else; every directory above it must be owned by this user or
 *    root and not writable by others unless sticky (as /tmp is).
 *  - An entry is a file and its record (the file's name + ".sha256"): the
 *    SHA-256 key of everything the file was built from, and the SHA-256 of
 *    its bytes. A file is used only when it is a regular file owned by this
 *    user (or root), writable by no one else, its record names the key
 *    asked for, and its bytes match the record's digest. Anything else is a
 *    miss: the caller builds afresh and stores over it.
 *  - Paths never truncate: one that does not fit its buffer is an error.
 */
#ifndef FI_CORE_CACHE_H
#define FI_CORE_CACHE_H

#include "core/internal.h"
#include "core/sha256.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Hex digits of an entry's key in its file name (128 bits). */
#define FI_CACHE_NAME_HEX 32

/* Where the cache directory is configured to be (the order above), into
 * buf[n]; nothing is created or checked. */
fi_status fi_cache_location(char *buf, size_t n);
/* The cache directory, created and verified as above, into buf[n]. */
fi_status fi_cache_dir(char *buf, size_t n);
/* The subdirectory `sub` of the cache directory, created and verified. */
fi_status fi_cache_subdir(const char *sub, char *buf, size_t n);
/* snprintf into buf[n]; a result that does not fit is
 * FI_STATUS_INVALID_ARGUMENT naming `what`, never a truncated path. */
fi_status fi_cache_format(char *buf, size_t n, const char *what, const char *fmt, ...)
    FI_PRINTF(4, 5);

/* Store `data` as the entry `path` for `key`: the file (mode 0600, written
 * through a temporary name and renamed) and its record. */
fi_status fi_cache_store(const char *path, const uint8_t key[FI_SHA256_BYTES], const void *data,
                         size_t size);
/* Make the file at `tmp` (another process's output, e.g. the C
 * compiler's) the entry `path` for `key`: mode `mode`, its record written,
 * then renamed onto path. */
fi_status fi_cache_seal(const char *tmp, const char *path, const uint8_t key[FI_SHA256_BYTES],
                        mode_t mode);
/* The verified bytes of entry `path` for `key` (malloc'd), or NULL when
 * there is none that passes every check (a miss, not an error). */
char *fi_cache_load(const char *path, const uint8_t key[FI_SHA256_BYTES], size_t *size);
/* Whether entry `path` for `key` passes every check (for files loaded by
 * path, such as shared objects). */
bool fi_cache_check(const char *path, const uint8_t key[FI_SHA256_BYTES]);

/* Write a private file (0600) through a temporary name and rename; 0 on
 * success. */
int fi_cache_write(const char *path, const void *data, size_t size);
/* The whole file, malloc'd (NULL if absent, empty or unreadable). */
char *fi_cache_read(const char *path, size_t *size);

/* FNV-1a over bytes / a string with its NUL; seed with FI_FNV_SEED. For
 * names (kernel entry points), not for cache keys. */
#define FI_FNV_SEED 0xcbf29ce484222325ull
uint64_t fi_fnv(uint64_t h, const void *p, size_t n);
uint64_t fi_fnv_str(uint64_t h, const char *s);

#endif /* FI_CORE_CACHE_H */
