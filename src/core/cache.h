/*
 * cache.h — the on-disk cache both JITs share (CUDA cubins, CPU variant
 * shared objects): its directory, atomic file writes, and the FNV-1a hash
 * their keys are built from. docs/VARIANTS.md documents keys and location.
 */
#ifndef FI_CORE_CACHE_H
#define FI_CORE_CACHE_H

#include <stddef.h>
#include <stdint.h>

/* $FLASHINFER_CACHE_DIR, else $XDG_CACHE_HOME/flashinfer-c, else
 * $HOME/.cache/flashinfer-c (/tmp/.cache/flashinfer-c without HOME). */
void fi_cache_dir(char *buf, size_t n);
/* mkdir -p; failures are left to the file operations that follow. */
void fi_cache_make_dirs(const char *path);
/* The whole file, malloc'd (NULL if absent, empty or unreadable). */
char *fi_cache_read(const char *path, size_t *size);
/* Write via a temporary file and rename, so readers never see half a file.
 * Returns 0 on success; a cache that cannot be written is not an error for
 * callers that still hold the data. */
int fi_cache_write(const char *path, const void *data, size_t size);

/* FNV-1a over bytes / a string with its NUL; seed with FI_FNV_SEED. */
#define FI_FNV_SEED 0xcbf29ce484222325ull
uint64_t fi_fnv(uint64_t h, const void *p, size_t n);
uint64_t fi_fnv_str(uint64_t h, const char *s);

#endif /* FI_CORE_CACHE_H */
